//! Job history (ref §1.2) end to end: the manager, the local pod executor,
//! real OpenTofu and the real API server, whose garbage collector takes a
//! pruned Job's pod.

use captf::api::{JobPolicy, Source, TerraformCluster, WorkspaceSpec};
use captf::names::Kind;
use captf_testkit::scenario::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// The names of the cluster `c`'s apply Jobs, sorted by attempt.
async fn applies(env: &Env) -> Vec<String> {
    let mut names: Vec<(u32, String)> = env
        .jobs()
        .await
        .into_iter()
        .map(|j| j.name_any())
        .filter_map(|n| {
            let attempt = n.strip_prefix("captf-c-c-apply-a")?.split('-').next()?;
            Some((attempt.parse().ok()?, n))
        })
        .collect();
    names.sort();
    names.into_iter().map(|(_, n)| n).collect()
}

#[tokio::test]
async fn five_failed_applies_leave_the_newest_two_and_the_newest_success() {
    let env = setup(MANAGER, "history", &[], &[]).await;
    let workspace = WorkspaceSpec {
        source: Source {
            image: NOOP.into(),
            image_pull_policy: None,
        },
        identity_ref: Some(captf::api::IdentityReference {
            name: env.identity.clone(),
        }),
        jobs: Some(JobPolicy {
            successful_jobs_history_limit: Some(0),
            failed_jobs_history_limit: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    };
    env.create_cluster("c", workspace).await;
    within(&env, 240, "the first apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;

    // Each new input starts an apply at once (no backoff for new inputs),
    // and each one fails (at its plan: a cluster's re-apply is guarded, and
    // a failure that replaces a resource would be blocked instead).
    for n in 1..=5 {
        let patch = json!({"spec": {"variables": {"fail_plan": true, "message": format!("m{n}")}}});
        env.api::<TerraformCluster>()
            .patch("c", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let attempt = format!("captf-c-c-apply-a{}-", n + 1);
        within(&env, 240, &format!("failed apply {attempt}"), || async {
            let s = env.cluster_status("c").await?;
            let run = s.last_run.as_ref()?;
            (run.job.starts_with(&attempt)
                && condition(&s, "ApplyJobSucceeded") == Some(("False", "ApplyFailed")))
            .then_some(())
        })
        .await;
    }

    // The success is the newest of its op (kept at a limit of 0); of the
    // failures the newest two.
    let kept = within(&env, 60, "the history pruned", || async {
        let names = applies(&env).await;
        (names.len() == 3).then_some(names)
    })
    .await;
    let attempts: Vec<&str> = kept
        .iter()
        .map(|n| {
            n.trim_start_matches("captf-c-c-apply-")
                .split('-')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(attempts, ["a1", "a5", "a6"], "{kept:?}");
    // The failed inputs are not tried again before their backoff (ref
    // §8.4), although they differ from the applied ones.
    for n in 0..2 {
        let passes = env.passes(Kind::Cluster, "c");
        let touch = json!({"metadata": {"annotations": {"test/touch": n.to_string()}}});
        env.api::<TerraformCluster>()
            .patch("c", &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .unwrap();
        within(&env, 60, "a pass after the touch", || async {
            (env.passes(Kind::Cluster, "c") > passes).then_some(())
        })
        .await;
    }
    assert_eq!(applies(&env).await, kept);
    // The pruned Jobs' pods went with them.
    within(&env, 60, "only the kept Jobs' pods", || async {
        let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        pods.items
            .iter()
            .filter_map(|p| p.labels().get("job-name"))
            .all(|job| kept.contains(job))
            .then_some(())
    })
    .await;
}
