//! The webhook over TLS on loopback: requests per second and p50/p99
//! latency of `POST /validate` (the real route: read and parse the
//! AdmissionReview, run the rules of `Webhooks::offline()`, i.e. every rule
//! that needs no API server, serialize the answer) next to a bare route on
//! the same server, same TLS and same listener, that reads the body and
//! answers fixed bytes. The ratio is what validation costs.
//!
//! ```sh
//! cargo bench --bench webhook
//! cargo bench --bench webhook -- --requests 20000 --connections 4 --rounds 3
//! ```
//!
//! The server runs on a runtime with one worker thread and the client on
//! another, so that on a two-core machine each has a core. Every connection
//! is HTTP/2 (what the API server speaks to webhooks) and sends its requests
//! one after another; handshakes happen before the clock starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{Request, header};
use axum::routing::post;
use captf::server::dev_certs::DevCa;
use captf::server::listeners::serve;
use captf::server::tls::{self, ReloadingCert, TlsListener};
use captf::server::webhook;
use captf::webhooks::handler::Webhooks;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde_json::json;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

const BARE_ANSWER: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}"#;

struct Options {
    requests: usize,
    connections: usize,
    rounds: usize,
}

fn options() -> Options {
    let mut options = Options {
        requests: 20_000,
        connections: 4,
        rounds: 3,
    };
    let args: Vec<String> = std::env::args().collect();
    // cargo passes --bench; anything unknown is ignored.
    for pair in args.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--requests", Some(v)) => options.requests = v,
            ("--connections", Some(v)) => options.connections = v,
            ("--rounds", Some(v)) => options.rounds = v,
            _ => {}
        }
    }
    options
}

/// A CREATE of a TerraformCluster as the API server sends it, with managed
/// fields and the last-applied annotation (about 6 KiB).
fn admission_review() -> Bytes {
    let variables: serde_json::Map<String, serde_json::Value> = (0..24)
        .map(|i| {
            (
                format!("variable_{i:02}"),
                json!(format!("value-{i}-of-a-realistic-length")),
            )
        })
        .collect();
    let spec = json!({
        "source": {"image": "registry.example/infra/network-module:v1.4.2", "imagePullPolicy": "IfNotPresent"},
        "variables": variables,
        "identityRef": {"name": "platform-credentials"},
        "jobs": {"activeDeadlineSeconds": 3600, "lockTimeoutSeconds": 300, "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}]},
        "drift": {"intervalSeconds": 1800, "action": "Report"},
        "applyPolicy": "Automatic"
    });
    let object = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TerraformCluster",
        "metadata": {
            "name": "prod-eu-1",
            "namespace": "clusters",
            "uid": "7a5c7a54-2b1f-4f52-a4b4-4a0f0c7e9f11",
            "generation": 1,
            "labels": {"cluster.x-k8s.io/cluster-name": "prod-eu-1", "team": "platform"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": spec.to_string()},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "prod-eu-1", "uid": "0f7d2f7e-8f5a-4a51-9a63-3c5f0b1d2e3a", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:source": {"f:image": {}}, "f:variables": {}}}}]
        },
        "spec": spec
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": "TerraformCluster"},
            "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": "terraformclusters"},
            "requestKind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": "TerraformCluster"},
            "requestResource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": "terraformclusters"},
            "name": "prod-eu-1",
            "namespace": "clusters",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:capi-system:capi-controller-manager", "uid": "3c1f", "groups": ["system:serviceaccounts", "system:serviceaccounts:capi-system", "system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl"}
        }
    });
    Bytes::from(review.to_string())
}

struct Round {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

async fn connect(port: u16, config: Arc<ClientConfig>) -> SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    // As Go's HTTP client, which the API server uses, does.
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    let tls = TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").expect("a DNS name"), tcp)
        .await
        .expect("TLS handshake");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    sender
}

