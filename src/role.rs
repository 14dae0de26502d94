//! The module contract's roles, the inputs each role's module receives
//! (reference §9.3) and the outputs it must declare (§9.4). A user variable
//! may not shadow any of the inputs.

use crate::names::Kind;

/// The role a module plays for its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Cluster,
    Machine,
    MachinePool,
}

/// Inputs every role receives. All start with `captf_`, a prefix that user
/// variables may not use at all.
pub const COMMON_INPUTS: &[&str] = &[
    "captf_contract",
    "captf_cluster",
    "captf_object",
    "captf_tags",
    "captf_cluster_outputs",
];

impl From<Kind> for Role {
    fn from(kind: Kind) -> Role {
        match kind {
            Kind::Cluster => Role::Cluster,
            Kind::Machine => Role::Machine,
            Kind::MachinePool => Role::MachinePool,
        }
    }
}

impl Role {
    /// The role's name in the module contract (the `io.captf.role` image
    /// label), as hashed into the inputs hash.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Cluster => "cluster",
            Role::Machine => "machine",
            Role::MachinePool => "machinepool",
        }
    }

    /// The outputs the role's module declares, which the rendered root
    /// re-exports.
    pub fn outputs(self) -> &'static [&'static str] {
        match self {
            Role::Cluster => &[
                "control_plane_endpoint",
                "failure_domains",
                "exports",
                "health",
            ],
            Role::Machine => &[
                "provider_id",
                "addresses",
                "failure_domain",
                "interruptible",
                "health",
            ],
            Role::MachinePool => &[
                "provider_id",
                "provider_id_list",
                "replicas",
                "instances",
                "health",
            ],
        }
    }

    /// The inputs of this role besides the common ones.
    pub fn inputs(self) -> &'static [&'static str] {
        match self {
            Role::Cluster => &[
                "control_plane_endpoint",
                "kubernetes_version",
                "control_plane_initialized",
                "cluster_network",
            ],
            Role::Machine => &[
                "machine_name",
                "bootstrap_data",
                "bootstrap_format",
                "failure_domain",
                "kubernetes_version",
                "control_plane",
            ],
            Role::MachinePool => &[
                "machinepool_name",
                "replicas",
                "bootstrap_data",
                "bootstrap_format",
                "failure_domains",
                "cluster_failure_domains",
                "kubernetes_version",
                "node_labels",
                "autoscaling",
            ],
        }
    }
}
