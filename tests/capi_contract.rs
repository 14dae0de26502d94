//! The Cluster API contract end to end: the real Cluster API core manager
//! and CAPTF's manager against the test control plane, real OpenTofu in
//! the Jobs' pods (the local executor), and the test modules that stand in
//! for a cloud (`tests/modules/capi-*`).

use std::collections::BTreeMap;
use std::io::Read;

use captf::api::{
    IdentityReference, Source, TerraformCluster, TerraformClusterSpec, TerraformMachine,
    TerraformMachinePool, TerraformMachinePoolSpec, TerraformMachineSpec, TerraformMachineTemplate,
    TerraformMachineTemplateResource, TerraformMachineTemplateSpec, Variables, WorkspaceSpec,
    WorkspaceStatus,
};
use captf::names::{self, Kind};
use captf_testkit::capi::{self, CapiKind, CapiManager, MachineOptions};
use captf_testkit::controlplane;
use captf_testkit::scenario::{Env, condition, labels, setup, vars, within};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");
const CLUSTER: &str = "captf.test/modules/capi-cluster:dev";
const MACHINE: &str = "captf.test/modules/capi-machine:dev";
const POOL: &str = "captf.test/modules/capi-pool:dev";
const BOOTSTRAP: &[u8] = b"#cloud-config\nruncmd: [echo from-cluster-api]\n";

async fn world(prefix: &str) -> (Env, CapiManager) {
    let env = setup(MANAGER, prefix, &[], &["--sync-period=5s"]).await;
    let capi = CapiManager::start(controlplane::shared(), &env.ns).await;
    (env, capi)
}

fn workspace(env: &Env, image: &str, variables: Option<Variables>) -> WorkspaceSpec {
    WorkspaceSpec {
        source: Source {
            image: image.into(),
            image_pull_policy: None,
        },
        identity_ref: Some(IdentityReference {
            name: env.identity.clone(),
        }),
        variables,
        ..Default::default()
    }
}

/// A TerraformCluster `name` of the capi-cluster module and its Cluster.
async fn cluster(env: &Env, name: &str, variables: Option<Variables>, paused: bool) {
    let mut c = TerraformCluster::new(
        name,
        TerraformClusterSpec {
            workspace: workspace(env, CLUSTER, variables),
            ..Default::default()
        },
    );
    c.metadata.labels = labels(name);
    env.api::<TerraformCluster>()
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
    capi::create(
        &env.client,
        &env.ns,
        capi::cluster(name, name, paused, None),
    )
    .await;
}

async fn bootstrap(env: &Env, name: &str, cluster: &str) {
    env.secrets()
        .create(
            &PostParams::default(),
            &capi::bootstrap_secret(name, cluster, BOOTSTRAP, None),
        )
        .await
        .unwrap();
}

/// A TerraformMachine `name` of the capi-machine module in `cluster`.
async fn terraform_machine(env: &Env, name: &str, cluster: &str, variables: Option<Variables>) {
    let mut m = TerraformMachine::new(
        name,
        TerraformMachineSpec {
            workspace: workspace(env, MACHINE, variables),
            ..Default::default()
        },
    );
    m.metadata.labels = labels(cluster);
    env.api::<TerraformMachine>()
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
}

/// Its Machine, bootstrapped from `<name>-boot`.
async fn machine(env: &Env, name: &str, cluster: &str, infra: &str, domain: Option<&str>) {
    bootstrap(env, &format!("{name}-boot"), cluster).await;
    let options = MachineOptions {
        version: Some("1.36.3"),
        control_plane: false,
        failure_domain: domain,
    };
    let m = capi::machine(name, cluster, infra, &format!("{name}-boot"), &options);
    capi::create(&env.client, &env.ns, m).await;
}

fn reason<'a>(s: &'a WorkspaceStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    condition(s, type_)
}

async fn field(env: &Env, kind: CapiKind, name: &str, pointer: &str) -> Option<Value> {
    let object = capi::api(&env.client, &env.ns, kind)
        .get_opt(name)
        .await
        .ok()??;
    object
        .data
        .pointer(pointer)
        .cloned()
        .filter(|v| !v.is_null())
}

