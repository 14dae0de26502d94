//! The pod's run: bound to the node, its containers run in order, its status
//! written at each step, and the pod removed once deleted.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use captf::error::{Categorized, Category};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::sync::watch;

use super::contained::{Network, pod_ports, probe_readiness};
use super::env::{host_argv, merge_env};
use super::process::{Exit, Process};
use super::status::{State, Statuses, waiting};
use super::volumes::{Objects, in_root, write_file};
use super::{NODE, PodError, PodKey, PodRun, Shared, TOKEN_SECONDS, io_error};
use crate::identity::token_kubeconfig;

const RETRY: Duration = Duration::from_secs(1);
/// A kubelet's first wait before restarting a container.
const CRASH_BACKOFF: Duration = Duration::from_secs(10);

/// How the work on a pod ended.
enum Ending {
    Gone,
    /// Its status is final (or it can never start): remove it once deleted.
    Settled,
}

impl PodRun {
    pub(super) fn new(
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
            network: None,
            readiness: None,
        }
    }

    pub(super) fn log(&self, line: &str) {
        self.shared.log(&format!("{}: {line}", self.key));
    }

    pub(super) fn current(&self) -> Option<Pod> {
        self.rx.borrow().clone()
    }

    pub(super) async fn run(mut self) {
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
        // A full node leaves the pod Pending until a pod ends.
        let slots = self.shared.slots.clone();
        let slot = tokio::select! {
            slot = slots.acquire_owned() => slot,
            () = self.deleted() => return,
        };
        if !self.bind().await {
            return;
        }
        let ending = self.execute(&pod).await;
        drop(slot);
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

    /// Returns once the pod is gone or being deleted.
    async fn deleted(&mut self) {
        loop {
            let gone = self
                .rx
                .borrow()
                .as_ref()
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            if gone || self.rx.changed().await.is_err() {
                return;
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
        if self.shared.contained {
            match Network::start(self.shared.api_port, &pod_ports(pod)).await {
                Ok(network) => {
                    self.log(&format!("pod IP {}", network.ip));
                    self.network = Some(Arc::new(network));
                }
                Err(e) => {
                    let message = format!("the pod's network: {e}");
                    self.statuses.all_waiting("ContainerCreating", &message);
                    self.write_status().await;
                    return Ending::Settled;
                }
            }
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
        let restarts = |exit_code: i32| match spec.restart_policy.as_deref() {
            Some("Never") => false,
            Some("OnFailure") => exit_code != 0,
            _ => true,
        };
        let mut backoff = CRASH_BACKOFF;
        loop {
            let probe = self
                .network
                .clone()
                .and_then(|network| probe_readiness(network, &spec.containers[0]));
            let slot = &mut self.statuses.main[0];
            slot.state = State::Running {
                started_at: Timestamp::now(),
            };
            slot.ready = probe.as_ref().map(|_| false);
            let (prober, readiness) = probe.unzip();
            self.readiness = readiness;
            self.write_status().await;
            let started = tokio::time::Instant::now();
            let exit = self.run_process(&main).await;
            if let Some(prober) = prober {
                prober.abort();
            }
            self.readiness = None;
            let termination = match exit {
                Exit::Gone => return Ending::Gone,
                Exit::Done(termination) => termination,
            };
            let deleting = self
                .current()
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            let slot = &mut self.statuses.main[0];
            slot.ready = slot.ready.map(|_| false);
            if deleting || !restarts(termination.exit_code) {
                slot.state = State::Terminated(termination);
                self.write_status().await;
                return Ending::Settled;
            }
            // As a kubelet: the wait before a restart doubles up to five
            // minutes, and starts over after ten minutes of running.
            if started.elapsed() > Duration::from_secs(600) {
                backoff = CRASH_BACKOFF;
            }
            let line = format!(
                "container {} exited {}: restarting in {}s",
                main.container,
                termination.exit_code,
                backoff.as_secs()
            );
            slot.restarts += 1;
            slot.last = Some(termination);
            slot.state = waiting(
                "CrashLoopBackOff",
                Some(format!(
                    "back-off {}s restarting failed container",
                    backoff.as_secs()
                )),
            );
            self.log(&line);
            self.write_status().await;
            let until = tokio::time::Instant::now() + backoff;
            while tokio::time::Instant::now() < until {
                if self.pause(until - tokio::time::Instant::now()).await {
                    return Ending::Settled;
                }
            }
            backoff = (backoff * 2).min(Duration::from_secs(300));
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
            // crane may take seconds over a large image.
            let images = self.shared.images.clone();
            let reference = slot.image.clone();
            let pulled = tokio::task::spawn_blocking(move || images.pull(&reference))
                .await
                .unwrap_or_else(|e| Err(format!("pulling: {e}")));
            match pulled {
                Ok((_, image_id)) => slot.image_id = image_id,
                Err(message) => {
                    slot.state = waiting("ErrImagePull", Some(message));
                    unknown = true;
                }
            }
        }
        if unknown {
            self.log("an image was not pulled: ErrImagePull");
            self.write_status().await;
            return Err(());
        }
        Ok(())
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
                if let Some(network) = &self.network {
                    return self
                        .contained_process(pod, container, &image, network, &mut objects)
                        .await;
                }
                let root_has = |p: &Path| p.exists();
                let argv = host_argv(
                    &image,
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
                        token_kubeconfig(
                            &self.shared.server,
                            &self.shared.ca_data,
                            &token,
                            "pod",
                            None,
                        )
                        .as_bytes(),
                        0o600,
                    )
                    .map_err(mounting)?;
                    token_written = true;
                }
                let image_env = image.env().to_vec();
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
                    jail: None,
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
