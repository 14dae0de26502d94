//! Cluster API v1beta2 objects for tests, as `serde_json::Value`, created
//! through `Api<DynamicObject>`, and the core objects that stand in for a
//! workload cluster (its kubeconfig Secret, its Nodes).
//!
//! Cluster API's webhooks are not registered, so the builders set what its
//! defaulting would: the cluster-name label on Machines, MachineDeployments,
//! MachinePools and their templates, the selector and rollout strategy of a
//! MachineDeployment, replicas, the node deletion timeout, and `v`-prefixed
//! versions.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, PostParams};
use serde_json::{Value, json};

use crate::controlplane::ControlPlane;

pub const GROUP: &str = "cluster.x-k8s.io";
pub const VERSION: &str = "v1beta2";
/// The group of CAPTF's kinds, as an `apiGroup` of a reference.
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// The type of bootstrap data and kubeconfig Secrets.
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// What the Machine and MachinePool webhooks default
/// `deletion.nodeDeletionTimeoutSeconds` to.
const NODE_DELETION_TIMEOUT_SECONDS: i64 = 10;

/// The Cluster API kinds the kit makes or reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapiKind {
    Cluster,
    Machine,
    MachineSet,
    MachineDeployment,
    MachinePool,
}

impl CapiKind {
    pub const ALL: [CapiKind; 5] = [
        CapiKind::Cluster,
        CapiKind::Machine,
        CapiKind::MachineSet,
        CapiKind::MachineDeployment,
        CapiKind::MachinePool,
    ];

    pub const fn kind(self) -> &'static str {
        match self {
            CapiKind::Cluster => "Cluster",
            CapiKind::Machine => "Machine",
            CapiKind::MachineSet => "MachineSet",
            CapiKind::MachineDeployment => "MachineDeployment",
            CapiKind::MachinePool => "MachinePool",
        }
    }

    fn from_kind(kind: &str) -> Option<CapiKind> {
        CapiKind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    pub fn api_resource(self) -> ApiResource {
        let plural = format!("{}s", self.kind().to_lowercase());
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, VERSION, self.kind()),
            &plural,
        )
    }
}

/// The objects of `kind` in `ns`.
pub fn api(client: &kube::Client, ns: &str, kind: CapiKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind.api_resource())
}

/// Creates `object` (one of the builders' values) in `ns`.
pub async fn create(client: &kube::Client, ns: &str, object: Value) -> DynamicObject {
    let kind = object["kind"]
        .as_str()
        .and_then(CapiKind::from_kind)
        .unwrap_or_else(|| panic!("not a Cluster API kind of the kit: {}", object["kind"]));
    let name = object["metadata"]["name"].clone();
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    api(client, ns, kind)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating the {} {name}: {e}", kind.kind()))
}

/// The value at `path` (dotted, e.g. `initialization.infrastructureProvisioned`)
/// of the status of the `kind` `name`; None while the object or the field is
/// missing.
pub async fn status_field(
    client: &kube::Client,
    ns: &str,
    kind: CapiKind,
    name: &str,
    path: &str,
) -> Option<Value> {
    let object = api(client, ns, kind).get_opt(name).await.ok()??;
    let pointer = format!("/{}", path.replace('.', "/"));
    object.data.get("status")?.pointer(&pointer).cloned()
}

/// `status.phase` of the `kind` `name`, e.g. `Provisioned` or `Running`.
pub async fn phase(client: &kube::Client, ns: &str, kind: CapiKind, name: &str) -> Option<String> {
    status_field(client, ns, kind, name, "phase")
        .await?
        .as_str()
        .map(str::to_string)
}

/// A reference in v1beta2's shape: `{apiGroup, kind, name}`.
pub fn infrastructure_ref(kind: &str, name: &str) -> Value {
    json!({ "apiGroup": INFRASTRUCTURE_GROUP, "kind": kind, "name": name })
}

