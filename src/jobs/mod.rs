//! Everything a runner Job needs before it can start (book:
//! inside-the-job.md): the effective Job policy ([`policy`]), the rendered
//! root module and its inputs hash ([`inputs`]), the Job and its per-run
//! Secret ([`builder`]), the runner's ServiceAccount and RoleBinding
//! ([`rbac`]), and the run lease and cluster write lease ([`leases`]).
//!
//! `policy`, `inputs` and `builder` are pure; `rbac` and `leases` keep their
//! decisions pure and do their Kubernetes I/O in a few small functions.

pub mod builder;
pub mod durable;
pub mod inputs;
pub mod leases;
pub mod policy;
pub mod rbac;
pub mod variables;

use std::collections::BTreeMap;

use crate::names::{self, Kind};

/// On everything CAPTF creates and owns (ref §2.2).
pub const MANAGED_LABEL: &str = "captf.io/managed";
/// The owner's kind, e.g. `TerraformMachine`.
pub const OWNER_KIND_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/owner-kind";
/// The owner's name, or its hash when it does not fit a label value.
pub const OWNER_NAME_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/owner-name";
/// The Cluster API cluster, or its hash when it does not fit a label value.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The operation of a Job and its pod.
pub const OP_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/op";
/// The attempt of a Job and its pod.
pub const ATTEMPT_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/attempt";
/// `run` or `cluster` on CAPTF's own Leases, which tells them from the
/// backend's lock Lease.
pub const LEASE_LABEL: &str = "captf.io/lease";
/// A user's opt-in of a ServiceAccount as a runner override.
pub const RUNNER_LABEL: &str = "captf.io/runner";
/// Makes clusterctl move carry state Secrets (backend labels, ref §6.3).
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

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
