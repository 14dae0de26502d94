//! Guarded and approved applies (book: inside-the-job.md "Steps by
//! operation"): the plan is shown and judged before anything is applied,
//! and an approved apply applies the saved plan only.

use std::collections::BTreeMap;

use captf::runner::saved;
use k8s_openapi::ByteString;

use super::*;

fn root() -> Value {
    root_module(
        &[("message", false), ("generation", false), ("extra", false)],
        &["message"],
    )
}

fn vars(message: &str, generation: u32, extra: u32) -> Value {
    json!({"message": message, "generation": generation, "extra": extra})
}

async fn message(object: &Object) -> Value {
    let state = object.state().await;
    let item = state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "item")
        .unwrap()
        .clone();
    item["instances"][0]["attributes"]["input"]["value"].clone()
}

async fn saved_data(object: &Object, secret: &str) -> BTreeMap<String, ByteString> {
    object.secrets().get(secret).await.unwrap().data.unwrap()
}

#[tokio::test]
async fn a_guarded_apply_stops_before_a_delete_or_replace() {
    let object = Object::new("runner-guard").await;
    let pod = Pod::new("runner-plans", &root(), &vars("a", 1, 1));
    run(&pod, &object, "apply", &[]).await.assert_ok();

    // Additive and in-place changes apply, through the saved plan.
    let pod = Pod::new("runner-plans", &root(), &vars("b", 1, 2));
    let ran = run(&pod, &object, "apply", &["--guarded"]).await;
    ran.assert_ok();
    assert_eq!(
        ran.step_names(),
        ["init", "validate", "plan", "show", "apply"]
    );
    assert_eq!(ran.exit_code("plan"), 2);
    let plan_file = pod.work().join("plan.out").display().to_string();
    assert_eq!(
        ran.args("apply"),
        [
            "apply",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            &plan_file
        ]
    );
    let report = ran.result.plan.as_ref().unwrap();
    assert_eq!((report.add, report.change, report.destroy), (1, 1, 0));
    assert!(!report.destructive);
    assert_eq!(message(&object).await, "b");

    // A replacement and a delete stop it: nothing is applied.
    let pod = Pod::new("runner-plans", &root(), &vars("c", 2, 1));
    let ran = run(&pod, &object, "apply", &["--guarded"]).await;
    assert_eq!(ran.code, Some(1), "{}", ran.logs());
    assert_eq!(ran.step_names(), ["init", "validate", "plan", "show"]);
    let error = ran.result.error.as_ref().unwrap();
    assert_eq!(error.kind, RunErrorKind::Blocked);
    assert_eq!(
        error.summary.as_deref(),
        Some(
            "the plan deletes or replaces module.role.terraform_data.extra[1] (delete), \
             module.role.terraform_data.generation (replace): not applied"
        )
    );
    assert!(ran.result.plan.as_ref().unwrap().destructive);
    assert_eq!(message(&object).await, "b");

    // Allowed, the same plan applies.
    let pod = Pod::new("runner-plans", &root(), &vars("c", 2, 1));
    let ran = run(
        &pod,
        &object,
        "apply",
        &["--guarded", "--allow-destructive"],
    )
    .await;
    ran.assert_ok();
    let report = ran.result.plan.as_ref().unwrap();
    assert_eq!((report.add, report.change, report.destroy), (1, 1, 2));
    assert_eq!(message(&object).await, "c");
}

