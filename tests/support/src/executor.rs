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
//! Not modelled: `$(VAR)` expansion, subPath mounts, read-only mounts, more
//! than one main container, image entrypoints (a container needs a command),
//! resource limits (see [`Executor::kill_oom`]) and the
//! FallbackToLogsOnError message policy (read as File).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::ExitStatusExt;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use captf::error::{Categorized, Category, kube_category};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, DownwardAPIVolumeFile, KeyToPath, Pod, PodCondition,
    PodStatus, Secret, ServiceAccount, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::controlplane::ControlPlane;

/// The node every pod is bound to.
pub const NODE: &str = "captf-executor";
/// The runner image of the tests (the manager's `--runner-image`).
pub const TEST_RUNNER_IMAGE: &str = "captf.test/runner:dev";

const MANAGED_SELECTOR: &str = "captf.io/managed=true";
const DIR_PREFIX: &str = "captf-executor-";
/// What a kubelet keeps of a termination message.
const MESSAGE_LIMIT: usize = 4096;
const DEFAULT_GRACE_SECONDS: i64 = 30;
/// Kubelet's default mode for Secret, ConfigMap and projected files.
const DEFAULT_FILE_MODE: i32 = 0o644;
const RETRY: Duration = Duration::from_secs(1);
const TOKEN_SECONDS: i64 = 3600;
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Executor::stop`] waits for the pods' tasks to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The image reference of a test module under `tests/modules/<dir>`.
pub fn test_module_image(dir: &str) -> String {
    format!("captf.test/modules/{dir}:dev")
}

/// What a module image holds (reference §9.1), as local paths.
#[derive(Clone, Debug)]
pub struct ModuleImage {
    /// `/captf/module`.
    pub module: PathBuf,
    /// `/captf/runtime`: the built tofu.
    pub runtime: PathBuf,
    /// `/captf/providers`, when the image ships a provider mirror.
    pub providers: Option<PathBuf>,
    /// The image's ENV.
    pub env: Vec<(String, String)>,
}

/// A local stand-in for an image.
#[derive(Clone, Debug)]
pub enum Image {
    /// The runner image: the binary that is its `/runner`.
    Runner(PathBuf),
    Module(ModuleImage),
}

/// Image references and the local layouts they stand for.
#[derive(Clone, Debug, Default)]
pub struct Images {
    by_reference: HashMap<String, Image>,
}

impl Images {
    pub fn new() -> Images {
        Images::default()
    }

    pub fn with_runner(mut self, reference: &str, binary: PathBuf) -> Images {
        self.by_reference
            .insert(reference.to_string(), Image::Runner(binary));
        self
    }

    pub fn with_module(mut self, reference: &str, image: ModuleImage) -> Images {
        self.by_reference
            .insert(reference.to_string(), Image::Module(image));
        self
    }

    /// [`TEST_RUNNER_IMAGE`] as the runner built by cargo, and
    /// `captf.test/modules/<dir>:dev` for every directory of `tests/modules`,
    /// with the built tofu as its runtime.
    pub fn for_tests() -> Images {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let mut images = Images::new().with_runner(TEST_RUNNER_IMAGE, test_runner(&target));
        let modules = workspace.join("tests/modules");
        let tofu = crate::controlplane::binary("tofu");
        let entries =
            fs::read_dir(&modules).unwrap_or_else(|e| panic!("reading {}: {e}", modules.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(dir) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if path.is_dir() {
                let image = ModuleImage {
                    module: path,
                    runtime: tofu.clone(),
                    providers: None,
                    env: Vec::new(),
                };
                images = images.with_module(&test_module_image(&dir), image);
            }
        }
        images
    }

    /// The image a reference names: exactly, or without its digest, since the
    /// manager may pin one.
    pub fn get(&self, reference: &str) -> Option<&Image> {
        self.by_reference.get(reference).or_else(|| {
            let (name, _digest) = reference.split_once('@')?;
            self.by_reference.get(name)
        })
    }
}

/// The statically linked runner, unless it is missing or older than the one
/// of the plain debug build (which a test binary has just had cargo build).
fn test_runner(target: &Path) -> PathBuf {
    let static_runner = target.join("x86_64-unknown-linux-gnu/debug/captf-runner");
    let plain = target.join("debug/captf-runner");
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(&static_runner), modified(&plain)) {
        (Some(s), Some(p)) if s >= p => static_runner,
        (Some(_), None) => static_runner,
        _ => plain,
    }
}

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
    holds: watch::Sender<HashSet<PodKey>>,
    runs: Mutex<Vec<PodKey>>,
    log: Mutex<Option<fs::File>>,
    /// True once the watch has listed the pods.
    synced: watch::Sender<bool>,
}

struct Tracked {
    key: PodKey,
    updates: watch::Sender<Option<Pod>>,
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
        Executor::launch(client, plane, images, None).await
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
        Executor::launch(client, plane, images, Some(namespace.to_string())).await
    }

    async fn launch(
        client: kube::Client,
        plane: &ControlPlane,
        images: Images,
        namespace: Option<String>,
    ) -> Executor {
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
            holds: watch::Sender::new(HashSet::new()),
            runs: Mutex::new(Vec::new()),
            log: Mutex::new(log),
            synced: watch::Sender::new(false),
        });
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

async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<Pod> = match &shared.namespace {
        Some(namespace) => Api::namespaced(shared.client.clone(), namespace),
        None => Api::all(shared.client.clone()),
    };
    let config = watcher::Config::default().labels(MANAGED_SELECTOR);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // The UIDs listed since the watch (re)started: a pod deleted while the
    // watch was down is missing from the list and never reported deleted.
    let mut listed: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod)) => observe(&shared, pod),
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid {
                    forget(&shared, &uid);
                }
            }
            Ok(Event::Init) => listed = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Some(uid)) = (listed.as_mut(), pod.metadata.uid.clone()) {
                    listed.insert(uid);
                }
                observe(&shared, pod);
            }
            Ok(Event::InitDone) => {
                shared.synced.send_replace(true);
                if let Some(listed) = listed.take() {
                    let gone: Vec<String> = lock(&shared.pods)
                        .keys()
                        .filter(|uid| !listed.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        forget(&shared, &uid);
                    }
                }
            }
            Err(e) => shared.log(&format!("watching pods: {e}")),
        }
    }
}

fn observe(shared: &Arc<Shared>, pod: Pod) {
    let (Some(uid), Some(namespace), Some(name)) = (
        pod.metadata.uid.clone(),
        pod.metadata.namespace.clone(),
        pod.metadata.name.clone(),
    ) else {
        return;
    };
    let mut pods = lock(&shared.pods);
    if let Some(tracked) = pods.get(&uid) {
        tracked.updates.send_replace(Some(pod));
        return;
    }
    let key = PodKey { namespace, name };
    let (updates, rx) = watch::channel(Some(pod));
    let run = PodRun::new(shared.clone(), uid.clone(), key.clone(), rx);
    let task = tokio::spawn(run.run());
    pods.insert(
        uid,
        Tracked {
            key,
            updates,
            task,
            process: None,
            oom_killed: false,
        },
    );
}

/// The pod is gone from the API: its task kills what still runs.
fn forget(shared: &Shared, uid: &str) {
    if let Some(tracked) = lock(&shared.pods).remove(uid) {
        tracked.updates.send_replace(None);
    }
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

/// The state of one container, as its status shows it.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Termination),
}

#[derive(Clone, Debug, PartialEq)]
struct Termination {
    exit_code: i32,
    reason: String,
    message: Option<String>,
    signal: Option<i32>,
    started_at: Timestamp,
    finished_at: Timestamp,
}

fn waiting(reason: &str, message: Option<String>) -> State {
    State::Waiting {
        reason: reason.to_string(),
        message,
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Slot {
    name: String,
    image: String,
    state: State,
}

/// Every container's state, in the order of the pod's spec.
#[derive(Clone, Debug, PartialEq)]
struct Statuses {
    init: Vec<Slot>,
    main: Vec<Slot>,
}

impl Statuses {
    fn of(pod: &Pod) -> Statuses {
        let slots = |containers: &[Container], reason: &str| -> Vec<Slot> {
            containers
                .iter()
                .map(|c| Slot {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: waiting(reason, None),
                })
                .collect()
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let init = spec.init_containers.unwrap_or_default();
        let main_reason = if init.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        Statuses {
            init: slots(&init, "PodInitializing"),
            main: slots(&spec.containers, main_reason),
        }
    }

    /// Every container waits for the same reason.
    fn all_waiting(&mut self, reason: &str, message: &str) {
        for slot in self.init.iter_mut().chain(self.main.iter_mut()) {
            slot.state = waiting(reason, Some(message.to_string()));
        }
    }
}

/// The pod's phase from its containers' states, for restartPolicy Never.
fn phase(statuses: &Statuses) -> &'static str {
    let exit = |slot: &Slot| match &slot.state {
        State::Terminated(t) => Some(t.exit_code),
        _ => None,
    };
    if statuses
        .init
        .iter()
        .any(|s| exit(s).is_some_and(|code| code != 0))
    {
        return "Failed";
    }
    if statuses.init.iter().any(|s| exit(s).is_none()) {
        return "Pending";
    }
    if statuses
        .main
        .iter()
        .any(|s| matches!(s.state, State::Running { .. }))
    {
        return "Running";
    }
    let codes: Option<Vec<i32>> = statuses.main.iter().map(exit).collect();
    match codes {
        Some(codes) if !codes.is_empty() && codes.iter().all(|c| *c == 0) => "Succeeded",
        Some(codes) if !codes.is_empty() => "Failed",
        _ => "Pending",
    }
}

/// The pods/status a kubelet would write for these states.
fn pod_status(statuses: &Statuses, start_time: Timestamp, now: Timestamp) -> PodStatus {
    let container = |slot: &Slot| {
        let state = match &slot.state {
            State::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            State::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            State::Terminated(t) => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: t.exit_code,
                    reason: Some(t.reason.clone()),
                    message: t.message.clone(),
                    signal: t.signal,
                    started_at: Some(Time(t.started_at)),
                    finished_at: Some(Time(t.finished_at)),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        let running = matches!(slot.state, State::Running { .. });
        ContainerStatus {
            name: slot.name.clone(),
            image: slot.image.clone(),
            image_id: String::new(),
            ready: running,
            started: Some(running),
            restart_count: 0,
            state: Some(state),
            ..Default::default()
        }
    };
    let initialized = statuses
        .init
        .iter()
        .all(|s| matches!(&s.state, State::Terminated(t) if t.exit_code == 0));
    let ready = !statuses.main.is_empty()
        && statuses
            .main
            .iter()
            .all(|s| matches!(s.state, State::Running { .. }));
    let condition = |type_: &str, status: bool| PodCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    };
    PodStatus {
        phase: Some(phase(statuses).to_string()),
        start_time: Some(Time(start_time)),
        conditions: Some(vec![
            condition("PodScheduled", true),
            condition("Initialized", initialized),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ]),
        init_container_statuses: Some(statuses.init.iter().map(container).collect()),
        container_statuses: Some(statuses.main.iter().map(container).collect()),
        ..Default::default()
    }
}

/// How a container's process ended.
fn termination(
    status: ExitStatus,
    oom_killed: bool,
    message: Option<String>,
    started_at: Timestamp,
    finished_at: Timestamp,
) -> Termination {
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    let (exit_code, reason, message) = if oom_killed {
        // The OOM killer's SIGKILL; the process had no chance to write.
        (137, "OOMKilled", None)
    } else if exit_code == 0 {
        (0, "Completed", message)
    } else {
        (exit_code, "Error", message)
    };
    Termination {
        exit_code,
        reason: reason.to_string(),
        message,
        signal: if oom_killed {
            Some(libc::SIGKILL)
        } else {
            signal
        },
        started_at,
        finished_at,
    }
}

/// A termination message as a kubelet keeps it: at most 4096 bytes, cut on
/// a character boundary; none when empty.
fn termination_message(bytes: &[u8]) -> Option<String> {
    let cut = &bytes[..bytes.len().min(MESSAGE_LIMIT)];
    let cut = match std::str::from_utf8(cut) {
        // A character split by the limit is dropped, not replaced.
        Err(e) if e.error_len().is_none() => &cut[..e.valid_up_to()],
        _ => cut,
    };
    let message = String::from_utf8_lossy(cut).into_owned();
    (!message.is_empty()).then_some(message)
}

/// How long a terminating pod's processes get after SIGTERM.
fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(0)
}

/// A pod's hostname as a kubelet sets it: spec.hostname, else the pod's
/// name, at most 63 characters without a trailing `-` or `.`.
fn pod_hostname(pod: &Pod) -> String {
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_string()
}

/// A container path inside `root`; it must be absolute and plain.
fn in_root(root: &Path, container_path: &str) -> Result<PathBuf, PodError> {
    let path = Path::new(container_path);
    let mut out = root.to_path_buf();
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(PodError::Unsupported(format!(
            "path {container_path:?} is not absolute"
        )));
    }
    for component in components {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => {
                return Err(PodError::Unsupported(format!(
                    "path {container_path:?} leaves its root"
                )));
            }
        }
    }
    Ok(out)
}

/// A relative path of a volume item; it must stay inside the volume.
fn item_path(path: &str) -> Result<PathBuf, PodError> {
    let p = Path::new(path);
    if p.as_os_str().is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(PodError::Unsupported(format!(
            "volume item path {path:?} leaves its volume"
        )));
    }
    Ok(p.to_path_buf())
}

/// The data of a Secret or a ConfigMap, by key.
type Data = BTreeMap<String, Vec<u8>>;

/// One file of a Secret, ConfigMap or projected volume.
#[derive(Clone, Debug, PartialEq)]
struct VolumeFile {
    path: PathBuf,
    contents: Vec<u8>,
    mode: u32,
}

/// The files of an object's keys: every key, or the listed items. A listed
/// key that is missing is an error unless the source is optional.
fn key_files(
    kind: &'static str,
    name: &str,
    data: &Data,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
) -> Result<Vec<VolumeFile>, PodError> {
    let file = |path: &str, contents: &[u8], mode: Option<i32>| -> Result<VolumeFile, PodError> {
        Ok(VolumeFile {
            path: item_path(path)?,
            contents: contents.to_vec(),
            mode: (mode.unwrap_or(default_mode) & 0o7777) as u32,
        })
    };
    match items {
        None => data
            .iter()
            .map(|(key, value)| file(key, value, None))
            .collect(),
        Some(items) => {
            let mut files = Vec::new();
            for item in items {
                match data.get(&item.key) {
                    Some(value) => files.push(file(&item.path, value, item.mode)?),
                    None if optional => {}
                    None => {
                        return Err(PodError::MissingKey {
                            kind,
                            name: name.to_string(),
                            key: item.key.clone(),
                        });
                    }
                }
            }
            Ok(files)
        }
    }
}

/// The value of a downward API field a kubelet would resolve.
fn field_value(pod: &Pod, field_path: &str) -> Result<String, PodError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let value = match field_path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(map(&meta.labels)),
        "metadata.annotations" => Some(map(&meta.annotations)),
        "spec.nodeName" => Some(NODE.to_string()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        _ => {
            if let Some(key) = field_path
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.labels.as_ref().and_then(|l| l.get(key).cloned())
            } else if let Some(key) = field_path
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.annotations.as_ref().and_then(|a| a.get(key).cloned())
            } else {
                return Err(PodError::Unsupported(format!(
                    "the field {field_path:?} is not supported by the local executor"
                )));
            }
        }
    };
    Ok(value.unwrap_or_default())
}

/// A container's process environment as a container runtime builds it: the
/// image's ENV (over a PATH so that local-exec provisioners find their
/// programs), overridden by envFrom, overridden by env. A value naming a path
/// under one of the container's mounts is taken inside the root, as the
/// process sees the pod's files there.
fn merge_env(
    path: &str,
    image_env: &[(String, String)],
    env_from: &[(String, String)],
    env: &[(String, String)],
    root: &Path,
    mount_paths: &[String],
) -> BTreeMap<String, String> {
    let mut merged = BTreeMap::from([("PATH".to_string(), path.to_string())]);
    for (name, value) in image_env.iter().chain(env_from).chain(env) {
        merged.insert(name.clone(), value.clone());
    }
    for value in merged.values_mut() {
        let under_mount = mount_paths.iter().any(|m| {
            value == m
                || value
                    .strip_prefix(m.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        if under_mount && let Ok(local) = in_root(root, value) {
            *value = local.to_string_lossy().into_owned();
        }
    }
    merged
}

/// The envFrom entries of one object: its keys, prefixed, except those that
/// cannot be a variable's name.
fn prefixed(data: &Data, prefix: &str) -> Vec<(String, String)> {
    data.iter()
        .filter(|(key, _)| !key.is_empty() && !key.contains('='))
        .map(|(key, value)| {
            (
                format!("{prefix}{key}"),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect()
}

const IN_CLUSTER: &str = "--backend-config=in_cluster_config=true";

/// The host command line of a container. The runner image's `/runner` is its
/// binary; a program found in the root runs from there, any other from the
/// host. The runner's `run` gets `--root=<root>` and the kubeconfig in place
/// of the in-cluster configuration; for any other program, an absolute
/// argument whose path (or its parent) is in the root is taken inside it.
fn host_argv(
    image: &Image,
    command: &[String],
    args: &[String],
    root: &Path,
    kubeconfig: &Path,
    root_has: &dyn Fn(&Path) -> bool,
) -> Result<Vec<String>, PodError> {
    let argv: Vec<&String> = command.iter().chain(args).collect();
    let Some((program, rest)) = argv.split_first() else {
        return Err(PodError::Unsupported(
            "the container has no command (the local executor knows no image entrypoints)".into(),
        ));
    };
    let local = |arg: &str| -> Option<PathBuf> {
        let path = in_root(root, arg).ok()?;
        (root_has(&path) || path.parent().is_some_and(|p| p != root && root_has(p))).then_some(path)
    };
    let host_program = match image {
        Image::Runner(binary) if program.as_str() == "/runner" => binary.clone(),
        _ => local(program).unwrap_or_else(|| PathBuf::from(program.as_str())),
    };
    let mut out = vec![host_program.to_string_lossy().into_owned()];
    let runner_run = Path::new(program.as_str())
        .file_name()
        .is_some_and(|n| n == "runner")
        && rest.first().is_some_and(|a| a.as_str() == "run");
    if runner_run {
        out.push("run".into());
        out.push(format!("--root={}", root.display()));
        out.extend(rest[1..].iter().map(|arg| {
            if arg.as_str() == IN_CLUSTER {
                format!("--backend-config=config_path={}", kubeconfig.display())
            } else {
                arg.to_string()
            }
        }));
    } else {
        out.extend(rest.iter().map(|arg| match local(arg) {
            Some(path) => path.to_string_lossy().into_owned(),
            None => arg.to_string(),
        }));
    }
    Ok(out)
}

fn kubeconfig_yaml(server: &str, ca_data: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: captf-test
  cluster:
    server: {server}
    certificate-authority-data: {ca_data}
users:
- name: pod
  user:
    token: {token}
contexts:
- name: pod
  context:
    cluster: captf-test
    user: pod
current-context: pod
"
    )
}

/// The processes below `root`, from (pid, parent pid) pairs.
fn descendants(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in parents {
            if ppid == parent && pid != root && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Every (pid, parent pid) of the machine.
fn process_table() -> Vec<(u32, u32)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold anything but ends at
            // the last parenthesis.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// SIGKILL to a process, its process group and everything below it, found
/// before anything dies so that no child escapes by being reparented.
fn kill_tree(pid: u32) {
    let below = descendants(pid, &process_table());
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    // SAFETY: signals to processes this executor started and their children.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
        for child in below {
            if let Ok(child) = i32::try_from(child) {
                libc::kill(child, libc::SIGKILL);
            }
        }
    }
}

/// SIGKILL to a process group, which the kernel keeps from reuse while it
/// has members.
fn kill_group(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        // SAFETY: a signal to the process group of a process this executor started.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

fn signal(pid: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: a signal to a process this executor started.
        unsafe { libc::kill(pid, signal) };
    }
}

/// The identity maps of a user namespace that keeps the caller's IDs: what
/// an unprivileged process needs before it may set its own hostname.
struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

impl IdMaps {
    fn of_caller() -> IdMaps {
        // SAFETY: getters without side effects.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        IdMaps {
            uid_map: format!("{uid} {uid} 1").into_bytes(),
            gid_map: format!("{gid} {gid} 1").into_bytes(),
        }
    }

    /// Only async-signal-safe calls: this runs between fork and exec.
    fn write(&self) -> bool {
        let put = |path: &std::ffi::CStr, contents: &[u8]| -> bool {
            // SAFETY: open, write and close of a NUL-terminated path.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return false;
                }
                let written = libc::write(fd, contents.as_ptr().cast(), contents.len());
                libc::close(fd);
                written == contents.len() as isize
            }
        };
        put(c"/proc/self/setgroups", b"deny")
            && put(c"/proc/self/uid_map", &self.uid_map)
            && put(c"/proc/self/gid_map", &self.gid_map)
    }
}

/// A process that dies with its parent, leads its own process group (so
/// that a kill reaches all it started) and, where the kernel allows it, has
/// the pod's hostname.
fn own_process(cmd: &mut tokio::process::Command, hostname: &str) {
    let name = hostname.as_bytes().to_vec();
    let maps = IdMaps::of_caller();
    // SAFETY: geteuid has no side effects.
    let root = unsafe { libc::geteuid() } == 0;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::setpgid(0, 0);
            let uts = if root {
                libc::unshare(libc::CLONE_NEWUTS) == 0
            } else if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWUTS) == 0 {
                // In a user namespace without maps the process could not
                // write a file: better not to start.
                if !maps.write() {
                    return Err(std::io::Error::last_os_error());
                }
                true
            } else {
                false
            };
            if uts {
                libc::sethostname(name.as_ptr().cast(), name.len());
            }
            Ok(())
        });
    }
}

/// One container, ready to start.
struct Process {
    container: String,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: PathBuf,
    message_path: PathBuf,
}

/// How a container run ended.
enum Exit {
    /// The pod is gone from the API.
    Gone,
    Done(Termination),
}

/// How the work on a pod ended.
enum Ending {
    Gone,
    /// Its status is final (or it can never start): remove it once deleted.
    Settled,
}

struct PodRun {
    shared: Arc<Shared>,
    uid: String,
    key: PodKey,
    rx: watch::Receiver<Option<Pod>>,
    holds: watch::Receiver<HashSet<PodKey>>,
    api: Api<Pod>,
    root: PathBuf,
    statuses: Statuses,
    written: Option<Statuses>,
    start_time: Timestamp,
}

impl PodRun {
    fn new(
        shared: Arc<Shared>,
        uid: String,
        key: PodKey,
        rx: watch::Receiver<Option<Pod>>,
    ) -> PodRun {
        let api = Api::namespaced(shared.client.clone(), &key.namespace);
        let root = shared.dir.join(&key.namespace).join(&key.name);
        let holds = shared.holds.subscribe();
        let statuses = rx.borrow().as_ref().map(Statuses::of).unwrap_or(Statuses {
            init: Vec::new(),
            main: Vec::new(),
        });
        PodRun {
            shared,
            uid,
            key,
            rx,
            holds,
            api,
            root,
            statuses,
            written: None,
            start_time: Timestamp::now(),
        }
    }

    fn log(&self, line: &str) {
        self.shared.log(&format!("{}: {line}", self.key));
    }

    fn current(&self) -> Option<Pod> {
        self.rx.borrow().clone()
    }

    async fn run(mut self) {
        let Some(pod) = self.current() else {
            return;
        };
        let spec = pod.spec.as_ref();
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        // Bound by another executor (or a previous one), or already over.
        if spec.and_then(|s| s.node_name.as_ref()).is_some() || finished {
            return;
        }
        if !self.bind().await {
            return;
        }
        let ending = self.execute(&pod).await;
        // The copied runner is most of a pod's root (150 MB in a debug
        // build) and of no use once the pod's containers are over.
        let _ = fs::remove_file(self.root.join("captf/bin/runner"));
        if let Ending::Settled = ending {
            self.remove_when_deleted().await;
        }
    }

    /// Binds the pod to [`NODE`]; false when it is gone or another executor
    /// bound it first.
    async fn bind(&mut self) -> bool {
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": self.key.name, "uid": self.uid },
            "target": { "apiVersion": "v1", "kind": "Node", "name": NODE },
        });
        loop {
            let result: Result<serde_json::Value, kube::Error> = self
                .api
                .create_subresource("binding", &self.key.name, &PostParams::default(), &binding)
                .await;
            match result {
                Ok(_) => {
                    self.log(&format!("bound to {NODE}"));
                    return true;
                }
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                    self.log(&format!("not bound: {}", status.message));
                    return false;
                }
                Err(e) => {
                    self.log(&format!("binding: {e}; retrying"));
                    if self.pause(RETRY).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Waits a while or until the pod changes; true when it is gone or
    /// being deleted.
    async fn pause(&mut self, duration: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = self.rx.changed() => {}
        }
        self.rx
            .borrow()
            .as_ref()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    }

    async fn execute(&mut self, pod: &Pod) -> Ending {
        let spec = pod.spec.clone().unwrap_or_default();
        if spec.containers.len() != 1 {
            let message = format!(
                "the local executor runs pods with one container, not {}",
                spec.containers.len()
            );
            self.statuses
                .all_waiting("CreateContainerConfigError", &message);
            self.write_status().await;
            return Ending::Settled;
        }
        if self.pull_images().await.is_err() {
            return Ending::Settled;
        }
        self.write_status().await;
        let processes = loop {
            let latest = match self.current() {
                Some(pod) if pod.metadata.deletion_timestamp.is_none() => pod,
                Some(_) => return Ending::Settled,
                None => return Ending::Gone,
            };
            match self.prepare(&latest).await {
                Ok(processes) => break processes,
                Err((reason, error)) => {
                    self.log(&format!("cannot start yet ({reason}): {error}"));
                    self.statuses.all_waiting(reason, &error.to_string());
                    self.write_status().await;
                    if error.category() != Category::Transient || self.pause(RETRY).await {
                        return Ending::Settled;
                    }
                }
            }
        };
        let (init, main) = processes;
        for (index, process) in init.iter().enumerate() {
            self.statuses.init[index].state = State::Running {
                started_at: Timestamp::now(),
            };
            self.write_status().await;
            match self.run_process(process).await {
                Exit::Gone => return Ending::Gone,
                Exit::Done(termination) => {
                    let failed = termination.exit_code != 0;
                    self.statuses.init[index].state = State::Terminated(termination);
                    if failed {
                        self.write_status().await;
                        return Ending::Settled;
                    }
                }
            }
        }
        let deleting = self
            .current()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        if deleting {
            // A kubelet starts no container of a terminating pod.
            self.write_status().await;
            return Ending::Settled;
        }
        self.statuses.main[0].state = State::Running {
            started_at: Timestamp::now(),
        };
        self.write_status().await;
        match self.run_process(&main).await {
            Exit::Gone => Ending::Gone,
            Exit::Done(termination) => {
                self.statuses.main[0].state = State::Terminated(termination);
                self.write_status().await;
                Ending::Settled
            }
        }
    }

    /// Every image must be known, as every image must be pulled.
    async fn pull_images(&mut self) -> Result<(), ()> {
        let mut unknown = false;
        for slot in self
            .statuses
            .init
            .iter_mut()
            .chain(self.statuses.main.iter_mut())
        {
            if self.shared.images.get(&slot.image).is_none() {
                let error = PodError::UnknownImage(slot.image.clone());
                slot.state = waiting("ErrImagePull", Some(error.to_string()));
                unknown = true;
            }
        }
        if unknown {
            self.log("an image is unknown: ErrImagePull");
            self.write_status().await;
            return Err(());
        }
        Ok(())
    }

    async fn write_status(&mut self) {
        if self.written.as_ref() == Some(&self.statuses) {
            return;
        }
        let status = pod_status(&self.statuses, self.start_time, Timestamp::now());
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        for _ in 0..5 {
            match self
                .api
                .patch_status(&self.key.name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {
                    self.log(&format!("status: {}", phase(&self.statuses)));
                    self.written = Some(self.statuses.clone());
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return,
                Err(e) => {
                    self.log(&format!("writing the status: {e}"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Lays out the root and resolves each container's command and
    /// environment. The error comes with the waiting reason it shows as.
    async fn prepare(
        &self,
        pod: &Pod,
    ) -> Result<(Vec<Process>, Process), (&'static str, PodError)> {
        let mounting = |e| ("ContainerCreating", e);
        self.lay_out(pod).await.map_err(mounting)?;
        let spec = pod.spec.clone().unwrap_or_default();
        let kubeconfig = self.root.join("kubeconfig");
        let mut token_written = false;
        let mut objects = Objects::new(&self.shared.client, &self.key.namespace);
        let mut resolve =
            async |container: &Container| -> Result<Process, (&'static str, PodError)> {
                let config = |e| ("CreateContainerConfigError", e);
                let reference = container.image.clone().unwrap_or_default();
                let image = self
                    .shared
                    .images
                    .get(&reference)
                    .ok_or_else(|| config(PodError::UnknownImage(reference.clone())))?;
                let root_has = |p: &Path| p.exists();
                let argv = host_argv(
                    image,
                    container.command.as_deref().unwrap_or_default(),
                    container.args.as_deref().unwrap_or_default(),
                    &self.root,
                    &kubeconfig,
                    &root_has,
                )
                .map_err(config)?;
                let wants_kubeconfig = argv
                    .iter()
                    .any(|a| a.starts_with("--backend-config=config_path="));
                if wants_kubeconfig && !token_written {
                    let token = self
                        .token(pod, None, TOKEN_SECONDS)
                        .await
                        .map_err(mounting)?;
                    write_file(
                        &kubeconfig,
                        kubeconfig_yaml(&self.shared.server, &self.shared.ca_data, &token)
                            .as_bytes(),
                        0o600,
                    )
                    .map_err(mounting)?;
                    token_written = true;
                }
                let image_env = match image {
                    Image::Module(module) => module.env.clone(),
                    Image::Runner(_) => Vec::new(),
                };
                let (env_from, env) = self
                    .container_env(pod, container, &mut objects)
                    .await
                    .map_err(config)?;
                let mount_paths: Vec<String> = container
                    .volume_mounts
                    .iter()
                    .flatten()
                    .map(|m| m.mount_path.trim_end_matches('/').to_string())
                    .collect();
                let path =
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
                let cwd = match &container.working_dir {
                    Some(dir) => in_root(&self.root, dir).map_err(config)?,
                    None => self.root.clone(),
                };
                fs::create_dir_all(&cwd)
                    .map_err(io_error(&cwd))
                    .map_err(config)?;
                let message_path = container
                    .termination_message_path
                    .as_deref()
                    .unwrap_or("/dev/termination-log");
                Ok(Process {
                    container: container.name.clone(),
                    argv,
                    env: merge_env(&path, &image_env, &env_from, &env, &self.root, &mount_paths),
                    cwd,
                    message_path: in_root(&self.root, message_path).map_err(config)?,
                })
            };
        let mut init = Vec::new();
        for container in spec.init_containers.iter().flatten() {
            init.push(resolve(container).await?);
        }
        let main = match spec.containers.first() {
            Some(container) => resolve(container).await?,
            None => {
                return Err((
                    "CreateContainerConfigError",
                    PodError::Unsupported("the pod has no container".into()),
                ));
            }
        };
        Ok((init, main))
    }

    /// A fresh root: every volume at its mount path (or under `.volumes`
    /// when no container mounts it), the image's paths, and `dev/`.
    async fn lay_out(&self, pod: &Pod) -> Result<(), PodError> {
        let root = &self.root;
        match fs::remove_dir_all(root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(root)(e)),
            _ => {}
        }
        let dev = root.join("dev");
        fs::create_dir_all(&dev).map_err(io_error(&dev))?;
        let spec = pod.spec.clone().unwrap_or_default();
        let containers: Vec<&Container> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .collect();
        let mut objects = Objects::new(&self.shared.client, &self.key.namespace);
        for volume in spec.volumes.iter().flatten() {
            let mut paths = Vec::new();
            for mount in containers
                .iter()
                .flat_map(|c| c.volume_mounts.iter().flatten())
            {
                if mount.name != volume.name {
                    continue;
                }
                if mount.sub_path.as_deref().is_some_and(|s| !s.is_empty())
                    || mount
                        .sub_path_expr
                        .as_deref()
                        .is_some_and(|s| !s.is_empty())
                {
                    return Err(PodError::Unsupported(format!(
                        "volume {:?}: subPath mounts are not supported by the local executor",
                        volume.name
                    )));
                }
                let path = in_root(root, &mount.mount_path)?;
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
            // A volume no container mounts still has to be set up: a kubelet
            // waits for its Secret all the same.
            let dir = paths
                .first()
                .cloned()
                .unwrap_or_else(|| root.join(".volumes").join(&volume.name));
            self.fill_volume(pod, volume, &dir, &mut objects)
                .await
                .map_err(|e| PodError::Volume {
                    volume: volume.name.clone(),
                    source: Box::new(e),
                })?;
            for other in paths.iter().skip(1) {
                link(&dir, other)?;
            }
        }
        for container in &containers {
            let reference = container.image.clone().unwrap_or_default();
            if let Some(Image::Module(image)) = self.shared.images.get(&reference) {
                link(&image.module, &root.join("captf/module"))?;
                link(&image.runtime, &root.join("captf/runtime"))?;
                if let Some(providers) = &image.providers {
                    link(providers, &root.join("captf/providers"))?;
                }
            }
        }
        Ok(())
    }

    async fn fill_volume(
        &self,
        pod: &Pod,
        volume: &Volume,
        dir: &Path,
        objects: &mut Objects,
    ) -> Result<(), PodError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut files = Vec::new();
        if volume.empty_dir.is_some() {
            // An empty directory is all there is.
        } else if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let optional = source.optional.unwrap_or(false);
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            if let Some(data) = objects.secret(&name, optional).await? {
                files = key_files(
                    "secret",
                    &name,
                    &data,
                    source.items.as_deref(),
                    mode,
                    optional,
                )?;
            }
        } else if let Some(source) = &volume.config_map {
            let optional = source.optional.unwrap_or(false);
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            if let Some(data) = objects.config_map(&source.name, optional).await? {
                files = key_files(
                    "configmap",
                    &source.name,
                    &data,
                    source.items.as_deref(),
                    mode,
                    optional,
                )?;
            }
        } else if let Some(source) = &volume.downward_api {
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            files = downward_files(pod, source.items.as_deref().unwrap_or_default(), mode)?;
        } else if let Some(projected) = &volume.projected {
            let mode = projected.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            for source in projected.sources.iter().flatten() {
                if let Some(secret) = &source.secret {
                    let optional = secret.optional.unwrap_or(false);
                    if let Some(data) = objects.secret(&secret.name, optional).await? {
                        files.extend(key_files(
                            "secret",
                            &secret.name,
                            &data,
                            secret.items.as_deref(),
                            mode,
                            optional,
                        )?);
                    }
                } else if let Some(map) = &source.config_map {
                    let optional = map.optional.unwrap_or(false);
                    if let Some(data) = objects.config_map(&map.name, optional).await? {
                        files.extend(key_files(
                            "configmap",
                            &map.name,
                            &data,
                            map.items.as_deref(),
                            mode,
                            optional,
                        )?);
                    }
                } else if let Some(downward) = &source.downward_api {
                    files.extend(downward_files(
                        pod,
                        downward.items.as_deref().unwrap_or_default(),
                        mode,
                    )?);
                } else if let Some(token) = &source.service_account_token {
                    let seconds = token.expiration_seconds.unwrap_or(TOKEN_SECONDS);
                    let value = self.token(pod, token.audience.clone(), seconds).await?;
                    files.push(VolumeFile {
                        path: item_path(&token.path)?,
                        contents: value.into_bytes(),
                        mode: (mode & 0o7777) as u32,
                    });
                } else {
                    return Err(PodError::Unsupported(format!(
                        "volume {:?}: a projected source the local executor does not support",
                        volume.name
                    )));
                }
            }
        } else {
            return Err(PodError::Unsupported(format!(
                "volume {:?}: the local executor supports emptyDir, secret, configMap, downwardAPI and projected volumes",
                volume.name
            )));
        }
        for file in files {
            write_file(&dir.join(&file.path), &file.contents, file.mode)?;
        }
        Ok(())
    }

    /// A token of the pod's ServiceAccount, bound to the pod as a kubelet's.
    async fn token(
        &self,
        pod: &Pod,
        audience: Option<String>,
        seconds: i64,
    ) -> Result<String, PodError> {
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience.map(|a| vec![a]),
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.key.name.clone()),
                    uid: Some(self.uid.clone()),
                }),
            }),
            ..Default::default()
        };
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.shared.client.clone(), &self.key.namespace);
        let answer = accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) if status.code == 404 => PodError::NotFound {
                    kind: "serviceaccount",
                    name: account.clone(),
                },
                other => PodError::Api(other),
            })?;
        answer.status.and_then(|s| s.token).ok_or_else(|| {
            PodError::Unsupported("the TokenRequest came back without a token".into())
        })
    }

    /// The entries of envFrom and of env, resolved.
    async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        objects: &mut Objects,
    ) -> Result<(Vec<(String, String)>, Vec<(String, String)>), PodError> {
        let mut env_from = Vec::new();
        for source in container.env_from.iter().flatten() {
            let prefix = source.prefix.clone().unwrap_or_default();
            let data = if let Some(secret) = &source.secret_ref {
                objects
                    .secret(&secret.name, secret.optional.unwrap_or(false))
                    .await?
            } else if let Some(map) = &source.config_map_ref {
                objects
                    .config_map(&map.name, map.optional.unwrap_or(false))
                    .await?
            } else {
                None
            };
            if let Some(data) = data {
                env_from.extend(prefixed(&data, &prefix));
            }
        }
        let mut env = Vec::new();
        for var in container.env.iter().flatten() {
            let Some(from) = &var.value_from else {
                env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
                continue;
            };
            let (kind, name, key, optional, data) = if let Some(r) = &from.secret_key_ref {
                let optional = r.optional.unwrap_or(false);
                (
                    "secret",
                    &r.name,
                    &r.key,
                    optional,
                    objects.secret(&r.name, optional).await?,
                )
            } else if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional.unwrap_or(false);
                (
                    "configmap",
                    &r.name,
                    &r.key,
                    optional,
                    objects.config_map(&r.name, optional).await?,
                )
            } else if let Some(field) = &from.field_ref {
                env.push((var.name.clone(), field_value(pod, &field.field_path)?));
                continue;
            } else {
                return Err(PodError::Unsupported(format!(
                    "env {:?}: only value, secretKeyRef, configMapKeyRef and fieldRef are supported",
                    var.name
                )));
            };
            match data.as_ref().and_then(|d| d.get(key.as_str())) {
                Some(value) => env.push((
                    var.name.clone(),
                    String::from_utf8_lossy(value).into_owned(),
                )),
                None if optional => {}
                None => {
                    return Err(PodError::MissingKey {
                        kind,
                        name: name.clone(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok((env_from, env))
    }

    /// Runs one container's process to its end, stopping it as a kubelet
    /// would when the pod is deleted.
    async fn run_process(&mut self, process: &Process) -> Exit {
        let started_at = Timestamp::now();
        let fail_start = |message: String| {
            Exit::Done(Termination {
                exit_code: 128,
                reason: "StartError".into(),
                message: Some(message),
                signal: None,
                started_at,
                finished_at: Timestamp::now(),
            })
        };
        let log_path = self.root.join(format!("{}.log", process.container));
        let (stdout, stderr) =
            match fs::File::create(&log_path).and_then(|f| Ok((f.try_clone()?, f))) {
                Ok(files) => files,
                Err(e) => return fail_start(format!("{}: {e}", log_path.display())),
            };
        match fs::remove_file(&process.message_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return fail_start(format!("{}: {e}", process.message_path.display()));
            }
            _ => {}
        }
        let Some((program, args)) = process.argv.split_first() else {
            return fail_start("no command".into());
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(&process.env)
            .current_dir(&process.cwd)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        let hostname = self.current().map(|p| pod_hostname(&p)).unwrap_or_default();
        own_process(&mut cmd, &hostname);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                self.log(&format!(
                    "container {} did not start: {e}",
                    process.container
                ));
                return fail_start(format!("starting {program}: {e}"));
            }
        };
        let Some(pid) = child.id() else {
            return fail_start("the process vanished at start".into());
        };
        self.shared.set_process(&self.uid, Some(pid));
        {
            let mut runs = lock(&self.shared.runs);
            if !runs.contains(&self.key) {
                runs.push(self.key.clone());
            }
        }
        self.log(&format!(
            "container {} started (pid {pid}): {}",
            process.container,
            process.argv.join(" ")
        ));
        let mut terminating: Option<Instant> = None;
        let mut killed = false;
        let status = loop {
            let pod = self.rx.borrow_and_update().clone();
            let Some(pod) = pod else {
                kill_tree(pid);
                let _ = child.wait().await;
                self.shared.set_process(&self.uid, None);
                self.log(&format!(
                    "container {} killed: the pod is gone",
                    process.container
                ));
                return Exit::Gone;
            };
            if pod.metadata.deletion_timestamp.is_some() && terminating.is_none() {
                self.log(&format!(
                    "container {}: SIGTERM, grace {}s",
                    process.container,
                    grace_seconds(&pod)
                ));
                signal(pid, libc::SIGTERM);
                terminating = Some(Instant::now());
            }
            // The grace period may shrink with a second deletion.
            let deadline =
                terminating.map(|t| t + Duration::from_secs(grace_seconds(&pod).unsigned_abs()));
            tokio::select! {
                status = child.wait() => break status,
                _ = self.rx.changed() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() && !killed => {
                    self.log(&format!("container {}: grace period over, SIGKILL", process.container));
                    kill_tree(pid);
                    killed = true;
                }
            }
        };
        // As when a container's first process ends: nothing of it survives.
        // Only the group: the process is reaped, so its pid may be reused.
        kill_group(pid);
        self.shared.set_process(&self.uid, None);
        let finished_at = Timestamp::now();
        let termination = match status {
            Ok(status) => {
                let oom_killed = self.shared.oom_killed(&self.uid);
                let message = fs::read(&process.message_path)
                    .ok()
                    .and_then(|bytes| termination_message(&bytes));
                termination(status, oom_killed, message, started_at, finished_at)
            }
            Err(e) => Termination {
                exit_code: 128,
                reason: "Error".into(),
                message: Some(format!("waiting for the process: {e}")),
                signal: None,
                started_at,
                finished_at,
            },
        };
        self.log(&format!(
            "container {} ended: exit {} ({})",
            process.container, termination.exit_code, termination.reason
        ));
        Exit::Done(termination)
    }

    /// Once the pod is deleted (and not held), removes it at once, as a
    /// kubelet does when its containers are gone.
    async fn remove_when_deleted(&mut self) {
        loop {
            let pod = self.rx.borrow_and_update().clone();
            let Some(pod) = pod else {
                return;
            };
            let held = self.holds.borrow_and_update().contains(&self.key);
            if pod.metadata.deletion_timestamp.is_some() && !held {
                let params = DeleteParams::default()
                    .grace_period(0)
                    .preconditions(Preconditions {
                        uid: Some(self.uid.clone()),
                        resource_version: None,
                    });
                match self.api.delete(&self.key.name, &params).await {
                    Ok(_) => {
                        self.log("removed");
                        return;
                    }
                    Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => return,
                    Err(e) => {
                        self.log(&format!("removing: {e}; retrying"));
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            tokio::select! {
                changed = self.rx.changed() => if changed.is_err() { return },
                _ = self.holds.changed() => {}
            }
        }
    }
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
) -> Result<Vec<VolumeFile>, PodError> {
    items
        .iter()
        .map(|item| {
            let Some(field) = &item.field_ref else {
                return Err(PodError::Unsupported(format!(
                    "downward API item {:?}: only fieldRef is supported",
                    item.path
                )));
            };
            Ok(VolumeFile {
                path: item_path(&item.path)?,
                contents: field_value(pod, &field.field_path)?.into_bytes(),
                mode: (item.mode.unwrap_or(default_mode) & 0o7777) as u32,
            })
        })
        .collect()
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), PodError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    fs::write(path, contents).map_err(io_error(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_error(path))
}

/// `link` names `target` (replacing what was there).
fn link(target: &Path, link: &Path) -> Result<(), PodError> {
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    match fs::remove_file(link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(link)(e)),
        _ => {}
    }
    symlink(target, link).map_err(io_error(link))
}

/// The Secrets and ConfigMaps one preparation reads, each read once.
struct Objects {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    cache: HashMap<(&'static str, String), Option<Data>>,
}

impl Objects {
    fn new(client: &kube::Client, namespace: &str) -> Objects {
        Objects {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            cache: HashMap::new(),
        }
    }

    /// A Secret's data; None when it is missing and optional.
    async fn secret(&mut self, name: &str, optional: bool) -> Result<Option<Data>, PodError> {
        let key = ("secret", name.to_string());
        if !self.cache.contains_key(&key) {
            let data = self.secrets.get_opt(name).await?.map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect()
            });
            self.cache.insert(key.clone(), data);
        }
        Self::found(
            self.cache.get(&key).cloned().flatten(),
            "secret",
            name,
            optional,
        )
    }

    /// A ConfigMap's data and binaryData; None when it is missing and
    /// optional.
    async fn config_map(&mut self, name: &str, optional: bool) -> Result<Option<Data>, PodError> {
        let key = ("configmap", name.to_string());
        if !self.cache.contains_key(&key) {
            let data = self.config_maps.get_opt(name).await?.map(|m| {
                let text = m
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()));
                let binary = m
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0));
                text.chain(binary).collect()
            });
            self.cache.insert(key.clone(), data);
        }
        Self::found(
            self.cache.get(&key).cloned().flatten(),
            "configmap",
            name,
            optional,
        )
    }

    fn found(
        data: Option<Data>,
        kind: &'static str,
        name: &str,
        optional: bool,
    ) -> Result<Option<Data>, PodError> {
        match data {
            Some(data) => Ok(Some(data)),
            None if optional => Ok(None),
            None => Err(PodError::NotFound {
                kind,
                name: name.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn slot(name: &str, state: State) -> Slot {
        Slot {
            name: name.into(),
            image: "img".into(),
            state,
        }
    }

    fn done(exit_code: i32) -> State {
        State::Terminated(Termination {
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            signal: None,
            started_at: at(1),
            finished_at: at(2),
        })
    }

    fn running() -> State {
        State::Running { started_at: at(1) }
    }

    fn pending() -> State {
        waiting("PodInitializing", None)
    }

    #[test]
    fn images_are_found_by_reference_with_or_without_a_digest() {
        let images = Images::new()
            .with_runner("r:dev", PathBuf::from("/bin/runner"))
            .with_module(
                "m:dev",
                ModuleImage {
                    module: PathBuf::from("/m"),
                    runtime: PathBuf::from("/tofu"),
                    providers: None,
                    env: Vec::new(),
                },
            );
        let cases: &[(&str, Option<&str>)] = &[
            ("r:dev", Some("runner")),
            ("m:dev", Some("module")),
            ("m:dev@sha256:0123", Some("module")),
            ("m:other", None),
            ("x@sha256:0123", None),
        ];
        for (reference, want) in cases {
            let got = images.get(reference).map(|i| match i {
                Image::Runner(_) => "runner",
                Image::Module(_) => "module",
            });
            assert_eq!(got, *want, "{reference}");
        }
    }

    #[test]
    fn the_test_runner_is_the_static_one_unless_it_is_missing_or_older() {
        let dir = tempfile::tempdir().unwrap();
        let static_runner = dir
            .path()
            .join("x86_64-unknown-linux-gnu/debug/captf-runner");
        let plain = dir.path().join("debug/captf-runner");
        let make = |path: &Path, seconds: u64| {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            let file = fs::File::create(path).unwrap();
            file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(seconds))
                .unwrap();
        };
        assert_eq!(test_runner(dir.path()), plain, "neither exists");
        make(&plain, 100);
        assert_eq!(test_runner(dir.path()), plain, "only the plain one");
        make(&static_runner, 50);
        assert_eq!(test_runner(dir.path()), plain, "the static one is older");
        make(&static_runner, 200);
        assert_eq!(
            test_runner(dir.path()),
            static_runner,
            "the static one is newer"
        );
        fs::remove_file(&plain).unwrap();
        assert_eq!(
            test_runner(dir.path()),
            static_runner,
            "only the static one"
        );
    }

    #[test]
    fn the_phase_follows_the_containers() {
        let cases: Vec<(&str, Vec<State>, Vec<State>, &str)> = vec![
            (
                "nothing started",
                vec![pending()],
                vec![pending()],
                "Pending",
            ),
            ("init running", vec![running()], vec![pending()], "Pending"),
            ("init failed", vec![done(1)], vec![pending()], "Failed"),
            (
                "init done, main waiting",
                vec![done(0)],
                vec![pending()],
                "Pending",
            ),
            ("main running", vec![done(0)], vec![running()], "Running"),
            ("main succeeded", vec![done(0)], vec![done(0)], "Succeeded"),
            ("main failed", vec![done(0)], vec![done(137)], "Failed"),
            ("no init, main running", vec![], vec![running()], "Running"),
            (
                "no init, main succeeded",
                vec![],
                vec![done(0)],
                "Succeeded",
            ),
            ("no container", vec![], vec![], "Pending"),
        ];
        for (what, init, main, want) in cases {
            let statuses = Statuses {
                init: init.into_iter().map(|s| slot("runner", s)).collect(),
                main: main.into_iter().map(|s| slot("source", s)).collect(),
            };
            assert_eq!(phase(&statuses), want, "{what}");
        }
    }

    #[test]
    fn the_pod_status_shows_each_container_state() {
        let statuses = Statuses {
            init: vec![slot("runner", done(0))],
            main: vec![slot("source", running())],
        };
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5))).unwrap();
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["startTime"], "1970-01-01T00:00:00Z");
        let init = &status["initContainerStatuses"][0];
        assert_eq!(init["name"], "runner");
        assert_eq!(init["ready"], false);
        assert_eq!(init["state"]["terminated"]["exitCode"], 0);
        assert_eq!(init["state"]["terminated"]["reason"], "Completed");
        let main = &status["containerStatuses"][0];
        assert_eq!(main["name"], "source");
        assert_eq!(main["image"], "img");
        assert_eq!(main["ready"], true);
        assert_eq!(
            main["state"]["running"]["startedAt"],
            "1970-01-01T00:00:01Z"
        );
        let conditions: Vec<(String, String)> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["type"].as_str().unwrap().into(),
                    c["status"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [
            ("PodScheduled", "True"),
            ("Initialized", "True"),
            ("ContainersReady", "True"),
            ("Ready", "True"),
        ];
        assert_eq!(
            conditions,
            want.map(|(t, s)| (t.to_string(), s.to_string()))
        );

        let statuses = Statuses {
            init: vec![slot(
                "runner",
                waiting("ErrImagePull", Some("unknown".into())),
            )],
            main: vec![slot("source", pending())],
        };
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5))).unwrap();
        assert_eq!(status["phase"], "Pending");
        let waiting = &status["initContainerStatuses"][0]["state"]["waiting"];
        assert_eq!(
            (waiting["reason"].as_str(), waiting["message"].as_str()),
            (Some("ErrImagePull"), Some("unknown"))
        );
        assert_eq!(
            status["conditions"][1]["status"], "False",
            "not initialized"
        );
        assert_eq!(status["conditions"][3]["status"], "False", "not ready");
    }

    #[test]
    fn a_termination_says_how_the_process_ended() {
        struct Case {
            raw: i32,
            oom_killed: bool,
            exit_code: i32,
            reason: &'static str,
            message: Option<&'static str>,
            signal: Option<i32>,
        }
        let case = |raw, oom_killed, exit_code, reason, message, signal| Case {
            raw,
            oom_killed,
            exit_code,
            reason,
            message,
            signal,
        };
        let cases = [
            case(0, false, 0, "Completed", Some("result"), None),
            case(3 << 8, false, 3, "Error", Some("result"), None),
            case(
                libc::SIGTERM,
                false,
                143,
                "Error",
                Some("result"),
                Some(libc::SIGTERM),
            ),
            case(
                libc::SIGKILL,
                false,
                137,
                "Error",
                Some("result"),
                Some(libc::SIGKILL),
            ),
            case(
                libc::SIGKILL,
                true,
                137,
                "OOMKilled",
                None,
                Some(libc::SIGKILL),
            ),
        ];
        for c in cases {
            let t = termination(
                ExitStatus::from_raw(c.raw),
                c.oom_killed,
                Some("result".into()),
                at(1),
                at(2),
            );
            assert_eq!(
                (
                    t.exit_code,
                    t.reason.as_str(),
                    t.message.as_deref(),
                    t.signal
                ),
                (c.exit_code, c.reason, c.message, c.signal),
                "raw {}, OOM-killed {}",
                c.raw,
                c.oom_killed
            );
            assert_eq!((t.started_at, t.finished_at), (at(1), at(2)));
        }
    }

    #[test]
    fn a_termination_message_is_cut_at_4096_bytes_on_a_character() {
        let long = "a".repeat(5000);
        let split = format!("{}é", "a".repeat(4095));
        let cases: Vec<(&[u8], Option<String>)> = vec![
            (b"", None),
            (b"{\"ok\":true}", Some("{\"ok\":true}".into())),
            (long.as_bytes(), Some("a".repeat(4096))),
            (split.as_bytes(), Some("a".repeat(4095))),
            (b"a\xffb", Some("a\u{fffd}b".into())),
        ];
        for (bytes, want) in cases {
            assert_eq!(termination_message(bytes), want, "{} bytes", bytes.len());
        }
    }

    #[test]
    fn the_grace_period_comes_from_the_deletion_then_the_spec() {
        let cases = [
            (json_pod(Some(5), Some(600)), 5),
            (json_pod(None, Some(600)), 600),
            (json_pod(None, None), 30),
            (json_pod(Some(0), Some(600)), 0),
        ];
        for (pod, want) in cases {
            assert_eq!(grace_seconds(&pod), want);
        }
    }

    fn json_pod(deletion_grace: Option<i64>, spec_grace: Option<i64>) -> Pod {
        pod(serde_json::json!({
            "metadata": { "name": "p", "deletionGracePeriodSeconds": deletion_grace },
            "spec": { "containers": [], "terminationGracePeriodSeconds": spec_grace },
        }))
    }

    #[test]
    fn the_hostname_is_the_pods_as_a_kubelet_sets_it() {
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
        let cases = [
            (
                serde_json::json!({ "name": "captf-m-m1-apply-a1-abcdef-x2x4z" }),
                None,
                "captf-m-m1-apply-a1-abcdef-x2x4z",
            ),
            (serde_json::json!({ "name": "pod" }), Some("host"), "host"),
            (serde_json::json!({ "name": long }), None, &*"a".repeat(62)),
        ];
        for (metadata, hostname, want) in cases {
            let pod = pod(
                serde_json::json!({ "metadata": metadata, "spec": { "containers": [], "hostname": hostname } }),
            );
            assert_eq!(pod_hostname(&pod), want);
        }
    }

    #[test]
    fn container_paths_stay_in_the_root() {
        let root = Path::new("/r");
        let cases: &[(&str, Option<&str>)] = &[
            ("/captf/work", Some("/r/captf/work")),
            ("/captf/./bin/", Some("/r/captf/bin")),
            ("/", Some("/r")),
            ("captf/work", None),
            ("/captf/../etc", None),
        ];
        for (path, want) in cases {
            let got = in_root(root, path).ok();
            assert_eq!(got.as_deref(), want.map(Path::new), "{path}");
        }
        let items: &[(&str, bool)] = &[
            ("restore/0", true),
            ("token", true),
            ("../x", false),
            ("/x", false),
            ("", false),
        ];
        for (path, ok) in items {
            assert_eq!(item_path(path).is_ok(), *ok, "{path:?}");
        }
    }

    #[test]
    fn volume_files_follow_the_items_and_modes() {
        let data = BTreeMap::from([
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]);
        let item = |key: &str, path: &str, mode: Option<i32>| KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        };
        let file = |path: &str, contents: &[u8], mode: u32| VolumeFile {
            path: PathBuf::from(path),
            contents: contents.to_vec(),
            mode,
        };
        let all = key_files("secret", "s", &data, None, 0o440, false).unwrap();
        assert_eq!(all, vec![file("a", b"1", 0o440), file("b", b"2", 0o440)]);

        let items = [item("b", "restore/0", None), item("a", "x", Some(0o400))];
        let some = key_files("secret", "s", &data, Some(&items), 0o440, false).unwrap();
        assert_eq!(
            some,
            vec![file("restore/0", b"2", 0o440), file("x", b"1", 0o400)]
        );

        let missing = [item("c", "c", None)];
        let error = key_files("secret", "s", &data, Some(&missing), 0o440, false).unwrap_err();
        assert!(
            matches!(error, PodError::MissingKey { ref key, .. } if key == "c"),
            "{error}"
        );
        assert_eq!(error.category(), Category::Transient);
        assert_eq!(
            key_files("secret", "s", &data, Some(&missing), 0o440, true).unwrap(),
            vec![]
        );

        let escaping = [item("a", "../a", None)];
        assert!(key_files("secret", "s", &data, Some(&escaping), 0o440, false).is_err());
    }

    #[test]
    fn downward_fields_resolve_from_the_pod() {
        let pod = pod(serde_json::json!({
            "metadata": { "name": "p", "namespace": "ns", "uid": "u-1", "labels": { "job-name": "j", "a": "b" } },
            "spec": { "containers": [], "serviceAccountName": "captf-runner" },
        }));
        let cases: &[(&str, Option<&str>)] = &[
            ("metadata.name", Some("p")),
            ("metadata.namespace", Some("ns")),
            ("metadata.uid", Some("u-1")),
            ("metadata.labels['job-name']", Some("j")),
            ("metadata.labels['none']", Some("")),
            ("metadata.labels", Some("a=\"b\"\njob-name=\"j\"")),
            ("spec.nodeName", Some(NODE)),
            ("spec.serviceAccountName", Some("captf-runner")),
            ("status.podIP", None),
        ];
        for (path, want) in cases {
            assert_eq!(field_value(&pod, path).ok().as_deref(), *want, "{path}");
        }
        let files = downward_files(
            &pod,
            &[DownwardAPIVolumeFile {
                path: "namespace".into(),
                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                    field_path: "metadata.namespace".into(),
                    api_version: None,
                }),
                ..Default::default()
            }],
            0o644,
        )
        .unwrap();
        assert_eq!(
            files,
            vec![VolumeFile {
                path: "namespace".into(),
                contents: b"ns".to_vec(),
                mode: 0o644
            }]
        );
    }

    #[test]
    fn the_environment_layers_image_env_from_and_env() {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let image = pairs(&[
            ("A", "image"),
            ("B", "image"),
            ("C", "image"),
            ("LANG", "C.UTF-8"),
        ]);
        let from = pairs(&[("B", "from"), ("C", "from")]);
        let env = pairs(&[
            ("C", "env"),
            ("HOME", "/captf/work"),
            ("TMPDIR", "/tmp"),
            ("OTHER", "/tmpfoo"),
            ("SUB", "/tmp/x"),
        ]);
        let mounts = ["/captf/work".to_string(), "/tmp".to_string()];
        let merged = merge_env(
            "/usr/bin:/bin",
            &image,
            &from,
            &env,
            Path::new("/r"),
            &mounts,
        );
        let want = BTreeMap::from(
            [
                ("PATH", "/usr/bin:/bin"),
                ("A", "image"),
                ("B", "from"),
                ("C", "env"),
                ("LANG", "C.UTF-8"),
                ("HOME", "/r/captf/work"),
                ("TMPDIR", "/r/tmp"),
                ("OTHER", "/tmpfoo"),
                ("SUB", "/r/tmp/x"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        assert_eq!(merged, want);

        let overridden = merge_env(
            "/bin",
            &pairs(&[("PATH", "/image/bin")]),
            &[],
            &[],
            Path::new("/r"),
            &[],
        );
        assert_eq!(
            overridden["PATH"], "/image/bin",
            "an image's PATH wins over the host's"
        );

        let data = BTreeMap::from([
            ("KEY".to_string(), b"v".to_vec()),
            ("a=b".to_string(), b"x".to_vec()),
            (String::new(), b"x".to_vec()),
        ]);
        assert_eq!(prefixed(&data, "P_"), pairs(&[("P_KEY", "v")]));
    }

    #[test]
    fn commands_run_from_the_root_or_the_host() {
        let root = Path::new("/r");
        let kubeconfig = Path::new("/r/kubeconfig");
        let runner = Image::Runner(PathBuf::from("/target/captf-runner"));
        let module = Image::Module(ModuleImage {
            module: PathBuf::from("/m"),
            runtime: PathBuf::from("/tofu"),
            providers: None,
            env: Vec::new(),
        });
        // What the laid-out root holds: the runner volume, not yet the runner.
        let root_has = |p: &Path| p == Path::new("/r/captf/bin") || p == Path::new("/r/captf/work");
        let s = |v: &[&str]| -> Vec<String> { v.iter().map(|a| a.to_string()).collect() };
        struct Case<'a> {
            what: &'a str,
            image: &'a Image,
            command: Vec<String>,
            args: Vec<String>,
            want: Vec<String>,
        }
        let case = |what, image, command, args, want| Case {
            what,
            image,
            command,
            args,
            want,
        };
        let cases = [
            case(
                "the init container copies the runner",
                &runner,
                s(&["/runner", "copy", "/captf/bin/runner"]),
                vec![],
                s(&["/target/captf-runner", "copy", "/r/captf/bin/runner"]),
            ),
            case(
                "the runner runs with the root and the kubeconfig",
                &module,
                s(&["/captf/bin/runner", "run"]),
                s(&[
                    "--op=apply",
                    "--backend-config=namespace=ns",
                    IN_CLUSTER,
                    "--backend-config=labels={}",
                ]),
                s(&[
                    "/r/captf/bin/runner",
                    "run",
                    "--root=/r",
                    "--op=apply",
                    "--backend-config=namespace=ns",
                    "--backend-config=config_path=/r/kubeconfig",
                    "--backend-config=labels={}",
                ]),
            ),
            case(
                "a host program keeps its script",
                &module,
                s(&["/bin/sh", "-c"]),
                s(&["/bin/echo hi > /captf/work/x"]),
                s(&["/bin/sh", "-c", "/bin/echo hi > /captf/work/x"]),
            ),
            case(
                "a path argument in the root is taken there",
                &module,
                s(&["/bin/cat", "/captf/work/x", "/etc/hostname", IN_CLUSTER]),
                vec![],
                s(&["/bin/cat", "/r/captf/work/x", "/etc/hostname", IN_CLUSTER]),
            ),
            case(
                "a runner image runs other programs from the host",
                &runner,
                s(&["/bin/true"]),
                vec![],
                s(&["/bin/true"]),
            ),
        ];
        for c in cases {
            let got = host_argv(c.image, &c.command, &c.args, root, kubeconfig, &root_has).unwrap();
            assert_eq!(got, c.want, "{}", c.what);
        }
        let error = host_argv(&module, &[], &[], root, kubeconfig, &root_has).unwrap_err();
        assert_eq!(error.category(), Category::Invalid);
    }

    #[test]
    fn the_kubeconfig_holds_the_server_ca_and_token() {
        let yaml = kubeconfig_yaml("https://127.0.0.1:6443", "Q0E=", "tok");
        let config = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let cluster = config.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(config.current_context.as_deref(), Some("pod"));
        // The token as written (kube keeps its own copy out of reach).
        let raw: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(raw["users"][0]["user"]["token"], "tok");
    }

    #[test]
    fn descendants_are_found_through_every_generation() {
        // 10 → 11 → 12 → 13, 10 → 14; 20 is another tree.
        let table = [
            (10, 1),
            (11, 10),
            (12, 11),
            (13, 12),
            (14, 10),
            (20, 1),
            (21, 20),
        ];
        let mut below = descendants(10, &table);
        below.sort();
        assert_eq!(below, vec![11, 12, 13, 14]);
        assert_eq!(descendants(13, &table), Vec::<u32>::new());
        let mut own = descendants(std::process::id(), &process_table());
        own.sort();
        assert!(!own.contains(&std::process::id()));
    }

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
