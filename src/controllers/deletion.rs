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
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + secs).unwrap()
    }

    fn job(op: Op, succeeded: bool, secs: i64) -> Finished {
        Finished {
            op,
            outcome: match succeeded {
                true => crate::controllers::ledger::Outcome::Succeeded,
                false => crate::controllers::ledger::Outcome::Failed,
            },
            succeeded,
            counts_for_backoff: !succeeded,
            finished_at: at(secs),
            inputs_hash: None,
            remediation: false,
        }
    }

    fn base() -> Situation {
        Situation {
            kind: Kind::Machine,
            dependents: 0,
            abandoned: false,
            state: StateFact::Read {
                inputs_hash: Some("h2:a".into()),
            },
            ever_applied: true,
            namespace_terminating: false,
            away_possible: true,
            durable_inputs: true,
            renders: true,
            finished: vec![job(Op::Apply, true, 0)],
            failed_jobs_history_limit: 3,
            now: at(1000),
            foreign_lock: false,
        }
    }

    #[test]
    fn a_held_deletion_names_its_cause_and_both_ways_out() {
        let lost = held(Hold::Lost, "ns", "abc-m", "u-1", "");
        let corrupt = held(Hold::Unreadable, "ns", "abc-m", "u-1", "StateCorrupt");
        for c in [&lost, &corrupt] {
            assert_eq!(
                (c.type_, c.status, c.reason),
                (conditions::DELETING, Status::True, "DeletionHeld")
            );
            assert!(
                c.message.contains("captf-state-backup-abc-m-<serial>"),
                "{}",
                c.message
            );
            assert!(
                c.message.contains("into tfstate-default-abc-m"),
                "{}",
                c.message
            );
            assert!(
                c.message.contains("captf.io/abandon-infrastructure=u-1"),
                "{}",
                c.message
            );
        }
        assert!(lost.message.contains("tfstate-default-abc-m is missing"));
        assert!(corrupt.message.contains("cannot be read (StateCorrupt)"));
        let gone = held(
            Hold::NamespaceTerminating,
            "team-a",
            "abc-m",
            "u-1",
            "serial 4, 2 managed resources",
        );
        assert_eq!((gone.status, gone.reason), (Status::True, "DeletionHeld"));
        for part in [
            "namespace team-a is being deleted",
            "(serial 4, 2 managed resources)",
            "captf.io/abandon-infrastructure=u-1",
            "captf-state-backup-abc-m-<serial>",
            "another namespace",
        ] {
            assert!(gone.message.contains(part), "{part}: {}", gone.message);
        }
        let locked = held(
            Hold::Locked,
            "ns",
            "abc-m",
            "u-1",
            "the state lock is held by me@laptop",
        );
        assert_eq!(
            (locked.status, locked.reason),
            (Status::True, "DeletionHeld")
        );
        for part in [
            "held: the state lock is held by me@laptop. The state Secret",
            "tfstate-default-abc-m",
            "lock-tfstate-default-abc-m",
            "until the lock is released",
        ] {
            assert!(locked.message.contains(part), "{part}: {}", locked.message);
        }
        let m = missing_inputs(Kind::Machine, "w-0", "u-2");
        assert_eq!((m.status, m.reason), (Status::False, "DestroyFailed"));
        assert!(m.message.contains("captf-inputs-m-w-0") && m.message.contains("=u-2"));
    }

    #[test]
    fn the_finalizer_is_the_top_level_step() {
        let ours = vec![finalizer(Kind::Machine).to_string()];
        let other = vec!["example.com/other".to_string()];
        let table = [
            (false, vec![], Lifecycle::AddFinalizer),
            (false, other.clone(), Lifecycle::AddFinalizer),
            (false, ours.clone(), Lifecycle::Live),
            (true, ours.clone(), Lifecycle::Deleting),
            (true, other, Lifecycle::Released),
            (true, vec![], Lifecycle::Released),
        ];
        for (deleting, finalizers, want) in table {
            assert_eq!(
                lifecycle(Kind::Machine, deleting, &finalizers),
                want,
                "{deleting} {finalizers:?}"
            );
        }
        // Another kind's finalizer is not ours.
        assert_eq!(lifecycle(Kind::Cluster, true, &ours), Lifecycle::Released);
    }

    #[test]
    fn steps() {
        let with = |edit: &dyn Fn(&mut Situation)| {
            let mut f = base();
            edit(&mut f);
            f
        };
        let table: Vec<(&str, Situation, Next)> = vec![
            (
                "applied, readable: destroy from the durable inputs",
                base(),
                Next::Destroy(DestroyInputs::Durable),
            ),
            (
                "applied, namespace terminating: destroyed from the manager's namespace",
                with(&|f| f.namespace_terminating = true),
                Next::Destroy(DestroyInputs::Durable),
            ),
            (
                "applied, namespace terminating, no destroy possible from elsewhere: held",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.away_possible = false;
                }),
                Next::Hold(Hold::NamespaceTerminating),
            ),
            (
                "namespace terminating, state unreadable: held, even if possible from elsewhere",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.state = StateFact::Unreadable;
                }),
                Next::Hold(Hold::NamespaceTerminating),
            ),
            (
                "namespace terminating, a destroy from elsewhere failed: backing off",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.finished.insert(0, job(Op::Destroy, false, 970));
                }),
                Next::Backoff {
                    wait: Duration::from_secs(30),
                    failures: 1,
                },
            ),
            (
                "applied, state gone with the namespace: held on the namespace",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.state = StateFact::NotFound;
                    f.durable_inputs = false;
                }),
                Next::Hold(Hold::NamespaceTerminating),
            ),
            (
                "an apply started, namespace terminating, no state left: held",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.state = StateFact::NotFound;
                    f.ever_applied = false;
                }),
                Next::Hold(Hold::NamespaceTerminating),
            ),
            (
                "never applied, namespace terminating: clean up at once",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.state = StateFact::NotFound;
                    f.ever_applied = false;
                    f.durable_inputs = false;
                }),
                Next::Cleanup(Why::NeverApplied),
            ),
            (
                "namespace terminating, abandoned: clean up",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.abandoned = true;
                }),
                Next::Cleanup(Why::Abandoned),
            ),
            (
                "namespace terminating, destroyed already: clean up",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.finished.insert(0, job(Op::Destroy, true, 10));
                }),
                Next::Cleanup(Why::Destroyed),
            ),
            (
                "destroyed, a foreign holder has the lock: held, nothing deleted",
                with(&|f| {
                    f.finished.insert(0, job(Op::Destroy, true, 10));
                    f.foreign_lock = true;
                }),
                Next::Hold(Hold::Locked),
            ),
            (
                "abandoned, a foreign holder has the lock: held",
                with(&|f| {
                    f.abandoned = true;
                    f.foreign_lock = true;
                }),
                Next::Hold(Hold::Locked),
            ),
            (
                "never applied, a foreign holder has the lock: held",
                with(&|f| {
                    f.state = StateFact::NotFound;
                    f.ever_applied = false;
                    f.durable_inputs = false;
                    f.foreign_lock = true;
                }),
                Next::Hold(Hold::Locked),
            ),
            (
                "a foreign lock, a destroy due: the destroy's Job waits for the lock",
                with(&|f| f.foreign_lock = true),
                Next::Destroy(DestroyInputs::Durable),
            ),
            (
                "namespace terminating, destroyed, a foreign lock: clean up (the namespace takes it all)",
                with(&|f| {
                    f.namespace_terminating = true;
                    f.finished.insert(0, job(Op::Destroy, true, 10));
                    f.foreign_lock = true;
                }),
                Next::Cleanup(Why::Destroyed),
            ),
            (
                "never applied: clean up at once",
                with(&|f| {
                    f.state = StateFact::NotFound;
                    f.ever_applied = false;
                    f.durable_inputs = false;
                    f.finished = vec![job(Op::Apply, false, 0)];
                }),
                Next::Cleanup(Why::NeverApplied),
            ),
            (
                "applied, state gone: held",
                with(&|f| f.state = StateFact::NotFound),
                Next::Hold(Hold::Lost),
            ),
            (
                "corrupt: held",
                with(&|f| f.state = StateFact::Unreadable),
                Next::Hold(Hold::Unreadable),
            ),
            (
                "abandoned releases a hold",
                with(&|f| {
                    f.state = StateFact::Unreadable;
                    f.abandoned = true;
                }),
                Next::Cleanup(Why::Abandoned),
            ),
            (
                "abandoned releases a failing destroy",
                with(&|f| {
                    f.abandoned = true;
                    f.finished = vec![job(Op::Destroy, false, 990)];
                }),
                Next::Cleanup(Why::Abandoned),
            ),
            (
                "destroyed: clean up, even once the state is gone",
                with(&|f| {
                    f.state = StateFact::NotFound;
                    f.finished = vec![job(Op::Destroy, true, 900), job(Op::Destroy, false, 500)];
                }),
                Next::Cleanup(Why::Destroyed),
            ),
            (
                "a failed destroy backs off 1m",
                with(&|f| f.finished = vec![job(Op::Destroy, false, 970)]),
                Next::Backoff {
                    wait: Duration::from_secs(30),
                    failures: 1,
                },
            ),
            (
                "then retries",
                with(&|f| f.finished = vec![job(Op::Destroy, false, 940)]),
                Next::Destroy(DestroyInputs::Durable),
            ),
            (
                "two failures wait 2m",
                with(&|f| {
                    f.finished = vec![job(Op::Destroy, false, 900), job(Op::Destroy, false, 700)]
                }),
                Next::Backoff {
                    wait: Duration::from_secs(20),
                    failures: 2,
                },
            ),
            (
                "apply failures do not delay a destroy",
                with(&|f| f.finished = vec![job(Op::Apply, false, 999)]),
                Next::Destroy(DestroyInputs::Durable),
            ),
            (
                "a machine never falls back to its spec",
                with(&|f| f.durable_inputs = false),
                Next::MissingInputs,
            ),
            (
                "a pool falls back to its spec",
                with(&|f| {
                    f.kind = Kind::MachinePool;
                    f.durable_inputs = false;
                }),
                Next::Destroy(DestroyInputs::Current),
            ),
            (
                "unless the spec does not render",
                with(&|f| {
                    f.kind = Kind::MachinePool;
                    f.durable_inputs = false;
                    f.renders = false;
                }),
                Next::MissingInputs,
            ),
            (
                "a cluster waits for its machines, abandoned or not",
                with(&|f| {
                    f.kind = Kind::Cluster;
                    f.dependents = 2;
                    f.abandoned = true;
                }),
                Next::WaitForDependents(2),
            ),
            (
                "dependents do not hold a machine",
                with(&|f| f.dependents = 2),
                Next::Destroy(DestroyInputs::Durable),
            ),
        ];
        for (what, facts, want) in table {
            assert_eq!(next(&facts), want, "{what}");
        }
    }
}
