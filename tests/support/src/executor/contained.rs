//! Contained pods ([`super::Executor::start_contained`]): a pod that runs as
//! in a container, for the manager's own Deployment and the Jobs it starts
//! once installed.
//!
//! - Its filesystem is its root: the image's files and its volumes, with
//!   the host's `/proc` and a few devices bound in, and the process chrooted
//!   there in a mount namespace of its own, as its user (the security
//!   context's, else the image's).
//! - Its network is its own (a network namespace with only loopback), so two
//!   pods may listen on the same port, as during a rolling update. It has a
//!   pod IP of its own, added to the host's loopback interface, where the
//!   executor listens on each container port and forwards into the
//!   namespace; and it reaches the API server at
//!   `KUBERNETES_SERVICE_HOST:PORT` = `127.0.0.1:<port>`, forwarded out.
//!
//! Linux only, as root (the namespaces, chroot and the change of user).

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::env::{container_argv, expand, merge_env};
use super::images::Image;
use super::process::Process;
use super::volumes::{Objects, in_root};
use super::{PodError, PodRun, io_error};

/// The device files bound into a contained root, from the host's `/dev`.
pub(super) const DEVICES: [&str; 4] = ["null", "zero", "random", "urandom"];

/// A container's PATH when its image sets none.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The user and group a container runs as: its security context's, else
/// the pod's, else its image's USER (numeric only: no `/etc/passwd` is read),
/// else root; refused if it must not be root and would be.
pub(super) fn run_as(
    pod: &PodSpec,
    container: &Container,
    image_user: Option<&str>,
) -> Result<(u32, u32), String> {
    let own = container.security_context.as_ref();
    let shared = pod.security_context.as_ref();
    let (image_uid, image_gid) = match image_user {
        None => (None, None),
        Some(user) => {
            let (uid, gid) = user.split_once(':').unwrap_or((user, ""));
            let number = |s: &str| {
                s.parse::<u32>()
                    .map_err(|_| format!("the image's user {user:?} is not numeric"))
            };
            let gid = if gid.is_empty() {
                None
            } else {
                Some(number(gid)?)
            };
            (Some(number(uid)?), gid)
        }
    };
    let uid = own
        .and_then(|c| c.run_as_user)
        .or_else(|| shared.and_then(|c| c.run_as_user))
        .map(|u| u as u32)
        .or(image_uid)
        .unwrap_or(0);
    let gid = own
        .and_then(|c| c.run_as_group)
        .or_else(|| shared.and_then(|c| c.run_as_group))
        .map(|g| g as u32)
        .or(image_gid)
        .unwrap_or(0);
    let non_root = own
        .and_then(|c| c.run_as_non_root)
        .or_else(|| shared.and_then(|c| c.run_as_non_root))
        .unwrap_or(false);
    if non_root && uid == 0 {
        return Err("container has runAsNonRoot and image will run as root".into());
    }
    Ok((uid, gid))
}

/// A volume as a kubelet sets it up for the pod's fsGroup: every file and
/// folder in the group `group`, readable by it (and writable, for a
/// writable volume), folders setgid so that new files join the group.
pub(super) fn own_volume(dir: &Path, group: u32, writable: bool) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut paths = vec![dir.to_path_buf()];
    while let Some(path) = paths.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        std::os::unix::fs::lchown(&path, None, Some(group))?;
        let mode = meta.permissions().mode();
        let owner_x = mode & 0o100 != 0;
        let mut add = if writable { 0o060 } else { 0o040 };
        if meta.is_dir() {
            add |= 0o2010;
            paths.extend(std::fs::read_dir(&path)?.flatten().map(|e| e.path()));
        } else if owner_x {
            add |= 0o010;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | add))?;
    }
    Ok(())
}

