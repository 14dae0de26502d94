//! What a finished Job measures (ref §5): its duration, its queue time,
//! each step's duration from the result document, what went wrong and
//! where, and what its apply or destroy changed. Pure; the metrics record
//! it through `Metrics::job_accounted`.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ContainerStateTerminated;

use super::ledger::JobEnd;
use crate::api::{RunError, RunErrorKind};
use crate::metrics::{JobErrorKind, Step};
use crate::runner::result::RunResult;
use crate::runner::steps::Changed;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobFigures {
    /// Job creation to its end, in seconds.
    pub duration: Option<f64>,
    /// Job creation to the runner container's start; None when the pod
    /// reported no start.
    pub queue: Option<f64>,
    pub steps: Vec<(Step, f64)>,
    /// What went wrong, and in which step.
    pub error: Option<(JobErrorKind, Step)>,
    pub changed: Option<Changed>,
}

/// The `step` label of a step the result document names.
pub fn step(name: &str) -> Step {
    match name {
        "init" => Step::Init,
        "force-unlock" => Step::ForceUnlock,
        "validate" => Step::Validate,
        "plan" => Step::Plan,
        "show" => Step::ShowJson,
        "apply" => Step::Apply,
        "apply-refresh-only" => Step::ApplyRefreshOnly,
        "destroy" => Step::Destroy,
        "state-push" => Step::StatePush,
        "state-list" => Step::StateList,
        _ => Step::Other,
    }
}

fn seconds(from: k8s_openapi::jiff::Timestamp, to: k8s_openapi::jiff::Timestamp) -> Option<f64> {
    let s = from.duration_until(to).as_secs_f64();
    (s >= 0.0).then_some(s)
}

pub fn of(
    job: &Job,
    end: &JobEnd,
    terminated: Option<&ContainerStateTerminated>,
    document: Option<&RunResult>,
    error: Option<&RunError>,
) -> JobFigures {
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let started = terminated.and_then(|t| t.started_at.as_ref()).map(|t| t.0);
    let error = match (end.succeeded, end.deadline) {
        (true, _) => None,
        (false, true) => Some(JobErrorKind::Deadline),
        (false, false) => Some(match error.map(|e| e.kind) {
            Some(RunErrorKind::Step) => JobErrorKind::Step,
            Some(RunErrorKind::ImageLayout) => JobErrorKind::ImageLayout,
            Some(RunErrorKind::Interrupted) => JobErrorKind::Interrupted,
            Some(RunErrorKind::Blocked) => JobErrorKind::Blocked,
            Some(RunErrorKind::PlanChanged) => JobErrorKind::PlanChanged,
            None => JobErrorKind::Unknown,
        }),
    }
    .map(|kind| {
        let at = error
            .and_then(|e| e.step.as_deref())
            .map_or(Step::NoStep, step);
        (kind, at)
    });
    JobFigures {
        duration: created.and_then(|c| seconds(c, end.at)),
        queue: created.zip(started).and_then(|(c, s)| seconds(c, s)),
        steps: document
            .map(|d| {
                d.steps
                    .iter()
                    .map(|s| (step(&s.name), s.duration_milliseconds as f64 / 1000.0))
                    .collect()
            })
            .unwrap_or_default(),
        error,
        changed: document.and_then(|d| d.changed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Op;
    use crate::runner::result::StepRecord;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).unwrap()
    }

    fn job() -> Job {
        let mut j = Job::default();
        j.metadata.creation_timestamp = Some(Time(at(0)));
        j
    }

    fn doc(error: Option<RunError>) -> RunResult {
        RunResult {
            operation: Op::Apply,
            job: None,
            image: None,
            runtime_version: None,
            steps: [("init", 1500), ("show", 250), ("custom", 10)]
                .map(|(name, ms)| StepRecord {
                    name: name.into(),
                    exit_code: 0,
                    duration_milliseconds: ms,
                    args: None,
                })
                .to_vec(),
            changed: Some(Changed {
                add: 2,
                ..Default::default()
            }),
            plan: None,
            error,
        }
    }

    #[test]
    fn a_succeeded_job() {
        let end = JobEnd {
            succeeded: true,
            deadline: false,
            at: at(90),
        };
        let started = ContainerStateTerminated {
            started_at: Some(Time(at(12))),
            ..Default::default()
        };
        let f = of(&job(), &end, Some(&started), Some(&doc(None)), None);
        assert_eq!(f.duration, Some(90.0));
        assert_eq!(f.queue, Some(12.0));
        assert_eq!(
            f.steps,
            vec![
                (Step::Init, 1.5),
                (Step::ShowJson, 0.25),
                (Step::Other, 0.01)
            ]
        );
        assert_eq!(f.error, None);
        assert_eq!(f.changed.unwrap().add, 2);
        // No start reported: no queue time.
        assert_eq!(of(&job(), &end, None, None, None).queue, None);
    }

    #[test]
    fn errors_and_where() {
        let failed = |deadline| JobEnd {
            succeeded: false,
            deadline,
            at: at(30),
        };
        let blocked = RunError {
            kind: RunErrorKind::Blocked,
            step: Some("plan".into()),
            summary: None,
        };
        let layout = RunError {
            kind: RunErrorKind::ImageLayout,
            step: None,
            summary: None,
        };
        for (end, error, want) in [
            (
                failed(false),
                Some(&blocked),
                (JobErrorKind::Blocked, Step::Plan),
            ),
            (
                failed(false),
                Some(&layout),
                (JobErrorKind::ImageLayout, Step::NoStep),
            ),
            (
                failed(true),
                Some(&blocked),
                (JobErrorKind::Deadline, Step::Plan),
            ),
            (failed(false), None, (JobErrorKind::Unknown, Step::NoStep)),
        ] {
            assert_eq!(of(&job(), &end, None, None, error).error, Some(want));
        }
    }
}
