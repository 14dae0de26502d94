//! The spec and status pieces that several kinds share (ref §1.2), and the
//! Cluster API types the objects embed.
//!
//! Every optional field is an `Option` that serializes only when set, so an
//! object read from the API and written back carries exactly the fields it
//! had: nothing here invents a value. Built-in defaults are resolved when a
//! Job is built, never stored.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A DNS-1123 subdomain, the shape of most object names.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A DNS-1123 label, the shape of a namespace name.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The module a workload object runs: an OCI image that carries a Terraform or
/// OpenTofu module.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// OCI image reference of the module, `registry/repository:tag` or
    /// `registry/repository@sha256:<digest>`. The tag or digest is the module
    /// version. Only the reference syntax is checked; there is no registry
    /// policy.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// When the module image is pulled: IfNotPresent, Always or Never. Unset
    /// means IfNotPresent. It is not part of the inputs hash: changing only
    /// this field starts no Job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
}

/// When the kubelet pulls an image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ImagePullPolicy {
    #[default]
    IfNotPresent,
    Always,
    Never,
}

/// A reference to a cluster-scoped TerraformClusterIdentity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityReference {
    /// Name of the TerraformClusterIdentity.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How the Jobs of an object are run. Every field is optional; an unset field
/// takes the cluster's `spec.defaults.jobs` value (for machines and pools) and
/// then the built-in default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobPolicy {
    /// How many finished successful Jobs to keep per operation. Unset means 3.
    /// The newest success of each operation is always kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_jobs_history_limit: Option<i32>,

    /// How many finished failed Jobs to keep per operation. Unset means 3. The
    /// newest failure of each operation is kept while no newer success exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_jobs_history_limit: Option<i32>,

    /// Seconds a Job may run before it is stopped. Unset means 3600. Must be
    /// greater than the effective lockTimeoutSeconds of the same policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub active_deadline_seconds: Option<i64>,

    /// Seconds the runner waits for the state lock before it gives up. Unset
    /// means 300. Must be less than the effective activeDeadlineSeconds of the
    /// same policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub lock_timeout_seconds: Option<i64>,

    /// ServiceAccount the Job runs as. Unset means the controller-created
    /// `captf-runner`. Any other account must exist in the object's namespace
    /// and carry the label `captf.io/runner=true`, otherwise no Job starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Secrets used to pull the module image and the runner init image. For
    /// machines and pools they are united with the cluster defaults', the
    /// object's own first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// Compute resources of the main container. Unset means requests of cpu
    /// 250m and memory 512Mi and a memory limit of 2Gi, with no CPU limit. A
    /// value replaces the default as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Extra environment variables of the main container, merged by name with
    /// the cluster defaults' (the object's own first). Names beginning with
    /// `TF_` or `KUBE_` are dropped and never reach the Job.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub env: Option<Vec<EnvVar>>,

    /// Security context of the Job's main container. The defaults are
    /// seccomp RuntimeDefault, all capabilities dropped, no privilege
    /// escalation and a read-only root filesystem; a value is merged over
    /// them field by field, so only the fields it sets change (capabilities
    /// is one field). For machines and pools it replaces the cluster
    /// defaults' as a whole. Privileged containers, privilege escalation and
    /// added capabilities are rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Security context of the Job's pod. The defaults are seccomp
    /// RuntimeDefault and fsGroup 65532 (the group that reads the Secret
    /// volumes); a value is merged over them field by field. For machines
    /// and pools it replaces the cluster defaults' as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

/// Module variables as a free-form JSON object: each key is a variable name,
/// each value its JSON value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Variables(pub BTreeMap<String, serde_json::Value>);

impl JsonSchema for Variables {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Variables".into()
    }

    // Any JSON value may sit under a key, so the schema keeps unknown fields
    // instead of declaring properties; only the key count is bounded here.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Module variables as a JSON object, 1 to 256 keys.",
            "type": "object",
            "minProperties": 1,
            "maxProperties": 256,
            "x-kubernetes-preserve-unknown-fields": true,
        })
    }
}

/// A ConfigMap or Secret in the object's namespace whose data become module
/// variables. Exactly one of configMapRef and secretRef is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.configMapRef) != has(self.secretRef)",
    "message": "exactly one of configMapRef and secretRef must be set",
}]))]
pub struct VariablesSource {
    /// A ConfigMap in the object's namespace. It must carry the label
    /// `captf.io/variables=true`, otherwise it counts as missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<VariablesSourceReference>,

    /// A Secret in the object's namespace. It must carry the label
    /// `captf.io/variables=true`, otherwise it counts as missing. A variable
    /// whose winning value comes from a Secret is declared sensitive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<VariablesSourceReference>,

    /// Whether a missing or unlabeled source contributes nothing instead of
    /// blocking the object. Unset means false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,

    /// How each value is read: String passes it as a string, JSON parses it.
    /// Unset means String.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<VariablesFormat>,
}

/// A ConfigMap or Secret in the object's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariablesSourceReference {
    /// Name of the ConfigMap or Secret, a DNS subdomain.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// How the values of a variables source are read. Variants carry no doc
/// comments: those would replace the field's description in the CRD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VariablesFormat {
    #[default]
    String,
    #[serde(rename = "JSON")]
    Json,
}

