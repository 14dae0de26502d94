//! The local pod executor: test support standing in for a kubelet.
//!
//! The test control plane has no scheduler and no kubelet. The executor
//! watches the Pods of CAPTF Jobs (`captf.io/managed=true`, in every
//! namespace or in one),
//! binds each new one to the node [`NODE`] (so that a deletion waits for its
//! grace period, as with a kubelet), lays out a root directory per pod,
//! `<dir>/<namespace>/<pod>/`, holding every volume at its mount path and the
//! image's paths (`captf/module`, `captf/runtime`, `captf/providers`), then
//! runs the init containers and the main container as local processes and
//! writes the pod's status as a kubelet would. The runner runs for real, with
//! `--root=<root>`, the real tofu, and a kubeconfig holding a token of the
//! pod's ServiceAccount, so the runner's RBAC is the real one. Container
//! paths in arguments and environment values (`HOME=/captf/work`) are taken
//! inside the root.
//!
//! Each process runs in its own process group, with a parent-death signal
//! and, where the kernel allows it, in a UTS namespace whose hostname is the
//! pod's, so that a state lock's `Who` names the pod as in a cluster.
//!
//! Images of a test registry are pulled by reference and unpacked
//! (`images.rs`); a contained executor ([`Executor::start_contained`]) runs
//! every pod of its namespace as in a container instead, chrooted, with a
//! network and a pod IP of its own (`contained.rs`): the manager's own
//! Deployment and the Jobs it starts once installed.
//!
//! Not modelled: `$(VAR)` expansion outside contained pods, subPath mounts, read-only mounts, more
//! than one main container, resource limits (see [`Executor::kill_oom`]),
//! liveness and non-HTTP probes, and the FallbackToLogsOnError message
//! policy (read as File).

mod contained;
mod env;
mod images;
mod process;
mod run;
mod status;
mod volumes;
mod watch;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use captf::error::{Categorized, Category, kube_category};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tokio::sync::Semaphore;
use tokio::sync::watch::{Receiver, Sender};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::controlplane::ControlPlane;

pub use images::{Image, Images, ModuleImage, TEST_RUNNER_IMAGE, test_module_image};
use process::kill_tree;
use status::Statuses;
use watch::watch_pods;

/// The node every pod is bound to.
pub const NODE: &str = "captf-executor";

