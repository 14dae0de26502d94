//! The Job ledger (ref §8.1 step 6): an object's Jobs sorted into the one
//! active, the finished ones already accounted (their outcome in
//! `captf.io/bookkept`), and the finished ones not yet accounted, which
//! this pass settles. Pure.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;

use super::decide::Finished;
use crate::keys::{ATTEMPT_LABEL, BOOKKEPT, DRIFT_REMEDIATION, INPUTS_HASH, OP_LABEL};
use crate::names::Op;

/// How a Job ended, from its own status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEnd {
    pub succeeded: bool,
    /// The Job controller stopped it at activeDeadlineSeconds.
    pub deadline: bool,
    pub at: Timestamp,
}

/// The end of a Job, or None while it is active.
pub fn job_end(job: &Job) -> Option<JobEnd> {
    let status = job.status.as_ref()?;
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let end = conditions
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    let at = end
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .or(status.completion_time.as_ref().map(|t| t.0))
        .unwrap_or_else(Timestamp::now);
    Some(JobEnd {
        succeeded: end.type_ == "Complete",
        deadline: end.type_ == "Failed" && end.reason.as_deref() == Some("DeadlineExceeded"),
        at,
    })
}

/// How a finished Job counts for what comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// Counts towards the retry backoff (ref §8.4).
    Failed,
    /// Retried without backoff.
    Interrupted,
    /// A guarded apply stopped before a delete or a replace; not counted
    /// for backoff, and not retried until approved or the inputs change.
    Blocked,
    /// An approved apply found another plan; not counted for backoff.
    PlanChanged,
}

impl Outcome {
    /// The value of `captf.io/bookkept`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
            Outcome::Blocked => "blocked",
            Outcome::PlanChanged => "plan-changed",
        }
    }

    /// A value this manager wrote; anything else was not.
    pub fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Interrupted,
            Outcome::Blocked,
            Outcome::PlanChanged,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }

    /// `job` of `op`, ended at `at` with this outcome.
    pub fn finished(self, job: &Job, op: Op, at: Timestamp) -> Finished {
        Finished {
            op,
            outcome: self,
            succeeded: self == Outcome::Succeeded,
            counts_for_backoff: self == Outcome::Failed,
            finished_at: at,
            inputs_hash: job
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INPUTS_HASH))
                .cloned(),
            remediation: job
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DRIFT_REMEDIATION)),
        }
    }
}

/// A finished Job whose result is not in status yet.
#[derive(Clone, Debug)]
pub struct Unsettled<'a> {
    pub job: &'a Job,
    pub op: Op,
    pub end: JobEnd,
}

#[derive(Clone, Debug, Default)]
pub struct Ledger<'a> {
    pub active: Option<&'a Job>,
    /// Accounted before this pass, newest first.
    pub finished: Vec<Finished>,
    /// To settle in this pass, oldest first, so that the newest outcome is
    /// the one status keeps.
    pub unsettled: Vec<Unsettled<'a>>,
}

pub fn op(job: &Job) -> Option<Op> {
    label(job, OP_LABEL).and_then(Op::parse)
}

pub fn attempt(job: &Job) -> u32 {
    label(job, ATTEMPT_LABEL)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// How this manager accounted a finished Job; None when it has not (or
/// the value is not one it writes).
pub fn bookkept(job: &Job) -> Option<Outcome> {
    job.metadata
        .annotations
        .as_ref()?
        .get(BOOKKEPT)
        .and_then(|v| Outcome::parse(v))
}

fn label<'a>(job: &'a Job, key: &str) -> Option<&'a str> {
    job.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Sorts the object's Jobs. A Job without a known op is not CAPTF's to
/// account; one whose bookkept value this manager did not write is settled
/// again.
pub fn ledger(jobs: &[Job]) -> Ledger<'_> {
    let mut ledger = Ledger::default();
    for job in jobs {
        let Some(op) = op(job) else { continue };
        let Some(end) = job_end(job) else {
            ledger.active = Some(job);
            continue;
        };
        match bookkept(job) {
            Some(outcome) => ledger.finished.push(outcome.finished(job, op, end.at)),
            None => ledger.unsettled.push(Unsettled { job, op, end }),
        }
    }
    ledger
        .finished
        .sort_by_key(|f| std::cmp::Reverse(f.finished_at));
    ledger.unsettled.sort_by_key(|u| u.end.at);
    ledger
}

