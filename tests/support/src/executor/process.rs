//! Process control: a container's process in a process group of its own,
//! stopped as a kubelet would when its pod is deleted, and killed with all
//! it started.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::contained::Jail;
use super::status::{Termination, termination, termination_message};
use super::{PodRun, lock};

const DEFAULT_GRACE_SECONDS: i64 = 30;

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
pub(super) fn kill_tree(pid: u32) {
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
/// the pod's hostname; a contained one then enters its jail.
fn own_process(cmd: &mut tokio::process::Command, hostname: &str, jail: Option<Jail>) {
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
            if let Some(jail) = &jail {
                jail.enter()?;
                // The kernel clears the parent-death signal when the jail
                // switches to the pod's user.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// One container, ready to start.
pub(super) struct Process {
    pub(super) container: String,
    pub(super) argv: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) cwd: PathBuf,
    pub(super) message_path: PathBuf,
    /// A contained container's jail (`contained.rs`).
    pub(super) jail: Option<Jail>,
}

/// How a container run ended.
pub(super) enum Exit {
    /// The pod is gone from the API.
    Gone,
    Done(Termination),
}

impl PodRun {
    /// Runs one container's process to its end, stopping it as a kubelet
    /// would when the pod is deleted.
    pub(super) async fn run_process(&mut self, process: &Process) -> Exit {
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
        // A kubelet's termination log is there, and writable by any user.
        if process.jail.is_some()
            && let Err(e) = super::volumes::write_file(&process.message_path, b"", 0o666)
        {
            return fail_start(e.to_string());
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
        own_process(&mut cmd, &hostname, process.jail.clone());
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
            let readiness = async {
                match self.readiness.as_mut() {
                    Some(rx) => rx.changed().await.ok().map(|()| *rx.borrow_and_update()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                status = child.wait() => break status,
                _ = self.rx.changed() => {}
                ready = readiness => {
                    match ready {
                        Some(ready) => {
                            self.log(&format!("container {}: ready {ready}", process.container));
                            if let Some(slot) = self.statuses.main.first_mut() {
                                slot.ready = Some(ready);
                            }
                            self.write_status().await;
                        }
                        None => self.readiness = None,
                    }
                }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
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
}