#[tokio::test]
async fn an_approved_apply_applies_exactly_the_saved_plan() {
    let object = Object::new("runner-approve").await;
    let secret = "captf-plan-m-test";
    let pod = Pod::new("runner-plans", &root(), &vars("a", 1, 0));
    run(&pod, &object, "apply", &[]).await.assert_ok();

    // A plan Job saves its plan, sealed, and reports its hash.
    let pod = Pod::new("runner-plans", &root(), &vars("b", 1, 0));
    let saving = pod.saving(&object, secret).await;
    let flags = |extra: &[String]| -> Vec<String> { saving.iter().chain(extra).cloned().collect() };
    let ran = run(&pod, &object, "plan", &strs(&flags(&[]))).await;
    ran.assert_ok();
    let hash = ran.result.plan.as_ref().unwrap().plan_hash.clone();
    let data = saved_data(&object, secret).await;
    let opened = saved::open(&[42; 32], Some(&data)).unwrap();
    assert_eq!(
        (opened.plan_hash.as_str(), opened.inputs_hash.as_str()),
        (hash.as_str(), "h2:test")
    );
    assert_eq!(message(&object).await, "a");

    // Approved, it applies; the apply's own inputs are not what it applies.
    let pod = Pod::new("runner-plans", &root(), &vars("b", 1, 0));
    pod.saving(&object, secret).await;
    let approved = flags(&[format!("--approved-plan={hash}")]);
    let ran = run(&pod, &object, "apply", &strs(&approved)).await;
    ran.assert_ok();
    assert_eq!(
        ran.step_names(),
        ["init", "validate", "plan", "show", "apply"]
    );
    let approved_file = pod.work().join("approved.out").display().to_string();
    assert_eq!(ran.args("apply").last(), Some(&approved_file));
    assert_eq!(message(&object).await, "b");

    // A saved plan swapped for another: refused, and a fresh plan is saved.
    let pod = Pod::new("runner-plans", &root(), &vars("c", 1, 0));
    pod.saving(&object, secret).await;
    let ran = run(&pod, &object, "plan", &strs(&flags(&[]))).await;
    ran.assert_ok();
    let hash = ran.result.plan.as_ref().unwrap().plan_hash.clone();
    let mut data = saved_data(&object, secret).await;
    let mut swapped = data["plan"].0.clone();
    swapped.extend_from_slice(b"tampered");
    data.insert("plan".into(), ByteString(swapped));
    let mut s = object.secrets().get(secret).await.unwrap();
    s.data = Some(data);
    object
        .secrets()
        .replace(secret, &PostParams::default(), &s)
        .await
        .unwrap();
    let pod = Pod::new("runner-plans", &root(), &vars("c", 1, 0));
    pod.saving(&object, secret).await;
    let approved = flags(&[format!("--approved-plan={hash}")]);
    let ran = run(&pod, &object, "apply", &strs(&approved)).await;
    assert_eq!(ran.code, Some(1));
    let error = ran.result.error.as_ref().unwrap();
    assert_eq!(error.kind, RunErrorKind::PlanChanged, "{error:?}");
    assert!(
        error
            .summary
            .as_deref()
            .unwrap()
            .contains("fails its authentication"),
        "{error:?}"
    );
    assert_eq!(ran.step_names(), ["init", "validate", "plan", "show"]);
    assert_eq!(message(&object).await, "b");
    let resaved = saved::open(&[42; 32], Some(&saved_data(&object, secret).await)).unwrap();
    assert_eq!(resaved.plan_hash, hash);

    // That fresh plan applies once approved again.
    let pod = Pod::new("runner-plans", &root(), &vars("c", 1, 0));
    pod.saving(&object, secret).await;
    let ran = run(&pod, &object, "apply", &strs(&approved)).await;
    ran.assert_ok();
    assert_eq!(message(&object).await, "c");

    // The module now plans something else than what was approved.
    let pod = Pod::new("runner-plans", &root(), &vars("c", 1, 1));
    pod.saving(&object, secret).await;
    let ran = run(&pod, &object, "plan", &strs(&flags(&[]))).await;
    ran.assert_ok();
    let approved_hash = ran.result.plan.as_ref().unwrap().plan_hash.clone();
    let pod = Pod::new("runner-plans", &root(), &vars("c", 2, 1));
    pod.saving(&object, secret).await;
    let approved = flags(&[format!("--approved-plan={approved_hash}")]);
    let ran = run(&pod, &object, "apply", &strs(&approved)).await;
    assert_eq!(ran.code, Some(1));
    let error = ran.result.error.as_ref().unwrap();
    assert_eq!(error.kind, RunErrorKind::PlanChanged);
    let now = ran.result.plan.as_ref().unwrap();
    assert_ne!(now.plan_hash, approved_hash);
    assert!(
        error.summary.as_deref().unwrap().contains(&format!(
            "{approved_hash} was approved, but the plan is now {}",
            now.plan_hash
        )),
        "{error:?}"
    );
    assert_eq!(
        object.state().await["resources"].as_array().unwrap().len(),
        2
    );

    // A saved plan the state moved past is not applied either.
    let pod = Pod::new("runner-plans", &root(), &vars("d", 1, 0));
    pod.saving(&object, secret).await;
    let ran = run(&pod, &object, "plan", &strs(&flags(&[]))).await;
    ran.assert_ok();
    let hash = ran.result.plan.as_ref().unwrap().plan_hash.clone();
    let pod = Pod::new("runner-plans", &root(), &vars("e", 1, 0));
    run(&pod, &object, "apply", &[]).await.assert_ok();
    let pod = Pod::new("runner-plans", &root(), &vars("d", 1, 0));
    pod.saving(&object, secret).await;
    let approved = flags(&[format!("--approved-plan={hash}")]);
    let ran = run(&pod, &object, "apply", &strs(&approved)).await;
    assert_eq!(ran.code, Some(1), "{}", ran.logs());
    let error = ran.result.error.as_ref().unwrap();
    assert_eq!(error.kind, RunErrorKind::PlanChanged, "{error:?}");
    assert_eq!(ran.exit_code("apply"), 1);
    assert_eq!(message(&object).await, "e");
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
