//! Machine remediation (ref §8.8): with annotateMachine, the health-check
//! refresh samples the instance's health; an unhealthy machine's Machine
//! gets `cluster.x-k8s.io/remediate-machine` with CAPTF's marker, withdrawn
//! when it reads healthy again. The noop module reads its health from a
//! file of this host.

use captf::api::{Source, TerraformMachine, WorkspaceSpec};
use captf::capi::objects::Machine;
use captf::names::Kind;
use captf_testkit::scenario::*;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{MANAGER, scraped};

async fn machine_annotations(env: &Env) -> std::collections::BTreeMap<String, String> {
    Api::<Machine>::namespaced(env.client.clone(), &env.ns)
        .get("m")
        .await
        .unwrap()
        .annotations()
        .clone()
}

#[tokio::test]
async fn an_unhealthy_machine_asks_for_remediation_until_it_recovers() {
    let env = setup(MANAGER, "remediation", &[], &[]).await;
    let health = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(health.path(), "running").unwrap();
    let workspace = WorkspaceSpec {
        source: Source {
            image: NOOP.into(),
            image_pull_policy: None,
        },
        variables: vars(&[("health_file", json!(health.path().to_str().unwrap()))]),
        ..Default::default()
    };
    env.create_machine("m", "c", workspace).await;
    let remediation = json!({"spec": {"remediation": {
        "annotateMachine": true, "unhealthyThreshold": 1, "healthCheckIntervalSeconds": 60
    }}});
    env.api::<TerraformMachine>()
        .patch("m", &PatchParams::default(), &Patch::Merge(&remediation))
        .await
        .unwrap();
    within(&env, 240, "the apply, healthy", || async {
        let s = env.machine_status("m").await.filter(applied)?;
        (condition(&s, "InfrastructureHealthy") == Some(("True", "Healthy"))).then_some(())
    })
    .await;

    // The instance stops: the next health check finds it, and one sample
    // reaches the threshold.
    std::fs::write(health.path(), "stopped").unwrap();
    let marked = within(&env, 150, "the remediation request", || async {
        let a = machine_annotations(&env).await;
        a.contains_key("cluster.x-k8s.io/remediate-machine")
            .then(|| a.get("captf.io/remediation-requested").cloned())
            .flatten()
    })
    .await;
    assert_eq!(marked, "InstanceStopped for 1 consecutive samples");
    // The pass writes the Machine's annotations before its own status.
    within(&env, 30, "one unhealthy sample in status", || async {
        let m = env.api::<TerraformMachine>().get("m").await.ok()?;
        (m.status?.unhealthy_samples == Some(1)).then_some(())
    })
    .await;
    // The pass records its events after its writes.
    within(&env, 30, "the RemediationRequested event", || async {
        let events = env
            .events_about("RemediationRequested", Kind::Machine, "m")
            .await;
        (events.len() == 1).then_some(())
    })
    .await;
    let runs = env.jobs_named("captf-m-m-refresh-").await;
    assert!(!runs.is_empty(), "the health check is a refresh Job");

    // It recovers: the request is withdrawn.
    std::fs::write(health.path(), "running").unwrap();
    within(&env, 150, "the request withdrawn", || async {
        let a = machine_annotations(&env).await;
        (!a.contains_key("cluster.x-k8s.io/remediate-machine")
            && !a.contains_key("captf.io/remediation-requested"))
        .then_some(())
    })
    .await;
    // The pass records its events after its writes.
    within(&env, 30, "the RemediationWithdrawn event", || async {
        let events = env
            .events_about("RemediationWithdrawn", Kind::Machine, "m")
            .await;
        (events.len() == 1).then_some(())
    })
    .await;
    scraped(
        &env,
        &[
            "captf_remediation_requests_total{action=\"requested\"} 1",
            "captf_remediation_requests_total{action=\"withdrawn\"} 1",
        ],
    )
    .await;
}
