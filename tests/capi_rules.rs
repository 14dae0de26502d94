//! Rules of the contract with the real Cluster API manager and real
//! OpenTofu: outputs that do not fit it (ref §9.4: a required output the
//! module does not declare, a provider ID other than the one the object
//! already has), and the cluster's `control_plane_initialized` input
//! (§9.3) following Cluster API.

mod capi_shared;
use capi_shared::*;

use captf::api::{TerraformCluster, TerraformClusterSpec, TerraformMachine, TerraformMachineSpec};
use captf::names::Kind;
use captf_testkit::capi::{self, CapiKind, MachineOptions};
use std::io::Read;

use captf_testkit::scenario::{JobsSeen, condition_message, gzip, labels, put_state, within};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const UNDECLARED: &str = "captf.test/modules/capi-cluster-undeclared:dev";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_output_is_missing_and_a_known_provider_id_is_kept() {
    let (env, capi) = world("capi-outputs").await;
    let jobs = JobsSeen::watch(&env);

    // A module without failure_domains and exports applies, and is never
    // provisioned: the module has to change.
    let mut u = TerraformCluster::new(
        "u",
        TerraformClusterSpec {
            workspace: workspace(&env, UNDECLARED, None),
            ..Default::default()
        },
    );
    u.metadata.labels = labels("u");
    env.api::<TerraformCluster>()
        .create(&PostParams::default(), &u)
        .await
        .unwrap();
    capi::create(&env.client, &env.ns, capi::cluster("u", "u", false, None)).await;
    let s = within(&env, 240, "OutputsMissing on the cluster", || async {
        let s = env.cluster_status("u").await?;
        (reason(&s, "OutputsValid") == Some(("False", "OutputsMissing"))).then_some(s)
    })
    .await;
    assert_eq!(
        condition_message(&s, "OutputsValid"),
        Some("the module declares no output failure_domains, exports")
    );
    assert_eq!(
        reason(&s, "ApplyJobSucceeded"),
        Some(("True", "ApplySucceeded"))
    );
    assert!(!provisioned(&s));
    env.more_passes(Kind::Cluster, "u", 3).await;
    assert_eq!(jobs.named("captf-c-u-").len(), 1, "no second apply");
    let s = env.cluster_status("u").await.unwrap();
    assert_eq!(
        reason(&s, "OutputsValid"),
        Some(("False", "OutputsMissing"))
    );
    assert_eq!(
        field(
            &env,
            CapiKind::Cluster,
            "u",
            "/status/initialization/infrastructureProvisioned"
        )
        .await,
        None
    );

    // A machine whose spec already names another instance keeps it.
    cluster(&env, "c", None, false).await;
    capi.within(240, "the cluster's infrastructure provisioned", || async {
        let done = field(
            &env,
            CapiKind::Cluster,
            "c",
            "/status/initialization/infrastructureProvisioned",
        )
        .await?;
        (done == json!(true)).then_some(())
    })
    .await;
    let known = format!("captf-test://{}/adopted", env.ns);
    let mut m = TerraformMachine::new(
        "m",
        TerraformMachineSpec {
            workspace: workspace(&env, MACHINE, None),
            provider_id: Some(known.clone()),
            ..Default::default()
        },
    );
    m.metadata.labels = labels("c");
    env.api::<TerraformMachine>()
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
    machine(&env, "m", "c", "m", None).await;
    let s = within(&env, 240, "ProviderIDChanged on the machine", || async {
        let s = env.machine_status("m").await?;
        (reason(&s, "OutputsValid") == Some(("False", "ProviderIDChanged"))).then_some(s)
    })
    .await;
    assert!(!provisioned(&s));
    let m = env.api::<TerraformMachine>().get("m").await.unwrap();
    assert_eq!(m.spec.provider_id.as_deref(), Some(known.as_str()));
    let message = condition_message(&s, "OutputsValid").unwrap_or_default();
    assert!(
        !message.contains(&format!("{}/m", env.ns)),
        "no output value in {message:?}"
    );

    // A provisioned machine whose state later reports another provider ID
    // (as a refresh of a replaced instance would) keeps the first one.
    terraform_machine(&env, "n", "c", None).await;
    machine(&env, "n", "c", "n", None).await;
    let first = format!("captf-test://{}/n", env.ns);
    capi.within(
        240,
        "the Machine with the machine's provider ID",
        || async {
            let id = field(&env, CapiKind::Machine, "n", "/spec/providerID").await?;
            (id == json!(first)).then_some(())
        },
    )
    .await;
    let later = format!("captf-test://{}/n-replaced", env.ns);
    rewrite_provider_id(&env, "n", &later).await;
    let s = within(
        &env,
        120,
        "ProviderIDChanged after provisioning",
        || async {
            let s = env.machine_status("n").await?;
            (reason(&s, "OutputsValid") == Some(("False", "ProviderIDChanged"))).then_some(s)
        },
    )
    .await;
    assert!(provisioned(&s), "the latch holds");
    let n = env.api::<TerraformMachine>().get("n").await.unwrap();
    assert_eq!(n.spec.provider_id.as_deref(), Some(first.as_str()));
    assert_eq!(
        field(&env, CapiKind::Machine, "n", "/spec/providerID").await,
        Some(json!(first))
    );
}

