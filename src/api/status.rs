//! The status pieces that the three workload kinds share (ref §1.2): the
//! active Job, the last run, backups, and the fields of the Cluster API
//! contract.

use super::flat::fields;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::names::Op;

/// The Job that is running for an object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveJob {
    /// Name of the Job.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// The operation the Job runs: apply, destroy, drift, refresh, restore or
    /// plan.
    pub operation: Op,

    /// The `a<N>` of the Job name: it counts every retained Job of this
    /// operation, not retries.
    #[schemars(range(min = 1))]
    pub attempt: i32,

    /// When the Job started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
}

/// The result of the last finished Job, copied from the runner's termination
/// message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastRun {
    /// Name of the Job.
    #[schemars(length(min = 1, max = 63))]
    pub job: String,

    /// The operation the Job ran.
    pub operation: Op,

    /// The steps the runner ran, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub steps: Option<Vec<RunStep>>,

    /// Why the run failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,

    /// What a drift check found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftSummary>,
}

/// One step of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStep {
    /// Name of the step, e.g. init, validate, plan, apply or
    /// apply-refresh-only.
    #[schemars(length(min = 1, max = 64))]
    pub name: String,

    /// Exit code of the step.
    pub exit_code: i32,

    /// How long the step took, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub duration_milliseconds: Option<i64>,
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunError {
    /// The kind of failure: image-layout (the image is not a valid module
    /// image), step (a step failed), interrupted (the run was stopped from
    /// outside), blocked (a destructive plan was not approved) or
    /// plan-changed (an approved plan no longer matched).
    pub kind: RunErrorKind,

    /// The step that failed, set for kind step.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub step: Option<String>,

    /// The runner's curated description of the failure, never raw output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub summary: Option<String>,
}

/// The kind of a run failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunErrorKind {
    ImageLayout,
    Step,
    Interrupted,
    Blocked,
    PlanChanged,
}

/// What a drift check found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct DriftSummary {
    /// Resources the module would create.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub add: Option<i32>,

    /// Resources the module would update in place.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub change: Option<i32>,

    /// Resources the module would destroy, replacements included.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub destroy: Option<i32>,

    /// Addresses of the drifted resources, at most 20.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20), inner(length(min = 1, max = 512)))]
    pub resources: Option<Vec<String>>,
}

/// A plan that waits for approval (TerraformCluster with applyPolicy Manual).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanPreview {
    /// The inputs hash the plan was made from.
    #[schemars(length(min = 1, max = 128))]
    pub inputs_hash: String,

    /// The plan Job, or the approved apply that found the plan changed.
    #[schemars(length(min = 1, max = 63))]
    pub job: String,

    /// Hash of the plan, `p1:<sha256 hex>`. Approve it by setting the
    /// annotation `captf.io/approve-plan` to this value.
    #[schemars(length(min = 1, max = 128))]
    pub plan_hash: String,

    /// Resources the plan creates.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub add: Option<i32>,

    /// Resources the plan updates in place.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub change: Option<i32>,

    /// Resources the plan destroys, replacements included.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub destroy: Option<i32>,

    /// The planned changes as `<address> (<action>)`, sorted by address, at
    /// most 50. Actions: create, update, delete, replace, read, forget.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50), inner(length(min = 1, max = 600)))]
    pub resources: Option<Vec<String>>,

    /// Whether resources was cut at 50 entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,

    /// When the plan was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
}

/// The module source that last ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct SourceStatus {
    /// The spec.source.image reference that last ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// The image ID the pod reported; informational only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image_digest: Option<String>,

    /// The Terraform or OpenTofu version that ran, from `version -json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub runtime_version: Option<String>,
}

/// A backup of the object's state, restorable with the annotation
/// `captf.io/restore-state=<serial>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateBackup {
    /// Serial of the backed-up state.
    #[schemars(range(min = 1))]
    pub serial: i64,

    /// When the backup was taken.
    pub taken_at: Time,

    /// Compressed size of the backup in bytes, summed over its Secrets.
    #[schemars(range(min = 1))]
    pub bytes: i64,
}

/// Initialization status of the Cluster API contract.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct Initialization {
    /// Whether the infrastructure is provisioned. Derived from the state until
    /// it first holds, then kept true for the object's life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// The status fields that the three workload kinds share.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// Observations of the object's state; Ready summarizes them. At most 32.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"],
    ))]
    pub conditions: Option<Vec<Condition>>,

    /// Initialization status of the Cluster API contract.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// The metadata.generation this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub observed_generation: Option<i64>,

    /// The Job that is running, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_job: Option<ActiveJob>,

    /// The result of the last finished Job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,

    /// When the last drift check finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_drift_check: Option<Time>,

    /// When the state was last read fresh: the last refresh or drift
    /// completion, or the apply whose reading stands in for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_refresh: Option<Time>,

    /// Consecutive health samples that reported pending. Kept only in status.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pending_refreshes: Option<i32>,

    /// Serial of the state the controller last read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub observed_state_serial: Option<i64>,

    /// Suffix of the state Secret `tfstate-default-<suffix>`. Informational:
    /// the controller derives it and never reads it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub state_secret_suffix: Option<String>,

    /// The module source that last ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceStatus>,

    /// Restorable backups of the state, newest first, at most 16.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub state_backups: Option<Vec<StateBackup>>,
}

fields!(WorkspaceStatus, [], {
    "conditions" => conditions,
    "initialization" => initialization,
    "observedGeneration" => observed_generation,
    "activeJob" => active_job,
    "lastRun" => last_run,
    "lastDriftCheck" => last_drift_check,
    "lastRefresh" => last_refresh,
    "pendingRefreshes" => pending_refreshes,
    "observedStateSerial" => observed_state_serial,
    "stateSecretSuffix" => state_secret_suffix,
    "source" => source,
    "stateBackups" => state_backups,
});
