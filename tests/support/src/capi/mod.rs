//! The Cluster API core manager as a local process against a test control
//! plane: its CRDs, read at test time from the `sigs.k8s.io/cluster-api`
//! module of the Go module cache, and the manager (`capi-manager-v<version>`,
//! built by `tests/controlplane/build.sh`) watching one test's namespace.
//! Its webhooks serve but are never registered, so [`objects`] sets what
//! their defaulting would.

mod objects;

pub use objects::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::controlplane::{self, ControlPlane, spawn_owned};
use crate::manager::{apply_crds, http_status};
use crate::upstream;

/// The pinned Cluster API release, e.g. `1.14.2`.
pub fn version() -> String {
    controlplane::version("CLUSTER_API_VERSION")
}

/// The module directory of the pinned release in the Go module cache.
pub fn module_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| upstream::go_module(&format!("sigs.k8s.io/cluster-api@v{}", version())))
}

/// The CRDs of `core/config/crd/bases`, parsed once per test binary.
fn crds() -> &'static [Value] {
    static CRDS: OnceLock<Vec<Value>> = OnceLock::new();
    CRDS.get_or_init(|| upstream::yaml_dir(&module_dir().join("core/config/crd/bases")))
}

/// Installs Cluster API's CRDs and waits until they serve. Idempotent: many
/// tests of a binary may call it at once (server-side apply of unchanged
/// CRDs changes nothing, so their generation and the manager's CRD migration
/// stay put).
pub async fn install_crds(client: &kube::Client) {
    apply_crds(client, crds()).await;
}

/// The Cluster API core manager, watching one namespace. Stopped, with its
/// process group, when dropped.
pub struct CapiManager {
    child: Child,
    dir: tempfile::TempDir,
}

impl CapiManager {
    /// Starts the manager against `plane` for `namespace` and waits until
    /// `/readyz` answers 200. The CRDs must be installed first (both
    /// Cluster API's and the infrastructure's).
    pub async fn start(plane: &ControlPlane, namespace: &str) -> CapiManager {
        CapiManager::spawn(plane, Some(namespace)).await
    }

    /// The manager for every namespace: its MachineSet controller deletes
    /// Machines only with a cache of all namespaces (with `--namespace` it
    /// fails to "cast TerraformMachine informer to SharedIndexInformer"), so
    /// a test that scales a MachineDeployment down runs in a test binary of
    /// its own.
    pub async fn start_for_all_namespaces(plane: &ControlPlane) -> CapiManager {
        CapiManager::spawn(plane, None).await
    }

    /// Started on free ports; started again on others when one was taken
    /// between its pick and the manager's bind (CI failed once so: "listen
    /// tcp :22320: bind: address already in use").
    async fn spawn(plane: &ControlPlane, namespace: Option<&str>) -> CapiManager {
        for _ in 0..2 {
            match CapiManager::spawn_once(plane, namespace).await {
                Ok(manager) => return manager,
                Err(log) if log.contains("address already in use") => continue,
                Err(log) => panic!("the Cluster API manager exited:\n{log}"),
            }
        }
        match CapiManager::spawn_once(plane, namespace).await {
            Ok(manager) => manager,
            Err(log) => panic!("the Cluster API manager exited:\n{log}"),
        }
    }

    async fn spawn_once(
        plane: &ControlPlane,
        namespace: Option<&str>,
    ) -> Result<CapiManager, String> {
        let binary = controlplane::bin_dir().join(format!("capi-manager-v{}", version()));
        assert!(
            binary.exists(),
            "{} is missing: run tests/controlplane/build.sh",
            binary.display()
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The webhook server always starts (readiness waits on it), so it
        // needs a serving pair, though nothing calls it.
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        let pair = rcgen::generate_simple_self_signed(["localhost".into(), "127.0.0.1".into()])
            .expect("a serving certificate");
        std::fs::write(certs.join("tls.crt"), pair.cert.pem()).unwrap();
        std::fs::write(certs.join("tls.key"), pair.signing_key.serialize_pem()).unwrap();
        let [health_port, webhook_port] = crate::controlplane::free_ports().expect("free ports");
        let log = std::fs::File::create(dir.path().join("capi-manager.log")).unwrap();
        let mut cmd = Command::new(&binary);
        cmd.arg(format!("--kubeconfig={}", plane.kubeconfig().display()));
        // The control plane is shared by the tests of a binary.
        if let Some(namespace) = namespace {
            cmd.arg(format!("--namespace={namespace}"));
        }
        cmd.arg(format!("--webhook-cert-dir={}", certs.display()))
            .arg(format!("--webhook-port={webhook_port}"))
            .arg(format!("--health-addr=127.0.0.1:{health_port}"))
            // "0" turns the metrics server off.
            .arg("--diagnostics-address=0")
            .arg("--feature-gates=MachinePool=true,ClusterTopology=false")
            .arg("--leader-elect=false")
            // Nothing of the test's environment (KUBECONFIG, proxies) steers it.
            .env_clear()
            .env("HOME", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child =
            spawn_owned(cmd).unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut manager = CapiManager { child, dir };
        manager.wait_ready(health_port).await?;
        Ok(manager)
    }

    /// Its log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("capi-manager.log")).unwrap_or_default()
    }

    /// Polls `probe` until it yields a value; after `secs`, panics naming
    /// `what` with the end of the manager's log.
    pub async fn within<T, F, Fut>(&self, secs: u64, what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {secs}s waiting for {what}\n--- capi-manager.log:\n{}",
                crate::scenario::tail(&self.log())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Until it is ready; its log when it exited first.
    async fn wait_ready(&mut self, health_port: u16) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{status}:\n{}", self.log()));
            }
            if http_status(health_port, "/readyz") == Some(200) {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "the Cluster API manager never became ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for CapiManager {
    /// SIGTERM to its process group, then SIGKILL after ten seconds. The
    /// group is signalled only while its leader is not reaped, so its id
    /// cannot have been reused.
    fn drop(&mut self) {
        // spawn_owned made the child the leader of its own group.
        let group = -(self.child.id() as i32);
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: signalling the group of a child we have not reaped.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above; the leader is still running.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
