//! Settings shown at work end to end: the manager's
//! `--drift-default-interval`, `--runner-events=false` and `--watch-filter`;
//! an object's own `cluster.x-k8s.io/paused` annotation and
//! `spec.source.imagePullPolicy`; a cluster's `spec.defaults.drift` and
//! `spec.defaults.jobs`, a machine's own `spec.drift`; a jobs policy.

use std::time::Duration;

use captf::api::{ImagePullPolicy, TerraformCluster, TerraformMachine};
use captf::names::Kind;
use captf_testkit::scenario::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{MANAGER, completed_at, created_after, runner_events, scraped};

#[tokio::test]
async fn the_default_drift_interval_schedules_and_runner_events_can_be_off() {
    let env = setup(
        MANAGER,
        "defaults",
        &[],
        &["--drift-default-interval=20s", "--runner-events=false"],
    )
    .await;
    // No spec.drift: the manager's default interval applies.
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let applied_at = completed_at(&env, "captf-c-c-apply-").await;
    let after = created_after(&env, "captf-c-c-drift-", applied_at, 120).await;
    assert!(
        after >= Duration::from_secs(20) && after <= Duration::from_secs(22 + 15),
        "the drift check came {after:?} after the apply"
    );
    let drift = env.jobs_named("captf-c-c-drift-").await.remove(0);
    // The Job asks for no events, and the runner sent none.
    let args = drift.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(
        !args.iter().any(|a| a.starts_with("--events-for")),
        "{args:?}"
    );
    assert!(runner_events(&env).await.is_empty());
}

#[tokio::test]
async fn an_object_paused_by_its_own_annotation_starts_nothing() {
    let env = setup(MANAGER, "paused", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let pause = |on: bool| json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": if on { Some("") } else { None }}}});
    let api = env.api::<TerraformCluster>();
    api.patch("c", &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    within(&env, 60, "Paused", || async {
        let s = env.cluster_status("c").await?;
        (condition(&s, "Paused") == Some(("True", "Paused"))).then_some(())
    })
    .await;
    // New inputs wait while paused.
    let before = env.passes(Kind::Cluster, "c");
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"variables": {"message": "paused"}}})),
    )
    .await
    .unwrap();
    within(&env, 60, "a pass over the new inputs", || async {
        (env.passes(Kind::Cluster, "c") > before).then_some(())
    })
    .await;
    assert_eq!(env.jobs_named("captf-c-c-apply-").await.len(), 1);
    api.patch("c", &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();
    within(&env, 240, "the apply after the pause", || async {
        let s = env.cluster_status("c").await?;
        (s.last_run.as_ref()?.job.starts_with("captf-c-c-apply-a2")
            && condition(&s, "ApplyJobSucceeded") == Some(("True", "ApplySucceeded")))
        .then_some(())
    })
    .await;
    // Paused and Resumed tell it (ref §4), not a ConditionChanged; the
    // first NotPaused of a new object is no event at all.
    within(&env, 30, "the Paused and Resumed events", || async {
        let paused = env.events_about("Paused", Kind::Cluster, "c").await;
        let resumed = env.events_about("Resumed", Kind::Cluster, "c").await;
        (paused.len() == 1 && resumed.len() == 1).then_some(())
    })
    .await;
    let changed = env
        .events_about("ConditionChanged", Kind::Cluster, "c")
        .await;
    let about_paused: Vec<_> = changed
        .iter()
        .filter_map(|e| e.note.as_deref())
        .filter(|n| n.starts_with("Paused:"))
        .collect();
    assert!(about_paused.is_empty(), "{about_paused:?}");
}

#[tokio::test]
async fn a_machine_takes_its_clusters_default_drift_interval() {
    let env = setup(MANAGER, "inherit", &[], &[]).await;
    env.machine("m", "c", None).await;
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"defaults": {
                "drift": {"intervalSeconds": 20},
                "jobs": {
                    "lockTimeoutSeconds": 7,
                    "env": [{"name": "CAPTF_TEST_DEFAULTS", "value": "inherited"}]
                }
            }}})),
        )
        .await
        .unwrap();
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    // A pass after the cluster's change reads the inherited interval.
    env.api::<TerraformMachine>()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/touch": "1"}}})),
        )
        .await
        .unwrap();
    let applied_at = completed_at(&env, "captf-m-m-apply-").await;
    let after = created_after(&env, "captf-m-m-drift-", applied_at, 120).await;
    assert!(
        after >= Duration::from_secs(20) && after <= Duration::from_secs(22 + 15),
        "the drift check came {after:?} after the apply"
    );
    // The check's Job has the jobs policy the cluster's defaults give.
    let drift = env.jobs_named("captf-m-m-drift-").await.remove(0);
    let source = drift
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .remove(0);
    assert!(
        source
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "CAPTF_TEST_DEFAULTS" && e.value.as_deref() == Some("inherited")),
        "{:?}",
        source.env
    );
    let args = source.args.unwrap_or_default();
    assert!(args.iter().any(|a| a == "--lock-timeout=7s"), "{args:?}");
    // The machine's own interval wins over its cluster's.
    env.api::<TerraformMachine>()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drift": {"intervalSeconds": 30}}})),
        )
        .await
        .unwrap();
    let checked = within(&env, 120, "the first drift check done", || async {
        let jobs = env.jobs_named("captf-m-m-drift-").await;
        jobs.first()?.status.as_ref()?.completion_time.clone()
    })
    .await
    .0;
    let next = within(&env, 120, "the next drift check", || async {
        env.jobs_named("captf-m-m-drift-")
            .await
            .into_iter()
            .filter_map(|j| j.metadata.creation_timestamp)
            .find(|t| t.0 > checked)
    })
    .await
    .0;
    let gap = Duration::try_from(next.duration_since(checked)).unwrap();
    assert!(
        gap >= Duration::from_secs(30) && gap <= Duration::from_secs(33 + 15),
        "the machine's own interval: the next check came {gap:?} after the first"
    );
}

