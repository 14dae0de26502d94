//! Every metric of the manager, in one registry (ref §5 names, types and
//! labels, `captf_` prefix).
//!
//! Label values come from the enums of [`labels`], so every label is
//! bounded; the only free values are the namespace and name of the
//! per-object gauges, whose series [`Metrics::forget`] removes when the
//! object goes. The reconcilers record through the verbs of [`Metrics`]
//! (`job_finished`, `state_read_error`, ...), never through the families.

use std::fmt;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The API contract this build implements (the `contract` label of
/// `captf_build_info`).
pub const CONTRACT: &str = "v1alpha1";

mod labels;

pub use labels::*;

mod jobs;

use crate::api::WorkspaceStatus;
use crate::controllers::conditions::{DRIFT_DETECTED, INFRASTRUCTURE_HEALTHY, READY};
use crate::names::{Kind, Op};

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

// Buckets sized for Terraform Jobs: seconds to an hour and more.
fn job_duration_buckets() -> Histogram {
    Histogram::new([
        10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 7200.0,
    ])
}

fn job_step_buckets() -> Histogram {
    Histogram::new([
        0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ])
}

// Includes 300 s, the queue alert's threshold.
fn job_queue_buckets() -> Histogram {
    Histogram::new([1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0])
}

fn job_attempt_buckets() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0])
}

/// The manager's metrics. Cloning a family shares its series, so handing
/// `&Metrics` (or an `Arc`) to each reconciler is enough.
pub struct Metrics {
    registry: Registry,
    active: jobs::Active,
    /// `captf_jobs_total`: finished Jobs.
    jobs: Family<JobLabels, Counter>,
    /// `captf_job_duration_seconds`: Job start to finish.
    job_duration: HistogramFamily<JobLabels>,
    /// `captf_job_step_duration_seconds`.
    job_step_duration: HistogramFamily<JobStepLabels>,
    /// `captf_job_queue_seconds`: Job creation to the source container's start.
    job_queue: HistogramFamily<KindOpLabels>,
    /// `captf_job_errors_total`.
    job_errors: Family<JobErrorLabels, Counter>,
    /// `captf_jobs_active`.
    jobs_active: Family<KindOpLabels, Gauge>,
    /// `captf_job_attempts`: for a succeeded Job, 1 + the failed Jobs of its op since the last success.
    job_attempts: HistogramFamily<KindOpLabels>,
    /// `captf_resources_changed_total`.
    resources_changed: Family<ResourceChangeLabels, Counter>,
    /// `captf_drift_resources_total`.
    drift_resources: Family<DriftLabels, Counter>,
    /// `captf_reconcile_op_decisions_total`.
    reconcile_op_decisions: Family<DecisionLabels, Counter>,
    /// `captf_state_read_errors_total`.
    state_read_errors: Family<StateReadErrorLabels, Counter>,
    /// `captf_outputs_invalid_total`: transitions to invalid outputs.
    outputs_invalid: Family<KindReasonLabels, Counter>,
    /// `captf_drift_detected`: 1 or 0 per object.
    drift_detected: Family<ObjectLabels, Gauge>,
    /// `captf_ready`: 1 True, 0 False, -1 Unknown per object.
    ready: Family<ObjectLabels, Gauge>,
    /// `captf_infrastructure_healthy`: 1, 0 or -1 per object.
    infrastructure_healthy: Family<ObjectLabels, Gauge>,
    /// `captf_state_resources`: managed resources in the state.
    state_resources: Family<ObjectLabels, Gauge>,
    /// `captf_state_bytes`: compressed state size over all its Secrets.
    state_bytes: Family<ObjectLabels, Gauge>,
    /// `captf_inputs_bytes`: rendered input size, also when over the cap.
    inputs_bytes: Family<ObjectLabels, Gauge>,
    /// `captf_last_success_timestamp_seconds`: Unix time of the newest success per op.
    last_success_timestamp: Family<ObjectOpLabels, Gauge>,
    /// `captf_unhealthy_samples`: a TerraformMachine's status.unhealthySamples.
    unhealthy_samples: Family<MachineLabels, Gauge>,
    /// `captf_lock_force_unlocks_total`.
    lock_force_unlocks: Family<KindLabels, Counter>,
    /// `captf_identity_denied_total`.
    identity_denied: Family<IdentityDeniedLabels, Counter>,
    /// `captf_inputs_hash_changes_total`: applies started by an input change.
    inputs_hash_changes: Family<KindLabels, Counter>,
    /// `captf_remediation_requests_total`.
    remediation_requests: Family<RemediationLabels, Counter>,
    /// `captf_destructive_plan_approvals_consumed_total`.
    destructive_plan_approvals_consumed: Family<KindLabels, Counter>,
    /// `captf_lease_waits_total`: once per wait.
    lease_waits: Family<LeaseWaitLabels, Counter>,
    /// `captf_state_backups_total`.
    state_backups: Family<BackupLabels, Counter>,
    /// `captf_state_restores_total`.
    state_restores: Family<RestoreLabels, Counter>,
    /// `captf_plan_approvals_total`.
    plan_approvals: Family<ApprovalLabels, Counter>,
    /// `rest_client_requests_total`, as client-go names it.
    api_requests: Family<RequestLabels, Counter>,
    /// `controller_runtime_reconcile_total`, as controller-runtime names it.
    reconciles: Family<ReconcileLabels, Counter>,
    /// `controller_runtime_reconcile_errors_total`.
    reconcile_errors: Family<ControllerLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // controller-runtime's series keep their own names beside ours.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("captf");

