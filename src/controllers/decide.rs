//! Which operation is due (ref §8.2, the part this manager runs so far) and
//! the retry backoff (ref §8.4). Pure: facts in, a decision out.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::ledger::Outcome;
use crate::names::Op;

/// What the state says, as far as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateFact {
    /// No state Secret: the object was never applied.
    NotFound,
    /// A readable state, with the inputs hash of the apply that produced it
    /// when one was adopted.
    Read { inputs_hash: Option<String> },
    /// Corrupt, inconsistent or encrypted: nothing may run from it.
    Unreadable,
}

/// A finished Job of the object, newest first in [`Facts::finished`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub op: Op,
    pub outcome: Outcome,
    pub succeeded: bool,
    /// Whether the failure counts towards backoff (an interruption does not).
    pub counts_for_backoff: bool,
    pub finished_at: Timestamp,
    /// The inputs hash an apply Job ran with, or the one a restored backup
    /// recorded (`captf.io/inputs-hash` on the Job).
    pub inputs_hash: Option<String>,
    /// An apply that remediated drift (`captf.io/drift-remediation`).
    pub remediation: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub state: StateFact,
    /// The inputs hash the object renders now; None when it cannot render.
    pub inputs_hash: Option<String>,
    /// Whether a change of inputs re-applies (TerraformCluster and
    /// TerraformMachinePool); a TerraformMachine is never re-applied once its
    /// state carries an inputs hash.
    pub mutable: bool,
    /// Finished Jobs, newest first.
    pub finished: Vec<Finished>,
    pub failed_jobs_history_limit: i32,
    pub now: Timestamp,
    /// `captf.io/restore-state` names a complete backup whose restore has
    /// not run yet: it goes before anything else (ref §8.2).
    pub restore_requested: bool,
    /// Drift was found, the action is Remediate, and the remediation
    /// failures since the last successful check stay below the cap.
    pub remediate: bool,
}

/// Why a Job is due: mostly an apply, or a restore or a destroy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobReason {
    /// Not an apply: a refresh the schedule calls for (ref §8.3).
    Refresh(crate::controllers::schedule::Refresh),
    /// Not an apply: the drift interval elapsed.
    DriftInterval,
    NoState,
    NoInputsHash,
    InputsChanged,
    RetryFailed,
    /// Drift was found and the action is Remediate.
    Remediation,
    /// Not an apply: the `captf.io/restore-state` annotation asks for a
    /// restore, which goes first.
    RestoreRequested,
    /// Not an apply: the object is being deleted, and its destroy is due.
    Deleting,
}

impl JobReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            JobReason::Refresh(why) => why.as_str(),
            JobReason::DriftInterval => "the drift interval elapsed",
            JobReason::NoState => "the object has no state yet",
            JobReason::NoInputsHash => "the state carries no inputs hash",
            JobReason::InputsChanged => "the inputs changed",
            JobReason::RetryFailed => "the last apply failed",
            JobReason::Remediation => "drift was found and the action is Remediate",
            JobReason::RestoreRequested => "captf.io/restore-state asks for a restore",
            JobReason::Deleting => "the object is being deleted",
        }
    }

    /// The `reason` label of `captf_reconcile_op_decisions_total`.
    pub const fn metric(self) -> &'static str {
        match self {
            JobReason::Refresh(why) => why.metric(),
            JobReason::DriftInterval => "drift_interval",
            JobReason::NoState => "no_state",
            JobReason::NoInputsHash => "no_inputs_hash",
            JobReason::InputsChanged => "inputs_changed",
            JobReason::RetryFailed => "retry_failed",
            JobReason::Remediation => "drift_remediation",
            JobReason::RestoreRequested => "restore_requested",
            JobReason::Deleting => "deleting",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start a restore now.
    Restore,
    /// Start an apply now.
    Apply(JobReason),
    /// An apply is due but backs off until the delay has passed.
    Backoff {
        reason: JobReason,
        wait: Duration,
        failures: u32,
    },
    /// Nothing to run.
    Idle,
}

/// The delay after `failures` consecutive failures (ref §8.4): 1m·2^(n−1),
/// capped at 10m, and 10m once n reaches failedJobsHistoryLimit.
pub fn backoff(failures: u32, failed_jobs_history_limit: i32) -> Duration {
    const CAP: Duration = Duration::from_secs(600);
    if failures == 0 {
        return Duration::ZERO;
    }
    if i64::from(failures) >= i64::from(failed_jobs_history_limit.max(1)) {
        return CAP;
    }
    let exp = (failures - 1).min(4);
    (Duration::from_secs(60) * 2u32.pow(exp)).min(CAP)
}

/// Consecutive failures of `op` since its newest success, and the newest
/// failure's end.
fn failures_of(finished: &[Finished], op: Op) -> (u32, Option<Timestamp>) {
    let mut n = 0;
    let mut newest = None;
    for f in finished.iter().filter(|f| f.op == op) {
        if f.succeeded {
            break;
        }
        if f.counts_for_backoff {
            n += 1;
            newest.get_or_insert(f.finished_at);
        }
    }
    (n, newest)
}

