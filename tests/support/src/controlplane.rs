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

/// Starts a control plane. It boots on a thread of its own, because it
/// waits on a runtime of its own and may be called from inside a test's.
pub fn start() -> Result<ControlPlane, String> {
    std::thread::spawn(start_here)
        .join()
        .map_err(|_| "the control plane's boot thread panicked".to_string())?
}

fn start_here() -> Result<ControlPlane, String> {
    let started = Instant::now();
    remove_stale_dirs(DIR_PREFIX, "CAPTF_KEEP_CONTROLPLANE");
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{:x}",
        std::process::id(),
        started.elapsed().as_nanos() ^ rand_seed()
    ));
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;

    let etcd = binary("etcd");
    let apiserver = binary("kube-apiserver");
    let kcm = binary("kube-controller-manager");

    let plane = ControlPlane {
        kubeconfig: dir.join("kubeconfig"),
        manager_kubeconfig: OnceLock::new(),
        server: String::new(),
        dir: dir.clone(),
        children: Mutex::new(Vec::new()),
    };
    let result = boot(plane, &etcd, &apiserver, &kcm);
    if let Ok(plane) = &result {
        eprintln!(
            "control plane up at {} in {:.1}s ({})",
            plane.server,
            started.elapsed().as_secs_f64(),
            dir.display()
        );
    }
    result
}

