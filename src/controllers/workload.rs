//! What the reconcile needs to know of each workload kind, so that one
//! reconcile serves TerraformCluster, TerraformMachine and TerraformMachinePool.

use std::fmt::Debug;

use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::approval;
use crate::api::{
    ApiEndpoint, ApplyPolicy, DriftAction, MachineRemediation, TerraformCluster, TerraformMachine,
    TerraformMachinePool, WorkspaceSpec, WorkspaceStatus,
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

    /// The status fields of this kind alone (failure domains, addresses,
    /// replicas...), as the object has them.
    fn kind_status(&self) -> Map<String, Value>;

    /// The object's spec, for the fields its outputs write.
    fn spec_value(&self) -> Value;

    /// A TerraformMachine's `spec.providerID`.
    fn provider_id(&self) -> Option<&str> {
        None
    }

    /// A TerraformCluster's own `spec.controlPlaneEndpoint`.
    fn own_endpoint(&self) -> Option<&ApiEndpoint> {
        None
    }

    /// Its own drift interval, as set, and its drift action: Report unless
    /// the kind has an action and it says Remediate (ref §1.2).
    fn drift(&self) -> (Option<i64>, DriftAction) {
        (None, DriftAction::Report)
    }

    /// A TerraformMachine's `spec.remediation`.
    fn remediation(&self) -> Option<&MachineRemediation> {
        None
    }

    /// A pool's `membershipRefreshIntervalSeconds`.
    fn membership_interval(&self) -> Option<i64> {
        None
    }

    /// How its applies are gated (ref §8.2): only a TerraformCluster's are.
    fn approval(&self) -> approval::Policy {
        approval::Policy::None
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

/// `status` serialized, when its shared fields are cleared: its kind's own.
fn kind_fields(status: Option<impl Serialize>) -> Map<String, Value> {
    match status.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    }
}

impl Workload for TerraformCluster {
    fn spec_value(&self) -> Value {
        serde_json::to_value(&self.spec).unwrap_or_default()
    }

    fn kind_status(&self) -> Map<String, Value> {
        kind_fields(self.status.clone().map(|mut s| {
            s.workspace = WorkspaceStatus::default();
            s
        }))
    }

    const KIND: Kind = Kind::Cluster;
    const MUTABLE: bool = true;

    fn own_endpoint(&self) -> Option<&ApiEndpoint> {
        self.spec.control_plane_endpoint.as_ref()
    }

    fn drift(&self) -> (Option<i64>, DriftAction) {
        let d = self.spec.drift.as_ref();
        (
            d.and_then(|d| d.interval_seconds),
            d.and_then(|d| d.action).unwrap_or_default(),
        )
    }

    fn approval(&self) -> approval::Policy {
        match self.spec.apply_policy.unwrap_or_default() {
            ApplyPolicy::Automatic => approval::Policy::Guarded,
            ApplyPolicy::Manual => approval::Policy::Manual,
        }
    }

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}

impl Workload for TerraformMachine {
    fn provider_id(&self) -> Option<&str> {
        self.spec.provider_id.as_deref()
    }

    fn spec_value(&self) -> Value {
        serde_json::to_value(&self.spec).unwrap_or_default()
    }

    fn kind_status(&self) -> Map<String, Value> {
        kind_fields(self.status.clone().map(|mut s| {
            s.workspace = WorkspaceStatus::default();
            s
        }))
    }

    const KIND: Kind = Kind::Machine;
    const MUTABLE: bool = false;

    fn drift(&self) -> (Option<i64>, DriftAction) {
        let interval = self.spec.drift.as_ref().and_then(|d| d.interval_seconds);
        (interval, DriftAction::Report)
    }

    fn remediation(&self) -> Option<&MachineRemediation> {
        self.spec.remediation.as_ref()
    }

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}

impl Workload for TerraformMachinePool {
    fn spec_value(&self) -> Value {
        serde_json::to_value(&self.spec).unwrap_or_default()
    }

    fn kind_status(&self) -> Map<String, Value> {
        kind_fields(self.status.clone().map(|mut s| {
            s.workspace = WorkspaceStatus::default();
            s
        }))
    }

    const KIND: Kind = Kind::MachinePool;
    const MUTABLE: bool = true;

    fn drift(&self) -> (Option<i64>, DriftAction) {
        let d = self.spec.drift.as_ref();
        (
            d.and_then(|d| d.interval_seconds),
            d.and_then(|d| d.action).unwrap_or_default(),
        )
    }

    fn membership_interval(&self) -> Option<i64> {
        self.spec.membership_refresh_interval_seconds
    }

    fn workspace(&self) -> &WorkspaceSpec {
        &self.spec.workspace
    }

    fn workspace_status(&self) -> Option<&WorkspaceStatus> {
        self.status.as_ref().map(|s| &s.workspace)
    }
}
