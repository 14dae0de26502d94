//! The label values and label sets of the manager's metrics (ref §5). Every
//! value comes from an enum, so every label is bounded; the kind and the
//! operation are the crate's own [`Kind`] and [`Op`].

use std::fmt;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::names::{Kind, Op};

impl EncodeLabelValue for Kind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        EncodeLabelValue::encode(&self.kind(), encoder)
    }
}

impl EncodeLabelValue for Op {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Defines a label-value enum with the exact strings that go on the wire.
macro_rules! label_values {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $value),+ }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    };
}

label_values!(
    /// The `result` label of `captf_jobs_total` and `captf_job_duration_seconds`.
    JobResult {
        Succeeded => "succeeded",
        Failed => "failed",
        Deadline => "deadline",
        Interrupted => "interrupted",
        Blocked => "blocked",
        PlanChanged => "plan_changed",
    }
);

label_values!(
    /// The `result` label of `controller_runtime_reconcile_total`: how a
    /// pass ended (a pass always requeues, so `success` covers that).
    ReconcileResult {
        Success => "success",
        Error => "error",
    }
);

/// The `controller` label of the `controller_runtime_*` series: the
/// reconciled kind in lower case, as controller-runtime names a controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Controller(pub Kind);

impl EncodeLabelValue for Controller {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        EncodeLabelValue::encode(&self.0.kind().to_ascii_lowercase().as_str(), encoder)
    }
}

label_values!(
    /// The `step` label: a runner step, or `none` when an error has no step.
    Step {
        Init => "init",
        ForceUnlock => "force-unlock",
        Validate => "validate",
        Plan => "plan",
        ShowJson => "show-json",
        Apply => "apply",
        ApplyRefreshOnly => "apply-refresh-only",
        Destroy => "destroy",
        StatePush => "state-push",
        StateList => "state-list",
        Prepare => "prepare",
        Other => "other",
        NoStep => "none",
    }
);

label_values!(
    /// The `error_kind` label of `captf_job_errors_total`.
    JobErrorKind {
        Step => "step",
        ImageLayout => "image-layout",
        Interrupted => "interrupted",
        Blocked => "blocked",
        PlanChanged => "plan-changed",
        Deadline => "deadline",
        Unknown => "unknown",
    }
);

label_values!(
    /// The `action` label of resource changes (drift never counts `import`).
    ResourceAction {
        Add => "add",
        Change => "change",
        Destroy => "destroy",
        Import => "import",
    }
);

label_values!(
    /// The `reason` label of `captf_state_read_errors_total`.
    StateReadError {
        Inconsistent => "inconsistent",
        Encrypted => "encrypted",
        Corrupt => "corrupt",
        Lost => "lost",
        Locked => "locked",
    }
);

label_values!(
    /// The `reason` label of `captf_identity_denied_total`.
    IdentityDenied {
        NotFound => "notfound",
        Namespace => "namespace",
    }
);

label_values!(
    /// The `action` label of `captf_remediation_requests_total`.
    RemediationAction {
        Requested => "requested",
        Withdrawn => "withdrawn",
    }
);

label_values!(
    /// The `reason` label of `captf_lease_waits_total`.
    LeaseWait {
        RunLease => "run_lease",
        ClusterOperation => "cluster_operation",
        MachineOperations => "machine_operations",
    }
);

label_values!(
    /// The `result` label of `captf_state_backups_total`.
    BackupResult {
        Taken => "taken",
        Pruned => "pruned",
        Skipped => "skipped",
    }
);

label_values!(
    /// The `result` label of `captf_state_restores_total`.
    RestoreResult {
        Succeeded => "succeeded",
        Failed => "failed",
        NotFound => "not_found",
    }
);

label_values!(
    /// The `result` label of `captf_plan_approvals_total`.
    ApprovalResult {
        Approved => "approved",
        Changed => "changed",
    }
);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub kind: Kind,
    pub op: Op,
    pub result: JobResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobStepLabels {
    pub kind: Kind,
    pub op: Op,
    pub step: Step,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindOpLabels {
    pub kind: Kind,
    pub op: Op,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobErrorLabels {
    pub kind: Kind,
    pub op: Op,
    pub error_kind: JobErrorKind,
    pub step: Step,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceChangeLabels {
    pub kind: Kind,
    pub op: Op,
    pub action: ResourceAction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    pub kind: Kind,
    pub action: ResourceAction,
}

/// A decision's reason is a constant of the decision code, hence `'static`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub kind: Kind,
    pub op: Op,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateReadErrorLabels {
    pub kind: Kind,
    pub reason: StateReadError,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindReasonLabels {
    pub kind: Kind,
    pub reason: &'static str,
}

/// One object's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectLabels {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectOpLabels {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub op: Op,
}

/// A TerraformMachine's series (the kind is implied).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MachineLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: Kind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub controller: Controller,
    pub result: ReconcileResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: Controller,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdentityDeniedLabels {
    pub reason: IdentityDenied,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemediationLabels {
    pub action: RemediationAction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseWaitLabels {
    pub kind: Kind,
    pub reason: LeaseWait,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackupLabels {
    pub kind: Kind,
    pub result: BackupResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestoreLabels {
    pub kind: Kind,
    pub result: RestoreResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApprovalLabels {
    pub kind: Kind,
    pub result: ApprovalResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildInfoLabels {
    pub(super) version: &'static str,
    pub(super) commit: &'static str,
    pub(super) contract: &'static str,
}

label_values!(
    /// The `method` label of `rest_client_requests_total`.
    RequestMethod {
        Get => "GET",
        Post => "POST",
        Put => "PUT",
        Patch => "PATCH",
        Delete => "DELETE",
        Other => "OTHER",
    }
);

impl RequestMethod {
    pub fn of(method: &http::Method) -> RequestMethod {
        match *method {
            http::Method::GET => RequestMethod::Get,
            http::Method::POST => RequestMethod::Post,
            http::Method::PUT => RequestMethod::Put,
            http::Method::PATCH => RequestMethod::Patch,
            http::Method::DELETE => RequestMethod::Delete,
            _ => RequestMethod::Other,
        }
    }
}

/// An HTTP status code, or `<error>` when no answer came (client-go's
/// spelling).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct StatusCode(pub Option<u16>);

impl EncodeLabelValue for StatusCode {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        match self.0 {
            Some(code) => EncodeLabelValue::encode(&code.to_string().as_str(), encoder),
            None => EncodeLabelValue::encode(&"<error>", encoder),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: RequestMethod,
    pub code: StatusCode,
}
