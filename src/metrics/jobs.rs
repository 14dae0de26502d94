//! The verbs of the Job and per-object families (ref §5): what a finished
//! Job measured, the Jobs active now, the inputs' size, the newest success
//! per operation, and the failures counted once per transition.

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::controllers::figures::JobFigures;

/// The active Job of each object, as its passes last saw it: what
/// `captf_jobs_active` counts.
pub(super) type Active = std::sync::Mutex<HashMap<(Kind, String, String), Op>>;

impl Metrics {
    /// What a finished Job measured: `captf_job_duration_seconds`,
    /// `captf_job_step_duration_seconds`, `captf_job_queue_seconds`,
    /// `captf_job_errors_total` and `captf_resources_changed_total`.
    pub fn job_accounted(&self, kind: Kind, op: Op, result: JobResult, f: &JobFigures) {
        if let Some(d) = f.duration {
            self.job_duration
                .get_or_create(&JobLabels { kind, op, result })
                .observe(d);
        }
        for (step, d) in &f.steps {
            self.job_step_duration
                .get_or_create(&JobStepLabels {
                    kind,
                    op,
                    step: *step,
                })
                .observe(*d);
        }
        if let Some(q) = f.queue {
            self.job_queue
                .get_or_create(&KindOpLabels { kind, op })
                .observe(q);
        }
        if let Some((error_kind, step)) = f.error {
            self.job_errors
                .get_or_create(&JobErrorLabels {
                    kind,
                    op,
                    error_kind,
                    step,
                })
                .inc();
        }
        if let Some(c) = f.changed {
            for (action, n) in [
                (ResourceAction::Import, c.import),
                (ResourceAction::Add, c.add),
                (ResourceAction::Change, c.change),
                (ResourceAction::Destroy, c.destroy),
            ] {
                if n > 0 {
                    self.resources_changed
                        .get_or_create(&ResourceChangeLabels { kind, op, action })
                        .inc_by(n);
                }
            }
        }
    }

    /// A Job succeeded after `attempts` tries: `captf_job_attempts`.
    pub fn job_attempts(&self, kind: Kind, op: Op, attempts: u32) {
        self.job_attempts
            .get_or_create(&KindOpLabels { kind, op })
            .observe(f64::from(attempts));
    }

    /// The object's active Job, or none: `captf_jobs_active`, counted over
    /// every object.
    pub fn active_job(&self, kind: Kind, namespace: &str, name: &str, op: Option<Op>) {
        let Ok(mut active) = self.active.lock() else {
            return;
        };
        let key = (kind, namespace.to_owned(), name.to_owned());
        let before = match op {
            Some(op) => active.insert(key, op),
            None => active.remove(&key),
        };
        if before == op {
            return;
        }
        for op in before.into_iter().chain(op) {
            let n = active
                .iter()
                .filter(|((k, _, _), o)| *k == kind && **o == op)
                .count();
            self.jobs_active
                .get_or_create(&KindOpLabels { kind, op })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The rendered inputs' size, also over the cap: `captf_inputs_bytes`.
    pub fn inputs_bytes(&self, kind: Kind, namespace: &str, name: &str, bytes: u64) {
        self.inputs_bytes
            .get_or_create(&ObjectLabels::new(kind, namespace, name))
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The newest success of `op`, or no series:
    /// `captf_last_success_timestamp_seconds`.
    pub fn last_success(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        op: Op,
        at: Option<Timestamp>,
    ) {
        let labels = ObjectOpLabels {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            op,
        };
        match at {
            Some(at) => {
                self.last_success_timestamp
                    .get_or_create(&labels)
                    .set(at.as_second());
            }
            None => {
                self.last_success_timestamp.remove(&labels);
            }
        }
    }

    /// IdentityAllowed turned False for this reason:
    /// `captf_identity_denied_total`.
    pub fn identity_denied(&self, reason: IdentityDenied) {
        self.identity_denied
            .get_or_create(&IdentityDeniedLabels { reason })
            .inc();
    }

    /// A remediation request set or withdrawn:
    /// `captf_remediation_requests_total`.
    pub fn remediation(&self, action: RemediationAction) {
        self.remediation_requests
            .get_or_create(&RemediationLabels { action })
            .inc();
    }

    /// A TerraformMachine's unhealthy samples in a row, or no series:
    /// `captf_unhealthy_samples`.
    pub fn unhealthy_samples(&self, namespace: &str, name: &str, samples: Option<u64>) {
        let labels = MachineLabels {
            namespace: namespace.into(),
            name: name.into(),
        };
        match samples {
            Some(n) => {
                self.unhealthy_samples
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            None => {
                self.unhealthy_samples.remove(&labels);
            }
        }
    }

    /// OutputsValid turned False for this reason:
    /// `captf_outputs_invalid_total`.
    pub fn outputs_invalid(&self, kind: Kind, reason: &'static str) {
        self.outputs_invalid
            .get_or_create(&KindReasonLabels { kind, reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_jobs_are_counted_over_objects() {
        let m = Metrics::new();
        let count = |op: Op| {
            m.jobs_active
                .get_or_create(&KindOpLabels {
                    kind: Kind::Machine,
                    op,
                })
                .get()
        };
        m.active_job(Kind::Machine, "ns", "a", Some(Op::Apply));
        m.active_job(Kind::Machine, "ns", "b", Some(Op::Apply));
        m.active_job(Kind::Machine, "ns", "a", Some(Op::Apply));
        assert_eq!(count(Op::Apply), 2);
        m.active_job(Kind::Machine, "ns", "a", Some(Op::Refresh));
        assert_eq!((count(Op::Apply), count(Op::Refresh)), (1, 1));
        m.active_job(Kind::Machine, "ns", "a", None);
        m.forget(Kind::Machine, "ns", "b");
        assert_eq!((count(Op::Apply), count(Op::Refresh)), (0, 0));
    }
}
