//! The reconcilers end to end, shared by their test files: a namespace
//! with an identity, the local pod executor in place of kubelet (real
//! OpenTofu in the Jobs' pods), and a manager process for that namespace
//! (`--namespace`), against the real API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use captf::api::{
    AllowedNamespaces, IdentityReference, LastRun, SecretReference, Source, TerraformCluster,
    TerraformClusterIdentity, TerraformClusterIdentitySpec, TerraformClusterSpec, TerraformMachine,
    TerraformMachineSpec, Variables, WorkspaceSpec, WorkspaceStatus,
};
use captf::controllers::workload::Workload;
use captf::names::{self, Kind};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::controlplane::{self, ControlPlane};
use crate::executor::{Executor, Image, Images};
use crate::manager::{Manager, install_crds, install_runner_role};

/// The noop module (tests/modules/noop).
pub const NOOP: &str = "captf.test/modules/noop:dev";
/// The noop module in an image whose ENV tries to steer tofu.
pub const POISONED: &str = "captf.test/modules/noop:poisoned-env";
/// A copy of the noop module that a test may change under the same
/// reference, as a module image republished under its tag would be
/// ([`Env::mutable_module`]).
pub const MUTABLE: &str = "captf.test/modules/mutable:dev";

/// One test's world.
pub struct Env {
    /// The control plane the namespace is on.
    pub plane: &'static ControlPlane,
    pub client: kube::Client,
    pub ns: String,
    /// The identity that allows `ns`; its Secret is `creds` in `ns`.
    pub identity: String,
    pub manager: Manager,
    pub executor: Executor,
    /// The manager's own namespace (its POD_NAMESPACE), where the destroys
    /// of a namespace being deleted run.
    pub away: String,
    /// The executor of `away`, once [`Env::run_away_pods`] started it.
    pub away_executor: Option<Executor>,
    binary: PathBuf,
    /// The module directory of [`MUTABLE`].
    pub mutable_module: PathBuf,
    _mutable: tempfile::TempDir,
}

/// A namespace with an identity that allows it (its Secret `creds` holds
/// `creds`), an executor and a manager (`binary`, the test crate's
/// `env!("CARGO_BIN_EXE_captf-manager")`) for that namespace, with `extra`
/// flags.
pub async fn setup(binary: &str, prefix: &str, creds: &[(&str, &str)], extra: &[&str]) -> Env {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    crate::capi::install_crds(&client).await;
    let ns = crate::namespace(&client, prefix).await;
    let identity = format!("id-{ns}");
    create_identity(&client, &identity, &ns, &ns).await;
    setup_in(controlplane::shared(), binary, &ns, &identity, creds, extra).await
}

