//! What the reconcile needs to know of each workload kind, so that one
//! reconcile serves TerraformCluster, TerraformMachine and TerraformMachinePool.

use std::fmt::Debug;

use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{
    ApiEndpoint, TerraformCluster, TerraformMachine, TerraformMachinePool, WorkspaceSpec,
    WorkspaceStatus,
};
use crate::keys::CLUSTER_NAME_LABEL;
use crate::names::Kind;

pub trait Workload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    /// Whether a change of inputs re-applies it (ref §8.2): a machine is
    /// never re-applied once provisioned.
    const MUTABLE: bool;

    fn workspace(&self) -> &WorkspaceSpec;
    fn workspace_status(&self) -> Option<&WorkspaceStatus>;

    /// A TerraformCluster's own `spec.controlPlaneEndpoint`.
    fn own_endpoint(&self) -> Option<&ApiEndpoint> {
        None
    }

    /// The Cluster API cluster it belongs to, from its cluster-name label.
    fn cluster_name(&self) -> Option<&str> {
        self.meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(CLUSTER_NAME_LABEL))
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }
}

impl Workload for TerraformCluster {
    const KIND: Kind = Kind::Cluster;
    const MUTABLE: bool = true;

    fn own_endpoint(&self) -> Option<&ApiEndpoint> {
        self.spec.control_plane_endpoint.as_ref()
    }

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}

impl Workload for TerraformMachine {
    const KIND: Kind = Kind::Machine;
    const MUTABLE: bool = false;

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}

impl Workload for TerraformMachinePool {
    const KIND: Kind = Kind::MachinePool;
    const MUTABLE: bool = true;

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}
