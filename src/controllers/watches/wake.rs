//! Which objects a change wakes: each watch hands what changed here, once
//! its store has it, and the objects it concerns get a pass.

use std::hash::{DefaultHasher, Hash, Hasher};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::Labelled;

use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::capi::objects::{Cluster, ContractRef, Machine, MachinePool};
use crate::capi::owners::owner_ref;
use crate::controllers::ledger;
use crate::controllers::workload::Workload;
use crate::jobs;
use crate::jobs::variables::{self, SourceKind};
use crate::keys::{
    CLUSTER_NAME_LABEL, LEASE_LABEL, OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_UID_LABEL,
};
use crate::locks::PodFact;
use crate::names::{self, Kind};

/// The objects of one kind a change can wake: its controller's store, and
/// the channel into that controller.
pub struct Target<K: Workload> {
    sender: UnboundedSender<ObjectRef<K>>,
    store: Store<K>,
}

impl<K: Workload> Clone for Target<K> {
    fn clone(&self) -> Self {
        Target {
            sender: self.sender.clone(),
            store: self.store.clone(),
        }
    }
}

impl<K: Workload> Target<K> {
    /// A target over `store`, and what its controller reconciles on.
    pub fn new(store: Store<K>) -> (Self, UnboundedReceiver<ObjectRef<K>>) {
        let (sender, receiver) = unbounded();
        (Target { sender, store }, receiver)
    }

    /// The controller's store.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    fn send(&self, object: ObjectRef<K>) {
        // Closed only once the controller stopped.
        let _ = self.sender.unbounded_send(object);
    }

    fn each(&self, wakes: impl Fn(&K) -> bool) {
        for o in self.store.state() {
            if wakes(&o) {
                self.send(ObjectRef::from_obj(o.as_ref()));
            }
        }
    }

    /// The object whose owner labels `labelled` carries: its uid label
    /// (the Jobs run from the manager's namespace), else its name label in
    /// the same namespace.
    fn owner(&self, labelled: &impl Labelled) {
        if let Some(uid) = labelled.label(OWNER_UID_LABEL) {
            return self.each(|o| o.meta().uid.as_deref() == Some(uid));
        }
        let (Some(ns), Some(value)) = (
            labelled.object_namespace(),
            labelled.label(OWNER_NAME_LABEL),
        ) else {
            return;
        };
        // The label is the name itself, looked up at once; only a name too
        // long for a label is labelled by its hash, and only for a value that
        // may be one are the namespace's long names hashed and compared.
        let named = ObjectRef::new(value).within(ns);
        if self.store.get(&named).is_some() {
            self.send(named);
        }
        if names::may_be_label_hash(value) {
            self.each(|o| {
                o.meta().namespace.as_deref() == Some(ns)
                    && o.meta()
                        .name
                        .as_deref()
                        .is_some_and(|n| n.len() > value.len() && names::label_value(n) == *value)
            });
        }
    }

    /// The objects of `ns` whose cluster-name label is `cluster`.
    fn in_cluster(&self, ns: Option<&str>, cluster: Option<&str>, only_deleting: bool) {
        if cluster.is_none() {
            return;
        }
        self.each(|o| {
            o.meta().namespace.as_deref() == ns
                && o.cluster_name() == cluster
                && (!only_deleting || o.meta().deletion_timestamp.is_some())
        });
    }

    /// The object `infra` names, in `ns`.
    fn named_by(&self, infra: Option<&ContractRef>, ns: Option<&str>) {
        let infra = infra.filter(|r| r.api_group == crate::api::GROUP && r.kind == K::KIND.kind());
        if let (Some(infra), Some(ns)) = (infra, ns) {
            self.send(ObjectRef::new(&infra.name).within(ns));
        }
    }

    /// The objects of the source's namespace whose `variablesFrom` names it.
    fn referencing(&self, kind: SourceKind, source: &ObjectMeta) {
        let Some(name) = source.name.as_deref() else {
            return;
        };
        let ns = source.namespace.as_deref();
        self.each(|o| {
            o.meta().namespace.as_deref() == ns
                && o.workspace()
                    .variables_from
                    .iter()
                    .flatten()
                    .any(|s| variables::reference(s) == Some((kind, name)))
        });
    }
}