/// `spec.clusterNetwork` of a Cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterNetwork<'a> {
    pub pods: &'a [&'a str],
    pub services: &'a [&'a str],
    pub service_domain: Option<&'a str>,
    pub api_server_port: Option<u16>,
}

impl ClusterNetwork<'_> {
    fn to_value(&self) -> Value {
        let mut network = json!({});
        if !self.pods.is_empty() {
            network["pods"] = json!({ "cidrBlocks": self.pods });
        }
        if !self.services.is_empty() {
            network["services"] = json!({ "cidrBlocks": self.services });
        }
        if let Some(domain) = self.service_domain {
            network["serviceDomain"] = domain.into();
        }
        if let Some(port) = self.api_server_port {
            network["apiServerPort"] = port.into();
        }
        network
    }
}

/// A Cluster whose infrastructure is the TerraformCluster `infra`,
/// `paused` or not, with a cluster network or none.
pub fn cluster(name: &str, infra: &str, paused: bool, network: Option<&ClusterNetwork>) -> Value {
    let mut spec = json!({ "infrastructureRef": infrastructure_ref("TerraformCluster", infra) });
    if paused {
        spec["paused"] = true.into();
    }
    if let Some(network) = network {
        spec["clusterNetwork"] = network.to_value();
    }
    object(CapiKind::Cluster, name, json!({}), spec)
}

/// What a Machine runs besides its cluster and infrastructure.
#[derive(Clone, Debug, Default)]
pub struct MachineOptions<'a> {
    /// `spec.version`; a `v` is prefixed if missing.
    pub version: Option<&'a str>,
    /// Labels the Machine `cluster.x-k8s.io/control-plane`.
    pub control_plane: bool,
    pub failure_domain: Option<&'a str>,
}

/// A Machine of `cluster` whose infrastructure is the TerraformMachine
/// `infra` and whose bootstrap data is the Secret `bootstrap`.
pub fn machine(
    name: &str,
    cluster: &str,
    infra: &str,
    bootstrap: &str,
    options: &MachineOptions,
) -> Value {
    let mut labels = json!({ CLUSTER_NAME_LABEL: cluster });
    if options.control_plane {
        labels[CONTROL_PLANE_LABEL] = "".into();
    }
    let mut spec = machine_spec(
        cluster,
        infrastructure_ref("TerraformMachine", infra),
        bootstrap,
        options.version,
    );
    spec["deletion"] = json!({ "nodeDeletionTimeoutSeconds": NODE_DELETION_TIMEOUT_SECONDS });
    if let Some(domain) = options.failure_domain {
        spec["failureDomain"] = domain.into();
    }
    object(CapiKind::Machine, name, labels, spec)
}

/// A MachineDeployment of `cluster` with `replicas` Machines cloned from the
/// TerraformMachineTemplate `template`, bootstrapped from the Secret
/// `bootstrap`.
pub fn machine_deployment(
    name: &str,
    cluster: &str,
    replicas: u32,
    template: &str,
    bootstrap: &str,
    version: Option<&str>,
) -> Value {
    let selected = json!({ CLUSTER_NAME_LABEL: cluster, DEPLOYMENT_NAME_LABEL: name });
    let spec = json!({
        "clusterName": cluster,
        "replicas": replicas,
        "selector": { "matchLabels": selected },
        "rollout": {
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 },
            },
        },
        "template": {
            "metadata": { "labels": selected },
            "spec": machine_spec(
                cluster,
                infrastructure_ref("TerraformMachineTemplate", template),
                bootstrap,
                version,
            ),
        },
    });
    object(
        CapiKind::MachineDeployment,
        name,
        json!({ CLUSTER_NAME_LABEL: cluster }),
        spec,
    )
}

