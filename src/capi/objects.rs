//! The Cluster API v1beta2 objects CAPTF reads: only the fields it uses.
//! Unknown fields are ignored on read, and CAPTF never writes these types
//! whole (its writes to them are merge patches of single fields).

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::api::ApiEndpoint;

/// A reference to a Cluster API contract object (v1beta2 ContractVersionedObjectReference).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContractRef {
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

/// The `cluster.x-k8s.io/v1beta2` Cluster, as far as CAPTF reads it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default)]
    pub paused: Option<bool>,
    #[serde(default)]
    pub infrastructure_ref: Option<ContractRef>,
    #[serde(default)]
    pub control_plane_ref: Option<ContractRef>,
    #[serde(default)]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    #[serde(default)]
    pub cluster_network: Option<ClusterNetwork>,
    #[serde(default)]
    pub topology: Option<Topology>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    #[serde(default)]
    pub api_server_port: Option<i64>,
    #[serde(default)]
    pub pods: Option<NetworkRanges>,
    #[serde(default)]
    pub services: Option<NetworkRanges>,
    #[serde(default)]
    pub service_domain: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRanges {
    #[serde(default)]
    pub cidr_blocks: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    #[serde(default)]
    pub initialization: Option<ClusterInitialization>,
    #[serde(default)]
    pub conditions: Option<Vec<ClusterCondition>>,
}

/// A condition of a Cluster, as far as CAPTF reads it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

impl Cluster {
    /// Cluster API's own test (its ControlPlaneInitialized predicate): the
    /// condition, which it sets with or without a `controlPlaneRef`, or the
    /// initialization field, which it sets only with one.
    pub fn control_plane_initialized(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        let field = status
            .initialization
            .as_ref()
            .and_then(|i| i.control_plane_initialized)
            == Some(true);
        field
            || status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "ControlPlaneInitialized" && c.status == "True")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    #[serde(default)]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(default)]
    pub control_plane_initialized: Option<bool>,
}

/// The `cluster.x-k8s.io/v1beta2` Machine, as far as CAPTF reads it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub bootstrap: Option<Bootstrap>,
    #[serde(default)]
    pub infrastructure_ref: Option<ContractRef>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub failure_domain: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    #[serde(default)]
    pub data_secret_name: Option<String>,
}

/// The `cluster.x-k8s.io/v1beta2` MachinePool, as far as CAPTF reads it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachinePool",
    namespaced,
    status = "MachinePoolStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolSpec {
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub failure_domains: Option<Vec<String>>,
    #[serde(default)]
    pub template: MachineTemplate,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineTemplate {
    #[serde(default)]
    pub metadata: Option<TemplateMetadata>,
    #[serde(default)]
    pub spec: MachineTemplateSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateMetadata {
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    #[serde(default)]
    pub bootstrap: Option<Bootstrap>,
    #[serde(default)]
    pub infrastructure_ref: Option<ContractRef>,
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachinePoolStatus {
    #[serde(default)]
    pub replicas: Option<i32>,
}
