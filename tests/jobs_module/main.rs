//! The jobs module against the real platform: the run lease and the cluster
//! write lease under races, the runner RBAC, a built Job and its per-run
//! Secret as the API server and the garbage collector see them, and the
//! rendered root as OpenTofu runs it.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use captf::api::{Source, TerraformMachine, TerraformMachineSpec, WorkspaceSpec};
use captf::jobs::builder::{self, JobRequest};
use captf::jobs::inputs::{self, InputsRequest};
use captf::jobs::leases::{self, Acquired, LeaseRequest};
use captf::jobs::policy;
use captf::jobs::rbac::{self, RbacError, RbacRefusal};
use captf::names::{self, Kind, Op};
use captf::role::DECLARED_OUTPUTS;
use captf_testkit::{controlplane, eventually, namespace, run_ok, tofu};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodSpec, PodTemplateSpec, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(3600);

mod built;
mod runner_rbac;

async fn client() -> Client {
    controlplane::shared().client().await
}

/// A Job that never starts a pod (suspended) unless `deadline` is given: then
/// it starts, and the job controller fails it once the deadline passes, with
/// no kubelet needed.
async fn create_job(jobs: &Api<Job>, name: &str, deadline: Option<i64>) {
    let job = Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            suspend: Some(deadline.is_none()),
            active_deadline_seconds: deadline,
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some("example.invalid/none:1".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    jobs.create(&PostParams::default(), &job).await.unwrap();
}

fn request<'a>(ns: &'a str, name: &'a str, job: &'a str) -> LeaseRequest<'a> {
    LeaseRequest {
        kind: Kind::Machine,
        namespace: ns,
        name,
        cluster_name: Some("prod"),
        op: Op::Apply,
        job,
        now: Timestamp::now(),
    }
}

#[tokio::test]
async fn two_jobs_race_and_one_takes_the_run_lease() {
    let client = client().await;
    let ns = namespace(&client, "lease-race").await;
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    create_job(&jobs, "job-a", None).await;
    create_job(&jobs, "job-b", None).await;

    let a = leases::run_lease(&request(&ns, "m1", "job-a"));
    let b = leases::run_lease(&request(&ns, "m1", "job-b"));
    assert_eq!(a.metadata.name, b.metadata.name);
    let name = a.metadata.name.clone().unwrap();
    // Neither has seen the Lease: both create it, one of them in vain.
    let (ra, rb) = tokio::join!(
        leases::acquire(&leases_api, &a, &jobs, DEADLINE, false),
        leases::acquire(&leases_api, &b, &jobs, DEADLINE, false)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let winner = match (&ra, &rb) {
        (Acquired::Taken, Acquired::HeldBy(h)) => {
            assert_eq!(h, "job-a");
            "job-a"
        }
        (Acquired::HeldBy(h), Acquired::Taken) => {
            assert_eq!(h, "job-b");
            "job-b"
        }
        other => panic!("exactly one must win: {other:?}"),
    };
    assert_eq!(
        leases::holder(&leases_api, &name).await.unwrap().as_deref(),
        Some(winner)
    );

    // Taking it again for the holder is a no-op that succeeds.
    let again = if winner == "job-a" { &a } else { &b };
    let before = leases_api.get(&name).await.unwrap();
    assert_eq!(
        leases::acquire(&leases_api, again, &jobs, DEADLINE, false)
            .await
            .unwrap(),
        Acquired::Taken
    );
    assert_eq!(
        leases_api
            .get(&name)
            .await
            .unwrap()
            .metadata
            .resource_version,
        before.metadata.resource_version
    );

    // The stored Lease is the one built: labels, annotations, no owner.
    let stored = leases_api.get(&name).await.unwrap();
    let labels = stored.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["captf.io/lease"], "run");
    assert_eq!(labels["captf.io/managed"], "true");
    assert_eq!(
        labels["captf.infrastructure.cluster.x-k8s.io/owner-name"],
        "m1"
    );
    assert_eq!(
        stored.metadata.annotations.as_ref().unwrap()["captf.io/lease-op"],
        "apply"
    );
    assert_eq!(stored.metadata.owner_references, None);
}

