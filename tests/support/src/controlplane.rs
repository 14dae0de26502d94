//! A real Kubernetes control plane for tests and the demo: etcd,
//! kube-apiserver and kube-controller-manager built from source by
//! `tests/controlplane/build.sh`, started on free loopback ports in a
//! temporary directory.
//!
//! One control plane serves a whole test binary ([`shared`]). It stops when
//! the process exits, also after a failed test: an `atexit` hook stops the
//! processes and removes the directory, and every process is started with a
//! parent-death signal so that even a killed test binary leaves none running.
//! Directories left by a killed binary are removed by the next start.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use captf::server::dev_certs::DevCa;
use kube::config::{KubeConfigOptions, Kubeconfig};

const VERSIONS: &str = include_str!("../../controlplane/versions.env");
const DIR_PREFIX: &str = "captf-controlplane-";
const START_TIMEOUT: Duration = Duration::from_secs(120);

mod boot;
mod ports;

pub use boot::start;
pub(crate) use boot::wait_apiserver_ready;
pub use ports::free_ports;

/// The pinned version of one component, from versions.env.
pub fn version(key: &str) -> String {
    VERSIONS
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{key} is not pinned in tests/controlplane/versions.env"))
}

/// Where build.sh puts the binaries.
pub fn bin_dir() -> PathBuf {
    let cache = std::env::var_os("CAPTF_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("captf")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/captf")))
        .expect("neither CAPTF_CACHE_DIR, XDG_CACHE_HOME nor HOME is set");
    cache.join("bin")
}

/// The path of a built binary, building the platform first when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let version = match name {
        "kube-apiserver" | "kube-controller-manager" | "kubectl" => version("KUBERNETES_VERSION"),
        "etcd" => version("ETCD_VERSION"),
        "tofu" => version("OPENTOFU_VERSION"),
        "helm" => version("HELM_VERSION"),
        "promtool" => version("PROMETHEUS_MODULE_VERSION"),
        "crane" => version("GGCR_VERSION"),
        "capi-manager"
        | "clusterctl"
        | "capi-kubeadm-bootstrap-manager"
        | "capi-kubeadm-control-plane-manager" => version("CLUSTER_API_VERSION"),
        "cert-manager-controller" | "cert-manager-cainjector" | "cert-manager-webhook" => {
            version("CERT_MANAGER_VERSION")
        }
        other => panic!("no pinned version for {other}"),
    };
    let path = bin_dir().join(format!("{name}-v{version}"));
    if !path.exists() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane/build.sh");
        let status = Command::new(&script)
            .status()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(status.success(), "{} failed", script.display());
    }
    path
}

pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    /// The manager's own identity, set up on first use.
    manager_kubeconfig: OnceLock<PathBuf>,
    server: String,
    pub(crate) children: Mutex<Vec<Process>>,
}

/// One process of the control plane, with what started it, so that a fault
/// test can start it again ([`crate::faults`]).
pub(crate) struct Process {
    pub(crate) name: &'static str,
    pub(crate) bin: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) child: Child,
}

static SHARED: [OnceLock<ControlPlane>; 2] = [OnceLock::new(), OnceLock::new()];

/// The control plane of this test binary, started on first use.
pub fn shared() -> &'static ControlPlane {
    nth(0)
}

/// A second control plane of this test binary, for a test that moves
/// objects from one management cluster to another.
pub fn other() -> &'static ControlPlane {
    nth(1)
}

fn nth(i: usize) -> &'static ControlPlane {
    SHARED[i].get_or_init(|| {
        let plane = start().unwrap_or_else(|e| panic!("starting a control plane: {e}"));
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(stop_shared) };
        plane
    })
}

extern "C" fn stop_shared() {
    for plane in SHARED.iter().filter_map(OnceLock::get) {
        plane.stop();
    }
}

impl ControlPlane {
    /// A kubeconfig file for the admin user (group system:masters).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig for the manager's own ServiceAccount,
    /// `captf-system/captf-controller-manager`, with exactly the permissions
    /// of `config/rbac` (applied, and a token issued, on first use): the
    /// tests run the manager as it runs in a cluster, so a rule it lacks
    /// fails them. Its namespace is `captf-system`, the manager's own.
    pub fn manager_kubeconfig(&self) -> &Path {
        self.manager_kubeconfig.get_or_init(|| {
            crate::identity::install(self)
                .unwrap_or_else(|e| panic!("setting up the manager's ServiceAccount: {e}"))
        })
    }

    /// The directory of this control plane's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// A new client. Each test makes its own: a client lives on the runtime
    /// that made it, and every `#[tokio::test]` has a runtime of its own.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("reading the kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("loading the kubeconfig");
        kube::Client::try_from(config).expect("building a client")
    }

    /// Stops every process and removes the directory. Idempotent.
    pub fn stop(&self) {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        // Stop in reverse order of start: the controller-manager, then the
        // API server, then etcd.
        for process in children.iter_mut().rev() {
            terminate(&mut process.child);
        }
        children.clear();
        if std::env::var_os("CAPTF_KEEP_CONTROLPLANE").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Spawns a process that dies with this process (a parent-death signal) and
/// keeps out of the terminal's process group, so that Ctrl-C reaches only its
/// owner, which then stops it in order.
///
/// The parent-death signal fires when the spawning *thread* ends, and a test's
/// thread ends with the test: so every spawn happens on one thread that lives
/// as long as the process.
pub fn spawn_owned(mut cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("captf-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // Every sender is gone only at exit; keep the children alive
                // until then.
                loop {
                    std::thread::park();
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// SIGTERM, then SIGKILL after ten seconds.
pub fn terminate(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: sending a signal to a process we started and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) fn log_tail(path: &Path) -> String {
    let Ok(mut file) = fs::File::open(path) else {
        return "(no log)".into();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(4000)));
    let mut tail = String::new();
    let _ = file.read_to_string(&mut tail);
    tail
}

fn rand_seed() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Removes the directories named `<prefix><pid>-...` in the temporary
/// directory whose process is gone, unless `keep_var` is set.
pub(crate) fn remove_stale_dirs(prefix: &str, keep_var: &str) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        if !alive && std::env::var_os(keep_var).is_none() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
