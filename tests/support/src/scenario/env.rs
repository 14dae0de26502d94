//! What a test does through its [`Env`]: objects, Jobs, events, the
//! manager's restarts.

use super::*;

impl Env {
    pub fn api<K: Workload>(&self) -> Api<K> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// How many passes over `kind`/`name` the manager has logged (its
    /// debug `pass ... requests=N` lines).
    pub fn passes(&self, kind: Kind, name: &str) -> usize {
        let (kind, name) = (format!("kind={}", kind.kind()), format!("name={name} "));
        self.manager
            .log()
            .lines()
            .filter(|l| l.contains(" pass ") && l.contains(&kind) && l.contains(&name))
            .count()
    }

    /// Waits for `n` more passes over `kind`/`name` than now.
    pub async fn more_passes(&self, kind: Kind, name: &str, n: usize) {
        let now = self.passes(kind, name);
        within(self, 120, &format!("{n} passes over {name}"), || async {
            (self.passes(kind, name) >= now + n).then_some(())
        })
        .await;
    }

    /// Deletes the Secret `name` for good: CAPTF's protection finalizer is
    /// taken off first, as a person who means it would.
    pub async fn lose_secret(&self, name: &str) {
        let secrets = self.secrets();
        let secret = secrets.get(name).await.unwrap();
        let kept: Vec<String> = secret
            .finalizers()
            .iter()
            .filter(|f| *f != "captf.io/protection")
            .cloned()
            .collect();
        secrets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": kept}})),
            )
            .await
            .unwrap();
        secrets
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Creates `name` (cluster-scoped) allowing only `namespace`, over the
    /// Secret `creds` of this test's namespace.
    pub async fn identity_allowing(&self, name: &str, namespace: &str) {
        create_identity(&self.client, name, &self.ns, namespace).await;
    }

    /// A TerraformCluster of `image` with this test's identity.
    pub async fn cluster(
        &self,
        name: &str,
        image: &str,
        variables: Option<Variables>,
    ) -> TerraformCluster {
        let workspace = WorkspaceSpec {
            source: Source {
                image: image.into(),
                image_pull_policy: None,
            },
            identity_ref: Some(IdentityReference {
                name: self.identity.clone(),
            }),
            variables,
            ..Default::default()
        };
        self.create_cluster(name, workspace).await
    }

    pub async fn create_cluster(&self, name: &str, workspace: WorkspaceSpec) -> TerraformCluster {
        let mut c = TerraformCluster::new(
            name,
            TerraformClusterSpec {
                workspace,
                ..Default::default()
            },
        );
        c.metadata.labels = labels(name);
        c.metadata.owner_references = Some(vec![
            crate::owners::cluster(&self.client, &self.ns, name).await,
        ]);
        self.api::<TerraformCluster>()
            .create(&PostParams::default(), &c)
            .await
            .unwrap()
    }

    /// A TerraformMachine of the noop module in `cluster`.
    pub async fn machine(
        &self,
        name: &str,
        cluster: &str,
        variables: Option<Variables>,
    ) -> TerraformMachine {
        self.create_machine(name, cluster, noop(variables)).await
    }

    pub async fn create_machine(
        &self,
        name: &str,
        cluster: &str,
        workspace: WorkspaceSpec,
    ) -> TerraformMachine {
        let mut m = TerraformMachine::new(
            name,
            TerraformMachineSpec {
                workspace,
                ..Default::default()
            },
        );
        m.metadata.labels = labels(cluster);
        crate::owners::external_cluster(&self.client, &self.ns, cluster, &self.identity).await;
        m.metadata.owner_references = Some(vec![
            crate::owners::machine(&self.client, &self.ns, name, cluster).await,
        ]);
        self.api::<TerraformMachine>()
            .create(&PostParams::default(), &m)
            .await
            .unwrap()
    }

    pub async fn status<K: Workload>(&self, name: &str) -> Option<WorkspaceStatus> {
        self.api::<K>()
            .get_opt(name)
            .await
            .ok()??
            .workspace_status()
            .cloned()
    }

    pub async fn machine_status(&self, name: &str) -> Option<WorkspaceStatus> {
        self.status::<TerraformMachine>(name).await
    }

