//! Every label, annotation and finalizer key CAPTF sets or reads (ref §2,
//! CONTRACT.md), defined once. The names built from them are in
//! [`crate::names`].

use crate::names::Kind;

// Labels CAPTF puts on what it creates (ref §2.2).

/// On everything CAPTF creates and owns.
pub const MANAGED_LABEL: &str = "captf.io/managed";
/// The owner's kind, e.g. `TerraformMachine`.
pub const OWNER_KIND_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/owner-kind";
/// The owner's name, or its hash when it does not fit a label value.
pub const OWNER_NAME_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/owner-name";
/// On what CAPTF makes in the manager's namespace for the objects of a
/// namespace being deleted: that namespace.
pub const OWNER_NAMESPACE_LABEL: &str = "captf.io/owner-namespace";
/// On a Job in the manager's namespace: its object's uid (no owner
/// reference can cross namespaces).
pub const OWNER_UID_LABEL: &str = "captf.io/owner-uid";
/// The operation of a Job and its pod.
pub const OP_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/op";
/// The attempt of a Job and its pod.
pub const ATTEMPT_LABEL: &str = "captf.infrastructure.cluster.x-k8s.io/attempt";
/// `run` or `cluster` on CAPTF's own Leases, which tells them from the
/// backend's lock Lease.
pub const LEASE_LABEL: &str = "captf.io/lease";
/// On a credentials mirror.
pub const MIRRORED_LABEL: &str = "captf.io/mirrored";
/// `"true"` on every backup chunk.
pub const BACKUP_LABEL: &str = "captf.io/state-backup";
/// The backend suffix of the state a backup chunk was copied from.
pub const BACKUP_SUFFIX_LABEL: &str = "captf.io/state-backup-suffix";

// Labels users set.

/// A user's opt-in of a ServiceAccount as a runner override.
pub const RUNNER_LABEL: &str = "captf.io/runner";
/// A user's opt-in of a ConfigMap or Secret as a `variablesFrom` source.
pub const VARIABLES_LABEL: &str = "captf.io/variables";

// Annotations users set (ref §2.1).

/// Asks for a restore of the backup with this serial.
pub const RESTORE_STATE: &str = "captf.io/restore-state";
/// Set to the object's `metadata.uid`, cleans up without a destroy: the
/// infrastructure is left to whoever set it. The uid makes it a deliberate
/// act for this very object, never one copied from another.
pub const ABANDON: &str = "captf.io/abandon-infrastructure";

/// On a TerraformCluster: approves the destructive guarded apply of the
/// inputs with this hash (ref §2.1); removed once that apply succeeded.
pub const APPROVE_DESTRUCTIVE_PLAN: &str = "captf.io/approve-destructive-plan";
/// On a TerraformCluster with applyPolicy Manual: approves the saved plan
/// with this hash (ref §2.1); removed once that plan is applied.
pub const APPROVE_PLAN: &str = "captf.io/approve-plan";

// Annotations CAPTF sets and reads (ref §2.2).

/// On an apply Job that remediates drift.
pub const DRIFT_REMEDIATION: &str = "captf.io/drift-remediation";
/// On an approved apply Job: the plan hash it must reproduce.
pub const APPROVED_PLAN: &str = "captf.io/approved-plan";