/// The three controllers a change can wake.
#[derive(Clone)]
pub struct Wake {
    pub clusters: Target<TerraformCluster>,
    pub machines: Target<TerraformMachine>,
    pub pools: Target<TerraformMachinePool>,
}

impl Wake {
    /// A Job, pod, state Secret, backup or Lease wakes the object its owner
    /// labels name.
    pub fn by_owner_labels<R: Labelled>(&self) -> impl Fn(&R) + Clone + Send + 'static {
        let w = self.clone();
        move |r: &R| match r.label(OWNER_KIND_LABEL) {
            Some(k) if k == Kind::Cluster.kind() => w.clusters.owner(r),
            Some(k) if k == Kind::Machine.kind() => w.machines.owner(r),
            Some(k) if k == Kind::MachinePool.kind() => w.pools.owner(r),
            _ => {}
        }
    }

    /// A cluster write lease wakes the machines and pools of its cluster:
    /// they may be waiting for the cluster's operation.
    pub fn of_cluster_lease<R: Resource>(&self) -> impl Fn(&R) + Clone + Send + 'static {
        let w = self.clone();
        move |r: &R| {
            let labels = r.meta().labels.as_ref();
            if labels.and_then(|l| l.get(LEASE_LABEL)).map(String::as_str) != Some("cluster") {
                return;
            }
            let ns = r.meta().namespace.as_deref();
            let cluster = labels
                .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                .map(String::as_str);
            w.machines.in_cluster(ns, cluster, false);
            w.pools.in_cluster(ns, cluster, false);
        }
    }

    /// A labelled ConfigMap or Secret wakes the objects whose
    /// `variablesFrom` names it.
    pub fn of_variables<R: Resource<DynamicType = ()>>(
        &self,
    ) -> impl Fn(&R) + Clone + Send + 'static {
        let w = self.clone();
        let kind = match R::kind(&()).as_ref() {
            "ConfigMap" => SourceKind::ConfigMap,
            _ => SourceKind::Secret,
        };
        move |r: &R| {
            w.clusters.referencing(kind, r.meta());
            w.machines.referencing(kind, r.meta());
            w.pools.referencing(kind, r.meta());
        }
    }

    /// A Cluster wakes its TerraformCluster (its infrastructureRef), and
    /// the machines and pools of the cluster (paused, endpoint,
    /// initialization).
    pub fn of_cluster(&self) -> impl Fn(&Cluster) + Clone + Send + 'static {
        let w = self.clone();
        move |c: &Cluster| {
            let ns = c.metadata.namespace.as_deref();
            w.clusters.named_by(c.spec.infrastructure_ref.as_ref(), ns);
            let name = c.metadata.name.as_deref();
            w.machines.in_cluster(ns, name, false);
            w.pools.in_cluster(ns, name, false);
        }
    }

    /// A Machine wakes the TerraformMachine its infrastructureRef names.
    pub fn of_machine(&self) -> impl Fn(&Machine) + Clone + Send + 'static {
        let w = self.clone();
        move |m: &Machine| {
            w.machines.named_by(
                m.spec.infrastructure_ref.as_ref(),
                m.metadata.namespace.as_deref(),
            );
        }
    }

    /// A MachinePool wakes the TerraformMachinePool its template names.
    pub fn of_machine_pool(&self) -> impl Fn(&MachinePool) + Clone + Send + 'static {
        let w = self.clone();
        move |p: &MachinePool| {
            w.pools.named_by(
                p.spec.template.spec.infrastructure_ref.as_ref(),
                p.metadata.namespace.as_deref(),
            );
        }
    }

    /// A TerraformCluster (its exports, through its status) wakes the
    /// machines and pools of its cluster.
    pub fn of_terraform_cluster(&self, c: &TerraformCluster) {
        let ns = c.metadata.namespace.as_deref();
        let cluster = owner_ref(Kind::Cluster, c.owner_references())
            .map(|r| r.name.as_str())
            .or_else(|| c.cluster_name());
        self.machines.in_cluster(ns, cluster, false);
        self.pools.in_cluster(ns, cluster, false);
    }

    /// A machine or pool (its removal above all) wakes its TerraformCluster
    /// when that is being deleted: it waits for them.
    pub fn of_dependent<K: Workload>(&self, o: &K) {
        self.clusters
            .in_cluster(o.meta().namespace.as_deref(), o.cluster_name(), true);
    }
}

