//! Accounting a finished Job into status (ref §8.1 step 6): its outcome from
//! the Job's conditions and the runner's result document in the pod's
//! termination message. Pure.

use k8s_openapi::api::core::v1::ContainerStateTerminated;

use super::conditions::{
    APPLY_JOB_SUCCEEDED, Cond, DRIFT_JOB_SUCCEEDED, RESTORE_JOB_SUCCEEDED, Status,
};
use super::ledger::{JobEnd, Outcome};
use crate::api::{LastRun, RunError, RunErrorKind, RunStep};
use crate::metrics::JobResult;
use crate::names::Op;
use crate::runner::plan::PlanReport;
use crate::runner::result::RunResult;

/// What bookkeeping records for one finished Job.
#[derive(Clone, Debug, PartialEq)]
pub struct Accounted {
    pub last_run: LastRun,
    pub outcome: Outcome,
    pub condition: Cond,
    pub runtime_version: Option<String>,
    /// The `result` of `captf_jobs_total`.
    pub result: JobResult,
    /// The plan the runner reported.
    pub plan: Option<PlanReport>,
    /// The runner's result document, when it wrote one.
    pub document: Option<RunResult>,
}

/// Status keeps at most 16 steps (the CRD's limit).
const MAX_STEPS: usize = 16;
const MAX_SUMMARY: usize = 512;
/// A step's name, in `steps` and in `error` (the CRD's limit).
const MAX_NAME: usize = 64;
/// A step the document gives no name.
const UNNAMED: &str = "(unnamed)";

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Accounts a finished Job: `terminated` is its runner container's final
/// state, when a pod ran.
pub fn account(
    job: &str,
    op: Op,
    end: &JobEnd,
    terminated: Option<&ContainerStateTerminated>,
) -> Accounted {
    let document: Option<RunResult> = terminated
        .and_then(|t| t.message.as_deref())
        .filter(|m| !m.trim().is_empty())
        .and_then(|m| serde_json::from_str(m).ok());
    let document_error = document.as_ref().and_then(|d| d.error.clone());
    let oom = terminated.and_then(|t| t.reason.as_deref()) == Some("OOMKilled");

    let error = if end.succeeded {
        None
    } else if let Some(e) = document_error {
        Some(e)
    } else if end.deadline {
        Some(RunError {
            kind: RunErrorKind::Interrupted,
            step: None,
            summary: Some("the Job reached its activeDeadlineSeconds".into()),
        })
    } else {
        let summary = match terminated {
            Some(_) if oom => "the runner was killed: OOMKilled (memory limit reached)".to_string(),
            Some(t) => format!(
                "the runner exited {} without a result document",
                t.exit_code
            ),
            None => "the Job failed before its runner ran".to_string(),
        };
        Some(RunError {
            kind: RunErrorKind::Step,
            step: None,
            summary: Some(summary),
        })
    };
    // The document is the pod's to write: clipped to the CRD's bounds, or
    // the status write that carries it is refused.
    let error = error.map(|mut e| {
        e.step = e
            .step
            .map(|s| truncate(s, MAX_NAME))
            .filter(|s| !s.is_empty());
        e.summary = e
            .summary
            .map(|s| truncate(s, MAX_SUMMARY))
            .filter(|s| !s.is_empty());
        e
    });

    let steps: Vec<RunStep> = document
        .as_ref()
        .map(|d| {
            d.steps
                .iter()
                .take(MAX_STEPS)
                .map(|s| RunStep {
                    name: Some(truncate(s.name.clone(), MAX_NAME))
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| UNNAMED.into()),
                    exit_code: s.exit_code,
                    duration_milliseconds: Some(
                        i64::try_from(s.duration_milliseconds).unwrap_or(i64::MAX),
                    ),
                })
                .collect()
        })
        .unwrap_or_default();

    let result = job_result(end, error.as_ref().map(|e| e.kind));
    // An interruption reported by the runner is retried without backoff; a
    // deadline counts unless the runner said it was interrupted (ref §8.4).
    let counts_for_backoff = !end.succeeded
        && !matches!(
            error.as_ref().map(|e| e.kind),
            Some(RunErrorKind::Interrupted | RunErrorKind::Blocked | RunErrorKind::PlanChanged)
        )
        || end.deadline && document.as_ref().and_then(|d| d.error.as_ref()).is_none();

    let outcome = if end.succeeded {
        Outcome::Succeeded
    } else if counts_for_backoff {
        Outcome::Failed
    } else {
        match error.as_ref().map(|e| e.kind) {
            Some(RunErrorKind::Blocked) => Outcome::Blocked,
            Some(RunErrorKind::PlanChanged) => Outcome::PlanChanged,
            _ => Outcome::Interrupted,
        }
    };
    let condition = condition(op, end, error.as_ref(), job);
    Accounted {
        last_run: LastRun {
            job: job.to_string(),
            operation: op,
            steps: (!steps.is_empty()).then_some(steps),
            error,
            drift: None,
        },
        outcome,
        condition,
        plan: document.as_ref().and_then(|d| d.plan.clone()),
        runtime_version: document
            .as_ref()
            .and_then(|d| d.runtime_version.clone())
            .filter(|v| !v.is_empty() && v.len() <= 64),
        result,
        document,
    }
}