/// The inputs hash: of the apply a Job runs, of the state's last
/// successful apply (base state Secret), of the durable inputs, and of the
/// state a backup was copied from (its chunk 0).
/// On a TerraformCluster: who set its endpoint, `user` or `module`
/// (ref §8.8); written once.
pub const ENDPOINT_SOURCE: &str = "captf.io/endpoint-source";
pub const INPUTS_HASH: &str = "captf.io/inputs-hash";
/// On a Job: its result has been accounted into status; the value is the
/// outcome the backoff needs.
pub const BOOKKEPT: &str = "captf.io/bookkept";
/// On a restore Job: the backup serial it pushes.
pub const RESTORE_SERIAL: &str = "captf.io/restore-serial";
/// On the durable inputs: `spec.source.image` as the apply ran it.
pub const IMAGE: &str = "captf.io/image";
/// On the durable inputs: the digest the successful apply's pod ran,
/// `sha256:<hex>` (ref §8.9).
pub const IMAGE_DIGEST: &str = "captf.io/image-digest";
/// On the durable inputs and a credentials mirror: the identity.
pub const IDENTITY: &str = "captf.io/identity";
/// On the durable inputs, `"true"` once an apply of the object has
/// succeeded: a missing state is then lost, not absent.
pub const APPLIED: &str = "captf.io/applied";
/// On a credentials mirror: the hash of the identity Secret it copies.
pub const SOURCE_HASH: &str = "captf.io/source-hash";
/// On CAPTF's Leases: the operation the holder runs.
pub const LEASE_OP: &str = "captf.io/lease-op";
/// On CAPTF's Leases: when the holder took it (RFC 3339).
pub const LEASE_ACQUIRED_AT: &str = "captf.io/lease-acquired-at";
pub const BACKUP_SERIAL: &str = "captf.io/state-backup-serial";
pub const BACKUP_LINEAGE: &str = "captf.io/state-backup-lineage";
pub const BACKUP_TAKEN_AT: &str = "captf.io/state-backup-taken-at";
pub const BACKUP_SOURCE_JOB: &str = "captf.io/state-backup-source-job";
/// sha256 of a backup's concatenated payloads, in chunk order.
pub const BACKUP_DIGEST: &str = "captf.io/state-backup-digest";
pub const BACKUP_RESOURCES: &str = "captf.io/state-backup-resources";
/// The set id that groups the chunks of one backup.
pub const BACKUP_SET: &str = "captf.io/state-backup-set";
pub const BACKUP_CHUNK: &str = "captf.io/state-backup-chunk";
pub const BACKUP_CHUNKS: &str = "captf.io/state-backup-chunks";

// The backend's (ref §6.3).

/// The lock info on the state lock Lease.
pub const LOCK_INFO: &str = "app.terraform.io/lock-info";

// Kubernetes'.

/// The label Kubernetes puts on a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// kubectl's copy of what `kubectl apply` last applied, as JSON text: the
/// webhook does not read it.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

// Cluster API's and clusterctl's (ref §2.3).

/// The Cluster API cluster an object belongs to (or its hash when it does
/// not fit a label value).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// `--watch-filter` selects objects by this label's value.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// On a Machine: it is a control-plane machine (`control_plane = true`).
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// An object managed by something else than CAPTF: skipped entirely.
pub const MANAGED_BY: &str = "cluster.x-k8s.io/managed-by";
/// An object paused by hand (its Cluster's `spec.paused` pauses it too).
pub const PAUSED: &str = "cluster.x-k8s.io/paused";
/// Keeps clusterctl move from moving an object while a Job runs for it.
pub const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// On a Machine: asks Cluster API to remediate it (ref §8.8).
pub const REMEDIATE_MACHINE: &str = "cluster.x-k8s.io/remediate-machine";
/// On a Machine, beside REMEDIATE_MACHINE: CAPTF set it, and why; without
/// it the request is someone else's and stays.
pub const REMEDIATION_REQUESTED: &str = "captf.io/remediation-requested";
/// On a MachinePool: the autoscaler's bounds of its replicas.
pub const AUTOSCALER_MIN_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
pub const AUTOSCALER_MAX_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
/// On a MachinePool: who manages its replicas instead of Cluster API
/// (`captf` while CAPTF writes them back from the module).
pub const REPLICAS_MANAGED_BY: &str = "cluster.x-k8s.io/replicas-managed-by";
/// The template a machine or pool was cloned from.
pub const CLONED_FROM_NAME: &str = "cluster.x-k8s.io/cloned-from-name";
/// Makes clusterctl move carry state Secrets (backend labels).
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";
/// Makes clusterctl move carry a CRD's objects with their hierarchy.
pub const MOVE_HIERARCHY_LABEL: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";
/// clusterctl's mark on an object it deletes as part of a move.
pub const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

/// CAPTF's finalizer on what a destroy or a restore needs: the base state
/// Secret, the lock Lease, the backup sets, the durable inputs and the
/// credentials mirror. A namespace deletion (or a `kubectl delete`) cannot
/// take them before CAPTF has destroyed or abandoned the object; cleanup,
/// the namespace sweep and the README's manual recovery remove it.
pub const PROTECTION: &str = "captf.io/protection";
/// `"true"` on everything that carries [`PROTECTION`], so that the sweep
/// finds them.
pub const PROTECTED_LABEL: &str = "captf.io/protected";

/// The finalizer of each workload kind (ref §2.4).
pub const fn finalizer(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => "terraformcluster.infrastructure.cluster.x-k8s.io",
        Kind::Machine => "terraformmachine.infrastructure.cluster.x-k8s.io",
        Kind::MachinePool => "terraformmachinepool.infrastructure.cluster.x-k8s.io",
    }
}