pub fn decide(facts: &Facts) -> Decision {
    if facts.restore_requested {
        return Decision::Restore;
    }
    // Retried: a failure, not a block, a changed plan or a remediation
    // (ref §8.2 item 6), which have their own ways back.
    let newest_apply_failed = facts
        .finished
        .iter()
        .find(|f| f.op == Op::Apply)
        .is_some_and(|f| {
            matches!(f.outcome, Outcome::Failed | Outcome::Interrupted) && !f.remediation
        });
    let reason = match &facts.state {
        StateFact::Unreadable => return Decision::Idle,
        StateFact::NotFound => JobReason::NoState,
        StateFact::Read { inputs_hash: None } => JobReason::NoInputsHash,
        StateFact::Read {
            inputs_hash: Some(applied),
        } => {
            if !facts.mutable {
                return Decision::Idle;
            }
            match &facts.inputs_hash {
                Some(current) if current != applied => JobReason::InputsChanged,
                _ if newest_apply_failed => JobReason::RetryFailed,
                _ if facts.remediate => JobReason::Remediation,
                _ => return Decision::Idle,
            }
        }
    };
    // New inputs start at once; a repeat of what failed waits its turn,
    // or an input change that fails would start an apply after every
    // failure.
    let newest_apply = facts.finished.iter().find(|f| f.op == Op::Apply);
    let repeat = newest_apply.is_some_and(|f| {
        !f.succeeded && f.inputs_hash.is_some() && f.inputs_hash == facts.inputs_hash
    });
    if reason == JobReason::InputsChanged && !repeat {
        return Decision::Apply(reason);
    }
    match backing_off(
        &facts.finished,
        Op::Apply,
        facts.failed_jobs_history_limit,
        facts.now,
    ) {
        Some((wait, failures)) => Decision::Backoff {
            reason,
            wait,
            failures,
        },
        None => Decision::Apply(reason),
    }
}