/// The number of a container's port, by number or by name.
fn port_number(container: &Container, port: &IntOrString) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Every container port of the pod.
pub(super) fn pod_ports(pod: &Pod) -> Vec<u16> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut ports: Vec<u16> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Probes `container` as its readinessProbe says (an httpGet; other probes
/// are not modelled and never turn ready), sending each answer: ready after
/// `successThreshold` successes in a row, not after `failureThreshold`
/// failures. None without a readiness probe.
pub(super) fn probe_readiness(
    network: Arc<Network>,
    container: &Container,
) -> Option<(JoinHandle<()>, watch::Receiver<bool>)> {
    let probe = container.readiness_probe.clone()?;
    let (tx, rx) = watch::channel(false);
    let target = probe.http_get.as_ref().and_then(|get| {
        Some((
            port_number(container, &get.port)?,
            get.path.clone().unwrap_or("/".into()),
        ))
    });
    let seconds =
        |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
    let delay = seconds(probe.initial_delay_seconds, 0);
    let period = seconds(probe.period_seconds, 10).max(Duration::from_secs(1));
    let successes = probe.success_threshold.unwrap_or(1).max(1);
    let failures = probe.failure_threshold.unwrap_or(3).max(1);
    let task = tokio::spawn(async move {
        let Some((port, path)) = target else {
            return;
        };
        tokio::time::sleep(delay).await;
        let (mut ok_run, mut failed_run) = (0, 0);
        loop {
            if network.probe_http(port, &path).await {
                (ok_run, failed_run) = (ok_run + 1, 0);
                if ok_run >= successes {
                    tx.send_if_modified(|r| !std::mem::replace(r, true));
                }
            } else {
                (ok_run, failed_run) = (0, failed_run + 1);
                if failed_run >= failures {
                    tx.send_if_modified(|r| std::mem::replace(r, false));
                }
            }
            tokio::time::sleep(period).await;
        }
    });
    Some((task, rx))
}

impl PodRun {
    /// A contained container, ready to start: its image's command line and
    /// environment as they are (nothing is taken inside a root: it is the
    /// root), the API server's address, and its jail.
    pub(super) async fn contained_process(
        &self,
        pod: &Pod,
        container: &Container,
        image: &Image,
        network: &Network,
        objects: &mut Objects,
    ) -> Result<Process, (&'static str, PodError)> {
        let config = |e| ("CreateContainerConfigError", e);
        let unsupported = |m: String| config(PodError::Unsupported(m));
        let Image::Unpacked(unpacked) = image else {
            return Err(unsupported(
                "a contained pod runs images of a registry only".into(),
            ));
        };
        let (env_from, env) = self
            .container_env(pod, container, objects)
            .await
            .map_err(config)?;
        // The container's own references, not the image's.
        let lookup = |name: &str| {
            env.iter()
                .chain(&env_from)
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let expanded = |list: &Option<Vec<String>>| -> Vec<String> {
            list.iter().flatten().map(|t| expand(t, lookup)).collect()
        };
        let (command, args) = (expanded(&container.command), expanded(&container.args));
        let argv: Vec<String> = container_argv(image, &command, &args)
            .into_iter()
            .cloned()
            .collect();
        if argv.is_empty() {
            return Err(unsupported(
                "the container has no command, and its image no entrypoint".into(),
            ));
        }
        let mut env = merge_env(
            CONTAINER_PATH,
            &unpacked.env,
            &env_from,
            &env,
            &self.root,
            &[],
        );
        env.insert(
            "KUBERNETES_SERVICE_HOST".into(),
            Ipv4Addr::LOCALHOST.to_string(),
        );
        env.insert(
            "KUBERNETES_SERVICE_PORT".into(),
            self.shared.api_port.to_string(),
        );
        env.insert(
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let spec = pod.spec.clone().unwrap_or_default();
        let user = run_as(&spec, container, unpacked.user.as_deref()).map_err(unsupported)?;
        let cwd = container
            .working_dir
            .clone()
            .or_else(|| unpacked.working_dir.clone())
            .unwrap_or_else(|| "/".into());
        let host_cwd = in_root(&self.root, &cwd).map_err(config)?;
        std::fs::create_dir_all(&host_cwd)
            .map_err(io_error(&host_cwd))
            .map_err(config)?;
        let message_path = container
            .termination_message_path
            .as_deref()
            .unwrap_or("/dev/termination-log");
        let groups = spec
            .security_context
            .as_ref()
            .map(|c| {
                c.fs_group
                    .into_iter()
                    .chain(c.supplemental_groups.iter().flatten().copied())
                    .map(|g| g as u32)
                    .collect()
            })
            .unwrap_or_default();
        let jail = Jail::new(network, &self.root, &cwd, Some(user), groups)
            .map_err(|e| config(PodError::Unsupported(format!("the container's jail: {e}"))))?;
        Ok(Process {
            container: container.name.clone(),
            argv,
            env,
            cwd: host_cwd,
            message_path: in_root(&self.root, message_path).map_err(config)?,
            jail: Some(jail),
        })
    }
}

/// The next pod IP, from 198.18.0.0/15 (RFC 2544's benchmarking range,
/// which an EndpointSlice accepts, as it refuses loopback addresses):
/// `198.18.<this process % 250>.<n + 2>`, then in 198.19.
fn next_pod_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let process = (std::process::id() % 250) as u8;
    Ipv4Addr::new(
        198,
        18 + ((n / 250) % 2) as u8,
        process,
        (n % 250 + 2) as u8,
    )
}

/// Adds (or removes) `ip` on the host's loopback interface, where the
/// executor listens for the pod.
fn host_address(verb: &str, ip: Ipv4Addr) -> io::Result<()> {
    let out = std::process::Command::new("ip")
        .args(["addr", verb, &format!("{ip}/32"), "dev", "lo"])
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || (verb == "add" && said.contains("File exists")) {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "ip addr {verb} {ip}: {}",
        said.trim()
    )))
}

