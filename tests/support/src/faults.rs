//! Faults of the control plane, for the tests of recovery: the API server
//! restarted as a rolling upgrade restarts it, and etcd stalled as a slow
//! disk or a partition stalls it.

use std::fs::OpenOptions;
use std::time::{Duration, Instant};

use crate::controlplane::{ControlPlane, terminate, wait_apiserver_ready};

const APISERVER: &str = "kube-apiserver";
const ETCD: &str = "etcd";

impl ControlPlane {
    /// Stops the API server (SIGTERM: it closes its watches and drains its
    /// requests), starts it again with the same flags on the same port, and
    /// waits for its `/readyz`. Returns how long it was away.
    pub async fn restart_apiserver(&self) -> Result<Duration, String> {
        let started = Instant::now();
        let (bin, args) = {
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            let process = children
                .iter_mut()
                .find(|p| p.name == APISERVER)
                .ok_or("the control plane has no API server")?;
            terminate(&mut process.child);
            (process.bin.clone(), process.args.clone())
        };
        let path = self.dir().join(format!("{APISERVER}.log"));
        let log = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        let child = self.launch(&bin, &args, log)?;
        if let Some(process) = self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
            .find(|p| p.name == APISERVER)
        {
            process.child = child;
        }
        wait_apiserver_ready(self, Instant::now() + Duration::from_secs(120)).await?;
        Ok(started.elapsed())
    }

    /// Stops etcd (SIGSTOP) until the guard is dropped: every request that
    /// needs storage hangs, and the watches see nothing.
    pub fn pause_etcd(&self) -> Result<Paused, String> {
        let children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let process = children
            .iter()
            .find(|p| p.name == ETCD)
            .ok_or("the control plane has no etcd")?;
        let pid = process.child.id() as i32;
        // SAFETY: a signal to a process this control plane started.
        if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
            return Err(format!(
                "stopping etcd: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Paused { pid })
    }
}

/// etcd, stopped until this is dropped.
pub struct Paused {
    pid: i32,
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: a signal to a process this control plane started.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}