const DIR_PREFIX: &str = "captf-executor-";
/// How long a token lasts unless its projection says; here, as both the
/// kubeconfig (env.rs) and projected volumes (volumes.rs) take it.
const TOKEN_SECONDS: i64 = 3600;
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Executor::stop`] waits for the pods' tasks to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A pod by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: String,
    name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The local pod executor. Dropping it stops every process and removes its
/// directory (kept when `CAPTF_KEEP_EXECUTOR` is set).
pub struct Executor {
    shared: Arc<Shared>,
    watcher: JoinHandle<()>,
    _dir: Option<tempfile::TempDir>,
}

struct Shared {
    client: kube::Client,
    images: Images,
    /// The one namespace watched, if not all.
    namespace: Option<String>,
    dir: PathBuf,
    server: String,
    /// The API server's CA, base64 as in a kubeconfig.
    ca_data: String,
    /// Pods seen, by UID.
    pods: Mutex<HashMap<String, Tracked>>,
    /// Pods whose removal waits for [`Executor::hold_terminating`].
    holds: Sender<HashSet<PodKey>>,
    runs: Mutex<Vec<PodKey>>,
    log: Mutex<Option<fs::File>>,
    /// True once the watch has listed the pods.
    synced: Sender<bool>,
    /// A slot per pod that may run at once (see [`Executor::limit_pods`]).
    slots: Arc<Semaphore>,
    /// Every pod of the namespace runs contained (`contained.rs`).
    contained: bool,
    /// The API server's port on `127.0.0.1`.
    api_port: u16,
}

struct Tracked {
    key: PodKey,
    updates: Sender<Option<Pod>>,
    task: JoinHandle<()>,
    /// The process of the running container.
    process: Option<u32>,
    oom_killed: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Executor {
    /// Starts watching the Pods of CAPTF Jobs in every namespace with
    /// `client` (an admin client of `plane`), and returns once the first list
    /// is in. Must be called on the runtime the client belongs to.
    pub async fn start(client: kube::Client, plane: &ControlPlane, images: Images) -> Executor {
        Executor::launch(client, plane, images, None, false).await
    }

    /// Like [`Executor::start`], for the pods of one namespace only. The
    /// tests of one binary run in parallel, each with an executor of its own:
    /// scoped to its namespace, no executor runs another test's pods.
    pub async fn start_in(
        client: kube::Client,
        plane: &ControlPlane,
        images: Images,
        namespace: &str,
    ) -> Executor {
        Executor::launch(client, plane, images, Some(namespace.to_string()), false).await
    }

    /// Runs every pod of `namespace`, each contained as in a container
    /// (`contained.rs`): its images pulled from the registry, its root its
    /// filesystem, a network and pod IP of its own, its containers
    /// restarted as its restart policy says and made ready by their
    /// readiness probes. The manager's own Deployment runs so.
    pub async fn start_contained(
        client: kube::Client,
        plane: &ControlPlane,
        images: Images,
        namespace: &str,
    ) -> Executor {
        Executor::launch(client, plane, images, Some(namespace.to_string()), true).await
    }

    async fn launch(
        client: kube::Client,
        plane: &ControlPlane,
        images: Images,
        namespace: Option<String>,
        contained: bool,
    ) -> Executor {
        let api_port = plane
            .server()
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("no port in {}", plane.server()));
        crate::controlplane::remove_stale_dirs(DIR_PREFIX, "CAPTF_KEEP_EXECUTOR");
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .unwrap_or_else(|e| panic!("creating the executor's directory: {e}"));
        let kubeconfig = kube::config::Kubeconfig::read_from(plane.kubeconfig())
            .unwrap_or_else(|e| panic!("reading {}: {e}", plane.kubeconfig().display()));
        let ca_data = kubeconfig
            .clusters
            .iter()
            .find_map(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
            .unwrap_or_else(|| panic!("{} has no CA", plane.kubeconfig().display()));
        let log = fs::File::create(dir.path().join("executor.log")).ok();
        let shared = Arc::new(Shared {
            client,
            images,
            namespace,
            dir: dir.path().to_path_buf(),
            server: plane.server().to_string(),
            ca_data,
            pods: Mutex::new(HashMap::new()),
            holds: Sender::new(HashSet::new()),
            runs: Mutex::new(Vec::new()),
            log: Mutex::new(log),
            synced: Sender::new(false),
            slots: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            contained,
            api_port,
        });
        if contained {
            register_node(&shared.client).await;
        }
        let mut synced = shared.synced.subscribe();
        let watcher = tokio::spawn(watch_pods(shared.clone()));
        // Not fatal: the watch retries, and its first list comes when it can.
        if tokio::time::timeout(SYNC_TIMEOUT, synced.wait_for(|s| *s))
            .await
            .is_err()
        {
            shared.log("the first list of pods is late; going on");
        }
        let dir = if std::env::var_os("CAPTF_KEEP_EXECUTOR").is_some() {
            eprintln!("keeping the executor's directory {}", dir.keep().display());
            None
        } else {
            Some(dir)
        };
        Executor {
            shared,
            watcher,
            _dir: dir,
        }
    }

    /// Runs at most `pods` pods at once, as a node of that capacity would:
    /// the others stay Pending, unbound, until one ends. Call it before any
    /// pod runs.
    pub fn limit_pods(&self, pods: usize) {
        self.shared
            .slots
            .forget_permits(Semaphore::MAX_PERMITS.saturating_sub(pods.max(1)));
    }

    /// The root of a pod: its volumes at their mount paths (but the copied
    /// runner, removed once the pod is over), its image's paths, and
    /// `<container>.log` for each container that ran.
    pub fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        self.shared.dir.join(namespace).join(pod)
    }

    /// What the executor did, one line per step (its `executor.log`).
    pub fn log(&self) -> String {
        fs::read_to_string(self.shared.dir.join("executor.log")).unwrap_or_default()
    }

    /// The pods whose first container started, as (namespace, name), in order.
    pub fn runs(&self) -> Vec<(String, String)> {
        lock(&self.shared.runs)
            .iter()
            .map(|k| (k.namespace.clone(), k.name.clone()))
            .collect()
    }

    /// Kills the running container of a pod and every process under it, as
    /// the kernel's OOM killer would kill a container at its memory limit:
    /// the container ends OOMKilled with exit code 137 and no termination
    /// message. False when no container of that pod is running.
    pub fn kill_oom(&self, namespace: &str, pod: &str) -> bool {
        let mut pods = lock(&self.shared.pods);
        let Some(tracked) = pods
            .values_mut()
            .find(|t| t.key.namespace == namespace && t.key.name == pod && t.process.is_some())
        else {
            return false;
        };
        tracked.oom_killed = true;
        if let Some(pid) = tracked.process {
            kill_tree(pid);
        }
        self.shared
            .log(&format!("{namespace}/{pod}: OOM-killed on request"));
        true
    }

    /// While held, a deleted pod is not removed: its processes are stopped
    /// and its final status written, but it stays terminating (with its
    /// deletionTimestamp) until released.
    pub fn hold_terminating(&self, namespace: &str, pod: &str, hold: bool) {
        let key = PodKey {
            namespace: namespace.to_string(),
            name: pod.to_string(),
        };
        self.shared.holds.send_modify(|holds| {
            if hold {
                holds.insert(key);
            } else {
                holds.remove(&key);
            }
        });
    }

    /// Stops watching, kills every process and waits (a while) for the
    /// pods' tasks to end. Idempotent.
    pub async fn stop(&self) {
        self.halt();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline
            && lock(&self.shared.pods)
                .values()
                .any(|t| !t.task.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops watching and kills every process, without waiting.
    fn halt(&self) {
        self.watcher.abort();
        let pods = lock(&self.shared.pods);
        for tracked in pods.values() {
            tracked.task.abort();
            if let Some(pid) = tracked.process {
                kill_tree(pid);
            }
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The Node [`NODE`], as a kubelet registers its own: the EndpointSlice
/// controller skips the pods of a node it cannot find.
async fn register_node(client: &kube::Client) {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": NODE },
        "spec": {},
    }))
    .unwrap_or_default();
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    match nodes.create(&kube::api::PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("registering the node {NODE}: {e}"),
    }
}

impl Shared {
    fn log(&self, line: &str) {
        use std::io::Write as _;
        if let Some(file) = lock(&self.log).as_mut() {
            let _ = writeln!(file, "{} {line}", Timestamp::now());
        }
    }

    fn set_process(&self, uid: &str, process: Option<u32>) {
        if let Some(tracked) = lock(&self.pods).get_mut(uid) {
            tracked.process = process;
        }
    }

    fn oom_killed(&self, uid: &str) -> bool {
        lock(&self.pods).get(uid).is_some_and(|t| t.oom_killed)
    }
}

/// The work on one pod. Here, not in run.rs, for each part to add its
/// methods: the run, its status, volumes, environment and token, processes.
struct PodRun {
    shared: Arc<Shared>,
    uid: String,
    key: PodKey,
    rx: Receiver<Option<Pod>>,
    holds: Receiver<HashSet<PodKey>>,
    api: Api<Pod>,
    root: PathBuf,
    statuses: Statuses,
    written: Option<Statuses>,
    start_time: Timestamp,
    /// A contained pod's network (`contained.rs`).
    network: Option<Arc<contained::Network>>,
    /// The main container's readiness, while a probe runs.
    readiness: Option<Receiver<bool>>,
}

/// Why a pod cannot run (yet).
#[derive(Debug, thiserror::Error)]
enum PodError {
    #[error("image {0:?} is not known to the local executor")]
    UnknownImage(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} has no key {key:?}")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("MountVolume.SetUp failed for volume {volume:?}: {source}")]
    Volume {
        volume: String,
        source: Box<PodError>,
    },
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Categorized for PodError {
    fn category(&self) -> Category {
        match self {
            PodError::UnknownImage(_) | PodError::Unsupported(_) => Category::Invalid,
            // A kubelet retries until the object or its key appears.
            PodError::NotFound { .. } | PodError::MissingKey { .. } => Category::Transient,
            PodError::Volume { source, .. } => source.category(),
            PodError::Api(e) => kube_category(e),
            PodError::Io { .. } => Category::Internal,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> PodError + '_ {
    move |source| PodError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_to_wait() {
        let cases = [
            (PodError::UnknownImage("x".into()), Category::Invalid),
            (PodError::Unsupported("x".into()), Category::Invalid),
            (
                PodError::NotFound {
                    kind: "secret",
                    name: "s".into(),
                },
                Category::Transient,
            ),
            (
                PodError::Volume {
                    volume: "config".into(),
                    source: Box::new(PodError::NotFound {
                        kind: "secret",
                        name: "s".into(),
                    }),
                },
                Category::Transient,
            ),
            (
                PodError::Io {
                    path: PathBuf::from("/x"),
                    source: std::io::Error::other("disk"),
                },
                Category::Internal,
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.category(), want, "{error}");
        }
        let mount = PodError::Volume {
            volume: "config".into(),
            source: Box::new(PodError::NotFound {
                kind: "secret",
                name: "late".into(),
            }),
        };
        assert_eq!(
            mount.to_string(),
            "MountVolume.SetUp failed for volume \"config\": secret \"late\" not found"
        );
    }
}
