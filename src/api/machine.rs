//! TerraformMachine: the infrastructure machine of Cluster API (ref §1.3).

use super::flat::fields;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::Serialize;

use super::{
    MachineAddress, MachineDriftPolicy, MachineRemediation, WorkspaceSpec, WorkspaceStatus,
};

/// The desired state of a TerraformMachine.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachine",
    plural = "terraformmachines",
    namespaced,
    status = "TerraformMachineStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformMachine is the infrastructure of a Cluster API Machine, provisioned by running a Terraform or OpenTofu module in Kubernetes Jobs."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformMachineSpec {
    /// Provider ID of the machine, set by the controller from the module's
    /// `provider_id` output. Once set it cannot change.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,

    /// The module, identity, Job policy and variables shared by every
    /// workload kind. The source, identityRef, variables and variablesFrom of
    /// a machine cannot change after creation. An unset identityRef resolves
    /// to the cluster's `spec.defaults.identityRef`, then to the cluster's
    /// identityRef.
    #[serde(flatten)]
    pub workspace: WorkspaceSpec,

    /// Drift checking of the machine's infrastructure; drift is only ever
    /// reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<MachineDriftPolicy>,

    /// How an unhealthy machine asks Cluster API for remediation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remediation: Option<MachineRemediation>,
}

/// The observed state of a TerraformMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachineStatus {
    /// The status fields shared by every workload kind.
    #[serde(flatten)]
    pub workspace: WorkspaceStatus,

    /// Addresses of the machine from the module's `addresses` output, in
    /// canonical order (InternalIP, InternalDNS, ExternalIP, ExternalDNS,
    /// Hostname, then by address).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub addresses: Option<Vec<MachineAddress>>,

    /// Failure domain the machine runs in, from the module's
    /// `failure_domain` output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// Whether the machine can be interrupted by its provider (e.g. a spot
    /// instance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruptible: Option<bool>,

    /// Consecutive unhealthy health samples. Kept only in status.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub unhealthy_samples: Option<i32>,
}

fields!(TerraformMachineSpec, ["source"], {
    "providerID" => provider_id,
    "drift" => drift,
    "remediation" => remediation,
}, flatten workspace);

fields!(TerraformMachineStatus, [], {
    "addresses" => addresses,
    "failureDomain" => failure_domain,
    "interruptible" => interruptible,
    "unhealthySamples" => unhealthy_samples,
}, flatten workspace);