/// The attributes of `terraform_data.<resource>` in the object's state.
async fn resource_input(env: &Env, kind: Kind, name: &str, resource: &str) -> Value {
    let suffix = names::suffix(&env.ns, kind, name);
    let secret = env
        .secrets()
        .get(&names::state_secret(&suffix))
        .await
        .unwrap();
    let gz = &secret.data.unwrap()["tfstate"].0;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    let state: Value = serde_json::from_str(&text).unwrap();
    state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == "terraform_data" && r["name"] == resource)
        .map(|r| r["instances"][0]["attributes"]["input"]["value"].clone())
        .unwrap_or_else(|| panic!("no terraform_data.{resource} in the state"))
}

fn provisioned(s: &WorkspaceStatus) -> bool {
    s.initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
}

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
    env.secrets()
        .create(
            &PostParams::default(),
            &capi::kubeconfig_secret(controlplane::shared(), "c"),
        )
        .await
        .unwrap();
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
async fn a_machine_deployment_comes_up_and_scales_down() {
    let (env, capi) = world("capi-md").await;
    cluster(&env, "c", None, false).await;
    let template = TerraformMachineTemplate::new(
        "workers",
        TerraformMachineTemplateSpec {
            template: TerraformMachineTemplateResource {
                metadata: None,
                spec: TerraformMachineSpec {
                    workspace: workspace(&env, MACHINE, None),
                    ..Default::default()
                },
            },
        },
    );
    Api::<TerraformMachineTemplate>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    bootstrap(&env, "md-boot", "c").await;
    let md = capi::machine_deployment("md", "c", 3, "workers", "md-boot", Some("1.36.3"));
    capi::create(&env.client, &env.ns, md).await;
    let machines = capi
        .within(480, "three machines provisioned", || async {
            let list = env
                .api::<TerraformMachine>()
                .list(&Default::default())
                .await
                .ok()?;
            let done: Vec<TerraformMachine> = list
                .items
                .into_iter()
                .filter(|m| m.status.as_ref().is_some_and(|s| provisioned(&s.workspace)))
                .collect();
            (done.len() == 3).then_some(done)
        })
        .await;
    let mut ids: Vec<String> = machines
        .iter()
        .map(|m| m.spec.provider_id.clone().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    // The bring-up count (ref §8.8): one cluster apply and one apply per
    // machine; without a control plane, control_plane_initialized never
    // flips, so the cluster is not applied again.
    for m in &machines {
        env.more_passes(Kind::Machine, &m.name_any(), 2).await;
    }
    let applies: Vec<String> = env
        .jobs()
        .await
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.contains("-apply-"))
        .collect();
    assert_eq!(applies.len(), 4, "{applies:?}");

    capi::api(&env.client, &env.ns, CapiKind::MachineDeployment)
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let left = capi
        .within(300, "two machines destroyed and gone", || async {
            let list = env
                .api::<TerraformMachine>()
                .list(&Default::default())
                .await
                .ok()?;
            (list.items.len() == 1).then_some(list.items)
        })
        .await;
    let destroys: Vec<String> = env
        .jobs()
        .await
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.contains("-destroy-"))
        .collect();
    assert_eq!(destroys.len(), 2, "{destroys:?}");
    for m in &machines {
        if m.name_any() == left[0].name_any() {
            continue;
        }
        let suffix = names::suffix(&env.ns, Kind::Machine, &m.name_any());
        within(
            &env,
            60,
            "the destroyed machine's state cleaned up",
            || async { env.state_secrets(&suffix).await.is_empty().then_some(()) },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_pool_follows_its_replicas() {
    let (env, capi) = world("capi-mp").await;
    cluster(&env, "c", None, false).await;
    let mut pool = TerraformMachinePool::new(
        "tp",
        TerraformMachinePoolSpec {
            workspace: workspace(&env, POOL, None),
            ..Default::default()
        },
    );
    pool.metadata.labels = labels("c");
    env.api::<TerraformMachinePool>()
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
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
    env.api::<TerraformMachine>()
        .delete("np", &DeleteParams::default())
        .await
        .unwrap();
    env.more_passes(Kind::Machine, "np", 3).await;
    assert!(env.jobs_named("captf-m-np-destroy-").await.is_empty());
    assert!(!env.gone::<TerraformMachine>("np").await);
    pause(false).await;
    env.wait_gone::<TerraformMachine>(240, "np").await;
    assert_eq!(env.jobs_named("captf-m-np-destroy-").await.len(), 1);
    drop(capi);
}