    pub async fn cluster_status(&self, name: &str) -> Option<WorkspaceStatus> {
        self.status::<TerraformCluster>(name).await
    }

    /// The finalizers of an object (none once it is gone).
    pub async fn finalizers<K: Workload>(&self, name: &str) -> Vec<String> {
        self.api::<K>()
            .get_opt(name)
            .await
            .unwrap()
            .map(|o| o.finalizers().to_vec())
            .unwrap_or_default()
    }

    /// Deletes an object (it stays while it has a finalizer).
    pub async fn delete<K: Workload>(&self, name: &str) {
        self.api::<K>()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Whether the object is gone (404).
    pub async fn gone<K: Workload>(&self, name: &str) -> bool {
        self.api::<K>().get_opt(name).await.unwrap().is_none()
    }

    /// Waits up to `secs` until the object is gone.
    pub async fn wait_gone<K: Workload>(&self, secs: u64, name: &str) {
        let what = format!("{} {name} gone", K::KIND.kind());
        within(self, secs, &what, || async {
            self.gone::<K>(name).await.then_some(())
        })
        .await;
    }

    /// The state Secret suffix of an object of this namespace.
    pub fn suffix(&self, kind: Kind, name: &str) -> String {
        names::suffix(&self.ns, kind, name)
    }

    /// The names of the state Secrets of `suffix` (every chunk).
    pub async fn state_secrets(&self, suffix: &str) -> Vec<String> {
        let list = self
            .secrets()
            .list(&ListParams::default().labels(&captf::state::label_selector(suffix)))
            .await
            .unwrap();
        list.items.iter().map(|s| s.name_any()).collect()
    }

    /// The names of the state backup Secrets of `suffix` (every chunk).
    pub async fn backup_secrets(&self, suffix: &str) -> Vec<String> {
        let selector = format!("captf.io/state-backup=true,captf.io/state-backup-suffix={suffix}");
        let list = self
            .secrets()
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        list.items.iter().map(|s| s.name_any()).collect()
    }

    /// The Jobs of the namespace, oldest first.
    pub async fn jobs(&self) -> Vec<Job> {
        let mut jobs = Api::<Job>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        jobs.sort_by_key(|j| j.metadata.creation_timestamp.clone().map(|t| t.0));
        jobs
    }

    /// The Jobs whose names begin with `prefix` (`captf-m-m-destroy-`).
    pub async fn jobs_named(&self, prefix: &str) -> Vec<Job> {
        self.jobs()
            .await
            .into_iter()
            .filter(|j| j.name_any().starts_with(prefix))
            .collect()
    }

    /// The events of the namespace with `reason`.
    pub async fn events(&self, reason: &str) -> Vec<Event> {
        let mut events: Vec<Event> = Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect();
        events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
        events
    }

    /// The events with `reason` about the object `name` of `kind`.
    pub async fn events_about(&self, reason: &str, kind: Kind, name: &str) -> Vec<Event> {
        let about = |e: &Event| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some(kind.kind()) && r.name.as_deref() == Some(name)
            })
        };
        self.events(reason)
            .await
            .into_iter()
            .filter(about)
            .collect()
    }

    /// The managers' and the executor's logs, for a failure message.
    pub fn context(&self) -> String {
        let away = match &self.away_executor {
            Some(e) => format!("\n--- executor log of {}:\n{}", self.away, tail(&e.log())),
            None => String::new(),
        };
        format!(
            "\n--- manager log:\n{}\n--- executor log:\n{}{away}",
            tail(&self.manager.log()),
            tail(&self.executor.log())
        )
    }

    /// Another manager for this namespace, ready, with `extra` flags.
    pub async fn start_manager(&self, extra: &[&str]) -> Manager {
        start_manager(self.plane, &self.binary, &self.ns, &self.away, extra).await
    }

    /// Runs the pods of the manager's namespace too: the destroys of a
    /// namespace being deleted.
    pub async fn run_away_pods(&mut self) {
        self.away_executor =
            Some(Executor::start_in(self.client.clone(), self.plane, images(), &self.away).await);
    }

    /// Stops the manager and starts a new one with `extra` flags.
    pub async fn restart_manager(&mut self, extra: &[&str]) {
        self.manager.stop();
        self.manager = self.start_manager(extra).await;
    }
}
