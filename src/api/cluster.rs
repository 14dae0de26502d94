//! TerraformCluster: the infrastructure cluster of Cluster API (ref §1.3).

use super::flat::fields;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    ApiEndpoint, DriftPolicy, FailureDomain, IdentityReference, JobPolicy, MachineDriftPolicy,
    PlanPreview, WorkspaceSpec, WorkspaceStatus,
};

/// The desired state of a TerraformCluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformCluster",
    plural = "terraformclusters",
    namespaced,
    status = "TerraformClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformCluster is the infrastructure of a Cluster API Cluster, provisioned by running a Terraform or OpenTofu module in Kubernetes Jobs."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformClusterSpec {
    /// Endpoint of the cluster's API server. A value set here is passed to the
    /// module as its `control_plane_endpoint` input; otherwise the controller
    /// writes the module's output here once. It cannot change once it has a
    /// host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,

    /// The module, identity, Job policy and variables shared by every
    /// workload kind. The identityRef is required on a TerraformCluster
    /// (checked at admission, so that a template can leave it to a
    /// ClusterClass patch).
    #[serde(flatten)]
    pub workspace: WorkspaceSpec,

    /// Drift checking of the cluster's infrastructure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftPolicy>,

    /// Whether a change is applied at once (Automatic) or planned and applied
    /// only after its plan hash is approved with the annotation
    /// `captf.io/approve-plan` (Manual). Unset means Automatic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apply_policy: Option<ApplyPolicy>,

    /// Values that the cluster's TerraformMachines and TerraformMachinePools
    /// inherit when they leave them unset. Never applied to the cluster
    /// itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defaults: Option<ClusterDefaults>,
}

/// When a TerraformCluster's changes are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ApplyPolicy {
    #[default]
    Automatic,
    Manual,
}

/// What the machines and pools of a cluster inherit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDefaults {
    /// Identity of machines and pools that set no identityRef. Unset means
    /// the cluster's own identityRef.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<IdentityReference>,

    /// Job policy fields that machines and pools leave unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<JobPolicy>,

    /// Drift interval of machines and pools that set none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<MachineDriftPolicy>,
}

/// The observed state of a TerraformCluster. All of it can be rebuilt: status
/// does not survive `clusterctl move`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformClusterStatus {
    /// The status fields shared by every workload kind.
    #[serde(flatten)]
    pub workspace: WorkspaceStatus,

    /// Failure domains from the module's `failure_domains` output, 1 to 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub failure_domains: Option<Vec<FailureDomain>>,

    /// The plan that waits for approval; unset when nothing waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanPreview>,
}

fields!(TerraformClusterSpec, ["source"], {
    "controlPlaneEndpoint" => control_plane_endpoint,
    "drift" => drift,
    "applyPolicy" => apply_policy,
    "defaults" => defaults,
}, flatten workspace);

fields!(TerraformClusterStatus, [], {
    "failureDomains" => failure_domains,
    "plan" => plan,
}, flatten workspace);
