//! The Cluster API types the objects embed (endpoint, failure domains,
//! addresses, pool instances) and what templates carry for scaling from
//! zero.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The endpoint of a cluster's API server (Cluster API APIEndpoint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Host name or IP address of the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub host: Option<String>,

    /// Port of the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// A failure domain (Cluster API FailureDomain).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,

    /// Whether control-plane machines may be placed in this failure domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,

    /// Free-form attributes of the failure domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// An address of a machine (Cluster API MachineAddress).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// Type of the address: Hostname, ExternalIP, InternalIP, ExternalDNS or
    /// InternalDNS.
    #[serde(rename = "type")]
    pub address_type: MachineAddressType,

    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

/// The type of a machine address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MachineAddressType {
    Hostname,
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    #[serde(rename = "InternalIP")]
    InternalIp,
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
    #[serde(rename = "InternalDNS")]
    InternalDns,
}

/// One instance of a machine pool, from the module's `instances` output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct MachinePoolInstance {
    /// Provider ID of the instance, as the Node reports it.
    #[serde(rename = "providerID")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: String,

    /// The instance's ID at its provider.
    #[serde(rename = "instanceID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub instance_id: Option<String>,

    /// Addresses of the instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub addresses: Option<Vec<MachineAddress>>,

    /// Failure domain the instance runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// State of the instance: pending, running, degraded, stopped,
    /// terminated or unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<InstanceState>,
}

/// The state of an instance, as the module reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Pending,
    Running,
    Degraded,
    Stopped,
    Terminated,
    Unknown,
}

/// What the nodes of a machine template run on, for scaling from zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct NodeInfo {
    /// CPU architecture of the nodes: amd64, arm64, s390x or ppc64le.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,

    /// Operating system of the nodes, e.g. linux.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub operating_system: Option<String>,
}

/// A CPU architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Amd64,
    Arm64,
    S390x,
    Ppc64le,
}

/// Where the capacity of a machine template was read from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySource {
    /// The module image whose labels were read.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
}

/// Labels and annotations copied onto the objects created from a template
/// (Cluster API ObjectMeta).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateObjectMeta {
    /// Labels set on the created object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,

    /// Annotations set on the created object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}
