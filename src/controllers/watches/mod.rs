//! What the manager watches, and the view of the cluster a pass reads from.
//!
//! An idle pass makes no API request: everything it reads is answered from
//! watches, each by label (CAPTF's Jobs, their pods, the state and
//! CAPTF-managed Secrets as metadata only, the state lock Leases, the
//! labelled `variablesFrom` sources), besides the workload kinds, the
//! Cluster API owners, the identities and the namespaces' metadata. A
//! Secret's data is read only when its resourceVersion changed since it was
//! last read ([`derived`]). No watch takes every Secret of the cluster.
//!
//! Each watch also wakes the objects a change concerns ([`wake`]), after
//! its store took the change: a pass never reads a store older than what
//! woke it.

mod compact;
mod derived;
mod index;
mod lean;
mod sources;
mod wake;
mod workloads;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PartialObjectMeta};
use kube::core::NamespaceResourceScope;
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::api::{TerraformCluster, TerraformClusterIdentity};
use crate::capi::objects::{Cluster, Machine, MachinePool};
use crate::keys::{
    BACKUP_SUFFIX_LABEL, JOB_NAME_LABEL, MANAGED_LABEL, OWNER_NAME_LABEL, VARIABLES_LABEL,
};
use crate::state;

pub use compact::{Compact, Labelled};
pub use derived::{BackupSets, Derived, Versions, key};
use index::Index;
pub use lean::Lean;
pub use sources::Sources;
pub use wake::{Target, Wake};
pub use workloads::{Feed, View, Workloads, view};

/// One kind's stores: one per namespace scope watched (the objects'
/// namespaces, and the manager's own when destroys run there and it is not
/// among them), and the index of one label when the watch keeps one.
pub struct Scoped<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    stores: Vec<Store<K>>,
    index: Option<Arc<Index>>,
}

impl<K> Scoped<K>
where
    K: Labelled + Lookup + Clone + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Default,
{
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let key = ObjectRef::new_with(name, Default::default()).within(namespace);
        self.stores.iter().find_map(|s| s.get(&key))
    }

    pub fn filter(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.stores
            .iter()
            .flat_map(Store::state)
            .filter(|o| keep(o))
            .collect()
    }

    /// The objects of `namespace` whose indexed label (`label`) is `value`:
    /// from the index when the watch keeps one for that label.
    pub fn labelled(&self, namespace: &str, label: &str, value: &str) -> Vec<Arc<K>> {
        let carries = |o: &K| o.label(label) == Some(value);
        match self.index.as_ref().filter(|i| i.label == label) {
            Some(index) => index
                .lookup(namespace, value)
                .iter()
                .filter_map(|name| self.get(namespace, name))
                .filter(|o| carries(o))
                .collect(),
            None => self.filter(|o| o.object_namespace() == Some(namespace) && carries(o)),
        }
    }
}

/// The manager's view of the cluster, kept by watches.
pub struct Watches {
    pub jobs: Scoped<Job>,
    pub pods: Scoped<Pod>,
    /// The state lock Leases (the backend's `tfstate` label).
    pub lock_leases: Scoped<Lease>,
    /// CAPTF's Leases, ServiceAccounts and RoleBindings: what the
    /// namespace sweep looks for.
    pub leases: Scoped<PartialObjectMeta<Lease>>,
    pub accounts: Scoped<PartialObjectMeta<ServiceAccount>>,
    pub bindings: Scoped<RoleBinding>,
    /// The state chunk Secrets (the backend's `tfstate` label).
    pub state_secrets: Scoped<Compact<Secret>>,
    /// CAPTF's own Secrets: backups, durable inputs, mirrors, per-run and
    /// plan Secrets.
    pub managed_secrets: Scoped<Compact<Secret>>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub identities: Store<TerraformClusterIdentity>,
    /// The identities' Secrets, each watched by name once first read.
    pub identity_sources: Sources,
    pub variables_config_maps: Scoped<ConfigMap>,
    pub variables_secrets: Scoped<Secret>,
    pub clusters: Scoped<Cluster>,
    pub machines: Scoped<Machine>,
    pub machine_pools: Scoped<MachinePool>,
    /// The TerraformClusters: their controller's store.
    pub terraform_clusters: Store<TerraformCluster>,
    /// What was derived from Secrets' data, by their resourceVersions.
    pub derived: Derived,
    tasks: Vec<JoinHandle<()>>,
    synced: Vec<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl Watches {
    /// Whether every watch has listed once.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s())
    }