/// The `result` of `captf_jobs_total` (ref §5): a deadline is a deadline
/// whatever the runner said; blocked and plan-changed are outcomes of
/// their own, not failures.
pub fn job_result(end: &JobEnd, error: Option<RunErrorKind>) -> JobResult {
    if end.succeeded {
        return JobResult::Succeeded;
    }
    if end.deadline {
        return JobResult::Deadline;
    }
    match error {
        Some(RunErrorKind::Interrupted) => JobResult::Interrupted,
        Some(RunErrorKind::Blocked) => JobResult::Blocked,
        Some(RunErrorKind::PlanChanged) => JobResult::PlanChanged,
        Some(RunErrorKind::Step | RunErrorKind::ImageLayout) | None => JobResult::Failed,
    }
}

fn condition(op: Op, end: &JobEnd, error: Option<&RunError>, job: &str) -> Cond {
    let summary = error.and_then(|e| e.summary.clone()).unwrap_or_default();
    let failed_message = match error.and_then(|e| e.step.as_deref()) {
        Some(step) => format!("Job {job} failed in step {step}: {summary}"),
        None => format!("Job {job} failed: {summary}"),
    };
    let image_layout = error.is_some_and(|e| e.kind == RunErrorKind::ImageLayout);
    match op {
        Op::Apply | Op::Destroy | Op::Plan => {
            let (ok, failed) = match op {
                Op::Destroy => ("DestroySucceeded", "DestroyFailed"),
                _ => ("ApplySucceeded", "ApplyFailed"),
            };
            if end.succeeded {
                if op == Op::Plan {
                    Cond::new(
                        APPLY_JOB_SUCCEEDED,
                        Status::Unknown,
                        "PlanAwaitingApproval",
                        format!("plan Job {job} finished"),
                    )
                } else {
                    Cond::new(
                        APPLY_JOB_SUCCEEDED,
                        Status::True,
                        ok,
                        format!("Job {job} succeeded"),
                    )
                }
            } else if end.deadline {
                Cond::new(
                    APPLY_JOB_SUCCEEDED,
                    Status::False,
                    "JobDeadlineExceeded",
                    failed_message,
                )
            } else if image_layout {
                Cond::new(
                    APPLY_JOB_SUCCEEDED,
                    Status::False,
                    "ImageInvalid",
                    failed_message,
                )
            } else {
                Cond::new(APPLY_JOB_SUCCEEDED, Status::False, failed, failed_message)
            }
        }
        Op::Refresh | Op::Drift => {
            if end.succeeded {
                Cond::new(
                    DRIFT_JOB_SUCCEEDED,
                    Status::True,
                    "DriftChecked",
                    format!("Job {job} succeeded"),
                )
            } else if end.deadline {
                Cond::new(
                    DRIFT_JOB_SUCCEEDED,
                    Status::False,
                    "DriftJobDeadlineExceeded",
                    failed_message,
                )
            } else {
                Cond::new(
                    DRIFT_JOB_SUCCEEDED,
                    Status::False,
                    "DriftJobFailed",
                    failed_message,
                )
            }
        }
        Op::Restore => {
            if end.succeeded {
                Cond::new(
                    RESTORE_JOB_SUCCEEDED,
                    Status::True,
                    "StateRestored",
                    format!("Job {job} succeeded"),
                )
            } else {
                Cond::new(
                    RESTORE_JOB_SUCCEEDED,
                    Status::False,
                    "RestoreFailed",
                    failed_message,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn end(succeeded: bool, deadline: bool) -> JobEnd {
        JobEnd {
            succeeded,
            deadline,
            at: Timestamp::from_second(1).unwrap(),
        }
    }

    fn term(exit: i32, reason: &str, message: &str) -> ContainerStateTerminated {
        ContainerStateTerminated {
            exit_code: exit,
            reason: Some(reason.into()),
            message: (!message.is_empty()).then(|| message.into()),
            ..Default::default()
        }
    }

    const OK_DOC: &str = r#"{"operation":"apply","runtimeVersion":"1.12.6","steps":[{"name":"init","exitCode":0,"durationMilliseconds":5,"args":["init"]},{"name":"apply","exitCode":0,"durationMilliseconds":7}]}"#;
    const FAILED_DOC: &str = r#"{"operation":"apply","steps":[{"name":"init","exitCode":0,"durationMilliseconds":1},{"name":"apply","exitCode":1,"durationMilliseconds":2}],"error":{"kind":"step","step":"apply","summary":"Error: boom"}}"#;

    #[test]
    fn outcomes() {
        // (case, op, job end, runner container, succeeded, reason, jobs_total result, counts for backoff)
        type Row = (
            &'static str,
            Op,
            JobEnd,
            Option<ContainerStateTerminated>,
            bool,
            &'static str,
            JobResult,
            bool,
        );
        let table: Vec<Row> = vec![
            (
                "apply ok",
                Op::Apply,
                end(true, false),
                Some(term(0, "Completed", OK_DOC)),
                true,
                "ApplySucceeded",
                JobResult::Succeeded,
                false,
            ),
            (
                "apply step failure",
                Op::Apply,
                end(false, false),
                Some(term(1, "Error", FAILED_DOC)),
                false,
                "ApplyFailed",
                JobResult::Failed,
                true,
            ),
            (
                "oom, no document",
                Op::Apply,
                end(false, false),
                Some(term(137, "OOMKilled", "")),
                false,
                "ApplyFailed",
                JobResult::Failed,
                true,
            ),
            (
                "deadline",
                Op::Apply,
                end(false, true),
                None,
                false,
                "JobDeadlineExceeded",
                JobResult::Deadline,
                true,
            ),
            (
                "destroy failure",
                Op::Destroy,
                end(false, false),
                Some(term(1, "Error", FAILED_DOC)),
                false,
                "DestroyFailed",
                JobResult::Failed,
                true,
            ),
            (
                "drift ok",
                Op::Drift,
                end(true, false),
                Some(term(0, "Completed", OK_DOC)),
                true,
                "DriftChecked",
                JobResult::Succeeded,
                false,
            ),
            (
                "restore failure",
                Op::Restore,
                end(false, false),
                None,
                false,
                "RestoreFailed",
                JobResult::Failed,
                true,
            ),
            (
                "interrupted",
                Op::Apply,
                end(false, false),
                Some(term(
                    1,
                    "Error",
                    r#"{"operation":"apply","error":{"kind":"interrupted","summary":"SIGTERM"}}"#,
                )),
                false,
                "ApplyFailed",
                JobResult::Interrupted,
                false,
            ),
            (
                "image layout",
                Op::Apply,
                end(false, false),
                Some(term(
                    1,
                    "Error",
                    r#"{"operation":"apply","error":{"kind":"image-layout","summary":"no module"}}"#,
                )),
                false,
                "ImageInvalid",
                JobResult::Failed,
                true,
            ),
            (
                "garbage message",
                Op::Apply,
                end(false, false),
                Some(term(1, "Error", "not json")),
                false,
                "ApplyFailed",
                JobResult::Failed,
                true,
            ),
            (
                "blocked",
                Op::Apply,
                end(false, false),
                Some(term(
                    2,
                    "Error",
                    r#"{"operation":"apply","error":{"kind":"blocked","summary":"a delete"}}"#,
                )),
                false,
                "ApplyFailed",
                JobResult::Blocked,
                false,
            ),
            (
                "plan changed",
                Op::Apply,
                end(false, false),
                Some(term(
                    3,
                    "Error",
                    r#"{"operation":"apply","error":{"kind":"plan-changed","summary":"changed"}}"#,
                )),
                false,
                "ApplyFailed",
                JobResult::PlanChanged,
                false,
            ),
            (
                "deadline, runner interrupted",
                Op::Apply,
                end(false, true),
                Some(term(
                    1,
                    "Error",
                    r#"{"operation":"apply","error":{"kind":"interrupted","summary":"SIGTERM"}}"#,
                )),
                false,
                "JobDeadlineExceeded",
                JobResult::Deadline,
                false,
            ),
        ];
        for (what, op, e, t, ok, reason, result, backoff) in table {
            let a = account("job-x", op, &e, t.as_ref());
            assert_eq!(a.outcome == Outcome::Succeeded, ok, "{what}");
            assert_eq!(a.condition.reason, reason, "{what}");
            assert_eq!(a.result, result, "{what}");
            assert_eq!(a.outcome == Outcome::Failed, backoff, "{what}");
            assert_eq!(a.last_run.job, "job-x");
        }
    }

    /// Found by `make fuzz` (run_result): a 97-character error step was
    /// kept whole, so the status write carrying it was refused.
    #[test]
    fn a_document_past_the_schema_is_clipped_to_it() {
        let long = "applyt".repeat(20);
        let doc = serde_json::json!({
            "operation": "apply",
            "steps": [{"name": long, "exitCode": 1, "durationMilliseconds": 1},
                      {"name": "", "exitCode": 0, "durationMilliseconds": 1}],
            "error": {"kind": "step", "step": long, "summary": ""}
        })
        .to_string();
        let a = account(
            "j",
            Op::Apply,
            &end(false, false),
            Some(&term(1, "Error", &doc)),
        );
        let steps = a.last_run.steps.unwrap();
        assert_eq!(steps[0].name, long[..MAX_NAME]);
        assert_eq!(steps[1].name, UNNAMED);
        let error = a.last_run.error.unwrap();
        assert_eq!(error.step.as_deref(), Some(&long[..MAX_NAME]));
        assert_eq!(error.summary, None);
        let step = serde_json::json!({"kind": "step", "step": "", "summary": "x"}).to_string();
        let doc = format!(r#"{{"operation":"apply","steps":[],"error":{step}}}"#);
        let a = account(
            "j",
            Op::Apply,
            &end(false, false),
            Some(&term(1, "Error", &doc)),
        );
        assert_eq!(a.last_run.error.unwrap().step, None);
    }

    #[test]
    fn steps_and_summary_reach_last_run() {
        let a = account(
            "j",
            Op::Apply,
            &end(false, false),
            Some(&term(1, "Error", FAILED_DOC)),
        );
        let steps = a.last_run.steps.unwrap();
        assert_eq!(
            steps
                .iter()
                .map(|s| (s.name.as_str(), s.exit_code))
                .collect::<Vec<_>>(),
            [("init", 0), ("apply", 1)]
        );
        let error = a.last_run.error.unwrap();
        assert_eq!(
            (error.kind, error.step.as_deref(), error.summary.as_deref()),
            (RunErrorKind::Step, Some("apply"), Some("Error: boom"))
        );
        assert!(
            a.condition.message.contains("step apply: Error: boom"),
            "{}",
            a.condition.message
        );
        let ok = account(
            "j",
            Op::Apply,
            &end(true, false),
            Some(&term(0, "Completed", OK_DOC)),
        );
        assert_eq!(ok.runtime_version.as_deref(), Some("1.12.6"));
        assert_eq!(ok.last_run.error, None);
    }
}