/// Runs `f` on a thread of its own inside the network namespace `netns`.
fn in_netns<T: Send + 'static>(
    netns: &Arc<OwnedFd>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let netns = netns.clone();
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only, to a namespace fd we hold.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// A new network namespace with loopback up, created on a thread of its
/// own, and a listener inside it on `127.0.0.1:api_port`.
fn new_netns(api_port: u16) -> io::Result<(OwnedFd, TcpListener)> {
    std::thread::spawn(move || {
        // SAFETY: unshare of this thread's network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        loopback_up()?;
        // SAFETY: open of a NUL-terminated path; the fd is owned below.
        let fd = unsafe {
            libc::open(
                c"/proc/thread-self/ns/net".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        let netns = unsafe { OwnedFd::from_raw_fd(fd) };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, api_port))?;
        listener.set_nonblocking(true)?;
        Ok((netns, listener))
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Sets `lo` up in this thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket for the interface ioctls, closed below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the socket is ours.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: a zeroed ifreq is valid; its name is "lo" NUL-terminated.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: ioctls on our socket with a valid ifreq.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Copies both ways until either side closes.
async fn splice(a: std::net::TcpStream, b: tokio::net::TcpStream) {
    let Ok(()) = a.set_nonblocking(true) else {
        return;
    };
    let Ok(mut a) = tokio::net::TcpStream::from_std(a) else {
        return;
    };
    let mut b = b;
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

/// A pod's network: its namespace, its IP on the host and the forwarders.
pub(super) struct Network {
    pub(super) ip: Ipv4Addr,
    netns: Arc<OwnedFd>,
    tasks: Vec<JoinHandle<()>>,
}

impl Network {
    /// A namespace whose `127.0.0.1:api_port` reaches the API server, and
    /// a pod IP whose `ports` reach the namespace's.
    pub(super) async fn start(api_port: u16, ports: &[u16]) -> io::Result<Network> {
        let (netns, out) = tokio::task::spawn_blocking(move || new_netns(api_port))
            .await
            .map_err(io::Error::other)??;
        let netns = Arc::new(netns);
        let out = tokio::net::TcpListener::from_std(out)?;
        let mut tasks = vec![tokio::spawn(async move {
            while let Ok((inside, _)) = out.accept().await {
                tokio::spawn(async move {
                    let Ok(host) =
                        tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, api_port)).await
                    else {
                        return;
                    };
                    if let Ok(inside) = inside.into_std() {
                        splice(inside, host).await;
                    }
                });
            }
        })];
        let ip = next_pod_ip();
        host_address("add", ip)?;
        for &port in ports {
            let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, port))).await?;
            let netns = netns.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((outside, _)) = listener.accept().await {
                    let netns = netns.clone();
                    tokio::spawn(async move {
                        let inside = tokio::task::spawn_blocking(move || {
                            in_netns(&netns, move || {
                                TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                            })
                        })
                        .await;
                        if let Ok(Ok(inside)) = inside {
                            splice(inside, outside).await;
                        }
                    });
                }
            }));
        }
        Ok(Network { ip, netns, tasks })
    }

    /// The namespace, for a process to join.
    pub(super) fn netns(&self) -> RawFd {
        self.netns.as_raw_fd()
    }

    /// An HTTP GET of `path` on the pod's `port`, as a kubelet's probe:
    /// true on a status from 200 to 399.
    pub(super) async fn probe_http(&self, port: u16, path: &str) -> bool {
        let netns = self.netns.clone();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        let answer = tokio::task::spawn_blocking(move || {
            in_netns(&netns, move || {
                let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
                stream.set_read_timeout(Some(Duration::from_secs(1)))?;
                stream.write_all(request.as_bytes())?;
                let mut head = [0u8; 12];
                stream.read_exact(&mut head)?;
                Ok(head)
            })
        })
        .await;
        let Ok(Ok(head)) = answer else {
            return false;
        };
        std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|code| code.parse::<u16>().ok())
            .is_some_and(|code| (200..400).contains(&code))
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = host_address("del", self.ip);
    }
}

