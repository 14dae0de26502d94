//! The jobs module against the real platform: the run lease and the cluster
//! write lease under races, the runner RBAC, a built Job and its per-run
//! Secret as the API server and the garbage collector see them, and the
//! rendered root as OpenTofu runs it.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use captf::api::{Source, TerraformMachine, TerraformMachineSpec, Variables, WorkspaceSpec};
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
    let (ra, rb) = tokio::join!(
        leases::acquire(&leases_api, &a, &jobs, DEADLINE),
        leases::acquire(&leases_api, &b, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, again, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &lease, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &next, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &next, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &held, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &taker, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &fresh, &jobs, DEADLINE)
            .await
            .unwrap(),
        Acquired::Taken
    );
    let other = leases::run_lease(&request(&ns, "m-gone", "other"));
    assert_eq!(
        leases::acquire(&leases_api, &other, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &other, &jobs, DEADLINE)
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
        leases::acquire(&leases_api, &other, &jobs, DEADLINE)
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
                let got = leases::acquire(&leases_api, &lease, &jobs, DEADLINE)
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

fn subjects(binding: &RoleBinding) -> Vec<String> {
    binding
        .subjects
        .iter()
        .flatten()
        .map(|s| {
            format!(
                "{}/{}/{}",
                s.kind,
                s.namespace.as_deref().unwrap_or(""),
                s.name
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_rbac_is_ensured_per_namespace() {
    let client = client().await;
    let ns = namespace(&client, "runner-rbac").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);

    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let sa = accounts.get("captf-runner").await.unwrap();
    assert_eq!(sa.metadata.labels.unwrap()["captf.io/managed"], "true");
    let binding = bindings.get("captf-runner").await.unwrap();
    assert_eq!(
        binding.metadata.labels.as_ref().unwrap()["captf.io/managed"],
        "true"
    );
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "captf-runner");
    assert_eq!(
        subjects(&binding),
        [format!("ServiceAccount/{ns}/captf-runner")]
    );
    // Again: nothing changes.
    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let again = bindings.get("captf-runner").await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        binding.metadata.resource_version
    );

    // An override must exist and be opted in.
    match rbac::ensure(&client, &ns, "custom").await {
        Err(RbacError::NotOptedIn(RbacRefusal::Missing { name })) => assert_eq!(name, "custom"),
        other => panic!("{other:?}"),
    }
    let account = |name: &str, opted: bool| ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: opted.then(|| [("captf.io/runner".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account("custom", false))
        .await
        .unwrap();
    match rbac::ensure(&client, &ns, "custom").await {
        Err(e @ RbacError::NotOptedIn(RbacRefusal::NotLabelled { .. })) => {
            assert_eq!(e.reason(), "ServiceAccountNotOptedIn");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        subjects(&bindings.get("captf-runner").await.unwrap()).len(),
        1
    );

    // Opted-in overrides, added at the same time: none is lost.
    accounts
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "captf.io/runner": "true" } } })),
        )
        .await
        .unwrap();
    let mut names = vec!["custom".to_owned()];
    for i in 0..5 {
        let name = format!("runner-{i}");
        accounts
            .create(&PostParams::default(), &account(&name, true))
            .await
            .unwrap();
        names.push(name);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for name in names.clone() {
        let (client, ns) = (client.clone(), ns.clone());
        tasks.spawn(async move { rbac::ensure(&client, &ns, &name).await });
    }
    for result in tasks.join_all().await {
        result.unwrap();
    }
    let got: BTreeSet<String> = subjects(&bindings.get("captf-runner").await.unwrap())
        .into_iter()
        .collect();
    let want: BTreeSet<String> = std::iter::once("captf-runner".to_owned())
        .chain(names)
        .map(|n| format!("ServiceAccount/{ns}/{n}"))
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_pre_existing_runner_account_is_kept_as_it_is() {
    let client = client().await;
    let ns = namespace(&client, "runner-kept").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let mine = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("captf-runner".into()),
            labels: Some([("team".to_owned(), "infra".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = accounts
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let after = accounts.get("captf-runner").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(after.metadata.labels, mine.metadata.labels);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        subjects(&bindings.get("captf-runner").await.unwrap()),
        [format!("ServiceAccount/{ns}/captf-runner")]
    );
}

#[tokio::test]
async fn a_built_job_is_accepted_owned_and_collected() {
    let client = client().await;
    captf_testkit::manager::install_crds(&client).await;
    let ns = namespace(&client, "built-job").await;
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // A name long enough for the hash rule, so that the pod name (the
    // hostname the lock records) is checked against the 63-character cap.
    let name = "machine-with-a-name-long-enough-to-need-the-job-name-hash";
    let machine = TerraformMachine::new(
        name,
        TerraformMachineSpec {
            workspace: WorkspaceSpec {
                source: Source {
                    image: "registry.example/mod:1".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let machine = machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let uid = machine.meta().uid.clone().unwrap();
    // Pods of a missing ServiceAccount are refused at admission.
    rbac::ensure(&client, &ns, names::RUNNER_RBAC)
        .await
        .unwrap();

    let variables: Variables = serde_json::from_value(json!({ "greeting": "hi" })).unwrap();
    let rendered = inputs::render(&InputsRequest {
        kind: Kind::Machine,
        namespace: &ns,
        name,
        cluster_name: Some("prod"),
        image: "registry.example/mod:1",
        template: None,
        variables: Some(&variables),
        sensitive: &[],
        role: &[],
    })
    .unwrap();
    let settings = policy::resolve(None, None);
    let attempt = NonZeroU32::MIN;
    let hash6 = builder::hash6(&rendered.inputs_hash, Op::Restore, attempt, 0);
    let chunks = ["backup-0".to_owned(), "backup-0-part-1".to_owned()];
    let mut built = builder::build(&JobRequest {
        kind: Kind::Machine,
        namespace: &ns,
        name,
        uid: &uid,
        cluster_name: Some("prod"),
        op: Op::Restore,
        attempt,
        hash6: &hash6,
        image: "registry.example/mod:1",
        image_pull_policy: None,
        runner_image: "registry.example/runner:1",
        settings: &settings,
        identity: Some("aws"),
        force_unlock: Some("lock-1"),
        inputs: &rendered,
        restore: Some(builder::RestoreRequest {
            chunk_secrets: &chunks,
            resources: 1,
            serial: 2,
        }),
        mode: builder::ApplyMode::Direct,
        events: false,
    });
    let job = jobs
        .create(&PostParams::default(), &built.job)
        .await
        .unwrap();
    let job_name = job.metadata.name.clone().unwrap();
    builder::own_run_secret(&mut built.run_secret, &job).unwrap();
    let secret = secrets
        .create(&PostParams::default(), &built.run_secret)
        .await
        .unwrap();
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(&owner.uid), job.metadata.uid.as_ref());
    assert_eq!(owner.kind, "Job");

    // The job controller makes its pod from the template; its name, which
    // is its hostname, fits.
    let pod = eventually("the Job's pod", || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("job-name={job_name}")))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await;
    let pod_name = pod.metadata.name.unwrap();
    assert!(pod_name.len() <= 63, "{pod_name}");
    assert!(
        names::is_own_runner_pod(Kind::Machine, name, &pod_name),
        "{pod_name}"
    );

    // Deleting the object collects the Job, and the Job its Secret.
    machines
        .delete(name, &DeleteParams::background())
        .await
        .unwrap();
    eventually("the Job and its Secret to be collected", || async {
        let job_gone = jobs.get_opt(&job_name).await.ok()?.is_none();
        let secret_gone = secrets
            .get_opt(&names::run_secret(&job_name))
            .await
            .ok()?
            .is_none();
        (job_gone && secret_gone).then_some(())
    })
    .await;
}

/// The rendered root, with the image's module beside it as in the Job, is a
/// root that OpenTofu applies: every input reaches the module and every
/// output of the role comes back, sensitive.
#[tokio::test]
async fn the_rendered_root_applies_against_the_noop_module() {
    let dir = tempfile::tempdir().unwrap();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modules/noop");
    std::os::unix::fs::symlink(&module, dir.path().join("module")).unwrap();
    let root = dir.path().join("work/root");
    std::fs::create_dir_all(&root).unwrap();

    let variables: Variables =
        serde_json::from_value(json!({ "greeting": "hi", "size": 3 })).unwrap();
    for kind in [Kind::Cluster, Kind::Machine, Kind::MachinePool] {
        let rendered = inputs::render(&InputsRequest {
            kind,
            namespace: "ns",
            name: "obj",
            cluster_name: Some("prod"),
            image: "registry.example/mod:1",
            template: Some("tmpl"),
            variables: Some(&variables),
            sensitive: &[],
            role: &[],
        })
        .unwrap();
        std::fs::write(root.join("main.tf.json"), &rendered.main_tf_json).unwrap();
        std::fs::write(root.join("terraform.tfvars.json"), &rendered.tfvars_json).unwrap();
        // Here the state stays local: the kubernetes backend is tested with
        // the runner.
        std::fs::write(
            root.join("override.tf.json"),
            r#"{"terraform":{"backend":{"local":{}}}}"#,
        )
        .unwrap();
        let _ = std::fs::remove_file(root.join("terraform.tfstate"));
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        run_ok(
            tofu(
                &root,
                &home,
                &["init", "-input=false", "-no-color", "-reconfigure"],
            ),
            "init",
        )
        .await;
        run_ok(
            tofu(
                &root,
                &home,
                &[
                    "apply",
                    "-auto-approve",
                    "-input=false",
                    "-no-color",
                    "-var-file=terraform.tfvars.json",
                ],
            ),
            "apply",
        )
        .await;
        let out = run_ok(tofu(&root, &home, &["output", "-json"]), "output").await;
        let outputs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut got: Vec<&str> = outputs
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        got.sort_unstable();
        // OpenTofu keeps no null output, and the noop machine's
        // failure_domain echoes its null input.
        let mut want: Vec<&str> = kind
            .outputs()
            .iter()
            .copied()
            .filter(|o| !(kind == Kind::Machine && *o == "failure_domain"))
            .chain([DECLARED_OUTPUTS])
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "{kind:?}");
        // The noop modules declare every output of their role, a null one
        // too.
        let declared = &outputs[DECLARED_OUTPUTS]["value"];
        assert_eq!(declared, &json!(kind.outputs()), "{kind:?}");
        // Every role output is sensitive; the list of names is not.
        for (name, o) in outputs.as_object().unwrap() {
            assert_eq!(o["sensitive"], name != DECLARED_OUTPUTS, "{name}");
        }
        // The module saw the inputs: its object name and the user variable.
        let provider_id = &outputs["provider_id"]["value"];
        if kind != Kind::Cluster {
            assert_eq!(provider_id, "noop://ns/obj", "{kind:?}");
        } else {
            assert_eq!(
                outputs["exports"]["value"],
                json!({ "cluster": "obj", "greeting": "hi" })
            );
        }
    }
}
