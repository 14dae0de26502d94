//! Settings shown at work end to end: the manager's
//! `--drift-default-interval`, `--runner-events=false` and `--watch-filter`;
//! an object's own `cluster.x-k8s.io/paused` annotation and
//! `spec.source.imagePullPolicy`; a cluster's `spec.defaults.drift`.

use std::time::Duration;

use captf::api::{TerraformCluster, TerraformMachine};
use captf::names::Kind;
use captf_testkit::scenario::*;
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
}

#[tokio::test]
async fn a_machine_takes_its_clusters_default_drift_interval() {
    let env = setup(MANAGER, "inherit", &[], &[]).await;
    env.machine("m", "c", None).await;
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"defaults": {"drift": {"intervalSeconds": 20}}}})),
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