fn boot(
    mut plane: ControlPlane,
    etcd: &Path,
    apiserver: &Path,
    kcm: &Path,
) -> Result<ControlPlane, String> {
    let dir = plane.dir.clone();
    let write = |name: &str, contents: &str| -> Result<PathBuf, String> {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    };

    let ca = DevCa::generate("captf-test-ca").map_err(|e| e.to_string())?;
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // 10.0.0.1 is the kubernetes Service's address in --service-cluster-ip-range.
    let serving = ca
        .issue_server(
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            &[loopback, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))],
        )
        .map_err(|e| e.to_string())?;
    let admin = ca
        .issue_client("captf-admin", &["system:masters"])
        .map_err(|e| e.to_string())?;
    let sa_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;

    let ca_file = write("ca.crt", ca.cert_pem())?;
    let serving_cert = write("apiserver.crt", &serving.cert_pem)?;
    let serving_key = write("apiserver.key", &serving.key_pem)?;
    let sa_key_file = write("service-account.key", &sa_key.serialize_pem())?;
    let sa_pub_file = write("service-account.pub", &sa_key.public_key_pem())?;

    let [etcd_client, etcd_peer, api_port, kcm_port] = free_ports()?;
    plane.server = format!("https://127.0.0.1:{api_port}");

    let kubeconfig = kubeconfig_yaml(
        &plane.server,
        ca.cert_pem(),
        &admin.cert_pem,
        &admin.key_pem,
    );
    plane.kubeconfig = write("kubeconfig", &kubeconfig)?;

    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    plane.spawn(
        "etcd",
        etcd,
        &[
            "--name=default".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // A test cluster's data is thrown away: durability buys nothing.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ],
    )?;
    let mut audit = Vec::new();
    if let Ok(to) = std::env::var("CAPTF_AUDIT_DIR") {
        audit = audit_flags(&dir, Path::new(&to))?;
    }
    plane.spawn(
        "kube-apiserver",
        apiserver,
        &[
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".into(),
            // These machines may have no default route to take an address from.
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_file.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", sa_pub_file.display()),
            format!(
                "--service-account-signing-key-file={}",
                sa_key_file.display()
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // A webhook's Service is dialled at its endpoints (the pod IPs
            // of the pod stand-in): there is no Service network.
            "--enable-aggregator-routing=true".into(),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .chain(audit)
        .collect::<Vec<_>>(),
    )?;
    let deadline = Instant::now() + START_TIMEOUT;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building a runtime: {e}"))?;
    runtime.block_on(wait_apiserver_ready(&plane, deadline))?;

    let kcm_kubeconfig = plane.kubeconfig.display().to_string();
    plane.spawn(
        "kube-controller-manager",
        kcm,
        &[
            format!("--kubeconfig={kcm_kubeconfig}"),
            format!("--authentication-kubeconfig={kcm_kubeconfig}"),
            format!("--authorization-kubeconfig={kcm_kubeconfig}"),
            // Deployments and Services for the managers installed in pods;
            // the aggregated ClusterRoles Cluster API's providers install.
            "--controllers=job-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,endpointslice-controller,clusterrole-aggregation-controller".into(),
            format!("--service-account-private-key-file={}", sa_key_file.display()),
            format!("--root-ca-file={}", ca_file.display()),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            format!("--secure-port={kcm_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join("kcm-certs").display()),
            "--v=1".into(),
        ],
    )?;
    runtime.block_on(wait_controllers_ready(&plane, deadline))?;
    Ok(plane)
}

impl ControlPlane {
    fn spawn(&mut self, name: &'static str, bin: &Path, args: &[String]) -> Result<(), String> {
        let log = fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| format!("creating {name}.log: {e}"))?;
        let child = self.launch(bin, args, log)?;
        self.children
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .push(Process {
                name,
                bin: bin.to_owned(),
                args: args.to_vec(),
                child,
            });
        Ok(())
    }

    /// Starts `bin` with `args` in this control plane's directory, its
    /// output to `log`.
    pub(crate) fn launch(
        &self,
        bin: &Path,
        args: &[String],
        log: fs::File,
    ) -> Result<Child, String> {
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        spawn_owned(cmd).map_err(|e| format!("starting {}: {e}", bin.display()))
    }

    /// Fails with the log tail of a process that exited.
    fn check_alive(&self) -> Result<(), String> {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for Process { name, child, .. } in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{name} exited with {status}; the end of its log:\n{}",
                    log_tail(&self.dir.join(format!("{name}.log")))
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn timed_out(&self, what: &str) -> String {
        let logs: Vec<String> = ["etcd", "kube-apiserver", "kube-controller-manager"]
            .iter()
            .map(|n| {
                format!(
                    "--- {n}.log\n{}",
                    log_tail(&self.dir.join(format!("{n}.log")))
                )
            })
            .collect();
        format!("timed out waiting for {what}\n{}", logs.join("\n"))
    }
}

pub(crate) async fn wait_apiserver_ready(
    plane: &ControlPlane,
    deadline: Instant,
) -> Result<(), String> {
    let client = plane.client().await;
    loop {
        plane.check_alive()?;
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        if let Ok(body) = client.request_text(req).await
            && body.trim() == "ok"
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(plane.timed_out("the API server's /readyz"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller-manager is up once its serviceaccount controller has made
/// the default namespace's ServiceAccount.
async fn wait_controllers_ready(plane: &ControlPlane, deadline: Instant) -> Result<(), String> {
    let client = plane.client().await;
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(client, "default");
    loop {
        plane.check_alive()?;
        if let Ok(Some(_)) = accounts.get_opt("default").await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(plane.timed_out("the controller-manager's default ServiceAccount"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With `CAPTF_AUDIT_DIR` set, the API server logs every request of the
/// manager's ServiceAccount (verb, resource, response code) to a file of
/// its own there: what `hack/rbac-audit.sh` sums up to review the
/// manager's ClusterRole against what the tests made it do.
fn audit_flags(dir: &Path, to: &Path) -> Result<Vec<String>, String> {
    let policy = dir.join("audit-policy.yaml");
    fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [\"system:serviceaccount:captf-system:captf-controller-manager\"]\n- level: None\n",
    )
    .map_err(|e| format!("writing {}: {e}", policy.display()))?;
    fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!(
            "--audit-log-path={}",
            to.join(format!("{name}.log")).display()
        ),
        "--audit-log-format=json".into(),
    ])
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: captf-test
  cluster:
    server: {server}
    certificate-authority-data: {}
users:
- name: captf-admin
  user:
    client-certificate-data: {}
    client-key-data: {}
contexts:
- name: captf-test
  context:
    cluster: captf-test
    user: captf-admin
current-context: captf-test
",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}

/// `N` distinct free ports below the kernel's ephemeral range: a port from
/// that range, free when picked, may be taken by an outgoing connection
/// before the process it is for binds it (a manager failed so, "Address
/// already in use"). Each is checked by binding it on every address, and
/// held until all are bound, so no port is handed out twice.
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let below = ephemeral_start().clamp(LOWEST_PORT + 1000, u16::MAX);
    let span = u64::from(below - LOWEST_PORT);
    let mut state = rand_seed() as u64 ^ u64::from(std::process::id()) << 32;
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    let mut tries = 0;
    while listeners.len() < N {
        tries += 1;
        if tries > 10_000 {
            return Err(format!("no free port between {LOWEST_PORT} and {below}"));
        }
        // splitmix64: spread the picks of concurrent test processes.
        state = state.wrapping_add(
            0x9E37_79B9_7F4A_7C15 ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let port = LOWEST_PORT + ((z ^ (z >> 31)) % span) as u16;
        if ports.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("0.0.0.0", port)) {
            ports[listeners.len()] = port;
            listeners.push(listener);
        }
    }
    Ok(ports)
}

/// The lowest port the test kit hands out.
const LOWEST_PORT: u16 = 20_000;

/// The first port of the kernel's ephemeral range (32768 when unknown).
fn ephemeral_start() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
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