/// A MachinePool of `cluster` with `replicas` members whose infrastructure
/// is the TerraformMachinePool `infra`, bootstrapped from the Secret
/// `bootstrap`.
pub fn machine_pool(
    name: &str,
    cluster: &str,
    replicas: u32,
    infra: &str,
    bootstrap: &str,
    version: Option<&str>,
) -> Value {
    let labels = json!({ CLUSTER_NAME_LABEL: cluster });
    let mut template_spec = machine_spec(
        cluster,
        infrastructure_ref("TerraformMachinePool", infra),
        bootstrap,
        version,
    );
    template_spec["deletion"] =
        json!({ "nodeDeletionTimeoutSeconds": NODE_DELETION_TIMEOUT_SECONDS });
    let spec = json!({
        "clusterName": cluster,
        "replicas": replicas,
        "template": { "metadata": { "labels": labels }, "spec": template_spec },
    });
    object(CapiKind::MachinePool, name, labels, spec)
}

/// The Secret of bootstrap data `value` (and `format`, e.g. `ignition`) for
/// the machines of `cluster`.
pub fn bootstrap_secret(name: &str, cluster: &str, value: &[u8], format: Option<&str>) -> Secret {
    let mut data = BTreeMap::from([("value".to_string(), ByteString(value.to_vec()))]);
    if let Some(format) = format {
        data.insert("format".into(), ByteString(format.as_bytes().to_vec()));
    }
    cluster_secret(name, cluster, data)
}

/// `<cluster>-kubeconfig`: the workload cluster of `cluster` is the test API
/// server itself, reached with the kit's admin kubeconfig (a client
/// certificate), so Cluster API finds Nodes there.
pub fn kubeconfig_secret(plane: &ControlPlane, cluster: &str) -> Secret {
    let kubeconfig = std::fs::read(plane.kubeconfig()).expect("reading the kubeconfig");
    let data = BTreeMap::from([("value".to_string(), ByteString(kubeconfig))]);
    cluster_secret(&format!("{cluster}-kubeconfig"), cluster, data)
}

/// A Ready Node with `provider_id`, which Cluster API matches to a Machine
/// or a MachinePool member. It stays Ready: no node controller runs here.
/// Nodes are cluster-wide, shared by every test of the binary: the provider
/// IDs of the test modules carry the namespace.
pub fn node(name: &str, provider_id: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.to_string()),
            ..Default::default()
        }),
        // A Node's status may be set on create. A MachinePool counts only
        // Ready Nodes, and is Running only once they are all counted.
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                last_transition_time: Some(Time(Timestamp::now())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn cluster_secret(name: &str, cluster: &str, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                cluster.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The spec shared by a Machine and the templates of MachineDeployments and
/// MachinePools.
fn machine_spec(cluster: &str, infra: Value, bootstrap: &str, version: Option<&str>) -> Value {
    let mut spec = json!({
        "clusterName": cluster,
        "bootstrap": { "dataSecretName": bootstrap },
        "infrastructureRef": infra,
    });
    if let Some(version) = version {
        spec["version"] = v_prefixed(version).into();
    }
    spec
}

/// `version` with the `v` that the webhooks would prefix.
fn v_prefixed(version: &str) -> String {
    if version.starts_with('v') {
        version.to_string()
    } else {
        format!("v{version}")
    }
}

fn object(kind: CapiKind, name: &str, labels: Value, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind.kind(),
        "metadata": { "name": name, "labels": labels },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_get_the_v_the_webhooks_would_prefix() {
        assert_eq!(v_prefixed("1.36.3"), "v1.36.3");
        assert_eq!(v_prefixed("v1.36.3+rke2r1"), "v1.36.3+rke2r1");
    }

    #[test]
    fn plurals_are_the_crds() {
        let plurals: Vec<String> = CapiKind::ALL.map(|k| k.api_resource().plural).to_vec();
        assert_eq!(
            plurals,
            [
                "clusters",
                "machines",
                "machinesets",
                "machinedeployments",
                "machinepools"
            ]
        );
    }
}
