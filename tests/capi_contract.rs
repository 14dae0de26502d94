//! The Cluster API contract end to end: the real Cluster API core manager
//! and CAPTF's manager against the test control plane, real OpenTofu in
//! the Jobs' pods (the local executor), and the test modules that stand in
//! for a cloud (`tests/modules/capi-*`).

use std::collections::BTreeMap;

mod capi_shared;
use capi_shared::*;

use captf::api::{
    TerraformCluster, TerraformClusterSpec, TerraformMachine, TerraformMachinePool,
    TerraformMachineSpec,
};
use captf::names::Kind;
use captf_testkit::capi::{self, CapiKind};
use captf_testkit::scenario::{JobsSeen, labels, vars, within};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_and_a_machine_come_up_through_cluster_api() {
    let (env, capi) = world("capi-up").await;
    cluster(&env, "c", None, false).await;
    let tc = within(
        &env,
        240,
        "the endpoint written to the TerraformCluster",
        || async {
            let tc = env.api::<TerraformCluster>().get("c").await.ok()?;
            tc.spec.control_plane_endpoint.is_some().then_some(tc)
        },
    )
    .await;
    assert!(tc.owner_references().iter().any(|o| o.kind == "Cluster"));
    assert_eq!(
        tc.annotations()
            .get("captf.io/endpoint-source")
            .map(String::as_str),
        Some("module")
    );
    let endpoint = serde_json::to_value(tc.spec.control_plane_endpoint.as_ref()).unwrap();
    capi.within(
        120,
        "Cluster API copying the endpoint and failure domains",
        || async {
            let copied = field(&env, CapiKind::Cluster, "c", "/spec/controlPlaneEndpoint").await?;
            let provisioned = field(
                &env,
                CapiKind::Cluster,
                "c",
                "/status/initialization/infrastructureProvisioned",
            )
            .await?;
            let domains = field(&env, CapiKind::Cluster, "c", "/status/failureDomains").await?;
            let names: Vec<&str> = domains
                .as_array()?
                .iter()
                .filter_map(|d| d["name"].as_str())
                .collect();
            (copied == endpoint && provisioned == json!(true) && names == ["fd-a", "fd-b"])
                .then_some(())
        },
    )
    .await;

    // A machine created before its Machine waits for it.
    terraform_machine(&env, "m", "c", None).await;
    within(&env, 60, "the machine waiting for its Machine", || async {
        let s = env.machine_status("m").await?;
        (reason(&s, "DependenciesReady") == Some(("Unknown", "WaitingForOwnerMachine")))
            .then_some(())
    })
    .await;
    machine(&env, "m", "c", "m", Some("fd-a")).await;
    let provider_id = format!("captf-test://{}/m", env.ns);
    capi.within(300, "the Machine provisioned", || async {
        let phase = capi::phase(&env.client, &env.ns, CapiKind::Machine, "m").await?;
        let id = field(&env, CapiKind::Machine, "m", "/spec/providerID").await?;
        (phase == "Provisioned" && id == json!(provider_id)).then_some(())
    })
    .await;
    let addresses = field(&env, CapiKind::Machine, "m", "/status/addresses")
        .await
        .unwrap();
    assert_eq!(addresses[0]["type"], "InternalIP");
    assert_eq!(addresses[1], json!({"type": "Hostname", "address": "m"}));
    let status = env.machine_status("m").await.unwrap();
    assert_eq!(
        reason(&status, "OutputsValid"),
        Some(("True", "OutputsValid"))
    );
    assert!(provisioned(&status));
    // Exactly the bootstrap data arrived, and the cluster's exports.
    let seen = resource_input(&env, Kind::Machine, "m", "machine").await;
    let digest: String = Sha256::digest(BOOTSTRAP)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(seen["bootstrap_digest"], json!(digest));
    let exports: Value = serde_json::from_str(seen["seen_exports"].as_str().unwrap()).unwrap();
    assert!(exports.is_object() && !exports.as_object().unwrap().is_empty());

    // With the workload cluster's kubeconfig and a Node, it runs.
    workload_kubeconfig(&env, "c").await;
    let node = format!("{}-m", env.ns);
    Api::<Node>::all(env.client.clone())
        .create(&PostParams::default(), &capi::node(&node, &provider_id))
        .await
        .unwrap();
    capi.within(240, "the Machine running", || async {
        let phase = capi::phase(&env.client, &env.ns, CapiKind::Machine, "m").await?;
        (phase == "Running").then_some(())
    })
    .await;
    within(&env, 60, "the machine Ready", || async {
        let s = env.machine_status("m").await?;
        (reason(&s, "Ready") == Some(("True", "Ready"))).then_some(())
    })
    .await;
    Api::<Node>::all(env.client.clone())
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_pool_follows_its_replicas() {
    let (env, capi) = world("capi-mp").await;
    cluster(&env, "c", None, false).await;
    workload_kubeconfig(&env, "c").await;
    // The module names the group too: spec.providerID.
    let group = format!("captf-test://{}/group", env.ns);
    let variables = vars(&[("group_provider_id", json!(group))]);
    terraform_machine_pool(&env, "tp", "c", variables).await;
    bootstrap(&env, "mp-boot", "c").await;
    let mp = capi::machine_pool("mp", "c", 2, "tp", "mp-boot", Some("1.36.3"));
    capi::create(&env.client, &env.ns, mp).await;
    for n in [2, 3] {
        if n == 3 {
            capi::api(&env.client, &env.ns, CapiKind::MachinePool)
                .patch(
                    "mp",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": 3}})),
                )
                .await
                .unwrap();
        }
        capi.within(300, &format!("the MachinePool at {n}"), || async {
            let ids = field(&env, CapiKind::MachinePool, "mp", "/spec/providerIDList").await?;
            let replicas = field(&env, CapiKind::MachinePool, "mp", "/status/replicas").await?;
            (ids.as_array()?.len() == n && replicas == json!(n)).then_some(())
        })
        .await;
        let tp = env.api::<TerraformMachinePool>().get("tp").await.unwrap();
        let status = tp.status.unwrap();
        assert_eq!(status.replicas, Some(n as i32));
        assert_eq!(status.ready, Some(true));
        assert_eq!(tp.spec.provider_id_list.map(|l| l.len()), Some(n));
        assert_eq!(tp.spec.provider_id.as_deref(), Some(group.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_keeps_a_job_from_starting() {
    let (env, capi) = world("capi-wait").await;
    cluster(&env, "c", None, false).await;
    // An externally managed TerraformCluster: no Job, no status.
    let mut ext = TerraformCluster::new(
        "ext",
        TerraformClusterSpec {
            workspace: workspace(&env, CLUSTER, None),
            ..Default::default()
        },
    );
    ext.metadata.annotations = Some(BTreeMap::from([(
        "cluster.x-k8s.io/managed-by".to_string(),
        "someone-else".to_string(),
    )]));
    env.api::<TerraformCluster>()
        .create(&PostParams::default(), &ext)
        .await
        .unwrap();
    // A cluster that never gets healthy: its machines wait.
    cluster(
        &env,
        "slow",
        vars(&[("health_state", json!("pending"))]),
        false,
    )
    .await;
    terraform_machine(&env, "sm", "slow", None).await;
    machine(&env, "sm", "slow", "sm", None).await;
    within(
        &env,
        240,
        "a machine waiting for its cluster's infrastructure",
        || async {
            let s = env.machine_status("sm").await?;
            (reason(&s, "DependenciesReady")
                == Some(("Unknown", "WaitingForClusterInfrastructure")))
            .then_some(())
        },
    )
    .await;
    // A Machine that names another infrastructure object.
    machine(&env, "other", "c", "someone-else", None).await;
    let other = capi::api(&env.client, &env.ns, CapiKind::Machine)
        .get("other")
        .await
        .unwrap();
    let mut mm = TerraformMachine::new(
        "mm",
        TerraformMachineSpec {
            workspace: workspace(&env, MACHINE, None),
            ..Default::default()
        },
    );
    mm.metadata.labels = labels("c");
    mm.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: "other".into(),
            uid: other.uid().unwrap(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    env.api::<TerraformMachine>()
        .create(&PostParams::default(), &mm)
        .await
        .unwrap();
    within(&env, 120, "the mismatched owner reported", || async {
        let s = env.machine_status("mm").await?;
        (reason(&s, "DependenciesReady").map(|r| r.1) == Some("OwnerMismatch")).then_some(())
    })
    .await;
    // A machine whose module outputs no provider ID is not provisioned.
    terraform_machine(&env, "np", "c", vars(&[("null_provider_id", json!(true))])).await;
    machine(&env, "np", "c", "np", None).await;
    within(&env, 300, "a null provider ID pending", || async {
        let s = env.machine_status("np").await?;
        (reason(&s, "OutputsValid") == Some(("Unknown", "OutputsPending"))).then_some(())
    })
    .await;
    assert!(!provisioned(&env.machine_status("np").await.unwrap()));
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().starts_with("captf-m-mm-")
                && !j.name_any().starts_with("captf-c-ext-"))
    );
    assert!(env.cluster_status("ext").await.is_none());
    assert!(env.machine_status("mm").await.unwrap().last_run.is_none());

    // Paused: an input change starts no Job until the Cluster is unpaused;
    // block-move is on while the Job runs and gone after.
    let pause = |paused: bool| {
        let api = capi::api(&env.client, &env.ns, CapiKind::Cluster);
        async move {
            api.patch(
                "c",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": paused}})),
            )
            .await
            .unwrap();
        }
    };
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(provisioned)
    })
    .await;
    pause(true).await;
    within(&env, 60, "the cluster paused", || async {
        let s = env.cluster_status("c").await?;
        (reason(&s, "Paused") == Some(("True", "Paused"))).then_some(())
    })
    .await;
    let applies = |jobs: Vec<k8s_openapi::api::batch::v1::Job>| {
        jobs.iter()
            .filter(|j| j.name_any().starts_with("captf-c-c-apply-"))
            .count()
    };
    let before = applies(env.jobs().await);
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"health_state": "running"}}})),
        )
        .await
        .unwrap();
    env.more_passes(Kind::Cluster, "c", 3).await;
    assert_eq!(
        applies(env.jobs().await),
        before,
        "a Job started while paused"
    );
    pause(false).await;
    within(&env, 120, "block-move while the re-apply runs", || async {
        let tc = env.api::<TerraformCluster>().get("c").await.ok()?;
        let running = tc.status.as_ref()?.workspace.active_job.is_some();
        (running
            && tc
                .annotations()
                .contains_key("clusterctl.cluster.x-k8s.io/block-move"))
        .then_some(())
    })
    .await;
    within(
        &env,
        240,
        "block-move gone once the Job is done",
        || async {
            let tc = env.api::<TerraformCluster>().get("c").await.ok()?;
            let idle = tc.status.as_ref()?.workspace.active_job.is_none();
            (idle
                && !tc
                    .annotations()
                    .contains_key("clusterctl.cluster.x-k8s.io/block-move"))
            .then_some(())
        },
    )
    .await;
    assert_eq!(applies(env.jobs().await), before + 1);

    // A deletion while paused waits for the unpause.
    pause(true).await;
    let seen = JobsSeen::watch(&env);
    env.api::<TerraformMachine>()
        .delete("np", &DeleteParams::default())
        .await
        .unwrap();
    env.more_passes(Kind::Machine, "np", 3).await;
    assert!(env.jobs_named("captf-m-np-destroy-").await.is_empty());
    assert!(!env.gone::<TerraformMachine>("np").await);
    pause(false).await;
    env.wait_gone::<TerraformMachine>(240, "np").await;
    // Its Jobs went with it; the watch saw the destroy.
    assert_eq!(seen.destroys(Kind::Machine, "np").len(), 1);
    drop(capi);
}
