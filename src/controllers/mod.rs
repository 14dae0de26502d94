//! The reconcilers of TerraformCluster, TerraformMachine and
//! TerraformMachinePool over one shared core (ref §8.1, as far as this
//! manager goes so far). Decisions are pure (conditions, decide,
//! bookkeeping, credentials' rules); `reconcile` gathers the facts, calls
//! them and applies the outcome.

pub mod approval;
pub mod assessment;
pub mod bookkeeping;
pub mod conditions;
pub mod credentials;
pub mod decide;
pub mod deletion;
pub mod figures;
pub mod history;
pub mod ledger;
mod reconcile;
pub mod remediation;
pub mod schedule;
pub mod sweep;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::capi::objects::{Cluster, ContractRef, Machine, MachinePool};
use crate::capi::owners::owner_ref;
use crate::error::{Categorized, Category, kube_category};
use crate::jobs::variables::{self, SourceKind};
use crate::keys::{
    CLUSTER_NAME_LABEL, LEASE_LABEL, MANAGED_LABEL, OWNER_KIND_LABEL, OWNER_UID_LABEL,
    VARIABLES_LABEL, WATCH_FILTER_LABEL,
};
use crate::metrics::Metrics;
use crate::names::Kind;
use crate::server::health::{GATE_WATCHES, Readiness};
use kube::ResourceExt;
use workload::Workload;

/// What every reconcile shares.
pub struct Context {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub settings: Settings,
    /// Namespaces to sweep soon: every finalizer removal asks, and the
    /// asks of a moment are swept once (a namespace of a thousand objects
    /// deleted at once is not swept a thousand times).
    pub sweeps: tokio::sync::mpsc::UnboundedSender<String>,
}