        let build_info = Family::<BuildInfoLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildInfoLabels {
                version: crate::VERSION,
                // Set by the release build; a local build has no commit to name.
                commit: option_env!("CAPTF_GIT_COMMIT").unwrap_or("unknown"),
                contract: CONTRACT,
            })
            .set(1);
        registry.register("build_info", "Build information; always 1", build_info);

        let metrics = Self {
            active: Default::default(),
            jobs: Family::default(),
            job_duration: Family::new_with_constructor(job_duration_buckets),
            job_step_duration: Family::new_with_constructor(job_step_buckets),
            job_queue: Family::new_with_constructor(job_queue_buckets),
            job_errors: Family::default(),
            jobs_active: Family::default(),
            job_attempts: Family::new_with_constructor(job_attempt_buckets),
            resources_changed: Family::default(),
            drift_resources: Family::default(),
            reconcile_op_decisions: Family::default(),
            state_read_errors: Family::default(),
            outputs_invalid: Family::default(),
            drift_detected: Family::default(),
            ready: Family::default(),
            infrastructure_healthy: Family::default(),
            state_resources: Family::default(),
            state_bytes: Family::default(),
            inputs_bytes: Family::default(),
            last_success_timestamp: Family::default(),
            unhealthy_samples: Family::default(),
            lock_force_unlocks: Family::default(),
            identity_denied: Family::default(),
            inputs_hash_changes: Family::default(),
            remediation_requests: Family::default(),
            destructive_plan_approvals_consumed: Family::default(),
            lease_waits: Family::default(),
            state_backups: Family::default(),
            state_restores: Family::default(),
            plan_approvals: Family::default(),
            api_requests: Family::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            registry: Registry::default(),
        };
        // Counters get `_total` and units their suffix from the registry.
        let r = registry;
        let m = &metrics;
        r.register("jobs", "Finished Jobs by result", m.jobs.clone());
        r.register_with_unit(
            "job_duration",
            "Job start to finish",
            Unit::Seconds,
            m.job_duration.clone(),
        );
        r.register_with_unit(
            "job_step_duration",
            "Runner step duration",
            Unit::Seconds,
            m.job_step_duration.clone(),
        );
        r.register_with_unit(
            "job_queue",
            "Job creation to the source container's start",
            Unit::Seconds,
            m.job_queue.clone(),
        );
        r.register(
            "job_errors",
            "Failed Jobs by error kind and step",
            m.job_errors.clone(),
        );
        r.register("jobs_active", "Jobs running now", m.jobs_active.clone());
        r.register(
            "job_attempts",
            "Attempts of an operation up to its success",
            m.job_attempts.clone(),
        );
        r.register(
            "resources_changed",
            "Resources changed by Jobs",
            m.resources_changed.clone(),
        );
        r.register(
            "drift_resources",
            "Resources found drifted",
            m.drift_resources.clone(),
        );
        r.register(
            "reconcile_op_decisions",
            "Operation decisions; op none when nothing is due",
            m.reconcile_op_decisions.clone(),
        );
        r.register(
            "state_read_errors",
            "State read failures",
            m.state_read_errors.clone(),
        );
        r.register(
            "outputs_invalid",
            "Transitions to invalid outputs",
            m.outputs_invalid.clone(),
        );
        r.register(
            "drift_detected",
            "1 when the object's infrastructure drifted",
            m.drift_detected.clone(),
        );
        r.register(
            "ready",
            "Ready condition: 1 True, 0 False, -1 Unknown",
            m.ready.clone(),
        );
        r.register(
            "infrastructure_healthy",
            "Infrastructure health: 1, 0, -1 unknown",
            m.infrastructure_healthy.clone(),
        );
        r.register(
            "state_resources",
            "Managed resources in the state",
            m.state_resources.clone(),
        );
        r.register_with_unit(
            "state",
            "Compressed state size over its Secrets",
            Unit::Bytes,
            m.state_bytes.clone(),
        );
        r.register_with_unit(
            "inputs",
            "Rendered input size",
            Unit::Bytes,
            m.inputs_bytes.clone(),
        );
        r.register_with_unit(
            "last_success_timestamp",
            "Unix time of the newest success per operation",
            Unit::Seconds,
            m.last_success_timestamp.clone(),
        );
        r.register(
            "unhealthy_samples",
            "A TerraformMachine's unhealthy samples",
            m.unhealthy_samples.clone(),
        );
        r.register(
            "lock_force_unlocks",
            "State locks force-unlocked",
            m.lock_force_unlocks.clone(),
        );
        r.register(
            "identity_denied",
            "Identity references refused",
            m.identity_denied.clone(),
        );
        r.register(
            "inputs_hash_changes",
            "Applies started by an input change",
            m.inputs_hash_changes.clone(),
        );
        r.register(
            "remediation_requests",
            "Remediation requests and withdrawals",
            m.remediation_requests.clone(),
        );
        r.register(
            "destructive_plan_approvals_consumed",
            "Destructive plan approvals used",
            m.destructive_plan_approvals_consumed.clone(),
        );
        r.register("lease_waits", "Waits for a lease", m.lease_waits.clone());
        r.register(
            "state_backups",
            "State backups taken, pruned or skipped",
            m.state_backups.clone(),
        );
        r.register("state_restores", "State restores", m.state_restores.clone());
        r.register("plan_approvals", "Plan approvals", m.plan_approvals.clone());
        root.register(
            "rest_client_requests",
            "Requests to the API server by method and code",
            m.api_requests.clone(),
        );
        root.register(
            "controller_runtime_reconcile",
            "Reconciliations per controller and result",
            m.reconciles.clone(),
        );
        root.register(
            "controller_runtime_reconcile_errors",
            "Reconciliations that ended in an error, per controller",
            m.reconcile_errors.clone(),
        );
        Self {
            registry: root,
            ..metrics
        }
    }

    /// A finished Job was accounted: `captf_jobs_total`.
    pub fn job_finished(&self, kind: Kind, op: Op, result: JobResult) {
        self.jobs
            .get_or_create(&JobLabels { kind, op, result })
            .inc();
    }

    /// A Job was started for `reason`: `captf_reconcile_op_decisions_total`,
    /// and `captf_inputs_hash_changes_total` for an input change.
    pub fn op_decided(&self, kind: Kind, op: Op, reason: &'static str, inputs_changed: bool) {
        self.reconcile_op_decisions
            .get_or_create(&DecisionLabels { kind, op, reason })
            .inc();
        if inputs_changed {
            self.inputs_hash_changes
                .get_or_create(&KindLabels { kind })
                .inc();
        }
    }

    /// The object's state as last read: its size and managed resources, or
    /// no series while there is no readable state.
    pub fn state_read(&self, kind: Kind, namespace: &str, name: &str, read: Option<(u64, u64)>) {
        let object = ObjectLabels::new(kind, namespace, name);
        match read {
            Some((bytes, resources)) => {
                let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                self.state_bytes.get_or_create(&object).set(gauge(bytes));
                self.state_resources
                    .get_or_create(&object)
                    .set(gauge(resources));
            }
            None => {
                self.state_bytes.remove(&object);
                self.state_resources.remove(&object);
            }
        }
    }

    /// The object's conditions as written: `captf_ready` and
    /// `captf_infrastructure_healthy` (1 True, 0 False, −1 Unknown) and
    /// `captf_drift_detected` (1 while drift stands, else 0); a condition
    /// the object does not have has no series.
    pub fn conditions(&self, kind: Kind, namespace: &str, name: &str, status: &WorkspaceStatus) {
        let object = ObjectLabels::new(kind, namespace, name);
        let of = |type_: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == type_)
                .map(|c| c.status.as_str())
        };
        let tri = |s: &str| match s {
            "True" => 1,
            "False" => 0,
            _ => -1,
        };
        for (family, value) in [
            (&self.ready, of(READY).map(tri)),
            (
                &self.infrastructure_healthy,
                of(INFRASTRUCTURE_HEALTHY).map(tri),
            ),
            (
                &self.drift_detected,
                of(DRIFT_DETECTED).map(|s| i64::from(s == "True")),
            ),
        ] {
            match value {
                Some(v) => {
                    family.get_or_create(&object).set(v);
                }
                None => {
                    family.remove(&object);
                }
            }
        }
    }

    /// The state turned unreadable, lost or locked: `captf_state_read_errors_total`.
    pub fn state_read_error(&self, kind: Kind, reason: StateReadError) {
        self.state_read_errors
            .get_or_create(&StateReadErrorLabels { kind, reason })
            .inc();
    }

    /// `n` backups taken, pruned or skipped: `captf_state_backups_total`.
    pub fn state_backups(&self, kind: Kind, result: BackupResult, n: u64) {
        self.state_backups
            .get_or_create(&BackupLabels { kind, result })
            .inc_by(n);
    }

    /// A restore ended: `captf_state_restores_total`.
    pub fn state_restore(&self, kind: Kind, result: RestoreResult) {
        self.state_restores
            .get_or_create(&RestoreLabels { kind, result })
            .inc();
    }

    /// A Job was started to force-unlock a stale lock: `captf_lock_force_unlocks_total`.
    pub fn force_unlock(&self, kind: Kind) {
        self.lock_force_unlocks
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// An approved plan's apply started, or found another plan:
    /// `captf_plan_approvals_total`.
    pub fn plan_approval(&self, kind: Kind, result: ApprovalResult) {
        self.plan_approvals
            .get_or_create(&ApprovalLabels { kind, result })
            .inc();
    }

    /// An approved destructive apply succeeded and its approval went:
    /// `captf_destructive_plan_approvals_consumed_total`.
    pub fn destructive_approval_consumed(&self, kind: Kind) {
        self.destructive_plan_approvals_consumed
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// A drift check found changes: `captf_drift_resources_total`.
    pub fn drift_found(&self, kind: Kind, add: i32, change: i32, destroy: i32) {
        for (action, n) in [
            (ResourceAction::Add, add),
            (ResourceAction::Change, change),
            (ResourceAction::Destroy, destroy),
        ] {
            if let Ok(n) = u64::try_from(n)
                && n > 0
            {
                self.drift_resources
                    .get_or_create(&DriftLabels { kind, action })
                    .inc_by(n);
            }
        }
    }

    /// A wait for a lease began: `captf_lease_waits_total`.
    pub fn lease_wait(&self, kind: Kind, reason: LeaseWait) {
        self.lease_waits
            .get_or_create(&LeaseWaitLabels { kind, reason })
            .inc();
    }

    /// One request to the API server answered with `code` (None: no
    /// answer).
    pub fn api_request(&self, method: &http::Method, code: Option<u16>) {
        self.api_requests
            .get_or_create(&RequestLabels {
                method: RequestMethod::of(method),
                code: StatusCode(code),
            })
            .inc();
    }

    /// A pass over an object of `kind` ended, with an error or not.
    pub fn reconciled(&self, kind: Kind, failed: bool) {
        let controller = Controller(kind);
        let result = match failed {
            true => ReconcileResult::Error,
            false => ReconcileResult::Success,
        };
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        if failed {
            self.reconcile_errors
                .get_or_create(&ControllerLabels { controller })
                .inc();
        }
    }

    /// Removes every series of one object; call it when the object is gone.
    pub fn forget(&self, kind: Kind, namespace: &str, name: &str) {
        self.active_job(kind, namespace, name, None);
        let object = ObjectLabels::new(kind, namespace, name);
        for family in [
            &self.drift_detected,
            &self.ready,
            &self.infrastructure_healthy,
            &self.state_resources,
            &self.state_bytes,
            &self.inputs_bytes,
        ] {
            family.remove(&object);
        }
        for op in Op::ALL {
            self.last_success_timestamp.remove(&ObjectOpLabels {
                kind,
                namespace: namespace.into(),
                name: name.into(),
                op,
            });
        }
        if kind == Kind::Machine {
            self.unhealthy_samples.remove(&MachineLabels {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests;
