//! The reconcilers end to end: the manager process, the local pod executor
//! in place of kubelet, real OpenTofu in the Jobs' pods, and the real API
//! server. Each test has its own namespace, manager (`--namespace`) and
//! executor.

use base64::Engine as _;
use std::time::Duration;

use captf::api::{TerraformCluster, TerraformClusterIdentity, TerraformMachine, WorkspaceSpec};
use captf::names::{self, Kind};
use captf_testkit::controlplane;
use captf_testkit::refusal::{self, Refusal};
use captf_testkit::scenario::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

mod accounts;
mod backups;
mod locks;

#[tokio::test]
async fn a_cluster_and_its_machine_are_applied_and_their_state_adopted() {
    let env = setup(MANAGER, "apply", &[("API_TOKEN", "s3cr3t-t0ken")], &[]).await;
    env.cluster("c1", NOOP, vars(&[("greeting", json!("hi"))]))
        .await;
    let machine = env
        .machine("m1", "c1", vars(&[("size", json!("small"))]))
        .await;

    let m = within(&env, 240, "the machine applied", || async {
        env.machine_status("m1").await.filter(applied)
    })
    .await;
    let c = within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c1").await.filter(applied)
    })
    .await;

    for (status, kind, name) in [(&c, Kind::Cluster, "c1"), (&m, Kind::Machine, "m1")] {
        let run = status.last_run.as_ref().expect("a last run");
        assert!(
            run.job
                .starts_with(&format!("captf-{}-{name}-apply-a1-", kind.short())),
            "{}",
            run.job
        );
        let steps = steps(run);
        assert_eq!(steps, ["init", "validate", "apply"], "{}", env.context());
        assert!(run.error.is_none());
        assert!(status.observed_state_serial.is_some_and(|s| s >= 1));
        assert_eq!(
            status
                .source
                .as_ref()
                .and_then(|s| s.runtime_version.as_deref()),
            Some("1.12.6")
        );
        assert_eq!(
            status.source.as_ref().and_then(|s| s.image.as_deref()),
            Some(NOOP)
        );
        assert!(status.active_job.is_none());
        let suffix = names::suffix(&env.ns, kind, name);
        assert_eq!(status.state_secret_suffix.as_deref(), Some(suffix.as_str()));

        // The state is adopted: it carries the applied inputs hash.
        let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
        let base = secrets.get(&names::state_secret(&suffix)).await.unwrap();
        assert!(
            base.annotations()
                .get("captf.io/inputs-hash")
                .is_some_and(|h| h.starts_with("h2:"))
        );
        // The per-run Secret is gone once bookkept; the run lease is free.
        assert!(
            secrets
                .get_opt(&names::run_secret(&run.job))
                .await
                .unwrap()
                .is_none()
        );
        let lease = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
            .get(&names::run_lease(&suffix))
            .await
            .unwrap();
        assert_eq!(
            lease
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty()),
            None
        );
    }
    // Each condition's change is an event series of its own, so each note
    // shows (one series would show only the first note, counted).
    within(&env, 30, "a ConditionChanged event per change", || async {
        let events = env
            .events_about("ConditionChanged", Kind::Cluster, "c1")
            .await;
        let shown = |prefix: &str| {
            events
                .iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.starts_with(prefix)))
        };
        [
            "StateReadable: Unknown/StateNotFound -> True/StateRead",
            "ApplyJobSucceeded: Unknown/NoApplyYet -> True/ApplySucceeded",
            "InfrastructureHealthy: Unknown/WaitingForProvisioning -> False/Provisioning",
            "InfrastructureHealthy: False/Provisioning -> True/Healthy",
        ]
        .into_iter()
        .all(shown)
        .then_some(())
    })
    .await;
    // A condition's first setting is no change, unless it starts out bad.
    // The one bad start this test can see: the cluster's first pass ran
    // before the manager's Cluster watch showed the Cluster created just
    // before it (it happened under CI's load).
    let lagged = "DependenciesReady: unset -> False/OwnerNotFound";
    let first: Vec<String> = env
        .events_about("ConditionChanged", Kind::Cluster, "c1")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .filter(|n| n.contains(": unset -> ") && !n.starts_with(lagged))
        .collect();
    assert!(first.is_empty(), "{first:?}");
    // Adopted: every state Secret is owned by the object (not as its
    // controller), which the finalizer keeps until the destroy ran.
    let cluster = env.api::<TerraformCluster>().get("c1").await.unwrap();
    for (object, kind, name) in [
        (cluster.meta(), Kind::Cluster, "c1"),
        (machine.meta(), Kind::Machine, "m1"),
    ] {
        let uid = object.uid.as_deref().unwrap();
        let chunks = env.state_secrets(&env.suffix(kind, name)).await;
        assert!(!chunks.is_empty());
        for chunk in chunks {
            let secret = env.secrets().get(&chunk).await.unwrap();
            let owner = secret
                .owner_references()
                .iter()
                .find(|o| o.uid == uid)
                .cloned();
            assert!(
                owner.is_some_and(|o| o.controller != Some(true)),
                "{chunk}: {:?}",
                secret.owner_references()
            );
        }
    }
    assert!(
        env.finalizers::<TerraformCluster>("c1")
            .await
            .contains(&finalizer(Kind::Cluster))
    );
    assert!(
        env.finalizers::<TerraformMachine>("m1")
            .await
            .contains(&finalizer(Kind::Machine))
    );
    // The durable inputs the destroy will run from.
    let inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Machine, "m1"))
        .await
        .unwrap();
    assert!(
        inputs
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == machine.meta().uid.as_ref())
    );
    let keys: Vec<&String> = inputs.data.iter().flatten().map(|(k, _)| k).collect();
    assert_eq!(keys, ["main.tf.json", "terraform.tfvars.json"]);
    let annotation = |key: &str| inputs.annotations().get(key).map(String::as_str);
    assert_eq!(annotation("captf.io/image"), Some(NOOP));
    assert!(annotation("captf.io/inputs-hash").is_some_and(|h| h.starts_with("h2:")));
    assert_eq!(annotation("captf.io/applied"), Some("true"));
    // The role inputs (ref §9.3), from the Machine, its bootstrap Secret and
    // the cluster's exports.
    let tfvars = |secret: &Secret| -> serde_json::Value {
        let data = secret.data.as_ref().unwrap();
        serde_json::from_slice(&data["terraform.tfvars.json"].0).unwrap()
    };
    let values = tfvars(&inputs);
    let bootstrap =
        base64::engine::general_purpose::STANDARD.encode(captf_testkit::owners::BOOTSTRAP_DATA);
    assert_eq!(values["machine_name"], json!("m1"));
    assert_eq!(values["bootstrap_data"], json!(bootstrap));
    assert_eq!(values["bootstrap_format"], json!("cloud-config"));
    assert_eq!(values["kubernetes_version"], json!("v1.36.3"));
    assert_eq!(values["control_plane"], json!(false));
    assert_eq!(values["failure_domain"], json!(null));
    assert_eq!(
        values["captf_cluster_outputs"],
        json!({"cluster": "c1", "greeting": "hi"})
    );
    assert_eq!(
        values["captf_cluster"],
        json!({"name": "c1", "namespace": env.ns})
    );
    let cluster_inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Cluster, "c1"))
        .await
        .unwrap();
    let values = tfvars(&cluster_inputs);
    assert_eq!(values["control_plane_endpoint"], json!(null));
    assert_eq!(values["control_plane_initialized"], json!(false));
    assert_eq!(values["kubernetes_version"], json!(null));
    assert_eq!(values["cluster_network"], json!(null));
    assert!(values.get("captf_cluster_outputs").is_none());
    assert!(!env.manager.log().contains(&bootstrap));

    // Applied inputs leave nothing to do: no second Job.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let jobs = env.jobs().await;
    assert_eq!(
        jobs.len(),
        2,
        "{:?}",
        jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    for job in &jobs {
        assert!(job.annotations().contains_key("captf.io/bookkept"));
    }
    assert!(!env.events("JobCreated").await.is_empty());
    assert!(!env.events("StateAdopted").await.is_empty());
    // The credentials mirror the Jobs mounted.
    let mirror = Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .get(&names::credentials_mirror(&env.identity))
        .await
        .unwrap();
    assert_eq!(
        mirror.labels().get("captf.io/mirrored").map(String::as_str),
        Some("true")
    );
    // No secret in the manager's log.
    assert!(!env.manager.log().contains("s3cr3t-t0ken"));
}

