//! What the Cluster API contract tests share: a namespace with CAPTF's
//! manager and the real Cluster API manager, and the objects of the test
//! modules that stand in for a cloud (`tests/modules/capi-*`).

#![allow(dead_code)] // each test binary uses its share

use std::io::Read;

use captf::api::{
    IdentityReference, Source, TerraformCluster, TerraformClusterSpec, TerraformMachine,
    TerraformMachinePool, TerraformMachinePoolSpec, TerraformMachineSpec, Variables, WorkspaceSpec,
    WorkspaceStatus,
};
use captf::names::{self, Kind};
use captf_testkit::capi::{self, CapiKind, CapiManager, MachineOptions};
use captf_testkit::controlplane;
use captf_testkit::scenario::{Env, condition, labels, setup};
use kube::api::PostParams;
use serde_json::Value;

pub const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");
pub const CLUSTER: &str = "captf.test/modules/capi-cluster:dev";
pub const MACHINE: &str = "captf.test/modules/capi-machine:dev";
pub const POOL: &str = "captf.test/modules/capi-pool:dev";
pub const BOOTSTRAP: &[u8] = b"#cloud-config\nruncmd: [echo from-cluster-api]\n";

/// A test's namespace with CAPTF's manager (`--sync-period=5s`) and the
/// Cluster API manager for it.
pub async fn world(prefix: &str) -> (Env, CapiManager) {
    let env = setup(MANAGER, prefix, &[], &["--sync-period=5s"]).await;
    let capi = CapiManager::start(controlplane::shared(), &env.ns).await;
    (env, capi)
}

pub fn workspace(env: &Env, image: &str, variables: Option<Variables>) -> WorkspaceSpec {
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
pub async fn cluster(env: &Env, name: &str, variables: Option<Variables>, paused: bool) {
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

/// `<cluster>-kubeconfig`: the workload cluster is the test API server,
/// which Cluster API needs for pools and for deleting Machines.
pub async fn workload_kubeconfig(env: &Env, cluster: &str) {
    env.secrets()
        .create(
            &PostParams::default(),
            &capi::kubeconfig_secret(controlplane::shared(), cluster),
        )
        .await
        .unwrap();
}

pub async fn bootstrap(env: &Env, name: &str, cluster: &str) {
    env.secrets()
        .create(
            &PostParams::default(),
            &capi::bootstrap_secret(name, cluster, BOOTSTRAP, None),
        )
        .await
        .unwrap();
}

/// A TerraformMachine `name` of the capi-machine module in `cluster`.
pub async fn terraform_machine(env: &Env, name: &str, cluster: &str, variables: Option<Variables>) {
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

/// A TerraformMachinePool `name` of the capi-pool module in `cluster`.
pub async fn terraform_machine_pool(
    env: &Env,
    name: &str,
    cluster: &str,
    variables: Option<Variables>,
) {
    let mut p = TerraformMachinePool::new(
        name,
        TerraformMachinePoolSpec {
            workspace: workspace(env, POOL, variables),
            ..Default::default()
        },
    );
    p.metadata.labels = labels(cluster);
    env.api::<TerraformMachinePool>()
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

/// Its Machine, bootstrapped from `<name>-boot`.
pub async fn machine(env: &Env, name: &str, cluster: &str, infra: &str, domain: Option<&str>) {
    bootstrap(env, &format!("{name}-boot"), cluster).await;
    let options = MachineOptions {
        version: Some("1.36.3"),
        control_plane: false,
        failure_domain: domain,
    };
    let m = capi::machine(name, cluster, infra, &format!("{name}-boot"), &options);
    capi::create(&env.client, &env.ns, m).await;
}

pub fn reason<'a>(s: &'a WorkspaceStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    condition(s, type_)
}

pub async fn field(env: &Env, kind: CapiKind, name: &str, pointer: &str) -> Option<Value> {
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
pub async fn resource_input(env: &Env, kind: Kind, name: &str, resource: &str) -> Value {
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

pub fn provisioned(s: &WorkspaceStatus) -> bool {
    s.initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
}
