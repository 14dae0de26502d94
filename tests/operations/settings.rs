//! Settings shown at work end to end: the manager's
//! `--drift-default-interval`, `--runner-events=false` and `--watch-filter`;
//! an object's own `cluster.x-k8s.io/paused` annotation and
//! `spec.source.imagePullPolicy`; a cluster's `spec.defaults.drift`.

use std::time::Duration;

use captf::api::{TerraformCluster, TerraformMachine};
use captf::names::Kind;
use captf_testkit::scenario::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::MANAGER;

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
    let apply = env.jobs_named("captf-c-c-apply-").await;
    let applied_at = apply[0]
        .status
        .as_ref()
        .and_then(|s| s.completion_time.clone())
        .unwrap()
        .0;
    let drift = within(&env, 120, "a drift check", || async {
        env.jobs_named("captf-c-c-drift-").await.into_iter().next()
    })
    .await;
    let started = drift.metadata.creation_timestamp.unwrap().0;
    let after = Duration::try_from(started.duration_since(applied_at)).unwrap();
    assert!(
        after >= Duration::from_secs(20) && after <= Duration::from_secs(22 + 15),
        "the drift check came {after:?} after the apply"
    );
    // The Job asks for no events, and the runner sent none.
    let args = drift.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(
        !args.iter().any(|a| a.starts_with("--events-for")),
        "{args:?}"
    );
    let runner_events = Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("captf.io/runner"))
        .count();
    assert_eq!(runner_events, 0);
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
    let apply = env.jobs_named("captf-m-m-apply-").await;
    let applied_at = apply[0]
        .status
        .as_ref()
        .and_then(|s| s.completion_time.clone())
        .unwrap()
        .0;
    let drift = within(&env, 120, "the machine's drift check", || async {
        env.jobs_named("captf-m-m-drift-").await.into_iter().next()
    })
    .await;
    let after = Duration::try_from(
        drift
            .metadata
            .creation_timestamp
            .unwrap()
            .0
            .duration_since(applied_at),
    )
    .unwrap();
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
