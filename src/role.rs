//! The module contract's role of each kind, the inputs each role's module receives
//! (reference §9.3) and the outputs it must declare (§9.4). A user variable
//! may not shadow any of the inputs.

use crate::names::Kind;

/// Inputs every role receives. All start with `captf_`, a prefix that user
/// variables may not use at all.
pub const COMMON_INPUTS: &[&str] = &[
    "captf_contract",
    "captf_cluster",
    "captf_object",
    "captf_tags",
    "captf_cluster_outputs",
];

/// The output of the rendered root listing which of the role's outputs the
/// module declares: tofu keeps no null output in a state, so without it an
/// output left undeclared would look like a null one.
pub const DECLARED_OUTPUTS: &str = "captf_declared_outputs";

/// The role each kind's module plays.
impl Kind {
    /// The role's name in the module contract (the `io.captf.role` image
    /// label), as hashed into the inputs hash.
    pub const fn role(self) -> &'static str {
        match self {
            Kind::Cluster => "cluster",
            Kind::Machine => "machine",
            Kind::MachinePool => "machinepool",
        }
    }

    /// The outputs of the role's module, which the rendered root re-exports
    /// (null when the module does not declare one).
    pub fn outputs(self) -> &'static [&'static str] {
        match self {
            Kind::Cluster => &[
                "control_plane_endpoint",
                "failure_domains",
                "exports",
                "health",
            ],
            Kind::Machine => &[
                "provider_id",
                "addresses",
                "failure_domain",
                "interruptible",
                "health",
            ],
            Kind::MachinePool => &[
                "provider_id",
                "provider_id_list",
                "replicas",
                "instances",
                "health",
            ],
        }
    }

    /// The outputs the module must declare (ref §9.4): one it does not is
    /// OutputsMissing. The others, `health` included, may be left out and
    /// count as null.
    pub fn required_outputs(self) -> &'static [&'static str] {
        match self {
            Kind::Cluster => &["control_plane_endpoint", "failure_domains", "exports"],
            Kind::Machine => &["provider_id", "interruptible"],
            Kind::MachinePool => &["provider_id_list", "replicas"],
        }
    }

    /// The inputs of this role besides the common ones.
    pub fn inputs(self) -> &'static [&'static str] {
        match self {
            Kind::Cluster => &[
                "control_plane_endpoint",
                "kubernetes_version",
                "control_plane_initialized",
                "cluster_network",
            ],
            Kind::Machine => &[
                "machine_name",
                "bootstrap_data",
                "bootstrap_format",
                "failure_domain",
                "kubernetes_version",
                "control_plane",
            ],
            Kind::MachinePool => &[
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