/// The manager flags the reconcilers use.
#[derive(Clone, Debug)]
pub struct Settings {
    pub runner_image: String,
    pub cluster_operation_gate: bool,
    /// Backups kept per object; 0 takes none.
    pub state_backups: u32,
    pub namespace: Option<String>,
    /// The manager's own namespace, where the destroys of objects whose
    /// namespace is being deleted run ([`crate::jobs::away`]).
    pub away: Option<String>,
    pub watch_filter: Option<String>,
    pub sync_period: Duration,
    pub concurrency: Concurrency,
    /// `--drift-default-interval`: the drift interval of objects that set
    /// none and inherit none.
    pub drift_default_interval: Duration,
    /// `--runner-events`: runners report their progress as events.
    pub runner_events: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Concurrency {
    pub cluster: u16,
    pub machine: u16,
    pub machine_pool: u16,
}

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API request failed: {0}")]
    Kube(#[source] kube::Error),
    #[error("reading the state: {0}")]
    State(#[from] crate::state::ReadError),
    #[error("runner RBAC: {0}")]
    Rbac(#[from] crate::jobs::rbac::RbacError),
    #[error("{0}")]
    Away(#[source] crate::jobs::away::AwayError),
    #[error("lease: {0}")]
    Lease(#[from] crate::jobs::leases::LeaseError),
    #[error("state lock: {0}")]
    Lock(#[from] crate::locks::LockError),
    #[error("state backups: {0}")]
    Backup(#[source] crate::backups::BackupError),
    #[error("durable inputs: {0}")]
    Durable(#[source] crate::jobs::durable::DurableError),
    #[error("plan Secrets: {0}")]
    PlanSecrets(#[source] crate::jobs::plans::PlanSecretsError),
    #[error("credentials mirror: {0}")]
    Mirror(String),
    #[error("the object has no {0}")]
    MissingMetadata(&'static str),
    #[error("encoding the status: {0}")]
    Encode(#[source] serde_json::Error),
}

impl Categorized for Error {
    fn category(&self) -> Category {
        match self {
            Error::Kube(e) => kube_category(e),
            Error::State(e) => e.category(),
            Error::Rbac(e) => e.category(),
            Error::Away(e) => e.category(),
            Error::Lease(e) => e.category(),
            Error::Lock(e) => e.category(),
            Error::Backup(e) => e.category(),
            Error::Durable(e) => e.category(),
            Error::PlanSecrets(e) => e.category(),
            // A conflict with another object's write, mostly: read again.
            Error::Mirror(_) => Category::Transient,
            Error::MissingMetadata(_) | Error::Encode(_) => Category::Invalid,
        }
    }
}

/// The name under which the manager records events and applies status.
pub const MANAGER: &str = "captf-manager";

/// An API of every namespace, or of the one `--namespace` names.
fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn watch_config(settings: &Settings) -> watcher::Config {
    match &settings.watch_filter {
        Some(value) => watcher::Config::default().labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => watcher::Config::default(),
    }
}

fn error_policy<K: Workload>(_obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(kind = K::KIND.kind(), "reconcile failed: {error}");
    match error.category() {
        Category::Transient => Action::requeue(Duration::from_secs(5)),
        _ => Action::requeue(Duration::from_secs(30)),
    }
}

/// Runs the three reconcilers until `shutdown` resolves. `readiness`'s
/// watches gate opens once every controller's cache has synced.
pub async fn run(
    client: kube::Client,
    metrics: Arc<Metrics>,
    settings: Settings,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let (sweeps, asked) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client: client.clone(),
        metrics,
        settings: settings.clone(),
        sweeps,
    });
    let ns = settings.namespace.as_deref();
    // Only CAPTF's own Jobs and cluster write Leases are watched.
    let jobs = || scoped::<Job>(&client, ns);
    let job_config = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    let lease_config = watcher::Config::default().labels(&format!("{LEASE_LABEL}=cluster"));

    let clusters = Controller::new(
        scoped::<TerraformCluster>(&client, ns),
        watch_config(&settings),
    )
    .owns(jobs(), job_config.clone())
    .graceful_shutdown_on(shutdown.clone());
    // A cluster being deleted waits for its machines and pools: each change
    // of one (its removal above all) wakes the cluster.
    let clusters_store = clusters.store();
    let clusters = clusters.watches(
        scoped::<TerraformMachine>(&client, ns),
        watcher::Config::default(),
        move |m: TerraformMachine| same_cluster(&clusters_store, &m),
    );
    let clusters_store = clusters.store();
    let clusters = clusters.watches(
        scoped::<TerraformMachinePool>(&client, ns),
        watcher::Config::default(),
        move |p: TerraformMachinePool| same_cluster(&clusters_store, &p),
    );
    let machines = Controller::new(
        scoped::<TerraformMachine>(&client, ns),
        watch_config(&settings),
    )
    .owns(jobs(), job_config.clone())
    .graceful_shutdown_on(shutdown.clone());
    let pools = Controller::new(
        scoped::<TerraformMachinePool>(&client, ns),
        watch_config(&settings),
    )
    .owns(jobs(), job_config)
    .graceful_shutdown_on(shutdown.clone());
    // A machine or pool waiting for its cluster's operation is woken when
    // the cluster write lease changes.
    let machines_store = machines.store();
    let machines = machines.watches(
        scoped::<Lease>(&client, ns),
        lease_config.clone(),
        move |lease: Lease| same_cluster(&machines_store, &lease),
    );
    let pools_store = pools.store();
    let pools = pools.watches(
        scoped::<Lease>(&client, ns),
        lease_config,
        move |lease: Lease| same_cluster(&pools_store, &lease),
    );

    // The destroys run from the manager's namespace carry no owner
    // reference: their object is found by the uid label.
    let (clusters, machines, pools) = match settings.away.as_deref() {
        Some(away) => (
            wake_on_away_jobs(clusters, &client, away),
            wake_on_away_jobs(machines, &client, away),
            wake_on_away_jobs(pools, &client, away),
        ),
        None => (clusters, machines, pools),
    };

    // An object waiting for a variablesFrom source, or using one that
    // changed, is woken by the source: only labeled ConfigMaps and Secrets
    // are watched.
    let sources = watcher::Config::default().labels(&format!("{VARIABLES_LABEL}=true"));
    let clusters = wake_on_sources(clusters, &client, ns, &sources);
    let machines = wake_on_sources(machines, &client, ns, &sources);
    let pools = wake_on_sources(pools, &client, ns, &sources);

    let (clusters, machines, pools) = wake_on_owners(clusters, machines, pools, &client, ns);

    let stores = (clusters.store(), machines.store(), pools.store());
    let ready = readiness.clone();
    tokio::spawn(async move {
        // Polled, not awaited: kube's store readiness wakes only the last
        // task that waited on it, and each controller waits on its own.
        loop {
            let all = [
                matches!(stores.0.wait_until_ready().now_or_never(), Some(Ok(()))),
                matches!(stores.1.wait_until_ready().now_or_never(), Some(Ok(()))),
                matches!(stores.2.wait_until_ready().now_or_never(), Some(Ok(()))),
            ];
            if all.iter().all(|s| *s) {
                info!("watches synced");
                ready.mark_ready(GATE_WATCHES);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    // The namespace sweep: at start, then every --sync-period, and soon
    // after a finalizer removal.
    let sweeper = tokio::spawn(sweep::periodically(
        client.clone(),
        settings.namespace.clone(),
        settings.away.clone(),
        settings.sync_period,
    ));
    let asked_sweeps = tokio::spawn(sweep::when_asked(
        client.clone(),
        settings.away.clone(),
        asked,
    ));

    info!(namespace = ?settings.namespace, "starting the reconcilers");
    let c = settings.concurrency;
    let clusters = clusters
        .with_config(kube::runtime::controller::Config::default().concurrency(c.cluster))
        .run(
            reconcile::reconcile::<TerraformCluster>,
            error_policy,
            ctx.clone(),
        )
        .for_each(log_outcome);
    let machines = machines
        .with_config(kube::runtime::controller::Config::default().concurrency(c.machine))
        .run(
            reconcile::reconcile::<TerraformMachine>,
            error_policy,
            ctx.clone(),
        )
        .for_each(log_outcome);
    let pools = pools
        .with_config(kube::runtime::controller::Config::default().concurrency(c.machine_pool))
        .run(
            reconcile::reconcile::<TerraformMachinePool>,
            error_policy,
            ctx,
        )
        .for_each(log_outcome);
    tokio::join!(clusters, machines, pools);
    sweeper.abort();
    asked_sweeps.abort();
    info!("the reconcilers stopped");
}

async fn log_outcome<T: std::fmt::Debug, E: std::fmt::Display>(outcome: Result<T, E>) {
    match outcome {
        Ok(object) => debug!(?object, "reconciled"),
        Err(e) => warn!("{e}"),
    }
}

fn wake_on_sources<K: Workload>(
    controller: Controller<K>,
    client: &kube::Client,
    ns: Option<&str>,
    config: &watcher::Config,
) -> Controller<K> {
    let store = controller.store();
    let controller = controller.watches(
        scoped::<ConfigMap>(client, ns),
        config.clone(),
        move |c: ConfigMap| referencing(&store, SourceKind::ConfigMap, &c),
    );
    let store = controller.store();
    controller.watches(
        scoped::<Secret>(client, ns),
        config.clone(),
        move |s: Secret| referencing(&store, SourceKind::Secret, &s),
    )
}

/// Each object is woken by its owner (ref §8.1 step 2) and by what its
/// inputs come from: the Cluster (paused, endpoint, initialization,
/// infrastructure provisioned) wakes its TerraformCluster, machines and
/// pools; a Machine or MachinePool wakes the object its infrastructureRef
/// names; a TerraformCluster (its state's exports, through its status)
/// wakes its machines and pools.
fn wake_on_owners(
    clusters: Controller<TerraformCluster>,
    machines: Controller<TerraformMachine>,
    pools: Controller<TerraformMachinePool>,
    client: &kube::Client,
    ns: Option<&str>,
) -> (
    Controller<TerraformCluster>,
    Controller<TerraformMachine>,
    Controller<TerraformMachinePool>,
) {
    let all = watcher::Config::default;
    let clusters = clusters.watches(scoped::<Cluster>(client, ns), all(), |c: Cluster| {
        named_by(c.spec.infrastructure_ref.as_ref(), &c)
    });
    let machines = machines.watches(scoped::<Machine>(client, ns), all(), |m: Machine| {
        named_by(m.spec.infrastructure_ref.as_ref(), &m)
    });
    let pools = pools.watches(
        scoped::<MachinePool>(client, ns),
        all(),
        |p: MachinePool| named_by(p.spec.template.spec.infrastructure_ref.as_ref(), &p),
    );
    let store = machines.store();
    let machines = machines.watches(scoped::<Cluster>(client, ns), all(), move |c: Cluster| {
        in_cluster(&store, &c, c.metadata.name.as_deref())
    });
    let store = pools.store();
    let pools = pools.watches(scoped::<Cluster>(client, ns), all(), move |c: Cluster| {
        in_cluster(&store, &c, c.metadata.name.as_deref())
    });
    let store = machines.store();
    let machines = machines.watches(
        scoped::<TerraformCluster>(client, ns),
        all(),
        move |c: TerraformCluster| in_cluster(&store, &c, cluster_of(&c)),
    );
    let store = pools.store();
    let pools = pools.watches(
        scoped::<TerraformCluster>(client, ns),
        all(),
        move |c: TerraformCluster| in_cluster(&store, &c, cluster_of(&c)),
    );
    (clusters, machines, pools)
}

/// The Cluster a TerraformCluster belongs to: its owner's name, else its
/// cluster-name label.
fn cluster_of(c: &TerraformCluster) -> Option<&str> {
    owner_ref(Kind::Cluster, c.owner_references())
        .map(|r| r.name.as_str())
        .or_else(|| c.cluster_name())
}

/// The object of kind `K` that `infra` names, in `owner`'s namespace.
fn named_by<K: Workload>(
    infra: Option<&ContractRef>,
    owner: &impl kube::Resource,
) -> Option<ObjectRef<K>> {
    let infra = infra.filter(|r| r.api_group == crate::api::GROUP && r.kind == K::KIND.kind())?;
    let ns = owner.meta().namespace.as_deref()?;
    Some(ObjectRef::new(&infra.name).within(ns))
}

/// The objects of `other`'s namespace whose cluster-name label is `name`.
fn in_cluster<K: Workload>(
    store: &kube::runtime::reflector::Store<K>,
    other: &impl kube::Resource,
    name: Option<&str>,
) -> Vec<ObjectRef<K>> {
    let ns = other.meta().namespace.as_deref();
    if name.is_none() {
        return Vec::new();
    }
    store
        .state()
        .iter()
        .filter(|o| o.meta().namespace.as_deref() == ns && o.cluster_name() == name)
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

fn wake_on_away_jobs<K: Workload>(
    controller: Controller<K>,
    client: &kube::Client,
    away: &str,
) -> Controller<K> {
    let store = controller.store();
    let config = watcher::Config::default().labels(&format!(
        "{MANAGED_LABEL}=true,{OWNER_KIND_LABEL}={},{OWNER_UID_LABEL}",
        K::KIND.kind()
    ));
    controller.watches(
        Api::<Job>::namespaced(client.clone(), away),
        config,
        move |job: Job| {
            let uid = kube::ResourceExt::labels(&job)
                .get(OWNER_UID_LABEL)
                .cloned();
            store
                .state()
                .iter()
                .find(|o| o.meta().uid.is_some() && o.meta().uid == uid)
                .map(|o| ObjectRef::from_obj(o.as_ref()))
        },
    )
}

/// The objects of `source`'s namespace whose `variablesFrom` names it.
fn referencing<K: Workload>(
    store: &kube::runtime::reflector::Store<K>,
    kind: SourceKind,
    source: &impl kube::Resource,
) -> Vec<ObjectRef<K>> {
    let ns = source.meta().namespace.as_deref();
    let Some(name) = source.meta().name.as_deref() else {
        return Vec::new();
    };
    store
        .state()
        .iter()
        .filter(|o| {
            o.meta().namespace.as_deref() == ns
                && o.workspace()
                    .variables_from
                    .iter()
                    .flatten()
                    .any(|s| variables::reference(s) == Some((kind, name)))
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// The objects of the namespace that carry `other`'s cluster-name label.
fn same_cluster<K: Workload>(
    store: &kube::runtime::reflector::Store<K>,
    other: &impl kube::Resource,
) -> Vec<ObjectRef<K>> {
    let ns = other.meta().namespace.as_deref();
    let cluster = other
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(CLUSTER_NAME_LABEL));
    store
        .state()
        .iter()
        .filter(|o| {
            o.meta().namespace.as_deref() == ns && o.cluster_name() == cluster.map(String::as_str)
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}
