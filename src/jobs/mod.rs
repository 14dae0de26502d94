//! Everything a runner Job needs before it can start (book:
//! inside-the-job.md): the effective Job policy ([`policy`]), the rendered
//! root module and its inputs hash ([`inputs`]), the Job and its per-run
//! Secret ([`builder`]), the runner's ServiceAccount and RoleBinding
//! ([`rbac`]), the run lease and cluster write lease ([`leases`]), and a
//! destroy's move to the manager's namespace when the object's is being
//! deleted ([`away`]).
//!
//! `policy`, `inputs` and `builder` are pure; `rbac` and `leases` keep their
//! decisions pure and do their Kubernetes I/O in a few small functions.

pub mod away;
pub mod builder;
pub mod digest;
pub mod durable;
pub mod inputs;
pub mod leases;
pub mod plans;
pub mod policy;
pub mod rbac;
pub mod variables;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::keys::{CLUSTER_NAME_LABEL, MANAGED_LABEL, OWNER_KIND_LABEL, OWNER_NAME_LABEL};
use crate::names::{self, Kind};

/// `captf.io/managed=true`, the owner labels and, when the object belongs
/// to a cluster, the cluster-name label.
pub fn owner_labels(
    kind: Kind,
    name: &str,
    cluster_name: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (MANAGED_LABEL.to_owned(), "true".to_owned()),
        (OWNER_KIND_LABEL.to_owned(), kind.kind().to_owned()),
        (OWNER_NAME_LABEL.to_owned(), names::label_value(name)),
    ]);
    if let Some(cluster) = cluster_name {
        labels.insert(CLUSTER_NAME_LABEL.to_owned(), names::label_value(cluster));
    }
    labels
}

/// Whether a write failed only because another writer came first: a
/// create found the object, or an update carried a stale resourceVersion.
/// Reading again and deciding anew is the answer to both.
pub(crate) fn lost_race(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_conflict() || status.is_already_exists())
}

/// The runner container's status in a Job's `pod`, once it terminated.
pub fn runner_terminated(pod: &Pod) -> Option<&ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find(|c| {
        c.name == builder::SOURCE_CONTAINER
            && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
    })
}