#[tokio::test]
async fn the_watch_filter_leaves_unlabeled_objects_alone() {
    let env = setup(MANAGER, "filter", &[], &["--watch-filter=team-a"]).await;
    env.cluster("b", NOOP, None).await;
    env.cluster("a", NOOP, None).await;
    env.api::<TerraformCluster>()
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"cluster.x-k8s.io/watch-filter": "team-a"}}}),
            ),
        )
        .await
        .unwrap();
    within(&env, 240, "the labeled cluster applied", || async {
        env.cluster_status("a").await.filter(applied)
    })
    .await;
    // Applying `a` took several passes; `b` got none.
    assert!(env.finalizers::<TerraformCluster>("b").await.is_empty());
    assert!(env.cluster_status("b").await.is_none());
    assert_eq!(env.passes(Kind::Cluster, "b"), 0);
    assert!(env.jobs_named("captf-c-b-").await.is_empty());
}

#[tokio::test]
async fn a_jobs_policy_shapes_the_job_and_its_deadline_stops_it() {
    let env = setup(MANAGER, "policy", &[], &[]).await;
    let mut workspace = noop(vars(&[("sleep_seconds", json!(120))]));
    workspace.identity_ref = Some(captf::api::IdentityReference {
        name: env.identity.clone(),
    });
    workspace.jobs = Some(
        serde_json::from_value(json!({
            "activeDeadlineSeconds": 15,
            "lockTimeoutSeconds": 5,
            "resources": {"limits": {"memory": "300Mi"}},
            "imagePullSecrets": [{"name": "registry"}],
            "podSecurityContext": {"runAsUser": 4242},
            "securityContext": {"runAsGroup": 4343},
            "env": [{"name": "CAPTF_TEST_ENV", "value": "set"}]
        }))
        .unwrap(),
    );
    env.create_cluster("c", workspace).await;
    let job = within(&env, 120, "the apply Job", || async {
        env.jobs_named("captf-c-c-apply-").await.into_iter().next()
    })
    .await;
    let spec = job.spec.unwrap();
    assert_eq!(spec.active_deadline_seconds, Some(15));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "registry");
    assert_eq!(pod.security_context.unwrap().run_as_user, Some(4242));
    let source = &pod.containers[0];
    let hardened = source.security_context.clone().unwrap();
    // Merged over the hardened defaults, which stay.
    assert_eq!(
        (hardened.run_as_group, hardened.allow_privilege_escalation),
        (Some(4343), Some(false))
    );
    let limits = source.resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["memory"].0, "300Mi");
    assert!(
        source
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "CAPTF_TEST_ENV" && e.value.as_deref() == Some("set"))
    );
    assert!(
        source
            .args
            .iter()
            .flatten()
            .any(|a| a == "--lock-timeout=5s")
    );
    // The apply sleeps past the deadline: the Job controller stops it.
    let s = within(&env, 180, "the deadline", || async {
        let s = env.cluster_status("c").await?;
        (condition(&s, "ApplyJobSucceeded") == Some(("False", "JobDeadlineExceeded"))).then_some(s)
    })
    .await;
    assert!(s.last_run.unwrap().job.starts_with("captf-c-c-apply-a1-"));
    scraped(
        &env,
        &["captf_jobs_total{kind=\"TerraformCluster\",op=\"apply\",result=\"deadline\"} 1"],
    )
    .await;
}

#[tokio::test]
async fn json_logs_are_one_json_object_per_line() {
    let env = setup(MANAGER, "json-logs", &[], &["--logging-format=json"]).await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let log = env.manager.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() > 10, "{log}");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("timestamp").is_some(),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_pull_policy_reaches_the_job_and_changing_it_applies_nothing() {
    let env = setup(MANAGER, "pull", &[], &[]).await;
    let mut workspace = noop(None);
    workspace.source.image_pull_policy = Some(ImagePullPolicy::Always);
    workspace.identity_ref = Some(captf::api::IdentityReference {
        name: env.identity.clone(),
    });
    env.create_cluster("c", workspace).await;
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let policy = |job: &Job| {
        let pod = job.spec.clone().unwrap().template.spec.unwrap();
        pod.containers[0]
            .image_pull_policy
            .clone()
            .unwrap_or_default()
    };
    let first = env.jobs_named("captf-c-c-apply-").await;
    assert_eq!(policy(&first[0]), "Always");

    // The policy is how an image is fetched, not an input: no apply.
    let api = env.api::<TerraformCluster>();
    let spec = |body: serde_json::Value| Patch::Merge(json!({ "spec": body }));
    let changed = api
        .patch(
            "c",
            &PatchParams::default(),
            &spec(json!({"source": {"imagePullPolicy": "IfNotPresent"}})),
        )
        .await
        .unwrap();
    let generation = changed.metadata.generation;
    within(&env, 60, "a pass over the new policy", || async {
        let s = env.cluster_status("c").await?;
        (s.observed_generation == generation).then_some(())
    })
    .await;
    assert_eq!(env.jobs_named("captf-c-c-apply-").await.len(), 1);

    // The next apply, for a new input, fetches the image the new way.
    api.patch(
        "c",
        &PatchParams::default(),
        &spec(json!({"variables": {"message": "next"}})),
    )
    .await
    .unwrap();
    let next = within(&env, 240, "the next apply", || async {
        env.jobs_named("captf-c-c-apply-a2")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(policy(&next), "IfNotPresent");
}
