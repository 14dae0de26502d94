//! TerraformMachinePool: the infrastructure machine pool of Cluster API
//! (ref §1.3).

use super::flat::fields;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::Serialize;

use super::{MachinePoolDriftPolicy, MachinePoolInstance, WorkspaceSpec, WorkspaceStatus};

/// The desired state of a TerraformMachinePool. Every field is mutable.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachinePool",
    plural = "terraformmachinepools",
    namespaced,
    status = "TerraformMachinePoolStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformMachinePool is the infrastructure of a Cluster API MachinePool, provisioned by running a Terraform or OpenTofu module in Kubernetes Jobs."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformMachinePoolSpec {
    /// Provider ID of the pool as a group, from the module's `provider_id`
    /// output. It may change.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,

    /// Provider IDs of the pool's instances from the module's
    /// `provider_id_list` output, sorted and without duplicates.
    #[serde(rename = "providerIDList", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 10000), inner(length(min = 1, max = 512)))]
    pub provider_id_list: Option<Vec<String>>,

    /// The module, identity, Job policy and variables shared by every
    /// workload kind. An unset identityRef resolves to the cluster's
    /// `spec.defaults.identityRef`, then to the cluster's identityRef.
    #[serde(flatten)]
    pub workspace: WorkspaceSpec,

    /// Drift checking of the pool's infrastructure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<MachinePoolDriftPolicy>,

    /// Seconds between reads of the pool's membership, 15 to 86400. Unset
    /// means 60.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 15, max = 86400))]
    pub membership_refresh_interval_seconds: Option<i64>,
}

/// The observed state of a TerraformMachinePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachinePoolStatus {
    /// The status fields shared by every workload kind.
    #[serde(flatten)]
    pub workspace: WorkspaceStatus,

    /// Whether the pool is provisioned, the flag that Cluster API's v1beta1
    /// machine pool contract reads; kept true together with
    /// initialization.provisioned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,

    /// The pool's observed number of instances, from the module's `replicas`
    /// output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,

    /// The pool's instances from the module's `instances` output, at most
    /// 1000.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1000))]
    pub instances: Option<Vec<MachinePoolInstance>>,
}

fields!(TerraformMachinePoolSpec, ["source"], {
    "providerID" => provider_id,
    "providerIDList" => provider_id_list,
    "drift" => drift,
    "membershipRefreshIntervalSeconds" => membership_refresh_interval_seconds,
}, flatten workspace);

fields!(TerraformMachinePoolStatus, [], {
    "ready" => ready,
    "replicas" => replicas,
    "instances" => instances,
}, flatten workspace);