/// [`setup`] on `plane`, in the namespace `ns` (created if missing), for
/// the identity `identity` that is left to the caller: what a namespace
/// needs once its objects arrive by a move.
pub async fn setup_in(
    plane: &'static ControlPlane,
    binary: &str,
    ns: &str,
    identity: &str,
    creds: &[(&str, &str)],
    extra: &[&str],
) -> Env {
    let client = plane.client().await;
    install_runner_role(&client).await;
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    let ns = ns.to_string();
    let identity = identity.to_string();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        string_data: Some(
            creds
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mutable = tempfile::tempdir().unwrap();
    let images = images();
    let Some(Image::Module(noop)) = images.get(NOOP) else {
        panic!("no {NOOP} image")
    };
    std::fs::copy(noop.module.join("main.tf"), mutable.path().join("main.tf")).unwrap();
    let images = images.with_module(
        MUTABLE,
        crate::executor::ModuleImage {
            module: mutable.path().to_owned(),
            ..noop
        },
    );
    let executor = Executor::start_in(client.clone(), plane, images, &ns).await;
    let away = crate::namespace(&client, &format!("{ns}-mgr")).await;
    let manager = start_manager(plane, Path::new(binary), &ns, &away, extra).await;
    Env {
        plane,
        client,
        ns,
        identity,
        manager,
        executor,
        away,
        away_executor: None,
        binary: PathBuf::from(binary),
        mutable_module: mutable.path().to_owned(),
        _mutable: mutable,
    }
}

/// The identity `name` over the Secret `creds` of `ns`, allowing only
/// `allowed`.
pub async fn create_identity(client: &kube::Client, name: &str, ns: &str, allowed: &str) {
    let id = TerraformClusterIdentity::new(
        name,
        TerraformClusterIdentitySpec {
            secret_ref: SecretReference {
                name: "creds".into(),
                namespace: ns.to_string(),
            },
            allowed_namespaces: Some(AllowedNamespaces {
                list: Some(vec![allowed.to_string()]),
                selector: None,
            }),
        },
    );
    Api::<TerraformClusterIdentity>::all(client.clone())
        .create(&PostParams::default(), &id)
        .await
        .unwrap();
}

async fn start_manager(
    plane: &'static ControlPlane,
    binary: &Path,
    ns: &str,
    away: &str,
    extra: &[&str],
) -> Manager {
    let namespace = format!("--namespace={ns}");
    let args: Vec<&str> = std::iter::once(namespace.as_str())
        .chain(extra.iter().copied())
        .collect();
    let mut manager = Manager::start_with_env(plane, binary, &args, &[("POD_NAMESPACE", away)]);
    manager.wait_ready().await;
    manager
}

/// Waits up to `secs` for `probe`; on a timeout, panics with what the
/// objects say and the manager's and executor's logs.
pub async fn within<T, F, Fut>(env: &Env, secs: u64, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() > deadline {
            let clusters = env
                .api::<TerraformCluster>()
                .list(&ListParams::default())
                .await;
            let machines = env
                .api::<TerraformMachine>()
                .list(&ListParams::default())
                .await;
            let statuses: Vec<String> = clusters
                .into_iter()
                .flat_map(|l| l.items.into_iter().map(|c| describe(&c)))
                .chain(
                    machines
                        .into_iter()
                        .flat_map(|l| l.items.into_iter().map(|m| describe(&m))),
                )
                .collect();
            panic!(
                "timed out after {secs}s waiting for {what}\n--- objects:\n{}{}",
                statuses.join("\n"),
                env.context()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An object's deletion, finalizers and conditions, one line each.
pub fn describe<K: Workload>(object: &K) -> String {
    let name = object.name_any();
    let deleting = object
        .meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| format!(" (deleting since {})", t.0))
        .unwrap_or_default();
    let header = format!(
        "{} {name}{deleting}, finalizers {:?}",
        K::KIND.kind(),
        object.finalizers()
    );
    let Some(status) = object.workspace_status() else {
        return format!("{header}: no status");
    };
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("  {}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "{header}:\n{}\n  lastRun: {:?}",
        conditions.join("\n"),
        status.last_run
    )
}

/// The last 60 lines of a log.
pub fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The test images, plus the noop module in an image whose ENV tries to
/// steer tofu ([`POISONED`]), and those of the test process's registry
/// once it runs ([`crate::registry::shared`]).
pub fn images() -> Images {
    let mut images = Images::for_tests();
    if let Some(registry) = crate::registry::started() {
        images = images.with_registry(registry.host());
    }
    let Some(Image::Module(noop)) = images.get(NOOP) else {
        panic!("no {NOOP} image")
    };
    let mut poisoned = noop.clone();
    poisoned.env = [
        ("TF_WORKSPACE", "poisoned"),
        ("TF_CLI_ARGS", "-poisoned-flag"),
        ("TF_VAR_message", "poisoned"),
        ("KUBE_CONFIG_PATH", "/poisoned"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec();
    images.with_module(POISONED, poisoned)
}

pub fn vars(pairs: &[(&str, serde_json::Value)]) -> Option<Variables> {
    Some(Variables(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    ))
}

/// The cluster-name label of the objects of `cluster`.
pub fn labels(cluster: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        "cluster.x-k8s.io/cluster-name".to_string(),
        cluster.to_string(),
    )]))
}

/// A workspace of the noop module with `variables`.
pub fn noop(variables: Option<Variables>) -> WorkspaceSpec {
    WorkspaceSpec {
        source: Source {
            image: NOOP.into(),
            image_pull_policy: None,
        },
        variables,
        ..Default::default()
    }
}

/// The finalizer of a kind, `<kind, lowercase>.infrastructure.cluster.x-k8s.io`.
pub fn finalizer(kind: Kind) -> String {
    format!(
        "{}.infrastructure.cluster.x-k8s.io",
        kind.kind().to_lowercase()
    )
}

/// The condition `type_` as (status, reason).
pub fn condition<'a>(status: &'a WorkspaceStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// The message of the condition `type_`.
pub fn condition_message<'a>(status: &'a WorkspaceStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.as_str())
}

pub fn applied(status: &WorkspaceStatus) -> bool {
    condition(status, "ApplyJobSucceeded") == Some(("True", "ApplySucceeded"))
        && condition(status, "StateReadable") == Some(("True", "StateRead"))
}

/// The names of the steps of a run.
pub fn steps(run: &LastRun) -> Vec<&str> {
    run.steps
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect()
}

