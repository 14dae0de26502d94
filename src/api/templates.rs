//! The three template kinds that Cluster API clones workload objects from
//! (ref §1.3). A template's `spec.template.spec` cannot change after creation;
//! its `spec.template.metadata` can.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::cluster::TerraformClusterSpec;
use super::machine::TerraformMachineSpec;
use super::machine_pool::TerraformMachinePoolSpec;
use super::{CapacitySource, NodeInfo, TemplateObjectMeta};

/// The desired state of a TerraformClusterTemplate.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformClusterTemplate",
    plural = "terraformclustertemplates",
    namespaced,
    status = "TerraformClusterTemplateStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformClusterTemplate is the template a ClusterClass creates TerraformClusters from."
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformClusterTemplateSpec {
    /// The TerraformCluster to create.
    pub template: TerraformClusterTemplateResource,
}

/// A TerraformCluster as a template describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformClusterTemplateResource {
    /// Labels and annotations of the created TerraformCluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,

    /// Spec of the created TerraformCluster. It cannot change after creation.
    pub spec: TerraformClusterSpec,
}

/// The observed state of a TerraformClusterTemplate. Nothing is reported yet;
/// the status subresource exists so that clients may rely on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TerraformClusterTemplateStatus {}

/// The desired state of a TerraformMachineTemplate.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachineTemplate",
    plural = "terraformmachinetemplates",
    namespaced,
    status = "TerraformMachineTemplateStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformMachineTemplate is the template that MachineDeployments, MachineSets, control planes and ClusterClasses create TerraformMachines from."
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachineTemplateSpec {
    /// The TerraformMachine to create.
    pub template: TerraformMachineTemplateResource,
}

/// A TerraformMachine as a template describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformMachineTemplateResource {
    /// Labels and annotations of the created TerraformMachine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,

    /// Spec of the created TerraformMachine. It cannot change after creation.
    pub spec: TerraformMachineSpec,
}

/// The observed state of a TerraformMachineTemplate: the node capacity that
/// Cluster API's autoscaling reads to scale from zero, resolved from the
/// module image's labels `io.captf.capacity` and `io.captf.node-info`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformMachineTemplateStatus {
    /// Observations of the template; CapacityResolved tells whether the
    /// capacity was read. At most 32.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"],
    ))]
    pub conditions: Option<Vec<Condition>>,

    /// Resources a node of this template offers, e.g. cpu, memory, pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,

    /// Architecture and operating system of the nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,

    /// The image the capacity was read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_source: Option<CapacitySource>,
}

/// The desired state of a TerraformMachinePoolTemplate.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachinePoolTemplate",
    plural = "terraformmachinepooltemplates",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformMachinePoolTemplate is the template a ClusterClass topology creates TerraformMachinePools from."
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachinePoolTemplateSpec {
    /// The TerraformMachinePool to create.
    pub template: TerraformMachinePoolTemplateResource,
}

/// A TerraformMachinePool as a template describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformMachinePoolTemplateResource {
    /// Labels and annotations of the created TerraformMachinePool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,

    /// Spec of the created TerraformMachinePool. It cannot change after
    /// creation.
    pub spec: TerraformMachinePoolSpec,
}
