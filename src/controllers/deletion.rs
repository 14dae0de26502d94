//! What the deletion of a workload object does next (book:
//! terraform-state.md "State on deletion"; ref §8.6 and Appendix B "held
//! deletion"). Pure: facts in, one step out. The state is removed only
//! once it is safe: after a destroy succeeded, for an object that was never
//! applied, or when a person abandons the infrastructure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::conditions::{self, Cond, Status};
use super::decide::{self, Finished, StateFact};
use crate::keys::{ABANDON, finalizer};
use crate::names::{self, Kind, Op};

/// The finalizer as the reconcile's top-level step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Live without the finalizer: add it, and end the pass.
    AddFinalizer,
    /// Live with the finalizer: reconcile.
    Live,
    /// Being deleted, with the finalizer: destroy and clean up.
    Deleting,
    /// Being deleted, the finalizer already gone: nothing is ours to do.
    Released,
}

pub fn lifecycle(kind: Kind, deleting: bool, finalizers: &[String]) -> Lifecycle {
    let ours = finalizers.iter().any(|f| f == finalizer(kind));
    match (deleting, ours) {
        (false, false) => Lifecycle::AddFinalizer,
        (false, true) => Lifecycle::Live,
        (true, true) => Lifecycle::Deleting,
        (true, false) => Lifecycle::Released,
    }
}

/// What the deletion pass knows; gathered only with no Job of the object
/// active (a running Job is waited for first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Situation {
    pub kind: Kind,
    /// TerraformMachines and TerraformMachinePools of a TerraformCluster's
    /// cluster still in the namespace (0 for the other kinds).
    pub dependents: usize,
    /// The abandon annotation names this object's uid.
    pub abandoned: bool,
    pub state: StateFact,
    /// An apply succeeded once: the durable inputs carry the applied
    /// marker, a backup exists, or the object's own status says so. A
    /// missing state is then lost.
    pub ever_applied: bool,
    /// The namespace is being deleted: no Job, Secret or Event can be
    /// created in it.
    pub namespace_terminating: bool,
    /// A destroy can run from the manager's namespace instead
    /// ([`crate::jobs::away::check`]); read only while the namespace is
    /// being deleted.
    pub away_possible: bool,
    /// The durable inputs Secret is there and whole.
    pub durable_inputs: bool,
    /// The spec renders now (a cluster's or pool's fallback for a destroy).
    pub renders: bool,
    /// Finished Jobs, newest first.
    pub finished: Vec<Finished>,
    pub failed_jobs_history_limit: i32,
    pub now: Timestamp,
    /// The state lock is held by something other than the object's own
    /// runner pods (someone's `terraform`, or a holder that cannot be told).
    pub foreign_lock: bool,
}

/// Why a deletion is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Applied once, and no state Secret is left.
    Lost,
    /// The state cannot be read (corrupt, inconsistent, encrypted).
    Unreadable,
    /// The namespace is being deleted, so no destroy Job can start in it,
    /// and none can run from the manager's namespace either (or there is
    /// no readable state to destroy from).
    NamespaceTerminating,
    /// Cleanup is due but a foreign holder has the state lock: deleting the
    /// state and the Lease under it would break its lock, and its next write
    /// would leave a state nobody owns.
    Locked,
}

/// Where a destroy takes its root from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestroyInputs {
    /// The durable inputs Secret: what the newest apply ran.
    Durable,
    /// The spec rendered now (TerraformCluster and TerraformMachinePool
    /// only, when the durable inputs are missing).
    Current,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// A TerraformCluster waits for its machines and pools.
    WaitForDependents(usize),
    /// Delete the state and everything else CAPTF made, then the finalizer.
    Cleanup(Why),
    /// Neither destroy nor clean up: a person has to restore or abandon.
    Hold(Hold),
    Destroy(DestroyInputs),
    /// A destroy failed; the next one waits this long.
    Backoff {
        wait: Duration,
        failures: u32,
    },
    /// A TerraformMachine without its durable inputs: no destroy can be
    /// built, and no fallback is safe (its spec may no longer describe what
    /// was applied).
    MissingInputs,
}

/// Why cleanup runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Destroyed,
    NeverApplied,
    Abandoned,
}

pub fn next(f: &Situation) -> Next {
    match step(f) {
        // A namespace being deleted takes the Lease and the state whatever
        // we do; holding would only keep the namespace.
        Next::Cleanup(_) if f.foreign_lock && !f.namespace_terminating => Next::Hold(Hold::Locked),
        next => next,
    }
}