/// `settled` (this pass's outcomes) merged into `finished`, newest first.
pub fn with_settled(mut finished: Vec<Finished>, settled: &[Finished]) -> Vec<Finished> {
    finished.extend_from_slice(settled);
    finished.sort_by_key(|f| std::cmp::Reverse(f.finished_at));
    finished
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    /// A Job `name` of `op` that ended at `end` ("Complete" or "Failed",
    /// seconds), with its bookkept value.
    pub(crate) fn job(
        name: &str,
        op: &str,
        end: Option<(&str, i64)>,
        bookkept: Option<&str>,
    ) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.metadata.labels = Some([(OP_LABEL.to_string(), op.to_string())].into());
        if let Some(b) = bookkept {
            j.metadata.annotations = Some([(BOOKKEPT.to_string(), b.to_string())].into());
        }
        if let Some((type_, s)) = end {
            j.status = Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(at(s))),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
        j
    }

    #[test]
    fn jobs_sort_into_active_accounted_and_unsettled() {
        struct Row {
            jobs: Vec<Job>,
            active: Option<&'static str>,
            finished: Vec<(Op, bool, bool)>,
            unsettled: Vec<&'static str>,
        }
        let rows = [
            Row {
                jobs: vec![],
                active: None,
                finished: vec![],
                unsettled: vec![],
            },
            Row {
                jobs: vec![job("run", "apply", None, None)],
                active: Some("run"),
                finished: vec![],
                unsettled: vec![],
            },
            Row {
                jobs: vec![
                    job("old", "apply", Some(("Failed", 1)), Some("failed")),
                    job("new", "apply", Some(("Complete", 5)), Some("succeeded")),
                    job("cut", "destroy", Some(("Failed", 3)), Some("interrupted")),
                ],
                active: None,
                finished: vec![
                    (Op::Apply, true, false),
                    (Op::Destroy, false, false),
                    (Op::Apply, false, true),
                ],
                unsettled: vec![],
            },
            Row {
                jobs: vec![
                    job("b", "apply", Some(("Complete", 9)), None),
                    job("a", "restore", Some(("Failed", 2)), None),
                    // Not a value this manager writes: settled again.
                    job("c", "apply", Some(("Failed", 4)), Some("yes")),
                ],
                active: None,
                finished: vec![],
                unsettled: vec!["a", "c", "b"],
            },
            Row {
                // Not CAPTF's: no op label value it knows.
                jobs: vec![job("x", "sync", Some(("Complete", 1)), None)],
                active: None,
                finished: vec![],
                unsettled: vec![],
            },
        ];
        for (i, row) in rows.iter().enumerate() {
            let l = ledger(&row.jobs);
            assert_eq!(
                l.active.and_then(|j| j.metadata.name.as_deref()),
                row.active,
                "row {i}"
            );
            let finished: Vec<_> = l
                .finished
                .iter()
                .map(|f| (f.op, f.succeeded, f.counts_for_backoff))
                .collect();
            assert_eq!(finished, row.finished, "row {i}");
            let unsettled: Vec<_> = l
                .unsettled
                .iter()
                .map(|u| u.job.metadata.name.as_deref().unwrap())
                .collect();
            assert_eq!(unsettled, row.unsettled, "row {i}");
        }
    }

    #[test]
    fn outcomes_round_trip_and_count_for_backoff_only_when_failed() {
        for o in [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Interrupted,
            Outcome::Blocked,
            Outcome::PlanChanged,
        ] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            let f = o.finished(&Job::default(), Op::Apply, at(0));
            assert_eq!(f.succeeded, o == Outcome::Succeeded);
            assert_eq!(f.counts_for_backoff, o == Outcome::Failed);
        }
        assert_eq!(Outcome::parse("Succeeded"), None);
    }

    #[test]
    fn settled_outcomes_merge_newest_first() {
        let older = Outcome::Failed.finished(&Job::default(), Op::Apply, at(1));
        let newer = Outcome::Succeeded.finished(&Job::default(), Op::Apply, at(9));
        let merged = with_settled(vec![older.clone()], std::slice::from_ref(&newer));
        assert_eq!(merged, vec![newer, older]);
    }
}