pub fn job_failed(job: &Job) -> bool {
    failed_at(job).is_some()
}

/// When a Job failed: its Failed condition's transition.
pub fn failed_at(job: &Job) -> Option<Timestamp> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    let failed = conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")?;
    failed.last_transition_time.as_ref().map(|t| t.0)
}

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

/// A watch running in the background while this lives.
struct Watching(tokio::task::JoinHandle<()>);

impl Watching {
    /// Hands every event of a watch of `api` to `seen`.
    fn start<K>(
        api: Api<K>,
        config: watcher::Config,
        mut seen: impl FnMut(watcher::Event<K>) + Send + 'static,
    ) -> Watching
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let stream = watcher(api, config).default_backoff();
        Watching(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Ok(event) = event {
                    seen(event);
                }
            }
        }))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every status an object was written with, in order, as a watch sees
/// them (nothing is missed between two polls), and whether the watch saw
/// it deleted.
pub struct Statuses {
    seen: Arc<Mutex<(Vec<WorkspaceStatus>, bool)>>,
    _watching: Watching,
}

impl Statuses {
    pub fn watch<K: Workload>(env: &Env, name: &str) -> Statuses {
        let seen = Arc::new(Mutex::new((Vec::new(), false)));
        let sink = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let watching = Watching::start(env.api::<K>(), config, move |event| {
            let mut seen = sink.lock().unwrap();
            match event {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    seen.0.extend(o.workspace_status().cloned())
                }
                watcher::Event::Delete(_) => seen.1 = true,
                _ => {}
            }
        });
        Statuses {
            seen,
            _watching: watching,
        }
    }

    pub fn all(&self) -> Vec<WorkspaceStatus> {
        self.seen.lock().unwrap().0.clone()
    }

    /// The last status written.
    pub fn last(&self) -> Option<WorkspaceStatus> {
        self.all().pop()
    }

    /// Whether the watch saw the object deleted: then it saw every status.
    pub fn deleted(&self) -> bool {
        self.seen.lock().unwrap().1
    }

    /// The newest record of each run whose Job name contains `pattern`
    /// (`-destroy-`), in the order they were first seen.
    pub fn runs(&self, pattern: &str) -> Vec<LastRun> {
        let mut runs: Vec<LastRun> = Vec::new();
        for run in self
            .all()
            .into_iter()
            .filter_map(|s| s.last_run)
            .filter(|r| r.job.contains(pattern))
        {
            match runs.iter_mut().find(|r| r.job == run.job) {
                Some(known) => *known = run,
                None => runs.push(run),
            }
        }
        runs
    }
}

/// Every Job of the namespace a watch saw, even those collected since,
/// with its creation time.
pub struct JobsSeen {
    seen: Arc<Mutex<BTreeMap<String, Timestamp>>>,
    _watching: Watching,
}

impl JobsSeen {
    pub fn watch(env: &Env) -> JobsSeen {
        Self::watch_in(env, &env.ns)
    }

    /// The Jobs of namespace `ns`.
    pub fn watch_in(env: &Env, ns: &str) -> JobsSeen {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let sink = seen.clone();
        let api = Api::<Job>::namespaced(env.client.clone(), ns);
        let watching = Watching::start(api, watcher::Config::default(), move |event| {
            if let watcher::Event::Apply(job) | watcher::Event::InitApply(job) = event {
                let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
                sink.lock()
                    .unwrap()
                    .insert(job.name_any(), created.unwrap_or_default());
            }
        });
        JobsSeen {
            seen,
            _watching: watching,
        }
    }

    /// The destroy Jobs of an object the watch saw, oldest first.
    pub fn destroys(&self, kind: Kind, name: &str) -> Vec<(String, Timestamp)> {
        self.named(&format!("captf-{}-{name}-destroy-", kind.short()))
    }

    /// The Jobs whose names begin with `prefix`, oldest first.
    pub fn named(&self, prefix: &str) -> Vec<(String, Timestamp)> {
        let seen = self.seen.lock().unwrap();
        let mut jobs: Vec<(String, Timestamp)> = seen
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(n, t)| (n.clone(), *t))
            .collect();
        jobs.sort_by_key(|(name, created)| (*created, name.clone()));
        jobs
    }
}

