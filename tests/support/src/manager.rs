//! captf-manager as a local process against a test control plane: with a
//! development CA and serving certificate, the CRDs installed, and the
//! committed webhook configurations pointed at it on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use captf::server::dev_certs::DevCa;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use crate::controlplane::{ControlPlane, spawn_owned, terminate};

pub struct Manager {
    child: Child,
    dir: tempfile::TempDir,
    pub webhook_port: u16,
    pub health_port: u16,
    /// `/metrics`, plain HTTP (`--insecure-diagnostics`).
    pub diagnostics_port: u16,
    ca: DevCa,
}

impl Manager {
    /// Starts `binary` against `plane` on free loopback ports, with `extra`
    /// flags after the defaults (a later flag wins in clap).
    pub fn start(plane: &ControlPlane, binary: &Path, extra: &[&str]) -> Manager {
        Self::start_with_env(plane, binary, extra, &[])
    }

    /// [`Manager::start`] with environment variables (`POD_NAME`, ...).
    pub fn start_with_env(
        plane: &ControlPlane,
        binary: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Manager {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ca = DevCa::generate("captf-test-webhook-ca").expect("a CA");
        let serving = ca
            .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .expect("a serving certificate");
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        std::fs::write(certs.join("tls.crt"), &serving.cert_pem).unwrap();
        std::fs::write(certs.join("tls.key"), &serving.key_pem).unwrap();
        let [webhook_port, health_port, diagnostics_port] =
            crate::controlplane::free_ports().expect("free ports");
        let log = std::fs::File::create(dir.path().join("manager.log")).unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg(format!(
            "--kubeconfig={}",
            plane.manager_kubeconfig().display()
        ))
        .arg(format!("--webhook-port={webhook_port}"))
        .arg(format!("--webhook-cert-dir={}", certs.display()))
        .arg(format!("--health-addr=127.0.0.1:{health_port}"))
        .arg(format!(
            "--diagnostics-address=127.0.0.1:{diagnostics_port}"
        ))
        .arg("--insecure-diagnostics");
        // Jobs' init containers run it: the local build, unless the test
        // names an image.
        if !extra.iter().any(|a| a.starts_with("--runner-image=")) {
            cmd.arg("--runner-image=captf.test/runner:dev");
        }
        cmd.args(extra)
            .env("RUST_LOG", "info,captf=debug")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child =
            spawn_owned(cmd).unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        Manager {
            child,
            dir,
            webhook_port,
            health_port,
            diagnostics_port,
            ca,
        }
    }

    /// The manager's process id.
    /// The process's resident set now and at its peak, and the CPU it
    /// has used, from /proc.
    pub fn usage(&self) -> Usage {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command name, which may hold spaces: utime
        // and stime are the 12th and 13th, in clock ticks (100 a second).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Usage {
            rss_kib: kib("VmRSS:"),
            peak_kib: kib("VmHWM:"),
            cpu_seconds: (ticks(11) + ticks(12)) / 100.0,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        let port = self.diagnostics_port;
        tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
            .await
            .expect("fetching /metrics")
            .unwrap_or_else(|| panic!("/metrics on port {port} did not answer"))
    }

    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("manager.log")).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("manager.log")
    }

    /// Waits until /readyz answers 200; panics with the log otherwise.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the manager exited with {status}:\n{}", self.log());
            }
            if http_status(self.health_port, "/readyz") == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the manager never became ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Applies config/webhook/manifests.yaml with each webhook's service
    /// replaced by `https://127.0.0.1:<port><path>` and this CA.
    pub async fn register_webhooks(&self, client: &kube::Client) {
        let manifests = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/webhook/manifests.yaml"),
        )
        .expect("reading config/webhook/manifests.yaml");
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&manifests).expect("parsing the webhook manifests");
        let params = PatchParams::apply("captf-testkit").force();
        for doc in docs {
            match doc["kind"].as_str() {
                Some("ValidatingWebhookConfiguration") => {
                    let mut config: ValidatingWebhookConfiguration =
                        serde_json::from_value(doc).unwrap();
                    for hook in &mut config.webhooks.iter_mut().flatten() {
                        hook.client_config = self.client_config(&hook.client_config);
                    }
                    let name = config.metadata.name.clone().unwrap();
                    Api::<ValidatingWebhookConfiguration>::all(client.clone())
                        .patch(&name, &params, &Patch::Apply(&config))
                        .await
                        .expect("registering the validating webhook");
                }
                Some("MutatingWebhookConfiguration") => {
                    let mut config: MutatingWebhookConfiguration =
                        serde_json::from_value(doc).unwrap();
                    for hook in &mut config.webhooks.iter_mut().flatten() {
                        hook.client_config = self.client_config(&hook.client_config);
                    }
                    let name = config.metadata.name.clone().unwrap();
                    Api::<MutatingWebhookConfiguration>::all(client.clone())
                        .patch(&name, &params, &Patch::Apply(&config))
                        .await
                        .expect("registering the mutating webhook");
                }
                other => panic!("unexpected kind {other:?} in the webhook manifests"),
            }
        }
    }

    fn client_config(&self, from: &WebhookClientConfig) -> WebhookClientConfig {
        let path = from
            .service
            .as_ref()
            .and_then(|s| s.path.clone())
            .expect("the manifest's webhook has a service path");
        WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{}{path}", self.webhook_port)),
            ca_bundle: Some(ByteString(self.ca_pem().as_bytes().to_vec())),
            service: None,
        }
    }

    /// SIGTERM, then SIGKILL after ten seconds.
    pub fn stop(&mut self) {
        terminate(&mut self.child);
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether `/readyz` answers 200 now.
    pub fn ready(&self) -> bool {
        http_status(self.health_port, "/readyz") == Some(200)
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Applies config/rbac/runner_clusterrole.yaml, the ClusterRole the
/// manager binds each namespace's runner ServiceAccount to (a deployment
/// ships it with the manager's RBAC).
pub async fn install_runner_role(client: &kube::Client) {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/rbac/runner_clusterrole.yaml"),
    )
    .expect("reading config/rbac/runner_clusterrole.yaml");
    let role: ClusterRole = serde_saphyr::from_str(&text).expect("parsing the runner ClusterRole");
    let name = role.metadata.name.clone().expect("a named ClusterRole");
    Api::<ClusterRole>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("captf-testkit").force(),
            &Patch::Apply(&role),
        )
        .await
        .expect("applying the runner ClusterRole");
}