async fn round(
    port: u16,
    config: &Arc<ClientConfig>,
    path: &'static str,
    body: &Bytes,
    options: &Options,
) -> Round {
    let per_connection = options.requests / options.connections;
    let mut senders = Vec::new();
    for _ in 0..options.connections {
        senders.push(connect(port, config.clone()).await);
    }
    let started = Instant::now();
    let workers: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_connection);
                for _ in 0..per_connection {
                    let request = Request::post(format!("https://localhost:{port}{path}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(body.clone()))
                        .expect("a request");
                    let sent = Instant::now();
                    let response = sender.send_request(request).await.expect("a response");
                    assert!(
                        response.status().is_success(),
                        "{path}: {}",
                        response.status()
                    );
                    response.into_body().collect().await.expect("a body");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.expect("a worker"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Round {
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let options = options();
    let ca = DevCa::generate("bench-ca").expect("a CA");
    let pair = ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().expect("an IP")])
        .expect("a serving certificate");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("tls.crt"), &pair.cert_pem).expect("write tls.crt");
    std::fs::write(dir.path().join("tls.key"), &pair.key_pem).expect("write tls.key");

    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the server runtime");
    let (stop, stopped) = watch::channel(false);
    let port = server.block_on(async {
        let certs = ReloadingCert::load(dir.path().join("tls.crt"), dir.path().join("tls.key"))
            .expect("certificates");
        let config = tls::server_config(Arc::new(certs)).expect("a TLS configuration");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = tcp.local_addr().expect("an address").port();
        let router = webhook::router(Arc::new(Webhooks::offline())).route(
            "/bare",
            post(|body: Bytes| async move {
                // Read the body like the real route, do nothing with it.
                std::hint::black_box(body);
                ([(header::CONTENT_TYPE, "application/json")], BARE_ANSWER)
            }),
        );
        let listener = TlsListener::new(tcp, config).expect("a TLS listener");
        tokio::spawn(serve("bench", listener, router, stopped));
        port
    });

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("the CA"))
        .expect("a root");
    let mut client_config = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_config.alpn_protocols = vec![b"h2".to_vec()];
    let client_config = Arc::new(client_config);

    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the client runtime");
    let body = admission_review();
    println!(
        "body {} bytes, {} requests per round over {} HTTP/2 connections, {} rounds",
        body.len(),
        options.requests,
        options.connections,
        options.rounds
    );
    client.block_on(async {
        // The body must pass every rule, or the figures measure an early denial.
        let mut sender = connect(port, client_config.clone()).await;
        let request = Request::post(format!("https://localhost:{port}/validate"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .expect("a request");
        let response = sender.send_request(request).await.expect("a response");
        let answer = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        let answer: serde_json::Value =
            serde_json::from_slice(&answer).expect("an AdmissionReview");
        assert_eq!(
            answer["response"]["allowed"], true,
            "the benchmark body is denied: {answer}"
        );

        let warmup = Options {
            requests: options.requests / 10,
            ..options
        };
        round(port, &client_config, "/bare", &body, &warmup).await;
        round(port, &client_config, "/validate", &body, &warmup).await;

        let (mut bare, mut validate) = (Vec::new(), Vec::new());
        for i in 0..options.rounds {
            for (path, results) in [("/bare", &mut bare), ("/validate", &mut validate)] {
                let r = round(port, &client_config, path, &body, &options).await;
                println!(
                    "round {} {path:<10} {:>9.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs",
                    i + 1,
                    r.rps,
                    r.p50.as_secs_f64() * 1e6,
                    r.p99.as_secs_f64() * 1e6
                );
                results.push(r);
            }
        }
        let summary = |rounds: &[Round]| {
            (
                median(rounds.iter().map(|r| r.rps).collect()),
                median(rounds.iter().map(|r| r.p50.as_secs_f64() * 1e6).collect()),
                median(rounds.iter().map(|r| r.p99.as_secs_f64() * 1e6).collect()),
            )
        };
        let (b, v) = (summary(&bare), summary(&validate));
        println!(
            "median     /bare      {:>9.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs",
            b.0, b.1, b.2
        );
        println!(
            "median     /validate  {:>9.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs",
            v.0, v.1, v.2
        );
        println!(
            "ratio /validate ÷ /bare: throughput {:.2}, p50 {:.2}, p99 {:.2}",
            v.0 / b.0,
            v.1 / b.1,
            v.2 / b.2
        );
    });
    let _ = stop.send(true);
}
