//! The runner's result document as the manager reads it: the runner
//! container's termination message, through `bookkeeping::account` (what
//! goes into `status.lastRun` and the conditions) and `figures::of` (the
//! metrics), for each kind of Job end; and the runner's own bounded writer
//! (`RunResult::to_bounded_json`) on whatever document parses.
//!
//! Input: the termination message (the kubelet keeps at most 4096 bytes;
//! not UTF-8: skipped, the API server hands out a string).
//!
//! Properties, beyond "no panic, no OOM, no hang":
//! - `status.lastRun` keeps the CRD's schema (src/api/status.rs: at most 16
//!   steps, names of 1 to 64 characters, durations not negative, an error's
//!   step of 1 to 64 characters and summary of 1 to 512), or the status
//!   write that carries it is refused;
//! - the runtime version kept for `status.source` has 1 to 64 characters;
//! - a document that parses is written back in at most `RESULT_MAX` bytes,
//!   and that reads again.

#![no_main]

use captf::api::LastRun;
use captf::controllers::bookkeeping::account;
use captf::controllers::figures;
use captf::controllers::ledger::JobEnd;
use captf::names::Op;
use captf::runner::result::{RESULT_MAX, RunResult};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ContainerStateTerminated;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;

const JOB: &str = "captf-m-foo-apply-a1-abc123";

fn length_within(what: &str, text: &str, min: usize, max: usize) {
    let chars = text.chars().count();
    assert!(
        (min..=max).contains(&chars),
        "{what} has {chars} characters, the schema allows {min} to {max}: {text:?}"
    );
}

/// The CRD's schema of `status.lastRun` (src/api/status.rs).
fn check_last_run(last: &LastRun) {
    length_within("lastRun.job", &last.job, 1, 63);
    if let Some(steps) = &last.steps {
        assert!((1..=16).contains(&steps.len()), "{} steps", steps.len());
        for step in steps {
            length_within("lastRun.steps[].name", &step.name, 1, 64);
            assert!(step.duration_milliseconds.is_none_or(|d| d >= 0));
        }
    }
    if let Some(error) = &last.error {
        if let Some(step) = &error.step {
            length_within("lastRun.error.step", step, 1, 64);
        }
        if let Some(summary) = &error.summary {
            length_within("lastRun.error.summary", summary, 1, 512);
        }
    }
    // The status write carries it as JSON.
    serde_json::to_vec(last).expect("lastRun encodes");
}

fuzz_target!(|data: &[u8]| {
    let Ok(message) = std::str::from_utf8(data) else {
        return;
    };
    let at = Timestamp::new(1_796_205_600, 0).expect("a timestamp");
    let terminated = ContainerStateTerminated {
        exit_code: 1,
        message: Some(message.to_owned()),
        reason: Some("Error".into()),
        started_at: Some(Time(Timestamp::new(1_796_205_500, 0).expect("a timestamp"))),
        ..Default::default()
    };
    let job = Job {
        metadata: ObjectMeta {
            name: Some(JOB.into()),
            creation_timestamp: Some(Time(Timestamp::new(1_796_205_400, 0).expect("a timestamp"))),
            ..Default::default()
        },
        ..Default::default()
    };
    for op in [Op::Apply, Op::Plan, Op::Drift, Op::Restore] {
        for (succeeded, deadline) in [(true, false), (false, false), (false, true)] {
            let end = JobEnd {
                succeeded,
                deadline,
                at,
            };
            let accounted = account(JOB, op, &end, Some(&terminated));
            check_last_run(&accounted.last_run);
            if let Some(version) = &accounted.runtime_version {
                length_within("source.runtimeVersion", version, 1, 64);
            }
            let _ = figures::of(
                &job,
                &end,
                Some(&terminated),
                accounted.document.as_ref(),
                accounted.last_run.error.as_ref(),
            );
        }
    }

    // The writer's bound, on any document that reads.
    if let Ok(document) = serde_json::from_str::<RunResult>(message) {
        let written = document.to_bounded_json();
        assert!(
            written.len() <= RESULT_MAX,
            "a result document written in {} bytes",
            written.len()
        );
        let again: RunResult =
            serde_json::from_slice(&written).expect("the written document reads");
        assert_eq!(again.operation, document.operation);
        assert_eq!(again.error.map(|e| e.kind), document.error.map(|e| e.kind));
    }
});