/// Creates `n` TerraformMachines `m-0`... of cluster `c` in `ns`, with the
/// identity `identity` (one that does not allow `ns` keeps them from ever
/// being applied), a few at a time.
pub async fn many_machines(client: &kube::Client, ns: &str, n: usize, identity: &str) {
    let api = Api::<TerraformMachine>::namespaced(client.clone(), ns);
    let spec = |i: usize| {
        let mut m = TerraformMachine::new(
            &format!("m-{i}"),
            TerraformMachineSpec {
                workspace: WorkspaceSpec {
                    identity_ref: Some(IdentityReference {
                        name: identity.into(),
                    }),
                    ..noop(None)
                },
                ..Default::default()
            },
        );
        m.metadata.labels = labels("c");
        m
    };
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &spec(i)).await.unwrap() }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// A state Secret written by hand, in the backend's shape.
pub async fn put_state(env: &Env, kind: Kind, name: &str, payload: &[u8]) {
    let suffix = env.suffix(kind, name);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names::state_secret(&suffix)),
            labels: Some(state_labels(&suffix)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "tfstate".to_string(),
            k8s_openapi::ByteString(payload.to_vec()),
        )])),
        ..Default::default()
    };
    let params = PatchParams::apply("test").force();
    env.secrets()
        .patch(
            &names::state_secret(&suffix),
            &params,
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

/// The labels the kubernetes backend puts on the state Secrets of `suffix`.
pub fn state_labels(suffix: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("tfstate".to_string(), "true".to_string()),
        ("tfstateSecretSuffix".to_string(), suffix.to_string()),
        ("tfstateWorkspace".to_string(), "default".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "terraform".to_string(),
        ),
    ])
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A state whose compressed size is about `bytes`: one output holding
/// incompressible text.
pub fn big_state(bytes: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e3779b97f4a7c15;
    // 36 symbols: about 5.2 bits, two thirds of a byte, each once gzipped.
    let noise: String = (0..bytes * 3 / 2)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(x % 36) as usize])
        })
        .collect();
    let doc = json!({"version": 4, "terraform_version": "1.12.6", "serial": 7, "lineage": "l-1",
        "outputs": {"noise": {"value": noise, "type": "string"}}, "resources": []});
    gzip(doc.to_string().as_bytes())
}

/// A machine's lock Lease written by hand in the backend's shape, held by
/// `who` (over the Lease an earlier run left, if any).
pub async fn put_lock(env: &Env, machine: &str, who: &str) -> Lease {
    let suffix = env.suffix(Kind::Machine, machine);
    let id = "4f2c1a9e-0b7d-4c55-9d21-7a6f3e8b1c00";
    let info = json!({"ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
        "Version": "1.12.6", "Created": "2026-12-02T10:00:00.000000000Z", "Path": ""});
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(names::state_lock_lease(&suffix)),
            annotations: Some(BTreeMap::from([(
                "app.terraform.io/lock-info".to_string(),
                info.to_string(),
            )])),
            // The backend labels every lock Lease it creates as it labels
            // the state Secrets.
            labels: Some(state_labels(&suffix)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(id.into()),
            ..Default::default()
        }),
    };
    let params = PatchParams::apply("test").force();
    env.leases()
        .patch(
            &names::state_lock_lease(&suffix),
            &params,
            &Patch::Apply(&lease),
        )
        .await
        .unwrap()
}

/// Waits until the apply attempt `attempt` of an object is adopted and its
/// serial backed up; returns the state's serial.
pub async fn applied_and_backed_up<K: Workload>(env: &Env, name: &str, attempt: u32) -> u64 {
    let status = within(env, 240, "the apply adopted and backed up", || async {
        let s = env.status::<K>(name).await?;
        let run_ok = s
            .last_run
            .as_ref()
            .is_some_and(|r| r.job.contains(&format!("-apply-a{attempt}-")));
        let newest = s.state_backups.as_ref()?.first()?.serial;
        (applied(&s) && run_ok && s.observed_state_serial == Some(newest)).then_some(s)
    })
    .await;
    let serial = u64::try_from(status.observed_state_serial.unwrap()).unwrap();
    // The newest backup holds exactly the state Secret's bytes.
    let suffix = env.suffix(K::KIND, name);
    let state = env
        .secrets()
        .get(&names::state_secret(&suffix))
        .await
        .unwrap();
    let backup = env
        .secrets()
        .get(&names::backup_secret(&suffix, serial))
        .await
        .unwrap();
    assert_eq!(
        state.data.as_ref().unwrap()["tfstate"],
        backup.data.as_ref().unwrap()["tfstate"]
    );
    assert_eq!(
        backup
            .labels()
            .get("captf.io/state-backup")
            .map(String::as_str),
        Some("true")
    );
    let owner = env.api::<K>().get(name).await.unwrap();
    assert!(
        backup
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == owner.meta().uid.as_ref()),
        "a backup is owned by its object"
    );
    serial
}
