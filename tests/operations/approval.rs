//! Guarded and approved TerraformCluster applies (ref §8.2 "Gating", §9.2
//! "Plan hash", Appendix B "Plan key Secret") end to end: the manager, the
//! local pod executor, real OpenTofu and the real API server.

use captf::api::{PlanPreview, TerraformCluster, WorkspaceStatus};
use captf::names::Kind;
use captf_testkit::scenario::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{MANAGER, scraped};

async fn patch(env: &Env, body: Value) {
    env.api::<TerraformCluster>()
        .patch("c", &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
}

async fn annotate(env: &Env, key: &str, value: &str) {
    patch(env, json!({"metadata": {"annotations": {key: value}}})).await;
}

/// The cluster `c`'s Jobs of `op`, by name.
async fn jobs_of(env: &Env, op: &str) -> Vec<Job> {
    let mut jobs: Vec<Job> = env
        .jobs()
        .await
        .into_iter()
        .filter(|j| j.name_any().starts_with(&format!("captf-c-c-{op}-")))
        .collect();
    jobs.sort_by_key(|j| j.name_any());
    jobs
}

async fn annotations(env: &Env) -> std::collections::BTreeMap<String, String> {
    env.api::<TerraformCluster>()
        .get("c")
        .await
        .unwrap()
        .annotations()
        .clone()
}

/// Waits until the newest run is `job_prefix` and ApplyJobSucceeded is
/// `(status, reason)`.
async fn settled(env: &Env, job_prefix: &str, want: (&str, &str), what: &str) -> WorkspaceStatus {
    within(env, 240, what, || async {
        let s = env.cluster_status("c").await?;
        (s.last_run.as_ref()?.job.starts_with(job_prefix)
            && condition(&s, "ApplyJobSucceeded") == Some(want))
        .then_some(s)
    })
    .await
}

/// The cluster's `status.plan`.
async fn waiting_plan(env: &Env) -> PlanPreview {
    let c = env.api::<TerraformCluster>().get("c").await.unwrap();
    c.status.and_then(|s| s.plan).expect("a plan waits")
}

/// A pass of the cluster after touching it, which decides anew.
async fn pass_after_a_touch(env: &Env) {
    let passes = env.passes(Kind::Cluster, "c");
    annotate(env, "test/touch", &format!("{passes}")).await;
    within(env, 60, "a pass after the touch", || async {
        (env.passes(Kind::Cluster, "c") > passes).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_destructive_cluster_change_waits_for_its_approval() {
    let env = setup(MANAGER, "guard", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("generation", json!(1))]))
        .await;
    let first = settled(
        &env,
        "captf-c-c-apply-a1",
        ("True", "ApplySucceeded"),
        "the first apply",
    )
    .await;
    // A first apply is never guarded.
    assert_eq!(
        steps(first.last_run.as_ref().unwrap()),
        ["init", "validate", "apply"]
    );

    // An additive change applies unguarded by any approval, through the
    // guarded steps.
    patch(
        &env,
        json!({"spec": {"variables": {"generation": 1, "message": "second"}}}),
    )
    .await;
    let s = settled(
        &env,
        "captf-c-c-apply-a2",
        ("True", "ApplySucceeded"),
        "the in-place change",
    )
    .await;
    assert_eq!(
        steps(s.last_run.as_ref().unwrap()),
        ["init", "validate", "plan", "show", "apply"]
    );

    // A replacement stops before anything is applied.
    patch(
        &env,
        json!({"spec": {"variables": {"generation": 2, "message": "second"}}}),
    )
    .await;
    let s = settled(
        &env,
        "captf-c-c-apply-a3",
        ("False", "DestructivePlanBlocked"),
        "the blocked apply",
    )
    .await;
    let blocked = &jobs_of(&env, "apply").await[2];
    let hash = blocked.annotations()["captf.io/inputs-hash"].clone();
    let message = condition_message(&s, "ApplyJobSucceeded").unwrap();
    for part in [
        "module.role.terraform_data.generation[0] (replace)",
        &format!("captf.io/approve-destructive-plan={hash}"),
        "kubectl annotate terraformcluster c -n",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(
        s.last_run.as_ref().unwrap().error.as_ref().unwrap().kind,
        captf::api::RunErrorKind::Blocked
    );
    assert_eq!(
        env.events_about("DestructivePlanBlocked", Kind::Cluster, "c")
            .await
            .len(),
        1
    );
    assert!(
        env.events_about("JobFailed", Kind::Cluster, "c")
            .await
            .is_empty()
    );
    // Blocked is not a failure to retry: nothing starts until approved.
    pass_after_a_touch(&env).await;
    assert_eq!(jobs_of(&env, "apply").await.len(), 3);

    // Approving other inputs changes nothing; approving these applies them.
    annotate(&env, "captf.io/approve-destructive-plan", "h2:other").await;
    pass_after_a_touch(&env).await;
    assert_eq!(jobs_of(&env, "apply").await.len(), 3);
    annotate(&env, "captf.io/approve-destructive-plan", &hash).await;
    let s = settled(
        &env,
        "captf-c-c-apply-a4",
        ("True", "ApplySucceeded"),
        "the approved apply",
    )
    .await;
    assert_eq!(
        steps(s.last_run.as_ref().unwrap()),
        ["init", "validate", "plan", "show", "apply"]
    );
    within(&env, 60, "the approval consumed", || async {
        let gone = !annotations(&env)
            .await
            .contains_key("captf.io/approve-destructive-plan");
        let told = !env
            .events_about("DestructivePlanApprovalConsumed", Kind::Cluster, "c")
            .await
            .is_empty();
        (gone && told).then_some(())
    })
    .await;
    scraped(
        &env,
        &[
            "captf_destructive_plan_approvals_consumed_total{kind=\"TerraformCluster\"} 1",
            "captf_jobs_total{kind=\"TerraformCluster\",op=\"apply\",result=\"blocked\"} 1",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_manual_plan_applies_only_once_approved_and_only_as_planned() {
    let env = setup(MANAGER, "manual", &[], &[]).await;
    env.cluster("c", MUTABLE, vars(&[("message", json!("first"))]))
        .await;
    settled(
        &env,
        "captf-c-c-apply-a1",
        ("True", "ApplySucceeded"),
        "the first apply",
    )
    .await;
    patch(&env, json!({"spec": {"applyPolicy": "Manual"}})).await;

    // A change is planned, and waits.
    patch(&env, json!({"spec": {"variables": {"message": "second"}}})).await;
    let s = settled(
        &env,
        "captf-c-c-plan-a1",
        ("Unknown", "PlanAwaitingApproval"),
        "the plan",
    )
    .await;
    let c = env.api::<TerraformCluster>().get("c").await.unwrap();
    let preview = waiting_plan(&env).await;
    assert_eq!(
        (preview.add, preview.change, preview.destroy),
        (Some(0), Some(1), Some(0))
    );
    assert!(preview.plan_hash.starts_with("p1:"), "{preview:?}");
    assert!(preview.job.starts_with("captf-c-c-plan-a1-"));
    let message = condition_message(&s, "ApplyJobSucceeded").unwrap();
    assert!(
        message.contains(&format!("captf.io/approve-plan={}", preview.plan_hash)),
        "{message}"
    );
    assert_eq!(
        env.events_about("PlanReady", Kind::Cluster, "c")
            .await
            .len(),
        1
    );
    // The plan is saved sealed beside its key; the key is the object's.
    let plan_secret = env.secrets().get("captf-plan-c-c").await.unwrap();
    assert!(plan_secret.data.unwrap().contains_key("mac"));
    let key = env.secrets().get("captf-plankey-c-c").await.unwrap();
    assert_eq!(key.owner_references()[0].uid, c.uid().unwrap());
    assert_eq!(key.data.unwrap()["key"].0.len(), 32);
    pass_after_a_touch(&env).await;
    assert_eq!(
        jobs_of(&env, "apply").await.len(),
        1,
        "nothing applies unapproved"
    );

    // Approved, exactly that plan is applied.
    annotate(&env, "captf.io/approve-plan", &preview.plan_hash).await;
    settled(
        &env,
        "captf-c-c-apply-a2",
        ("True", "ApplySucceeded"),
        "the approved apply",
    )
    .await;
    let apply = &jobs_of(&env, "apply").await[1];
    assert_eq!(
        apply.annotations()["captf.io/approved-plan"],
        preview.plan_hash
    );
    within(&env, 60, "the approval consumed", || async {
        let c = env.api::<TerraformCluster>().get("c").await.ok()?;
        let waiting = c.status.as_ref()?.plan.is_some();
        let annotated = c.annotations().contains_key("captf.io/approve-plan");
        let applied = env
            .events_about("PlanApplied", Kind::Cluster, "c")
            .await
            .len()
            == 1;
        (!waiting && !annotated && applied).then_some(())
    })
    .await;

    // A saved plan swapped between the Jobs is refused, and planned anew.
    patch(&env, json!({"spec": {"variables": {"message": "third"}}})).await;
    settled(
        &env,
        "captf-c-c-plan-a2",
        ("Unknown", "PlanAwaitingApproval"),
        "the second plan",
    )
    .await;
    let hash = waiting_plan(&env).await.plan_hash;
    let mut swapped: Secret = env.secrets().get("captf-plan-c-c").await.unwrap();
    let data = swapped.data.as_mut().unwrap();
    data.get_mut("plan")
        .unwrap()
        .0
        .extend_from_slice(b"swapped");
    env.secrets()
        .replace("captf-plan-c-c", &PostParams::default(), &swapped)
        .await
        .unwrap();
    annotate(&env, "captf.io/approve-plan", &hash).await;
    within(&env, 240, "the refused plan", || async {
        let changed = env.events_about("PlanChanged", Kind::Cluster, "c").await;
        changed
            .iter()
            .any(|e| {
                e.note
                    .as_deref()
                    .unwrap_or_default()
                    .contains("fails its authentication")
            })
            .then_some(())
    })
    .await;
    // The fresh plan the refusal saved has the approved hash: it applies.
    settled(
        &env,
        "captf-c-c-apply-a4",
        ("True", "ApplySucceeded"),
        "the re-planned apply",
    )
    .await;

    // The module changes under its tag after the approval: the approved
    // apply finds another plan, applies nothing, and offers the new one.
    patch(&env, json!({"spec": {"variables": {"message": "fourth"}}})).await;
    settled(
        &env,
        "captf-c-c-plan-a3",
        ("Unknown", "PlanAwaitingApproval"),
        "the third plan",
    )
    .await;
    let approved = waiting_plan(&env).await.plan_hash;
    let module = env.mutable_module.join("main.tf");
    let text = std::fs::read_to_string(&module).unwrap();
    std::fs::write(
        &module,
        format!("{text}\nresource \"terraform_data\" \"republished\" {{\n  input = 1\n}}\n"),
    )
    .unwrap();
    annotate(&env, "captf.io/approve-plan", &approved).await;
    let s = settled(
        &env,
        "captf-c-c-apply-a5",
        ("Unknown", "PlanChanged"),
        "the changed plan",
    )
    .await;
    let now = waiting_plan(&env).await;
    assert_ne!(now.plan_hash, approved);
    assert!(now.job.starts_with("captf-c-c-apply-a5-"), "{now:?}");
    assert_eq!((now.add, now.change), (Some(1), Some(1)));
    let message = condition_message(&s, "ApplyJobSucceeded").unwrap();
    assert!(
        message.contains(&format!("captf.io/approve-plan={}", now.plan_hash)),
        "{message}"
    );
    pass_after_a_touch(&env).await;
    assert_eq!(
        jobs_of(&env, "apply").await.len(),
        5,
        "nothing applies unapproved"
    );
    annotate(&env, "captf.io/approve-plan", &now.plan_hash).await;
    settled(
        &env,
        "captf-c-c-apply-a6",
        ("True", "ApplySucceeded"),
        "the new plan applied",
    )
    .await;
    scraped(
        &env,
        &[
            "captf_plan_approvals_total{kind=\"TerraformCluster\",result=\"approved\"} 5",
            "captf_plan_approvals_total{kind=\"TerraformCluster\",result=\"changed\"} 2",
        ],
    )
    .await;
}
