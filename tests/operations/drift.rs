//! Drift checks on their schedule (ref §8.3) end to end: the manager, the
//! local pod executor, real OpenTofu and the real API server. The noop
//! module reads a file of this host as its real world; changing the file
//! out of band is drift.

use std::time::Duration;

use captf::api::TerraformCluster;
use captf::names::Kind;
use captf_testkit::scenario::*;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{MANAGER, completed_at, created_after, scraped};

#[tokio::test]
async fn drift_is_found_on_schedule_reported_then_remediated() {
    let env = setup(MANAGER, "drift", &[], &[]).await;
    let world = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(world.path(), "one").unwrap();
    let path = world.path().to_str().unwrap().to_owned();
    env.cluster("c", NOOP, vars(&[("drift_file", json!(path))]))
        .await;
    let interval = 60;
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drift": {"intervalSeconds": interval}}})),
        )
        .await
        .unwrap();
    let s = within(&env, 240, "the first apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    assert_eq!(
        condition(&s, "DriftDetected"),
        Some(("Unknown", "DriftNotChecked")),
        "{s:?}"
    );
    let applied_at = completed_at(&env, "captf-c-c-apply-").await;

    // The world changes; the next check finds it, one interval (plus at
    // most a tenth of it) after the apply.
    std::fs::write(world.path(), "two").unwrap();
    let s = within(&env, 240, "drift found", || async {
        let s = env.cluster_status("c").await?;
        (condition(&s, "DriftDetected") == Some(("True", "DriftReported"))).then_some(s)
    })
    .await;
    assert_eq!(env.jobs_named("captf-c-c-drift-").await.len(), 1);
    let after = created_after(&env, "captf-c-c-drift-", applied_at, 1).await;
    assert!(
        after >= Duration::from_secs(interval)
            && after <= Duration::from_secs(interval * 11 / 10 + 15),
        "the drift check came {after:?} after the apply"
    );
    let run = s.last_run.as_ref().unwrap();
    assert_eq!(steps(run), ["init", "apply-refresh-only", "plan", "show"]);
    let found = run.drift.as_ref().unwrap();
    assert_eq!(
        (found.add, found.change, found.destroy),
        (Some(0), Some(1), Some(0))
    );
    assert_eq!(
        found.resources.as_deref(),
        Some(&["module.role.terraform_data.drift[0]".to_string()][..])
    );
    assert_eq!(
        condition(&s, "DriftJobSucceeded"),
        Some(("True", "DriftChecked"))
    );
    assert!(s.last_drift_check.is_some());
    assert_eq!(
        env.events_about("DriftDetected", Kind::Cluster, "c")
            .await
            .len(),
        1
    );
    let gauge = format!(
        "captf_drift_detected{{kind=\"TerraformCluster\",namespace=\"{}\",name=\"c\"}} 1",
        env.ns
    );
    scraped(
        &env,
        &[
            gauge.as_str(),
            "captf_drift_resources_total{kind=\"TerraformCluster\",action=\"change\"} 1",
        ],
    )
    .await;
    // Reported only: nothing was applied.
    assert_eq!(env.jobs_named("captf-c-c-apply-").await.len(), 1);

    // Under Remediate the module is applied again, and the drift is gone.
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drift": {"action": "Remediate"}}})),
        )
        .await
        .unwrap();
    let s = within(&env, 240, "the drift remediated", || async {
        let s = env.cluster_status("c").await?;
        (condition(&s, "DriftDetected") == Some(("False", "NoDrift"))).then_some(s)
    })
    .await;
    let remediation = env.jobs_named("captf-c-c-apply-a2").await;
    assert_eq!(
        remediation[0]
            .annotations()
            .get("captf.io/drift-remediation")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(
        condition(&s, "ApplyJobSucceeded"),
        Some(("True", "ApplySucceeded"))
    );
    for reason in ["DriftRemediationStarted", "DriftResolved"] {
        assert_eq!(
            env.events_about(reason, Kind::Cluster, "c").await.len(),
            1,
            "{reason}"
        );
    }
}
