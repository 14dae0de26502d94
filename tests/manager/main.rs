//! The manager as a process against the real control plane: readiness and
//! graceful shutdown (readiness waits for the API server and the watches, so
//! the CRDs are installed first), the webhook listener (TLS rotation, bad and oversized
//! bodies), and `/metrics` behind TokenReview and SubjectAccessReview.

use std::convert::Infallible;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use captf::server::dev_certs::{CertKey, DevCa};
use captf_testkit::controlplane::{self, spawn_owned};
use http::{Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const TIMEOUT: Duration = Duration::from_secs(60);
const SHUTDOWN_DELAY: &str = "3s";

mod bodies;
mod commands;
mod metrics;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// A directory laid out as kubelet lays out a mounted Secret: `tls.crt` and
/// `tls.key` link into `..data`, a link to a timestamped directory.
struct CertDir(tempfile::TempDir);

impl CertDir {
    fn new(pair: &CertKey) -> Self {
        let dir = Self(tempfile::tempdir().unwrap());
        dir.publish(
            "..2025_06_01_10_00_00.000000001",
            &pair.cert_pem,
            &pair.key_pem,
        );
        dir
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes a new timestamped directory and swaps `..data` to it atomically.
    fn publish(&self, stamp: &str, cert: &str, key: &str) {
        let root = self.0.path();
        let data = root.join(stamp);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("tls.crt"), cert).unwrap();
        std::fs::write(data.join("tls.key"), key).unwrap();
        let old = std::fs::read_link(root.join("..data")).ok();
        std::os::unix::fs::symlink(stamp, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        for name in ["tls.crt", "tls.key"] {
            let link = root.join(name);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(root.join(old)).unwrap();
        }
    }
}

fn serving_pair(ca: &DevCa) -> CertKey {
    ca.issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap()
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// A manager process; killed when dropped.
struct Manager {
    child: Child,
    log: PathBuf,
    health: u16,
    webhook: u16,
    diagnostics: u16,
    _log_dir: tempfile::TempDir,
}

impl Manager {
    fn start(kubeconfig: &Path, cert_dir: &Path, extra: &[&str]) -> Self {
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("manager.log");
        let file = std::fs::File::create(&log).unwrap();
        let [health, webhook, diagnostics] = controlplane::free_ports().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_captf-manager"));
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--health-addr=127.0.0.1:{health}"))
            .arg(format!("--webhook-port={webhook}"))
            .arg(format!("--diagnostics-address=127.0.0.1:{diagnostics}"))
            .arg(format!("--webhook-cert-dir={}", cert_dir.display()))
            .arg("--runner-image=registry.example/captf:test")
            .arg(format!("--shutdown-delay={SHUTDOWN_DELAY}"))
            .args(extra)
            .env("RUST_LOG", "info,captf=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = spawn_owned(cmd).unwrap();
        Self {
            child,
            log,
            health,
            webhook,
            diagnostics,
            _log_dir: log_dir,
        }
    }

    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    fn sigterm(&self) {
        // SAFETY: a signal to a child this test started and has not reaped.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
    }

    async fn readyz(&self) -> Option<(StatusCode, String)> {
        plain_get(self.health, "/readyz").await
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                panic!("the manager exited with {status}:\n{}", self.log());
            }
            if let Some((StatusCode::OK, _)) = self.readyz().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the manager never got ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the manager did not stop:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 or HTTP/2 connection.
enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Conn {
    async fn open<IO>(io: IO, h2: bool) -> Self
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Conn::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Conn::H1(sender)
        }
    }

    async fn send(&mut self, request: Request<Body>) -> (StatusCode, Bytes) {
        let response = match self {
            Conn::H1(sender) => sender.send_request(request).await.unwrap(),
            Conn::H2(sender) => sender.send_request(request).await.unwrap(),
        };
        let status = response.status();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

fn post(port: u16, path: &str, body: Body) -> Request<Body> {
    Request::post(format!("https://localhost:{port}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// GET over plain HTTP; `None` while nothing listens.
async fn plain_get(port: u16, path: &str) -> Option<(StatusCode, String)> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(conn);
    let request = Request::get(path)
        .header("host", format!("127.0.0.1:{port}"))
        .body(full(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn trusting(cas: &[&DevCa], alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
            .unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Every connection does a full handshake: a resumed session shows the
    // certificate of the session it resumes, not the one served now.
    config.resumption = Resumption::disabled();
    Arc::new(config)
}

/// Checks signatures but trusts any certificate: the metrics listener serves
/// a self-signed one, as Prometheus is then told to accept.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn trusting_anything() -> Arc<ClientConfig> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
        .with_no_client_auth();
    Arc::new(config)
}

async fn tls(port: u16, config: Arc<ClientConfig>) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

fn peer_leaf(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn is_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// A CREATE of a minimal TerraformCluster.
fn admission_review(uid: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": "TerraformCluster"},
            "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": "terraformclusters"},
            "name": "demo",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "TerraformCluster",
                "metadata": {"name": "demo", "namespace": "default"},
                "spec": {
                    "source": {"image": "registry.example/modules/noop:v1"},
                    "identityRef": {"name": "creds"}
                }
            },
            "oldObject": null,
            "dryRun": false
        }
    })
    .to_string()
}

/// The server's part of an answer: HTTP 200 and an AdmissionReview carrying
/// the request's UID and a verdict (which verdict is the rules' business).
fn assert_answered(status: StatusCode, body: &[u8], uid: &str) {
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(body));
    let review: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["response"]["uid"], uid);
    assert!(review["response"]["allowed"].is_boolean(), "{review}");
}

/// A TCP proxy to the API server, to decide when the manager reaches it.
fn proxy(listener: tokio::net::TcpListener, upstream: String) {
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

#[tokio::test]
async fn readyz_waits_for_the_api_server_and_turns_unready_at_sigterm() {
    let plane = controlplane::shared();
    captf_testkit::manager::install_crds(&plane.client().await).await;
    let ca = DevCa::generate("webhook-ca").unwrap();
    let certs = CertDir::new(&serving_pair(&ca));

    // The manager reaches the API server only through a proxy that is not
    // listening yet.
    let api = plane.server().strip_prefix("https://").unwrap().to_string();
    let [proxy_port] = controlplane::free_ports().unwrap();
    let kubeconfig = std::fs::read_to_string(plane.manager_kubeconfig())
        .unwrap()
        .replace(plane.server(), &format!("https://127.0.0.1:{proxy_port}"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig_path = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig).unwrap();

    let mut manager = Manager::start(&kubeconfig_path, certs.path(), &[]);
    let deadline = Instant::now() + TIMEOUT;
    let (status, why) = loop {
        if let Some(answer) = manager.readyz().await {
            break answer;
        }
        assert!(
            manager.exited().is_none(),
            "the manager exited:\n{}",
            manager.log()
        );
        assert!(Instant::now() < deadline, "no /readyz:\n{}", manager.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // The webhook serves already; the API server has not answered.
    let webhook = tls(manager.webhook, trusting(&[&ca], &[b"http/1.1"])).await;
    let mut conn = Conn::open(webhook, false).await;
    let (status, body) = conn
        .send(post(
            manager.webhook,
            "/validate",
            full(admission_review("early")),
        ))
        .await;
    assert_answered(status, &body, "early");
    let (status, why_now) = manager.readyz().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{why}");
    assert_eq!(why_now, "waiting for: watches");
    assert_eq!(
        plain_get(manager.health, "/healthz").await.unwrap().0,
        StatusCode::OK
    );

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", proxy_port))
        .await
        .unwrap();
    proxy(listener, api);
    manager.wait_ready().await;

    manager.sigterm();
    // The signal is handled a moment later; /readyz answers all along.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, why) = manager
            .readyz()
            .await
            .expect("/readyz answers during the shutdown delay");
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(why, "shutting down");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still ready after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // During the delay the webhook still serves, so that in-flight admission
    // calls from the API server succeed while endpoints catch up.
    let webhook = tls(manager.webhook, trusting(&[&ca], &[b"http/1.1"])).await;
    let mut conn = Conn::open(webhook, false).await;
    let (status, body) = conn
        .send(post(
            manager.webhook,
            "/validate",
            full(admission_review("late")),
        ))
        .await;
    assert_answered(status, &body, "late");

    let exit = manager.wait_exit(Duration::from_secs(30)).await;
    assert!(exit.success(), "{exit}:\n{}", manager.log());
    assert!(
        manager.readyz().await.is_none(),
        "the health listener stopped"
    );
    let log = manager.log();
    assert!(log.contains("FLAG: --webhook-port=\""), "{log}");
    assert!(log.contains("SIGTERM received"), "{log}");
}

#[tokio::test]
async fn a_kubelet_style_rotation_reaches_the_next_handshake() {
    let plane = controlplane::shared();
    captf_testkit::manager::install_crds(&plane.client().await).await;
    let (first_ca, second_ca) = (
        DevCa::generate("first-ca").unwrap(),
        DevCa::generate("second-ca").unwrap(),
    );
    let (first, second) = (serving_pair(&first_ca), serving_pair(&second_ca));
    let certs = CertDir::new(&first);
    let mut manager = Manager::start(plane.manager_kubeconfig(), certs.path(), &[]);
    manager.wait_ready().await;
    let config = trusting(&[&first_ca, &second_ca], &[b"h2", b"http/1.1"]);

    let stream = tls(manager.webhook, config.clone()).await;
    assert_eq!(peer_leaf(&stream), der(&first.cert_pem));
    assert!(is_h2(&stream), "ALPN offers h2");
    let mut before = Conn::open(stream, true).await;
    let (status, body) = before
        .send(post(
            manager.webhook,
            "/validate",
            full(admission_review("one")),
        ))
        .await;
    assert_answered(status, &body, "one");

    // A half-written certificate is not served: the old one stays.
    let cut = &second.cert_pem[..second.cert_pem.len() / 2];
    certs.publish("..2025_06_01_11_00_00.000000002", cut, &second.key_pem);
    let stream = tls(manager.webhook, config.clone()).await;
    assert_eq!(peer_leaf(&stream), der(&first.cert_pem));

    certs.publish(
        "..2025_06_01_12_00_00.000000003",
        &second.cert_pem,
        &second.key_pem,
    );
    let stream = tls(manager.webhook, config.clone()).await;
    assert_eq!(peer_leaf(&stream), der(&second.cert_pem));
    let mut after = Conn::open(stream, true).await;
    let (status, body) = after
        .send(post(
            manager.webhook,
            "/mutate",
            full(admission_review("two")),
        ))
        .await;
    assert_answered(status, &body, "two");
    // A connection made before the rotation goes on working.
    let (status, body) = before
        .send(post(
            manager.webhook,
            "/validate",
            full(admission_review("three")),
        ))
        .await;
    assert_answered(status, &body, "three");

    // A client that trusts only the old CA is now refused: really rotated.
    let tcp = TcpStream::connect(("127.0.0.1", manager.webhook))
        .await
        .unwrap();
    let refused = TlsConnector::from(trusting(&[&first_ca], &[]))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await;
    assert!(refused.is_err());
    assert!(manager.exited().is_none(), "{}", manager.log());
}