#[tokio::test]
async fn release_by_a_non_holder_changes_nothing_and_a_free_lease_is_taken() {
    let client = client().await;
    let ns = namespace(&client, "lease-release").await;
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    create_job(&jobs, "holder", None).await;
    create_job(&jobs, "next", None).await;

    let lease = leases::cluster_write_lease(&request(&ns, "c1", "holder")).unwrap();
    let name = lease.metadata.name.clone().unwrap();
    assert_eq!(
        leases::acquire(&leases_api, &lease, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
    let before = leases_api.get(&name).await.unwrap();

    leases::release(&leases_api, &name, "next").await.unwrap();
    let after = leases_api.get(&name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(
        leases::holder(&leases_api, &name).await.unwrap().as_deref(),
        Some("holder")
    );

    // While the holder is active, another Job does not get it.
    let next = leases::cluster_write_lease(&request(&ns, "c1", "next")).unwrap();
    assert_eq!(
        leases::acquire(&leases_api, &next, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::HeldBy("holder".into())
    );

    leases::release(&leases_api, &name, "holder").await.unwrap();
    assert_eq!(leases::holder(&leases_api, &name).await.unwrap(), None);
    // Releasing again, or releasing a Lease that does not exist, is fine.
    leases::release(&leases_api, &name, "holder").await.unwrap();
    leases::release(&leases_api, "captf-run-absent", "holder")
        .await
        .unwrap();
    assert_eq!(
        leases::holder(&leases_api, "captf-run-absent")
            .await
            .unwrap(),
        None
    );

    assert_eq!(
        leases::acquire(&leases_api, &next, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
    assert_eq!(
        leases::holder(&leases_api, &name).await.unwrap().as_deref(),
        Some("next")
    );
}

#[tokio::test]
async fn a_finished_or_long_missing_holder_is_taken_over() {
    let client = client().await;
    let ns = namespace(&client, "lease-takeover").await;
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);

    // A holder whose Job failed on its deadline.
    create_job(&jobs, "finished", Some(1)).await;
    let held = leases::run_lease(&request(&ns, "m-done", "finished"));
    let name = held.metadata.name.clone().unwrap();
    assert_eq!(
        leases::acquire(&leases_api, &held, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
    eventually("the holder Job to fail on its deadline", || async {
        let job = jobs.get("finished").await.ok()?;
        (leases::job_state(Some(&job)) == leases::JobState::Finished).then_some(())
    })
    .await;
    let taker = leases::run_lease(&request(&ns, "m-done", "taker"));
    assert_eq!(
        leases::acquire(&leases_api, &taker, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
    assert_eq!(
        leases::holder(&leases_api, &name).await.unwrap().as_deref(),
        Some("taker")
    );

    // A holder Job that never appeared, within the grace period and after it.
    let fresh = leases::run_lease(&request(&ns, "m-gone", "never-created"));
    assert_eq!(
        leases::acquire(&leases_api, &fresh, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
    let other = leases::run_lease(&request(&ns, "m-gone", "other"));
    assert_eq!(
        leases::acquire(&leases_api, &other, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::HeldBy("never-created".into())
    );
    let stale = leases::run_lease(&LeaseRequest {
        now: Timestamp::now()
            .checked_sub(SignedDuration::from_secs(60))
            .unwrap(),
        ..request(&ns, "m-stale", "never-created")
    });
    leases_api
        .create(&PostParams::default(), &stale)
        .await
        .unwrap();
    let other = leases::run_lease(&request(&ns, "m-stale", "other"));
    assert_eq!(
        leases::acquire(&leases_api, &other, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );

    // An active holder past its deadline plus the backstop.
    create_job(&jobs, "stuck", None).await;
    let stuck = leases::run_lease(&LeaseRequest {
        now: Timestamp::now()
            .checked_sub(SignedDuration::from_secs(3600 + 601))
            .unwrap(),
        ..request(&ns, "m-stuck", "stuck")
    });
    leases_api
        .create(&PostParams::default(), &stuck)
        .await
        .unwrap();
    let other = leases::run_lease(&request(&ns, "m-stuck", "other"));
    assert_eq!(
        leases::acquire(&leases_api, &other, &jobs, DEADLINE, true)
            .await
            .unwrap(),
        Acquired::Taken
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_contenders_one_winner() {
    let client = client().await;
    let ns = namespace(&client, "lease-twenty").await;
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);

    // Once with the Lease absent (all create), once with it free (all
    // update the same resourceVersion).
    for round in ["absent", "free"] {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..20 {
            let (leases_api, jobs, ns) = (leases_api.clone(), jobs.clone(), ns.clone());
            tasks.spawn(async move {
                let job = format!("{round}-{i}");
                let lease = leases::run_lease(&request(&ns, "m20", &job));
                let got = leases::acquire(&leases_api, &lease, &jobs, DEADLINE, true)
                    .await
                    .unwrap();
                (job, got)
            });
        }
        let results = tasks.join_all().await;
        let winners: Vec<_> = results
            .iter()
            .filter(|(_, got)| *got == Acquired::Taken)
            .collect();
        assert_eq!(winners.len(), 1, "{round}: {results:?}");
        let winner = &winners[0].0;
        for (job, got) in &results {
            if job != winner {
                assert_eq!(*got, Acquired::HeldBy(winner.clone()), "{round}");
            }
        }
        let name = names::run_lease(&names::suffix(&ns, Kind::Machine, "m20"));
        assert_eq!(
            leases::holder(&leases_api, &name).await.unwrap().as_ref(),
            Some(winner)
        );
        leases::release(&leases_api, &name, winner).await.unwrap();
    }
}