fn step(f: &Situation) -> Next {
    if f.kind == Kind::Cluster && f.dependents > 0 {
        return Next::WaitForDependents(f.dependents);
    }
    if f.finished
        .iter()
        .any(|j| j.op == Op::Destroy && j.succeeded)
    {
        return Next::Cleanup(Why::Destroyed);
    }
    if f.abandoned {
        return Next::Cleanup(Why::Abandoned);
    }
    // In a namespace being deleted a missing state proves nothing: the
    // namespace controller may have taken it before its first adoption
    // protected it, while the apply's durable inputs, protected from the
    // start, say an apply began.
    let maybe_applied = f.ever_applied || (f.namespace_terminating && f.durable_inputs);
    let readable = matches!(f.state, StateFact::Read { .. });
    match f.state {
        StateFact::NotFound if !maybe_applied => return Next::Cleanup(Why::NeverApplied),
        // The destroy runs from the manager's namespace, or not at all.
        _ if f.namespace_terminating && !(readable && f.away_possible) => {
            return Next::Hold(Hold::NamespaceTerminating);
        }
        StateFact::NotFound => return Next::Hold(Hold::Lost),
        StateFact::Unreadable => return Next::Hold(Hold::Unreadable),
        StateFact::Read { .. } => {}
    }
    let inputs = if f.durable_inputs {
        DestroyInputs::Durable
    } else if f.kind != Kind::Machine && f.renders {
        DestroyInputs::Current
    } else {
        return Next::MissingInputs;
    };
    match decide::backing_off(&f.finished, Op::Destroy, f.failed_jobs_history_limit, f.now) {
        Some((wait, failures)) => Next::Backoff { wait, failures },
        None => Next::Destroy(inputs),
    }
}

/// The Deleting condition of a held deletion: why, and the two ways out.
/// `detail` is the state's StateReadable reason when it cannot be read,
/// and what the state holds when the namespace is being deleted.
pub fn held(hold: Hold, namespace: &str, suffix: &str, uid: &str, detail: &str) -> Cond {
    let why = match hold {
        Hold::Lost => format!(
            "the state Secret {} is missing although the object was applied",
            names::state_secret(suffix)
        ),
        Hold::Unreadable => format!("the state cannot be read ({detail})"),
        Hold::Locked => {
            return Cond::new(
                conditions::DELETING,
                Status::True,
                "DeletionHeld",
                format!(
                    "deletion held: {detail}. The state Secret {}, its lock Lease {} and this object are kept \
                     until the lock is released: deleted under their holder, its lock would be broken and its next \
                     write would leave a state that nobody owns",
                    names::state_secret(suffix),
                    names::state_lock_lease(suffix),
                ),
            );
        }
        Hold::NamespaceTerminating => {
            return Cond::new(
                conditions::DELETING,
                Status::True,
                "DeletionHeld",
                format!(
                    "deletion held: namespace {namespace} is being deleted, so no destroy Job can be created in it, \
                     and none can run from the manager's namespace ({detail}); the infrastructure the state records \
                     is still there. The state Secret {}, its backups \
                     ({}-<serial>) and the durable inputs are kept until this object is destroyed or abandoned. Either \
                     annotate this object {ABANDON}={uid} to remove it and leave the infrastructure as it is, or copy the \
                     state and its backups into another namespace, recreate the object there and destroy it from there, \
                     then abandon this one",
                    names::state_secret(suffix),
                    names::backup_secret(suffix, 0).trim_end_matches("-0"),
                ),
            );
        }
    };
    Cond::new(
        conditions::DELETING,
        Status::True,
        "DeletionHeld",
        format!(
            "deletion held: {why}, so no destroy can run and every Secret is kept. Restore the state from a backup \
             (status.stateBackups, Secrets {}-<serial>) into {}, and the destroy runs; or, to remove the object without \
             a destroy and leave its infrastructure behind, annotate it {ABANDON}={uid}",
            names::backup_secret(suffix, 0).trim_end_matches("-0"),
            names::state_secret(suffix),
        ),
    )
}

/// ApplyJobSucceeded of a machine whose destroy cannot be built.
pub fn missing_inputs(kind: Kind, name: &str, uid: &str) -> Cond {
    Cond::new(
        conditions::APPLY_JOB_SUCCEEDED,
        Status::False,
        "DestroyFailed",
        format!(
            "durable inputs Secret {} is missing or damaged: no destroy can be built; restore it, or annotate the object {ABANDON}={uid} to remove it without a destroy",
            names::inputs_secret(kind, name),
        ),
    )
}

#[cfg(test)]
mod tests;
