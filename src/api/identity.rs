//! TerraformClusterIdentity: cluster-scoped credentials that workload objects
//! reference by name (ref §1.3). It has no finalizer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN};

/// The desired state of a TerraformClusterIdentity. Every field is mutable.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformClusterIdentity",
    plural = "terraformclusteridentities",
    status = "TerraformClusterIdentityStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "cluster-api",
    doc = "TerraformClusterIdentity holds the credentials that the Jobs of TerraformClusters, TerraformMachines and TerraformMachinePools receive, and the namespaces allowed to use them."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TerraformClusterIdentitySpec {
    /// The Secret whose data become the Jobs' credentials, mirrored into each
    /// namespace that uses this identity. Creating the identity or changing
    /// this reference requires permission to get the Secret. Deleting the
    /// identity never deletes the Secret.
    pub secret_ref: SecretReference,

    /// Namespaces whose objects may use this identity. Unset allows none; an
    /// empty selector allows every namespace. The list and the selector are
    /// ORed, and at least one of them must be set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<AllowedNamespaces>,
}

/// A Secret in a given namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret, a DNS subdomain.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// Namespace of the Secret, a DNS label.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: String,
}

/// The namespaces allowed to use an identity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Names of allowed namespaces, 1 to 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 100),
        inner(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))
    )]
    pub list: Option<Vec<String>>,

    /// Selects allowed namespaces by their labels, including namespaces
    /// created later. An empty selector selects every namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// The observed state of a TerraformClusterIdentity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerraformClusterIdentityStatus {
    /// Observations of the identity: Ready tells whether the Secret was
    /// found. At most 32.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"],
    ))]
    pub conditions: Option<Vec<Condition>>,

    /// Namespaces that currently hold a mirror of the credentials, at most
    /// 1000. The identity cannot be deleted while any remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000), inner(length(min = 1, max = 63)))]
    pub namespaces: Option<Vec<String>>,
}
