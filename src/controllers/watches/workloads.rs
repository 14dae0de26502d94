//! The workload kinds' own watches: each feeds its controller's store and
//! wakes the kinds that depend on it.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedReceiver;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::{Scope, Target, Wake, Watches};
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::controllers::workload::Workload;
use crate::names;

/// The workload kinds' stores.
pub type Workloads = (
    Store<TerraformCluster>,
    Store<TerraformMachine>,
    Store<TerraformMachinePool>,
);

/// What a workload kind's controller runs on: its store, its own watch
/// (polling it fills the store), and the objects other changes wake.
pub struct Feed<K: Workload> {
    pub store: Store<K>,
    pub events: BoxStream<'static, Result<K, watcher::Error>>,
    pub changes: UnboundedReceiver<ObjectRef<K>>,
}

/// Every watch, and the three controllers' feeds.
pub struct View {
    pub watches: Arc<Watches>,
    pub clusters: Feed<TerraformCluster>,
    pub machines: Feed<TerraformMachine>,
    pub pools: Feed<TerraformMachinePool>,
}

impl View {
    pub fn workloads(&self) -> Workloads {
        (
            self.clusters.store.clone(),
            self.machines.store.clone(),
            self.pools.store.clone(),
        )
    }
}

/// Starts the watches; `config` selects the workload objects (the watch
/// filter). Each kind's own watch wakes its dependents: a TerraformCluster
/// (its exports) its machines and pools; a machine or pool (its removal
/// above all) its TerraformCluster while that is being deleted.
pub fn view(scope: &Scope, config: &watcher::Config) -> View {
    let (cluster_store, cluster_writer) = reflector::store();
    let (machine_store, machine_writer) = reflector::store();
    let (pool_store, pool_writer) = reflector::store();
    let (clusters, cluster_changes) = Target::new(cluster_store.clone());
    let (machines, machine_changes) = Target::new(machine_store.clone());
    let (pools, pool_changes) = Target::new(pool_store.clone());
    let wake = Wake {
        clusters,
        machines,
        pools,
    };
    let watches = Arc::new(super::start(scope, &wake));
    let ns = scope.namespace.as_deref();
    let w = wake.clone();
    let cluster_events = events(scope.api(ns), config, cluster_writer, &watches, move |c| {
        w.of_terraform_cluster(c)
    });
    let w = wake.clone();
    let machine_events = events(scope.api(ns), config, machine_writer, &watches, move |m| {
        w.of_dependent(m)
    });
    let w = wake;
    let pool_events = events(scope.api(ns), config, pool_writer, &watches, move |p| {
        w.of_dependent(p)
    });
    View {
        watches,
        clusters: Feed {
            store: cluster_store,
            events: cluster_events,
            changes: cluster_changes,
        },
        machines: Feed {
            store: machine_store,
            events: machine_events,
            changes: machine_changes,
        },
        pools: Feed {
            store: pool_store,
            events: pool_events,
            changes: pool_changes,
        },
    }
}

/// A workload kind's watch into its store: every change (a removal too)
/// goes to `wake` once stored; a removed object's derived copies are
/// dropped.
fn events<K: Workload>(
    api: Api<K>,
    config: &watcher::Config,
    writer: reflector::store::Writer<K>,
    watches: &Arc<Watches>,
    wake: impl Fn(&K) + Send + 'static,
) -> BoxStream<'static, Result<K, watcher::Error>> {
    let watches = watches.clone();
    let events = watcher::watcher(api, config.clone())
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear());
    reflector::reflector(writer, events)
        .inspect_ok(move |event| match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => wake(o),
            watcher::Event::Delete(o) => {
                wake(o);
                if let (Some(ns), Some(name)) =
                    (o.meta().namespace.as_deref(), o.meta().name.as_deref())
                {
                    watches
                        .derived
                        .forget(ns, &names::suffix(ns, K::KIND, name));
                }
            }
            _ => {}
        })
        .applied_objects()
        .boxed()
}