/// Rewrites the `provider_id` output of the machine's state in place (a
/// new serial; the Secret's annotations stay).
async fn rewrite_provider_id(env: &captf_testkit::scenario::Env, name: &str, id: &str) {
    let suffix = env.suffix(Kind::Machine, name);
    let secret = env
        .secrets()
        .get(&captf::names::state_secret(&suffix))
        .await
        .unwrap();
    let gz = &secret.data.unwrap()["tfstate"].0;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    let mut state: serde_json::Value = serde_json::from_str(&text).unwrap();
    state["outputs"]["provider_id"]["value"] = json!(id);
    state["serial"] = json!(state["serial"].as_u64().unwrap() + 1);
    put_state(
        env,
        Kind::Machine,
        name,
        &gzip(state.to_string().as_bytes()),
    )
    .await;
}

/// Without a controlPlaneRef, Cluster API marks the control plane
/// initialized (its condition only) once a control-plane Machine has a
/// Node; the cluster is re-applied with the input true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_learns_that_its_control_plane_is_initialized() {
    let (env, capi) = world("capi-cp").await;
    cluster(&env, "c", None, false).await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(provisioned)
    })
    .await;
    let input = resource_input(&env, Kind::Cluster, "c", "cluster").await;
    assert_eq!(input["control_plane_initialized"], json!(false));

    terraform_machine(&env, "cp", "c", None).await;
    bootstrap(&env, "cp-boot", "c").await;
    let options = MachineOptions {
        version: Some("1.36.3"),
        control_plane: true,
        failure_domain: Some("fd-a"),
    };
    capi::create(
        &env.client,
        &env.ns,
        capi::machine("cp", "c", "cp", "cp-boot", &options),
    )
    .await;
    within(
        &env,
        240,
        "the control-plane machine provisioned",
        || async { env.machine_status("cp").await.filter(provisioned) },
    )
    .await;
    workload_kubeconfig(&env, "c").await;
    let node = format!("{}-cp", env.ns);
    let provider_id = format!("captf-test://{}/cp", env.ns);
    Api::<Node>::all(env.client.clone())
        .create(&PostParams::default(), &capi::node(&node, &provider_id))
        .await
        .unwrap();
    capi.within(
        240,
        "the cluster re-applied with its control plane initialized",
        || async {
            let input = resource_input(&env, Kind::Cluster, "c", "cluster").await;
            (input["control_plane_initialized"] == json!(true)).then_some(())
        },
    )
    .await;
    // Cluster API said so through the condition alone.
    assert_eq!(
        field(
            &env,
            CapiKind::Cluster,
            "c",
            "/status/initialization/controlPlaneInitialized"
        )
        .await,
        None
    );
    Api::<Node>::all(env.client.clone())
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
}