/// The rest of the backoff of `op` after its consecutive failures (ref
/// §8.4), with their count; None when `op` may run now.
pub fn backing_off(
    finished: &[Finished],
    op: Op,
    failed_jobs_history_limit: i32,
    now: Timestamp,
) -> Option<(Duration, u32)> {
    let (failures, newest) = failures_of(finished, op);
    let wait = backoff(failures, failed_jobs_history_limit);
    let elapsed = Duration::try_from(now.duration_since(newest?)).unwrap_or(Duration::ZERO);
    (elapsed < wait).then(|| (wait - elapsed, failures))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + secs).unwrap()
    }

    fn failed(secs: i64) -> Finished {
        Finished {
            op: Op::Apply,
            outcome: Outcome::Failed,
            succeeded: false,
            counts_for_backoff: true,
            finished_at: at(secs),
            inputs_hash: Some("h2:old".into()),
            remediation: false,
        }
    }

    /// A failed apply of `inputs_hash`.
    fn failed_with(inputs_hash: &str, secs: i64) -> Finished {
        Finished {
            inputs_hash: Some(inputs_hash.into()),
            ..failed(secs)
        }
    }

    fn ok(secs: i64) -> Finished {
        Finished {
            op: Op::Apply,
            outcome: Outcome::Succeeded,
            succeeded: true,
            counts_for_backoff: false,
            finished_at: at(secs),
            inputs_hash: Some("h2:old".into()),
            remediation: false,
        }
    }

    fn facts(state: StateFact, finished: Vec<Finished>, now: i64) -> Facts {
        Facts {
            state,
            inputs_hash: Some("h2:new".into()),
            mutable: true,
            finished,
            failed_jobs_history_limit: 3,
            now: at(now),
            restore_requested: false,
            remediate: false,
        }
    }

    #[test]
    fn remediation_and_what_is_not_retried() {
        let applied = || StateFact::Read {
            inputs_hash: Some("h2:new".into()),
        };
        let remediating = |f: Facts| Facts {
            remediate: true,
            ..f
        };
        let outcome = |o: Outcome, remediation: bool| Finished {
            outcome: o,
            succeeded: o == Outcome::Succeeded,
            counts_for_backoff: o == Outcome::Failed,
            remediation,
            inputs_hash: Some("h2:new".into()),
            ..failed(-30)
        };
        // (case, facts, decision)
        for (case, f, want) in [
            (
                "drift to remediate",
                remediating(facts(applied(), vec![], 0)),
                Decision::Apply(JobReason::Remediation),
            ),
            (
                "a failed remediation is not retried as a failure",
                facts(applied(), vec![outcome(Outcome::Failed, true)], 0),
                Decision::Idle,
            ),
            (
                "a blocked apply is not a failure",
                facts(applied(), vec![outcome(Outcome::Blocked, false)], 0),
                Decision::Idle,
            ),
            (
                "a changed plan is not a failure",
                facts(applied(), vec![outcome(Outcome::PlanChanged, false)], 0),
                Decision::Idle,
            ),
            (
                "an interrupted apply is retried at once",
                facts(applied(), vec![outcome(Outcome::Interrupted, false)], 0),
                Decision::Apply(JobReason::RetryFailed),
            ),
            (
                "a failure goes first, and waits its backoff",
                remediating(facts(applied(), vec![outcome(Outcome::Failed, false)], 0)),
                Decision::Backoff {
                    reason: JobReason::RetryFailed,
                    wait: Duration::from_secs(30),
                    failures: 1,
                },
            ),
        ] {
            assert_eq!(decide(&f), want, "{case}");
        }
    }

    #[test]
    fn backoff_sequence() {
        let m = |s| Duration::from_secs(s);
        let table = [
            (0, 3, m(0)),
            (1, 3, m(60)),
            (2, 3, m(120)),
            (3, 3, m(600)),
            (4, 3, m(600)),
            (3, 10, m(240)),
            (5, 10, m(600)),
            (9, 10, m(600)),
            (30, 100, m(600)),
            (1, 0, m(600)),
        ];
        for (n, limit, want) in table {
            assert_eq!(backoff(n, limit), want, "n={n} limit={limit}");
        }
    }

    #[test]
    fn decisions() {
        let hash = |h: &str| StateFact::Read {
            inputs_hash: Some(h.into()),
        };
        let table: Vec<(&str, Facts, Decision)> = vec![
            (
                "no state",
                facts(StateFact::NotFound, vec![], 0),
                Decision::Apply(JobReason::NoState),
            ),
            (
                "unreadable",
                facts(StateFact::Unreadable, vec![failed(0)], 999),
                Decision::Idle,
            ),
            (
                "no hash",
                facts(StateFact::Read { inputs_hash: None }, vec![], 0),
                Decision::Apply(JobReason::NoInputsHash),
            ),
            (
                "same hash",
                facts(hash("h2:new"), vec![ok(0)], 10),
                Decision::Idle,
            ),
            (
                "changed",
                facts(hash("h2:old"), vec![failed(0)], 1),
                Decision::Apply(JobReason::InputsChanged),
            ),
            (
                "changed inputs that failed wait their turn",
                facts(hash("h2:old"), vec![failed_with("h2:new", 0)], 30),
                Decision::Backoff {
                    reason: JobReason::InputsChanged,
                    wait: Duration::from_secs(30),
                    failures: 1,
                },
            ),
            (
                "changed inputs that failed, delay over",
                facts(hash("h2:old"), vec![failed_with("h2:new", 0)], 60),
                Decision::Apply(JobReason::InputsChanged),
            ),
            (
                "failed, backing off",
                facts(StateFact::NotFound, vec![failed(0)], 30),
                Decision::Backoff {
                    reason: JobReason::NoState,
                    wait: Duration::from_secs(30),
                    failures: 1,
                },
            ),
            (
                "failed, delay over",
                facts(StateFact::NotFound, vec![failed(0)], 60),
                Decision::Apply(JobReason::NoState),
            ),
            (
                "two failures wait 2m",
                facts(StateFact::NotFound, vec![failed(100), failed(0)], 200),
                Decision::Backoff {
                    reason: JobReason::NoState,
                    wait: Duration::from_secs(20),
                    failures: 2,
                },
            ),
            (
                "a success resets",
                facts(
                    StateFact::NotFound,
                    vec![failed(100), ok(50), failed(0), failed(-10)],
                    160,
                ),
                Decision::Apply(JobReason::NoState),
            ),
            (
                "retry of same inputs",
                facts(hash("h2:new"), vec![failed(0)], 61),
                Decision::Apply(JobReason::RetryFailed),
            ),
            (
                "retry backs off",
                facts(hash("h2:new"), vec![failed(0)], 10),
                Decision::Backoff {
                    reason: JobReason::RetryFailed,
                    wait: Duration::from_secs(50),
                    failures: 1,
                },
            ),
        ];
        for (what, f, want) in table {
            assert_eq!(decide(&f), want, "{what}");
        }
    }

    #[test]
    fn interruptions_do_not_count() {
        let mut f = failed(0);
        f.counts_for_backoff = false;
        assert_eq!(
            decide(&facts(StateFact::NotFound, vec![f], 1)),
            Decision::Apply(JobReason::NoState)
        );
    }

    #[test]
    fn a_machine_is_not_reapplied_once_its_state_has_a_hash() {
        let mut f = facts(
            StateFact::Read {
                inputs_hash: Some("h2:old".into()),
            },
            vec![failed(0)],
            999,
        );
        f.mutable = false;
        assert_eq!(decide(&f), Decision::Idle);
        f.state = StateFact::Read { inputs_hash: None };
        assert_eq!(decide(&f), Decision::Apply(JobReason::NoInputsHash));
    }

    #[test]
    fn a_requested_restore_goes_before_everything() {
        for state in [
            StateFact::NotFound,
            StateFact::Unreadable,
            StateFact::Read { inputs_hash: None },
            StateFact::Read {
                inputs_hash: Some("h2:old".into()),
            },
        ] {
            let mut f = facts(state.clone(), vec![failed(0)], 1);
            f.restore_requested = true;
            assert_eq!(decide(&f), Decision::Restore, "{state:?}");
        }
    }
}
