//! A TerraformMachinePool's autoscaling (ref §8.8) with the real Cluster
//! API manager and real OpenTofu: the MachinePool's autoscaler annotations
//! turn it on, CAPTF claims the replicas and writes back the count the
//! module reports, without applying again for it; without the annotations
//! the claim goes, and bad ones are reported while the pool still applies.
//! And a pool's own schedule (ref §8.3): its membership refreshes and its
//! drift checks, remediated under `action: Remediate`.

mod capi_shared;
use capi_shared::*;

use std::time::Duration;

use captf::api::TerraformMachinePool;
use captf::names::Kind;
use captf_testkit::capi::{self, CapiKind};
use captf_testkit::scenario::{JobsSeen, vars, within};
use kube::api::{Patch, PatchParams};
use serde_json::json;

const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
const MANAGED_BY: &str = "cluster.x-k8s.io/replicas-managed-by";

async fn annotate(env: &captf_testkit::scenario::Env, annotations: serde_json::Value) {
    capi::api(&env.client, &env.ns, CapiKind::MachinePool)
        .patch(
            "mp",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .unwrap();
}

/// The MachinePool's `replicas-managed-by`, if set.
async fn claim(env: &captf_testkit::scenario::Env) -> Option<String> {
    let mp = capi::api(&env.client, &env.ns, CapiKind::MachinePool)
        .get_opt("mp")
        .await
        .ok()??;
    mp.metadata.annotations?.get(MANAGED_BY).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_pool_writes_its_replicas_back() {
    let (env, capi) = world("capi-as").await;
    let jobs = JobsSeen::watch(&env);
    cluster(&env, "c", None, false).await;
    workload_kubeconfig(&env, "c").await;
    // The cloud's autoscaler holds the group at 4.
    terraform_machine_pool(&env, "tp", "c", vars(&[("cloud_scaled_to", json!(4))])).await;
    bootstrap(&env, "mp-boot", "c").await;
    let mut mp = capi::machine_pool("mp", "c", 2, "tp", "mp-boot", Some("1.36.3"));
    mp["metadata"]["annotations"] = json!({ MIN: "1", MAX: "5" });
    capi::create(&env.client, &env.ns, mp).await;

    capi.within(300, "the module's count written back", || async {
        let replicas = field(&env, CapiKind::MachinePool, "mp", "/spec/replicas").await?;
        let claim = claim(&env).await?;
        let status = field(&env, CapiKind::MachinePool, "mp", "/status/replicas").await?;
        (replicas == json!(4) && claim == "captf" && status == json!(4)).then_some(())
    })
    .await;
    let s = env.status::<TerraformMachinePool>("tp").await.unwrap();
    assert_eq!(
        reason(&s, "AutoscalingActive"),
        Some(("True", "ReplicasManagedByModule"))
    );
    let events = env
        .events_about("ReplicasWrittenBack", Kind::MachinePool, "tp")
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].note.as_deref(),
        Some("MachinePool mp spec.replicas 2 → 4")
    );
    // The count the module reports is not a reason to apply again.
    env.more_passes(Kind::MachinePool, "tp", 3).await;
    assert_eq!(jobs.named("captf-mp-tp-apply").len(), 1, "one apply");

    // Without the annotations: CAPTF withdraws its claim, and the pool
    // applies the MachinePool's count.
    annotate(&env, json!({ MIN: null, MAX: null })).await;
    within(
        &env,
        240,
        "autoscaling off, the claim withdrawn",
        || async {
            let s = env.status::<TerraformMachinePool>("tp").await?;
            let claim = claim(&env).await;
            (reason(&s, "AutoscalingActive") == Some(("False", "AutoscalingDisabled"))
                && claim.is_none())
            .then_some(())
        },
    )
    .await;

    // A pair that is no pair: reported, and the pool still applies.
    annotate(&env, json!({ MIN: "5", MAX: "2" })).await;
    let s = within(&env, 120, "AutoscalingAnnotationsInvalid", || async {
        let s = env.status::<TerraformMachinePool>("tp").await?;
        (reason(&s, "AutoscalingActive") == Some(("False", "AutoscalingAnnotationsInvalid")))
            .then_some(s)
    })
    .await;
    assert_eq!(
        reason(&s, "ApplyJobSucceeded"),
        Some(("True", "ApplySucceeded"))
    );
    assert_eq!(
        field(&env, CapiKind::MachinePool, "mp", "/spec/replicas").await,
        Some(json!(4)),
        "no write-back while autoscaling is off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_refreshes_its_membership_and_remediates_its_drift() {
    let (env, capi) = world("capi-pool-drift").await;
    let jobs = JobsSeen::watch(&env);
    cluster(&env, "c", None, false).await;
    workload_kubeconfig(&env, "c").await;
    let world_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(world_file.path(), "one").unwrap();
    let path = world_file.path().to_str().unwrap().to_owned();
    terraform_machine_pool(&env, "tp", "c", vars(&[("drift_file", json!(path))])).await;
    env.api::<TerraformMachinePool>()
        .patch(
            "tp",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "membershipRefreshIntervalSeconds": 15,
                "drift": {"intervalSeconds": 40, "action": "Remediate"}
            }})),
        )
        .await
        .unwrap();
    bootstrap(&env, "mp-boot", "c").await;
    let mp = capi::machine_pool("mp", "c", 2, "tp", "mp-boot", Some("1.36.3"));
    capi::create(&env.client, &env.ns, mp).await;

    // After its apply the pool reads its membership again every 15 s.
    let refreshes = capi
        .within(300, "three membership refreshes", || async {
            let seen = jobs.named("captf-mp-tp-refresh");
            (seen.len() >= 3).then_some(seen)
        })
        .await;
    let mut starts: Vec<_> = refreshes.iter().map(|(_, at)| *at).collect();
    starts.sort();
    for pair in starts.windows(2) {
        let gap = Duration::try_from(pair[1].duration_since(pair[0])).unwrap();
        assert!(gap >= Duration::from_secs(15), "refreshes {gap:?} apart");
    }

    // The world changes: the next drift check finds it, and the pool is
    // applied again to remediate it.
    std::fs::write(world_file.path(), "two").unwrap();
    capi.within(300, "the drift remediated", || async {
        let s = env.status::<TerraformMachinePool>("tp").await?;
        let remediated = !env
            .events_about("DriftRemediationStarted", Kind::MachinePool, "tp")
            .await
            .is_empty();
        (remediated && reason(&s, "DriftDetected") == Some(("False", "NoDrift"))).then_some(())
    })
    .await;
    let applies = jobs.named("captf-mp-tp-apply");
    assert_eq!(applies.len(), 2, "{applies:?}");
    assert!(
        !env.events_about("DriftDetected", Kind::MachinePool, "tp")
            .await
            .is_empty()
    );
}
