//! The spec pieces that several kinds share (ref §1.2); the status pieces
//! are in `status`, the Cluster API types in `capi`.
//!
//! Every optional field is an `Option` that serializes only when set, so an
//! object read from the API and written back carries exactly the fields it
//! had: nothing here invents a value. Built-in defaults are resolved when a
//! Job is built, never stored.

use super::flat::fields;
use super::variables::Variables;

use k8s_openapi::api::core::v1::{
    EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
};
use schemars::JsonSchema;
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
    /// defaults' as a whole. Privileged containers, privilege escalation,
    /// added capabilities, a writable root filesystem, an Unmasked procMount,
    /// Unconfined seccomp or AppArmor profiles, SELinux types other than
    /// container_t, container_init_t, container_kvm_t and container_engine_t
    /// (spc_t above all), runAsUser 0, runAsNonRoot false and Windows host
    /// processes are rejected.
    // Boxed, as the pod's: inline they made a TerraformCluster 3.3 KB,
    // copied at each step of its decode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_context: Option<Box<SecurityContext>>,

    /// Security context of the Job's pod. The defaults are seccomp
    /// RuntimeDefault and fsGroup 65532 (the group that reads the Secret
    /// volumes); a value is merged over them field by field. For machines
    /// and pools it replaces the cluster defaults' as a whole. Unconfined
    /// seccomp or AppArmor profiles, SELinux types other than container_t,
    /// container_init_t, container_kvm_t and container_engine_t (spc_t above
    /// all), runAsUser 0, runAsNonRoot false and Windows host processes are
    /// rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<Box<PodSecurityContext>>,
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
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

fields!(WorkspaceSpec, ["source"], {
    "source" => source,
    "identityRef" => identity_ref,
    "jobs" => jobs,
    "variables" => variables,
    "variablesFrom" => variables_from,
});