/// Installs the CRDs a manager needs: CAPTF's, and Cluster API's (its
/// watches of Clusters, Machines and MachinePools must list before any
/// pass runs), and waits until they serve.
pub async fn install_crds(client: &kube::Client) {
    crate::capi::install_crds(client).await;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("captf-testkit").force();
    let crds = captf::api::crds();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .expect("applying a CRD");
    }
    let names: Vec<String> = crds
        .iter()
        .map(|crd| crd.metadata.name.clone().unwrap())
        .collect();
    wait_established(&api, &names).await;
}

/// Applies CRDs given as documents (server-side, forced: many tests of a
/// binary may apply the same ones at once, and unchanged CRDs change
/// nothing) and waits until they serve.
pub async fn apply_crds(client: &kube::Client, crds: &[serde_json::Value]) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("captf-testkit").force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd["metadata"]["name"]
            .as_str()
            .expect("a named CRD")
            .to_string();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("applying the CRD {name}: {e}"));
        names.push(name);
    }
    wait_established(&api, &names).await;
}

/// Waits until each of the CRDs `names` is Established.
pub(crate) async fn wait_established(api: &Api<CustomResourceDefinition>, names: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in names {
        loop {
            let established = api
                .get(name)
                .await
                .ok()
                .and_then(|c| c.status)
                .is_some_and(|s| {
                    s.conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "CRD {name} never became established"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn http_response(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// The status code of a plain HTTP GET, or None if nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_response(port, path)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The body of a plain HTTP GET that answered 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let response = http_response(port, path)?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.split_whitespace()
        .nth(1)
        .filter(|code| *code == "200")?;
    Some(body.to_string())
}

/// What a process used, from /proc.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub rss_kib: u64,
    pub peak_kib: u64,
    pub cpu_seconds: f64,
}

/// The sum of the series of `family` in a Prometheus scrape.
pub fn metric_total(scrape: &str, family: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