/// What a contained process does between fork and exec: join the pod's
/// network, take a mount namespace of its own with `/proc` and the devices
/// bound into its root, chroot there, and become its user.
#[derive(Clone)]
pub(super) struct Jail {
    netns: RawFd,
    root: CString,
    binds: Vec<(CString, CString)>,
    cwd: CString,
    user: Option<(u32, u32)>,
    /// The supplementary groups: the pod's fsGroup and supplementalGroups.
    groups: Vec<libc::gid_t>,
}

impl Jail {
    /// `root` must hold `proc/` and `dev/<device>` for each of [`DEVICES`].
    pub(super) fn new(
        network: &Network,
        root: &Path,
        cwd: &str,
        user: Option<(u32, u32)>,
        groups: Vec<u32>,
    ) -> io::Result<Jail> {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
        let mut binds = vec![(c(Path::new("/proc"))?, c(&root.join("proc"))?)];
        for device in DEVICES {
            binds.push((
                c(&Path::new("/dev").join(device))?,
                c(&root.join("dev").join(device))?,
            ));
        }
        Ok(Jail {
            netns: network.netns(),
            root: c(root)?,
            binds,
            cwd: CString::new(cwd).map_err(io::Error::other)?,
            user,
            groups,
        })
    }

    /// Only async-signal-safe calls: this runs between fork and exec.
    pub(super) fn enter(&self) -> io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        // SAFETY: system calls with NUL-terminated paths prepared before the fork.
        unsafe {
            check(libc::setns(self.netns, libc::CLONE_NEWNET))?;
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for (from, to) in &self.binds {
                check(libc::mount(
                    from.as_ptr(),
                    to.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
            }
            check(libc::chroot(self.root.as_ptr()))?;
            check(libc::chdir(self.cwd.as_ptr()))?;
            if let Some((uid, gid)) = self.user {
                check(libc::setgroups(self.groups.len(), self.groups.as_ptr()))?;
                check(libc::setgid(gid))?;
                check(libc::setuid(uid))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