    /// Waits until [`Self::synced`].
    pub async fn wait_synced(&self) {
        // Polled: kube's store readiness wakes only the last task that
        // waited on it.
        while !self.synced() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
        self.identity_sources.stop();
    }
}

/// Where the watches look: every namespace, or `--namespace` and the
/// manager's own when destroys run there.
pub struct Scope {
    pub client: kube::Client,
    pub namespace: Option<String>,
    pub away: Option<String>,
}

impl Scope {
    fn namespaces(&self) -> Vec<Option<&str>> {
        match (&self.namespace, &self.away) {
            (None, _) => vec![None],
            (Some(ns), Some(away)) if ns != away => vec![Some(ns), Some(away)],
            (Some(ns), _) => vec![Some(ns)],
        }
    }

    pub fn api<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }
}

/// Builds the watches and starts them; `wake` wakes the objects a change
/// concerns.
fn start(scope: &Scope, wake: &Wake) -> Watches {
    let mut b = Builder::default();
    let managed = || watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    let tfstate = || watcher::Config::default().labels("tfstate=true");
    let variables = || watcher::Config::default().labels(&format!("{VARIABLES_LABEL}=true"));
    let all = watcher::Config::default;

    // What a pass reads of Jobs and their pods changes far less often
    // than they do: only those changes wake it.
    let jobs =
        b.by(OWNER_NAME_LABEL)
            .keyed(scope, managed(), wake::job_key, wake.by_owner_labels());
    let pods = b
        .by(JOB_NAME_LABEL)
        .keyed(scope, managed(), wake::pod_key, wake.by_owner_labels());
    let lock_leases = b.full(scope, tfstate(), wake.by_owner_labels());
    // The cluster write lease wakes the machines and pools waiting on it.
    let leases = b.full(scope, managed(), wake.of_cluster_lease());
    let accounts = b.full(scope, managed(), |_: &PartialObjectMeta<_>| {});
    let bindings = b.full(scope, managed(), |_: &RoleBinding| {});
    // Secrets' metadata, two or more per object, kept [`Compact`].
    let state_secrets = b
        .by(state::SUFFIX_LABEL)
        .compact(scope, tfstate(), wake.by_owner_labels());
    let managed_secrets =
        b.by(BACKUP_SUFFIX_LABEL)
            .compact(scope, managed(), wake.by_owner_labels());
    let variables_config_maps = b.full(scope, variables(), wake.of_variables());
    let variables_secrets = b.full(scope, variables(), wake.of_variables());
    let clusters = b.full(scope, all(), wake.of_cluster());
    let machines = b.full(scope, all(), wake.of_machine());
    let machine_pools = b.full(scope, all(), wake.of_machine_pool());
    let namespace_config = match &scope.namespace {
        Some(ns) => all().fields(&format!("metadata.name={ns}")),
        None => all(),
    };
    let namespaces = b.spawn(
        watcher::watcher(
            Api::<Lean<PartialObjectMeta<Namespace>>>::all(scope.client.clone()),
            namespace_config,
        )
        .map_ok(lean::unwrap),
        None,
        None,
        |_: &PartialObjectMeta<Namespace>| {},
    );
    let identities = b.spawn(
        watcher::watcher(
            Api::<Lean<TerraformClusterIdentity>>::all(scope.client.clone()),
            all(),
        )
        .map_ok(lean::unwrap),
        None,
        None,
        |_: &TerraformClusterIdentity| {},
    );
    Watches {
        jobs,
        pods,
        lock_leases,
        leases,
        accounts,
        bindings,
        state_secrets,
        managed_secrets,
        namespaces,
        identities,
        identity_sources: Sources::new(scope.client.clone()),
        variables_config_maps,
        variables_secrets,
        clusters,
        machines,
        machine_pools,
        terraform_clusters: wake.clusters.store(),
        derived: Derived::default(),
        tasks: b.tasks,
        synced: b.synced,
    }
}

/// What of an object's change is worth a pass: a change that leaves its
/// key as it was wakes nothing (its store takes it all the same).
type WakeKey<K> = fn(&K) -> u64;

/// A namespaced kind a [`Builder`] can watch.
trait Watched:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

#[derive(Default)]
struct Builder {
    tasks: Vec<JoinHandle<()>>,
    synced: Vec<Box<dyn Fn() -> bool + Send + Sync>>,
    /// The label the next watch built keeps an index of.
    index: Option<&'static str>,
}