/// What a pass reads of a Job's pod: its phase and whether it is being
/// deleted (the lock holder's), and whether its runner ended. Its other
/// changes (scheduled, a container started, ready) wake nothing.
pub fn pod_key(pod: &Pod) -> u64 {
    hash((
        PodFact::of(Some(pod)),
        jobs::runner_terminated(pod).is_some(),
    ))
}

/// What a pass reads of a Job: its labels and annotations (its operation,
/// attempt and bookkeeping), whether it is being deleted, and its end. Its
/// counts of active, ready and terminating pods wake nothing.
pub fn job_key(job: &Job) -> u64 {
    let m = &job.metadata;
    hash((
        &m.labels,
        &m.annotations,
        m.deletion_timestamp.is_some(),
        ledger::job_end(job).map(|e| (e.succeeded, e.deadline)),
    ))
}

fn hash(what: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod,
        PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::{job_key, pod_key};
    use crate::jobs::builder::SOURCE_CONTAINER;

    type Edit<'a, K> = &'a dyn Fn(&mut K);

    fn runner(state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            name: SOURCE_CONTAINER.into(),
            state: Some(state),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_wakes_on_its_phase_its_deletion_and_its_runner_ending() {
        let base = Pod {
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let was = pod_key(&base);
        let changed = |edit: &dyn Fn(&mut Pod)| {
            let mut p = base.clone();
            edit(&mut p);
            pod_key(&p) != was
        };
        let status = |p: &mut Pod| p.status.get_or_insert_with(Default::default).clone();
        let cases: [(&str, Edit<Pod>, bool); 6] = [
            ("scheduled", &|p| p.spec = Some(Default::default()), false),
            (
                "runner started",
                &|p| {
                    let mut s = status(p);
                    s.container_statuses = Some(vec![runner(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    })]);
                    p.status = Some(s);
                },
                false,
            ),
            (
                "running",
                &|p| {
                    let mut s = status(p);
                    s.phase = Some("Running".into());
                    p.status = Some(s);
                },
                true,
            ),
            (
                "failed",
                &|p| {
                    let mut s = status(p);
                    s.phase = Some("Failed".into());
                    p.status = Some(s);
                },
                true,
            ),
            (
                "runner ended",
                &|p| {
                    let mut s = status(p);
                    s.container_statuses = Some(vec![runner(ContainerState {
                        terminated: Some(ContainerStateTerminated::default()),
                        ..Default::default()
                    })]);
                    p.status = Some(s);
                },
                true,
            ),
            (
                "deleted",
                &|p| {
                    p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                },
                true,
            ),
        ];
        for (what, edit, wakes) in cases {
            assert_eq!(changed(edit), wakes, "{what}");
        }
    }

    #[test]
    fn a_job_wakes_on_its_metadata_and_its_end() {
        let base = Job::default();
        let was = job_key(&base);
        let changed = |edit: &dyn Fn(&mut Job)| {
            let mut j = base.clone();
            edit(&mut j);
            job_key(&j) != was
        };
        let condition = |type_: &str, status: &str| JobStatus {
            conditions: Some(vec![JobCondition {
                type_: type_.into(),
                status: status.into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let cases: [(&str, Edit<Job>, bool); 7] = [
            (
                "active",
                &|j| {
                    j.status = Some(JobStatus {
                        active: Some(1),
                        ready: Some(1),
                        ..Default::default()
                    });
                },
                false,
            ),
            (
                "success criteria met",
                &|j| {
                    j.status = Some(condition("SuccessCriteriaMet", "True"));
                },
                false,
            ),
            (
                "complete",
                &|j| j.status = Some(condition("Complete", "True")),
                true,
            ),
            (
                "failed",
                &|j| j.status = Some(condition("Failed", "True")),
                true,
            ),
            (
                "annotated",
                &|j| {
                    j.metadata.annotations = Some([("a".into(), "b".into())].into());
                },
                true,
            ),
            (
                "labelled",
                &|j| {
                    j.metadata.labels = Some([("a".into(), "b".into())].into());
                },
                true,
            ),
            (
                "deleted",
                &|j| {
                    j.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                },
                true,
            ),
        ];
        for (what, edit, wakes) in cases {
            assert_eq!(changed(edit), wakes, "{what}");
        }
    }
}