/// Drift checking of a TerraformCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftPolicy {
    /// Seconds between drift checks. Unset means the manager's
    /// `--drift-default-interval` (30m). 0 disables drift checks and with them
    /// all health sampling after provisioning.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub interval_seconds: Option<i64>,

    /// What to do about drift: Report it, or Remediate it with an apply.
    /// Unset means Report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<DriftAction>,
}

/// What to do about drift.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DriftAction {
    #[default]
    Report,
    Remediate,
}

/// Drift checking of a TerraformMachine, or the default for the machines and
/// pools of a cluster. Machine drift is only ever reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDriftPolicy {
    /// Seconds between drift checks. Unset means the cluster's
    /// `spec.defaults.drift`, then the manager's `--drift-default-interval`.
    /// 0 disables drift checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub interval_seconds: Option<i64>,
}

/// Drift checking of a TerraformMachinePool. A pool's drift checks cannot be
/// disabled, since they also sample its membership and health.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolDriftPolicy {
    /// Seconds between drift checks, at least 1. Unset means the cluster's
    /// `spec.defaults.drift` (an inherited 0 counts as unset), then the
    /// manager's `--drift-default-interval`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval_seconds: Option<i64>,

    /// What to do about drift: Report it, or Remediate it with an apply.
    /// Unset means Report; never inherited from the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<DriftAction>,
}

/// How an unhealthy TerraformMachine asks Cluster API for remediation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRemediation {
    /// Whether to annotate the owning Machine with
    /// `cluster.x-k8s.io/remediate-machine` once the instance has been
    /// unhealthy for unhealthyThreshold consecutive samples. Unset means false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotate_machine: Option<bool>,

    /// Consecutive unhealthy samples before the Machine is annotated. Unset
    /// means 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub unhealthy_threshold: Option<i32>,

    /// Seconds between health samples while annotateMachine is true. Unset
    /// means 300.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 86400))]
    pub health_check_interval_seconds: Option<i64>,
}

/// The fields that the three workload kinds share in their spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// The module to run.
    pub source: Source,

    /// The TerraformClusterIdentity whose credentials the Jobs receive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<IdentityReference>,

    /// How the Jobs of this object are run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<JobPolicy>,

    /// Module variables, a JSON object of 1 to 256 keys. Keys match
    /// `^[a-zA-Z_][a-zA-Z0-9_-]*$` and must not start with `captf_`, name a
    /// contract input of the kind, or be a module meta-argument. They win
    /// over every variablesFrom source. Never inherited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variables: Option<Variables>,

    /// ConfigMaps and Secrets whose data become module variables, read in
    /// order (a later source wins on the same key).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub variables_from: Option<Vec<VariablesSource>>,
}

/// An operation a Job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Apply,
    Destroy,
    Drift,
    Refresh,
    Restore,
    Plan,
}

/// The Job that is running for an object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveJob {
    /// Name of the Job.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// The operation the Job runs: apply, destroy, drift, refresh, restore or
    /// plan.
    pub operation: Operation,

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
    pub operation: Operation,

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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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

/// The endpoint of a cluster's API server (Cluster API APIEndpoint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Host name or IP address of the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub host: Option<String>,

    /// Port of the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// A failure domain (Cluster API FailureDomain).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,

    /// Whether control-plane machines may be placed in this failure domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,

    /// Free-form attributes of the failure domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// An address of a machine (Cluster API MachineAddress).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// Type of the address: Hostname, ExternalIP, InternalIP, ExternalDNS or
    /// InternalDNS.
    #[serde(rename = "type")]
    pub address_type: MachineAddressType,

    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

/// The type of a machine address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MachineAddressType {
    Hostname,
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    #[serde(rename = "InternalIP")]
    InternalIp,
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
    #[serde(rename = "InternalDNS")]
    InternalDns,
}

/// One instance of a machine pool, from the module's `instances` output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct MachinePoolInstance {
    /// Provider ID of the instance, as the Node reports it.
    #[serde(rename = "providerID")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: String,

    /// The instance's ID at its provider.
    #[serde(rename = "instanceID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub instance_id: Option<String>,

    /// Addresses of the instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub addresses: Option<Vec<MachineAddress>>,

    /// Failure domain the instance runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// State of the instance: pending, running, degraded, stopped,
    /// terminated or unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<InstanceState>,
}

/// The state of an instance, as the module reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Pending,
    Running,
    Degraded,
    Stopped,
    Terminated,
    Unknown,
}

/// What the nodes of a machine template run on, for scaling from zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct NodeInfo {
    /// CPU architecture of the nodes: amd64, arm64, s390x or ppc64le.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,

    /// Operating system of the nodes, e.g. linux.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub operating_system: Option<String>,
}

/// A CPU architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Amd64,
    Arm64,
    S390x,
    Ppc64le,
}

/// Where the capacity of a machine template was read from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySource {
    /// The module image whose labels were read.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
}

/// Labels and annotations copied onto the objects created from a template
/// (Cluster API ObjectMeta).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateObjectMeta {
    /// Labels set on the created object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,

    /// Annotations set on the created object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}