#[tokio::test]
async fn a_failed_apply_is_recorded_and_retried_after_the_backoff() {
    let env = setup(MANAGER, "fail", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    env.machine("m", "c", vars(&[("fail", json!(true))])).await;
    let status = within(&env, 240, "the failed apply recorded", || async {
        env.machine_status("m")
            .await
            .filter(|s| condition(s, "ApplyJobSucceeded") == Some(("False", "ApplyFailed")))
    })
    .await;
    let run = status.last_run.expect("a last run");
    let error = run.error.expect("an error");
    assert_eq!(error.step.as_deref(), Some("apply"));
    assert!(
        error.summary.as_deref().is_some_and(|s| !s.is_empty()),
        "{error:?}"
    );
    let first = env
        .jobs()
        .await
        .into_iter()
        .find(|j| j.name_any() == run.job)
        .expect("the failed Job");
    let failed = failed_at(&first).expect("a Failed condition");
    // The retry waits one minute (ref §8.4: 1m after the first failure).
    let retry = within(&env, 180, "the retry Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-m-m-apply-a2-"))
    })
    .await;
    let created = retry.metadata.creation_timestamp.unwrap().0;
    let waited = created.duration_since(failed).as_secs();
    assert!(
        (59..=90).contains(&waited),
        "the retry came {waited}s after the failure"
    );
}

