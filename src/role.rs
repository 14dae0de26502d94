//! The module contract's roles and the inputs each role's module receives
//! (reference §9.3). A user variable may not shadow any of them.

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

impl Role {
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
