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
pub mod recorder;
pub mod remediation;
pub mod schedule;
pub mod sweep;
pub mod watches;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::Reporter;

use self::recorder::Recorder;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::error::{Categorized, Category, kube_category};
use crate::keys::WATCH_FILTER_LABEL;
use crate::metrics::Metrics;
use crate::server::health::{GATE_WATCHES, Readiness};
use watches::{Scope, View, Watches};
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
    /// The view of the cluster the passes read.
    pub watches: Arc<Watches>,
    /// Starts undone because their per-run Secret was refused.
    pub undone_starts: reconcile::UndoneStarts,
    /// Jobs bookkept that the watch may not show so yet.
    pub bookkept: reconcile::Bookkept,
    /// True once every watch and the three controllers' stores have
    /// listed: no pass runs before, as a machine's pass reads its cluster
    /// from the clusters' controller store, which lists on its own time.
    pub listed: tokio::sync::watch::Receiver<bool>,
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
    /// A guarded write found its object (this one, or the namespace's
    /// credentials mirror) changed since the pass read it.
    #[error("an object changed since this pass read it; it is read again")]
    Stale,
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
            Error::Mirror(_) | Error::Stale => Category::Transient,
            Error::MissingMetadata(_) | Error::Encode(_) => Category::Invalid,
        }
    }
}

/// The name under which the manager records events and applies status.
pub const MANAGER: &str = "captf-manager";

fn watch_config(settings: &Settings) -> watcher::Config {
    match &settings.watch_filter {
        Some(value) => watcher::Config::default().labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => watcher::Config::default(),
    }
}

/// The changes a Job brings come in bursts (its pod's phase, the Job's
/// status, the lock's Lease, the state Secret, each from another writer
/// within milliseconds): an object waits this long after the last change
/// of a burst, so that one pass reads them all (`cargo bench --bench jobs`
/// counts the passes per Job).
const DEBOUNCE: Duration = Duration::from_millis(100);

fn passes(concurrency: u16) -> controller::Config {
    controller::Config::default()
        .concurrency(concurrency)
        .debounce(DEBOUNCE)
}

fn error_policy<K: Workload>(_obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::Stale = error {
        // Expected now and then: the cache catches up within moments.
        debug!(kind = K::KIND.kind(), "{error}");
        return Action::requeue(Duration::from_secs(1));
    }
    warn!(kind = K::KIND.kind(), "reconcile failed: {error}");
    match error.category() {
        Category::Transient => Action::requeue(Duration::from_secs(5)),
        _ => Action::requeue(Duration::from_secs(30)),
    }
}

/// Runs the three reconcilers until `shutdown` resolves. `readiness`'s
/// watches gate opens once every watch has listed; no pass runs before.
pub async fn run(
    client: kube::Client,
    metrics: Arc<Metrics>,
    settings: Settings,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let (sweeps, asked) = tokio::sync::mpsc::unbounded_channel();
    let scope = Scope {
        client: client.clone(),
        namespace: settings.namespace.clone(),
        away: settings.away.clone(),
    };
    let View {
        watches,
        clusters,
        machines,
        pools,
    } = watches::view(&scope, &watch_config(&settings));
    let (cluster_store, machine_store, pool_store) = (
        clusters.store.clone(),
        machines.store.clone(),
        pools.store.clone(),
    );
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
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
        watches: watches.clone(),
        undone_starts: Default::default(),
        bookkept: Default::default(),
        listed,
    });

    let stores = (
        cluster_store.clone(),
        machine_store.clone(),
        pool_store.clone(),
    );
    let synced = watches.clone();
    let ready = readiness.clone();
    let gate = tokio::spawn(async move {
        // Polled, not awaited: kube's store readiness wakes only the last
        // task that waited on it, and each controller waits on its own.
        loop {
            let all = [
                matches!(stores.0.wait_until_ready().now_or_never(), Some(Ok(()))),
                matches!(stores.1.wait_until_ready().now_or_never(), Some(Ok(()))),
                matches!(stores.2.wait_until_ready().now_or_never(), Some(Ok(()))),
                synced.synced(),
            ];
            if all.iter().all(|s| *s) {
                info!("watches synced");
                listed_tx.send_replace(true);
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
        watches.clone(),
        (cluster_store, machine_store, pool_store),
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
    let clusters = Controller::for_stream(clusters.events, clusters.store)
        .reconcile_on(clusters.changes)
        .graceful_shutdown_on(shutdown.clone())
        .with_config(passes(c.cluster))
        .run(
            reconcile::reconcile::<TerraformCluster>,
            error_policy,
            ctx.clone(),
        )
        .for_each(log_outcome);
    let machines = Controller::for_stream(machines.events, machines.store)
        .reconcile_on(machines.changes)
        .graceful_shutdown_on(shutdown.clone())
        .with_config(passes(c.machine))
        .run(
            reconcile::reconcile::<TerraformMachine>,
            error_policy,
            ctx.clone(),
        )
        .for_each(log_outcome);
    let pools = Controller::for_stream(pools.events, pools.store)
        .reconcile_on(pools.changes)
        .graceful_shutdown_on(shutdown.clone())
        .with_config(passes(c.machine_pool))
        .run(
            reconcile::reconcile::<TerraformMachinePool>,
            error_policy,
            ctx,
        )
        .for_each(log_outcome);
    // No pass before every watch has listed: an unlisted store would read
    // as "no Job, no state".
    tokio::select! {
        () = watches.wait_synced() => {
            tokio::join!(clusters, machines, pools);
        }
        () = shutdown => {}
    }
    gate.abort();
    sweeper.abort();
    asked_sweeps.abort();
    watches.stop();
    info!("the reconcilers stopped");
}

async fn log_outcome<T: std::fmt::Debug, E: std::fmt::Display>(outcome: Result<T, E>) {
    match outcome {
        Ok(object) => debug!(?object, "reconciled"),
        Err(e) => warn!("{e}"),
    }
}
