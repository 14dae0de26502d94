//! Names, attempts and the per-run Secret.

use super::*;

#[test]
fn long_names_use_the_hash_rule() {
    let name = "a-very-long-machine-name-that-does-not-fit-the-job-name";
    let built = build_case(&Case {
        name,
        ..Case::default()
    });
    let job = built.job.metadata.name.as_deref().unwrap();
    assert!(job.len() <= 57, "{job}");
    assert!(!job.contains(name), "{job}");
    assert!(
        job.starts_with("captf-m-") && job.contains("-apply-a1-"),
        "{job}"
    );
    assert_eq!(
        built.run_secret.metadata.name.as_deref(),
        Some(format!("captf-run-{job}").as_str())
    );
    // The owner reference and the label keep the real name, which fits a
    // label value.
    assert_eq!(
        built.job.metadata.owner_references.as_ref().unwrap()[0].name,
        name
    );
    assert_eq!(
        built.job.metadata.labels.as_ref().unwrap()["captf.infrastructure.cluster.x-k8s.io/owner-name"],
        name
    );
}

#[test]
fn run_secret_is_owned_by_the_created_job() {
    let mut built = build_case(&Case::default());
    assert_eq!(
        own_run_secret(&mut built.run_secret, &built.job),
        Err(JobNotCreated)
    );
    let mut created = built.job.clone();
    created.metadata.uid = Some("job-uid".into());
    own_run_secret(&mut built.run_secret, &created).unwrap();
    let owner = &built.run_secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        (
            "batch/v1",
            "Job",
            created.metadata.name.as_deref().unwrap(),
            "job-uid"
        )
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
}

#[test]
fn hash6_depends_on_every_part() {
    let base = hash6("h2:abc", Op::Apply, n(1), 0);
    assert_eq!(base, hash6("h2:abc", Op::Apply, n(1), 0));
    let others = [
        hash6("h2:abd", Op::Apply, n(1), 0),
        hash6("h2:abc", Op::Plan, n(1), 0),
        hash6("h2:abc", Op::Apply, n(2), 0),
        hash6("h2:abc", Op::Apply, n(1), 1),
    ];
    let all: std::collections::BTreeSet<_> =
        others.iter().chain([&base]).map(Hash6::as_str).collect();
    assert_eq!(all.len(), 5);
    assert_eq!(base, Hash6::of(b"h2:abc\napply\n1\n0"));
}

#[test]
fn next_attempt_counts_retained_jobs_of_the_op() {
    let job = |op: &str, attempt: &str| Job {
        metadata: ObjectMeta {
            labels: Some(
                [
                    (OP_LABEL.to_owned(), op.to_owned()),
                    (ATTEMPT_LABEL.to_owned(), attempt.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        status: Some(JobStatus {
            conditions: Some(vec![JobCondition::default()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let jobs = [
        job("apply", "1"),
        job("apply", "3"),
        job("destroy", "7"),
        job("apply", "x"),
        job("apply", "-2"),
        Job::default(),
    ];
    let table: &[(Op, &[Job], u32)] = &[
        (Op::Apply, &jobs, 4),
        (Op::Destroy, &jobs, 8),
        (Op::Drift, &jobs, 1),
        (Op::Apply, &[], 1),
        (Op::Apply, &jobs[..1], 2),
    ];
    for (op, jobs, want) in table {
        assert_eq!(next_attempt(*op, jobs.iter()).get(), *want, "{op:?}");
    }
    let max = [job("apply", &u32::MAX.to_string())];
    assert_eq!(next_attempt(Op::Apply, max.iter()).get(), u32::MAX);
}
