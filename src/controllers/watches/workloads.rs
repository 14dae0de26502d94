//! The workload kinds' own watches: each feeds its controller's store and
//! wakes the kinds that depend on it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures::channel::mpsc::UnboundedReceiver;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::{Lean, Scope, Target, Wake, Watches};
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
/// dropped. The object's own pass follows only changes [`asks_for_pass`].
fn events<K: Workload>(
    api: Api<Lean<K>>,
    config: &watcher::Config,
    writer: reflector::store::Writer<K>,
    watches: &Arc<Watches>,
    wake: impl Fn(&K) + Send + 'static,
) -> BoxStream<'static, Result<K, watcher::Error>> {
    let watches = watches.clone();
    // Decoded without their managed fields ([`Lean`]).
    let events = watcher::watcher(api, config.clone())
        .map_ok(super::lean::unwrap)
        .default_backoff();
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
        .predicate_filter(asks_for_pass, PredicateConfig::default())
        .boxed()
}

/// What of an object's own change asks for its pass: all but its status.
/// Only the passes write the status, and the echo of each write would cost
/// a pass that finds nothing new (a Job's four status writes were as many
/// passes); what a pass waits for comes from the other watches, its
/// requeue, or a change of the object's spec or metadata.
fn asks_for_pass<K: Resource>(o: &K) -> Option<u64> {
    let m = o.meta();
    let mut h = DefaultHasher::new();
    m.generation.hash(&mut h);
    m.labels.hash(&mut h);
    m.annotations.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.deletion_timestamp.is_some().hash(&mut h);
    for r in o.owner_references() {
        (&r.api_version, &r.kind, &r.name, &r.uid, r.controller).hash(&mut h);
    }
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    use super::asks_for_pass;
    use crate::api::{TerraformMachine, TerraformMachineSpec, TerraformMachineStatus};

    type Edit<'a> = &'a dyn Fn(&mut TerraformMachine);

    #[test]
    fn only_a_change_beside_the_status_asks_for_a_pass() {
        let mut base = TerraformMachine::new("tm", TerraformMachineSpec::default());
        base.metadata.generation = Some(1);
        base.metadata.resource_version = Some("1".into());
        let was = asks_for_pass(&base);
        let changed = |edit: &dyn Fn(&mut TerraformMachine)| {
            let mut o = base.clone();
            edit(&mut o);
            asks_for_pass(&o) != was
        };
        let cases: [(&str, Edit, bool); 8] = [
            (
                "status and version",
                &|o| {
                    o.status = Some(TerraformMachineStatus::default());
                    o.metadata.resource_version = Some("2".into());
                },
                false,
            ),
            (
                "managed fields",
                &|o| o.metadata.managed_fields = Some(vec![]),
                false,
            ),
            (
                "generation (spec)",
                &|o| o.metadata.generation = Some(2),
                true,
            ),
            (
                "labels",
                &|o| o.metadata.labels = Some([("a".into(), "b".into())].into()),
                true,
            ),
            (
                "annotations",
                &|o| {
                    o.metadata.annotations = Some([("a".into(), "b".into())].into());
                },
                true,
            ),
            (
                "finalizers",
                &|o| o.metadata.finalizers = Some(vec!["f".into()]),
                true,
            ),
            (
                "deletion",
                &|o| {
                    o.metadata.deletion_timestamp =
                        Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                },
                true,
            ),
            (
                "owner",
                &|o| {
                    o.metadata.owner_references = Some(vec![OwnerReference {
                        kind: "Machine".into(),
                        name: "m".into(),
                        uid: "u".into(),
                        ..Default::default()
                    }]);
                },
                true,
            ),
        ];
        for (what, edit, asks) in cases {
            assert_eq!(changed(edit), asks, "{what}");
        }
    }
}