impl Builder {
    /// Has the next watch keep an index of `label`.
    fn by(&mut self, label: &'static str) -> &mut Self {
        self.index = Some(label);
        self
    }

    /// A watch in each namespace scope: of whole objects, or of metadata
    /// only when `K` is a `PartialObjectMeta` (its `Api` asks for no more).
    fn full<K>(
        &mut self,
        scope: &Scope,
        config: watcher::Config,
        wake: impl Fn(&K) + Clone + Send + 'static,
    ) -> Scoped<K>
    where
        K: Watched,
    {
        self.watch(scope, config, None, |o: K| o, wake)
    }

    /// A watch of `K`'s metadata in each namespace scope, each object's
    /// kept [`Compact`].
    fn compact<K>(
        &mut self,
        scope: &Scope,
        config: watcher::Config,
        wake: impl Fn(&Compact<K>) + Clone + Send + 'static,
    ) -> Scoped<Compact<K>>
    where
        K: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
        PartialObjectMeta<K>: Watched,
    {
        let keep = |o: PartialObjectMeta<K>| Compact::from(o.metadata);
        self.watch(scope, config, None, keep, wake)
    }

    /// [`Self::full`], waking only on a change of `key`.
    fn keyed<K>(
        &mut self,
        scope: &Scope,
        config: watcher::Config,
        key: WakeKey<K>,
        wake: impl Fn(&K) + Clone + Send + 'static,
    ) -> Scoped<K>
    where
        K: Watched,
    {
        self.watch(scope, config, Some(key), |o: K| o, wake)
    }

    /// A watch of `W` in each namespace scope, each object stored as
    /// `keep` makes it.
    fn watch<W, S>(
        &mut self,
        scope: &Scope,
        config: watcher::Config,
        key: Option<WakeKey<S>>,
        keep: fn(W) -> S,
        wake: impl Fn(&S) + Clone + Send + 'static,
    ) -> Scoped<S>
    where
        W: Watched,
        S: Labelled + Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let index = self.index.take().map(|l| Arc::new(Index::new(l)));
        let stores = scope
            .namespaces()
            .into_iter()
            .map(|ns| {
                self.spawn(
                    watcher::watcher(scope.api::<Lean<W>>(ns), config.clone())
                        .map_ok(move |e| lean::map(e, |Lean(o)| keep(o))),
                    index.clone(),
                    key,
                    wake.clone(),
                )
            })
            .collect();
        Scoped { stores, index }
    }

    /// Reflects `events` into a store (and `index`); each change, once in
    /// the store, goes to `wake`: a removal always, another change when it
    /// changed the object's `key`, if it has one.
    fn spawn<K>(
        &mut self,
        events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
        index: Option<Arc<Index>>,
        key: Option<WakeKey<K>>,
        wake: impl Fn(&K) + Send + 'static,
    ) -> Store<K>
    where
        K: Labelled + Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
    {
        let kind = K::kind(&Default::default()).into_owned();
        let (reader, writer) = reflector::store();
        // Decoded without their managed fields ([`Lean`]).
        let events = events.default_backoff();
        let reflected = reflector::reflector(writer, events);
        self.tasks.push(tokio::spawn(async move {
            let mut reflected = std::pin::pin!(reflected);
            // The key each object last woke with, by uid; a relist starts
            // afresh (what it no longer lists is not seen removed).
            let mut keys: HashMap<String, u64> = HashMap::new();
            while let Some(event) = reflected.next().await {
                match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        if let Some(index) = &index {
                            index.update(&o, false);
                        }
                        if let Some(key) = key {
                            let k = key(&o);
                            let uid = o.object_uid().unwrap_or_default().to_owned();
                            if keys.insert(uid, k) == Some(k) {
                                continue;
                            }
                        }
                        wake(&o);
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        if let Some(index) = &index {
                            index.update(&o, true);
                        }
                        keys.remove(o.object_uid().unwrap_or_default());
                        wake(&o);
                    }
                    Ok(watcher::Event::Init) => keys.clear(),
                    Ok(_) => {}
                    Err(e) => warn!(kind, "watch: {e}"),
                }
            }
        }));
        let ready = reader.clone();
        self.synced.push(Box::new(move || {
            matches!(ready.wait_until_ready().now_or_never(), Some(Ok(())))
        }));
        reader
    }
}