#[tokio::test]
async fn two_managers_racing_start_one_job() {
    let env = setup(MANAGER, "race", &[], &[]).await;
    let second = env.start_manager(&[]).await;
    env.cluster("c", NOOP, None).await;
    for i in 0..3 {
        env.machine(&format!("m{i}"), "c", None).await;
    }
    for i in 0..3 {
        within(&env, 240, "the machine applied", || async {
            env.machine_status(&format!("m{i}")).await.filter(applied)
        })
        .await;
    }
    within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let jobs: Vec<String> = env.jobs().await.iter().map(|j| j.name_any()).collect();
    assert_eq!(
        jobs.len(),
        4,
        "one Job per object: {jobs:?}\n--- second manager:\n{}",
        tail(&second.log())
    );
}

/// The objects of a namespace share its credentials mirror, so passes
/// started together race to write it: the loser reads it again, and no
/// object reports the mirror failed.
#[tokio::test]
async fn machines_created_at_once_share_the_credentials_mirror_without_a_failure() {
    let env = setup(MANAGER, "mirror", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    let names: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    futures::future::join_all(names.iter().map(|n| env.machine(n, "c", None))).await;
    let mirror = names::credentials_mirror(&env.identity);
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let machines = Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns);
    within(
        &env,
        180,
        "every machine a user of the mirror, mirrored",
        || async {
            let owners: Vec<String> = secrets
                .get_opt(&mirror)
                .await
                .unwrap()?
                .owner_references()
                .iter()
                .map(|o| o.name.clone())
                .collect();
            let listed = machines.list(&ListParams::default()).await.unwrap().items;
            let mirrored = listed.iter().all(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| condition(&s.workspace, "CredentialsMirrored"))
                    == Some(("True", "Mirrored"))
            });
            (mirrored && names.iter().all(|n| owners.contains(n))).then_some(())
        },
    )
    .await;
    let failed: Vec<String> = env
        .events("ConditionChanged")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .filter(|n| n.contains("MirrorFailed"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", env.context());
}

/// The cluster `c` applied once (machines wait for its exports until
/// then), then re-applying slowly: its second apply Job.
async fn reapplying_cluster(env: &Env) -> Job {
    env.cluster("c", NOOP, None).await;
    within(env, 180, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 25}}})),
        )
        .await
        .unwrap();
    within(env, 120, "the cluster's second Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-c-c-apply-") && !finished(j))
    })
    .await
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_some_and(|s| s.succeeded.unwrap_or(0) > 0 || s.failed.unwrap_or(0) > 0)
}

#[tokio::test]
async fn a_machine_waits_while_its_cluster_holds_the_write_lease() {
    let env = setup(MANAGER, "gate", &[], &[]).await;
    let cluster_job = reapplying_cluster(&env).await;
    env.machine("m", "c", None).await;
    let status = within(&env, 60, "the machine waiting", || async {
        env.machine_status("m").await.filter(|s| {
            condition(s, "ApplyJobSucceeded") == Some(("Unknown", "WaitingForClusterOperation"))
        })
    })
    .await;
    assert!(status.active_job.is_none());
    let jobs = env.jobs().await;
    assert!(
        jobs.iter().all(|j| !j.name_any().starts_with("captf-m-")),
        "a machine Job started while the cluster applies"
    );
    let cluster_done = within(&env, 180, "the cluster's re-apply done", || async {
        env.cluster_status("c").await.filter(|s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.job == cluster_job.name_any())
        })
    })
    .await;
    let machine_job = within(&env, 120, "the machine's Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-m-m-apply-"))
    })
    .await;
    assert!(
        cluster_done
            .last_run
            .is_some_and(|r| r.job == cluster_job.name_any())
    );
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    assert!(!env.events("WaitingForClusterOperation").await.is_empty());
    drop(machine_job);
}

#[tokio::test]
async fn with_the_gate_off_a_machine_does_not_wait_for_its_cluster() {
    let env = setup(MANAGER, "nogate", &[], &["--cluster-operation-gate=false"]).await;
    reapplying_cluster(&env).await;
    env.machine("m", "c", None).await;
    within(
        &env,
        60,
        "the machine's Job while the cluster's runs",
        || async {
            let status = env.cluster_status("c").await?;
            let machine_job = env
                .jobs()
                .await
                .into_iter()
                .any(|j| j.name_any().starts_with("captf-m-m-apply-"));
            (machine_job && status.active_job.is_some()).then_some(())
        },
    )
    .await;
}
