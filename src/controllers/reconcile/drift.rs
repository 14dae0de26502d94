//! Refresh and drift checks (ref §8.3, §3 DriftDetected): what a finished
//! refresh, drift check or remediation leaves in status, and which check is
//! due next. Pure: the changes go into the plan.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::Pass;
use super::common::Common;
use super::plan::{Count, Note, Plan, Requeue};
use crate::api::{DriftAction, DriftSummary};
use crate::controllers::conditions::{
    Cond, DRIFT_DETECTED, DRIFT_JOB_SUCCEEDED, INFRASTRUCTURE_HEALTHY, OUTPUTS_VALID, Status,
};
use crate::controllers::decide::{Finished, JobReason};
use crate::controllers::ledger::Outcome;
use crate::controllers::remediation;
use crate::controllers::schedule::{self, Due, Health};
use crate::controllers::workload::Workload;
use crate::names::{Kind, Op};
use crate::runner::plan::PlanReport;

/// A machine's health-check interval when it sets none (ref §1.2).
const HEALTH_CHECK_DEFAULT: Duration = Duration::from_secs(300);

/// The most drifted addresses status lists.
const DRIFT_RESOURCES: usize = 20;

fn drifted(plan: &Plan) -> bool {
    plan.draft.status_of(DRIFT_DETECTED).map(|(s, _)| s) == Some(Status::True)
}

/// What a finished refresh, drift check or remediation apply says.
pub fn settle(
    action: DriftAction,
    finished: (&Job, Op, Outcome, Timestamp),
    remediation: bool,
    report: Option<&PlanReport>,
    plan: &mut Plan,
) {
    let (job, op, outcome, end) = finished;
    let name = job.name_any();
    let succeeded = outcome == Outcome::Succeeded;
    match op {
        Op::Refresh | Op::Drift if succeeded => {
            plan.draft.status.last_refresh = Some(Time(end));
        }
        Op::Apply if remediation => {
            if succeeded {
                resolved(
                    plan,
                    &format!("the remediation Job {name} applied the module"),
                );
            } else {
                plan.draft.set(Cond::new(
                    DRIFT_DETECTED,
                    Status::True,
                    "DriftPending",
                    format!("the remediation Job {name} did not apply; the drift stands"),
                ));
            }
            return;
        }
        _ => return,
    }
    if op != Op::Drift {
        return;
    }
    plan.draft.status.last_drift_check = Some(Time(end));
    let Some(report) = report else { return };
    let found = report.add + report.change + report.destroy > 0;
    if !found {
        resolved(plan, &format!("Job {name} found no drift"));
        return;
    }
    let resources: Vec<String> = report
        .resources
        .iter()
        .take(DRIFT_RESOURCES)
        .map(|r| {
            r.rsplit_once(" (")
                .map_or(r.as_str(), |(a, _)| a)
                .to_owned()
        })
        .collect();
    let summary = format!(
        "add {}, change {}, destroy {}: {}{}",
        report.add,
        report.change,
        report.destroy,
        resources.join(", "),
        if report.truncated || resources.len() < report.resources.len() {
            ", …"
        } else {
            ""
        }
    );
    if let Some(run) = plan.draft.status.last_run.as_mut() {
        run.drift = Some(DriftSummary {
            add: Some(report.add),
            change: Some(report.change),
            destroy: Some(report.destroy),
            resources: (!resources.is_empty()).then_some(resources),
        });
    }
    plan.counts.push(Count::Drift {
        add: report.add,
        change: report.change,
        destroy: report.destroy,
    });
    let (reason, then) = match action {
        DriftAction::Report => ("DriftReported", "reported only"),
        DriftAction::Remediate => ("DriftPending", "a remediation apply follows"),
    };
    plan.draft.set(Cond::new(
        DRIFT_DETECTED,
        Status::True,
        reason,
        format!("Job {name} found drift ({summary}); {then}"),
    ));
    plan.notes.push(
        Note::warning(
            "DriftDetected",
            format!("Job {name} found drift: {summary}"),
        )
        .about(job),
    );
}

fn resolved(plan: &mut Plan, why: &str) {
    if drifted(plan) {
        plan.notes
            .push(Note::normal("DriftResolved", why.to_owned()));
    }
    plan.draft.set(Cond::new(
        DRIFT_DETECTED,
        Status::False,
        "NoDrift",
        why.to_owned(),
    ));
}

/// Whether the health read in this pass asks for another reading soon.
fn health(plan: &Plan) -> Health {
    match plan.draft.status_of(INFRASTRUCTURE_HEALTHY) {
        Some((_, "InstancePending" | "HealthUnknown")) => Health::Pending,
        _ => Health::Settled,
    }
}

/// After the outputs of this pass were mapped: a machine's apply whose
/// own reading was enough stands in for the post-apply refresh, and a
/// health sample (a refresh, a drift check, an apply) counts pending
/// readings in a row.
pub fn sample<K: Workload>(applied_at: Option<Timestamp>, sampled: bool, plan: &mut Plan) {
    let pending = health(plan) == Health::Pending;
    if let (Kind::Machine, Some(at)) = (K::KIND, applied_at) {
        let valid = plan.draft.status_of(OUTPUTS_VALID).map(|(s, _)| s) == Some(Status::True);
        if valid && !pending {
            plan.draft.status.last_refresh = Some(Time(at));
        }
    }
    if sampled {
        let status = &mut plan.draft.status;
        status.pending_refreshes = match pending {
            true => Some(status.pending_refreshes.unwrap_or(0).saturating_add(1)),
            false => None,
        };
        if K::KIND == Kind::Machine {
            let before = plan
                .kind_status
                .get(UNHEALTHY_SAMPLES)
                .and_then(|v| v.as_u64())
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0);
            let reason = plan
                .draft
                .status_of(INFRASTRUCTURE_HEALTHY)
                .map_or("", |(_, r)| r);
            match remediation::count(before, remediation::sample(reason)) {
                0 => plan.kind_status.remove(UNHEALTHY_SAMPLES),
                n => plan
                    .kind_status
                    .insert(UNHEALTHY_SAMPLES.into(), serde_json::Value::from(n)),
            };
        }
    }
}

/// A machine's kind status field of unhealthy samples in a row.
pub const UNHEALTHY_SAMPLES: &str = "unhealthySamples";

/// Remediation failures since the last successful drift check.
pub fn remediation_failures(finished: &[Finished], since: Option<Timestamp>) -> u32 {
    let n = finished
        .iter()
        .filter(|f| f.op == Op::Apply && f.remediation && f.counts_for_backoff)
        .filter(|f| since.is_none_or(|s| f.finished_at > s))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whether drift found under Remediate should be remediated now.
pub fn remediate(p: &Pass<'_, impl Workload>, c: &Common, plan: &Plan) -> bool {
    let (_, action) = p.obj.drift();
    if action != DriftAction::Remediate || !drifted(plan) {
        return false;
    }
    let since = plan.draft.status.last_drift_check.as_ref().map(|t| t.0);
    remediation_failures(p.finished, since)
        < u32::try_from(c.settings.failed_jobs_history_limit.max(1)).unwrap_or(1)
}

/// The object's drift interval, from its own, its cluster's defaults and
/// the manager's.
fn interval<K: Workload>(p: &Pass<'_, K>) -> Option<Duration> {
    let (own, _) = p.obj.drift();
    let inherited = p
        .rest
        .cluster
        .as_ref()
        .and_then(|c| c.spec.defaults.as_ref())
        .and_then(|d| d.drift.as_ref())
        .and_then(|d| d.interval_seconds);
    schedule::drift_interval(K::KIND, own, inherited, p.settings.drift_default_interval)
}

/// Whether drift checks are scheduled for the object.
pub fn scheduled<K: Workload>(p: &Pass<'_, K>) -> bool {
    interval(p).is_some()
}

/// The refresh or drift check due now, or when to look again.
pub fn due<K: Workload>(p: &Pass<'_, K>, plan: &mut Plan) -> Option<(Op, JobReason)> {
    let obj = p.obj;
    let drift = interval(p);
    let status = &plan.draft.status;
    let last_apply = p
        .finished
        .iter()
        .find(|f| f.op == Op::Apply && f.succeeded)
        .map(|f| f.finished_at);
    let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
    // A pool's membership converges until it lists as many instances as
    // its module reports replicas.
    let converging = K::KIND == Kind::MachinePool && {
        let replicas = plan.kind_status.get("replicas").and_then(|v| v.as_u64());
        let listed = obj
            .spec_value()
            .get("providerIDList")
            .and_then(|v| v.as_array())
            .map_or(0, Vec::len);
        replicas.is_some_and(|r| u64::try_from(listed).ok() != Some(r))
    };
    let facts = schedule::Facts {
        kind: K::KIND,
        uid: &p.o.uid,
        now: plan.draft.now(),
        last_apply,
        last_refresh: status.last_refresh.as_ref().map(|t| t.0),
        last_drift_check: status.last_drift_check.as_ref().map(|t| t.0),
        health: health(plan),
        provisioned: status
            .initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false),
        pending_refreshes: u32::try_from(status.pending_refreshes.unwrap_or(0)).unwrap_or(0),
        converging,
        membership: (K::KIND == Kind::MachinePool).then(|| {
            obj.membership_interval()
                .filter(|s| *s > 0)
                .map_or(schedule::MEMBERSHIP_DEFAULT, secs)
        }),
        health_check: obj
            .remediation()
            .filter(|r| r.annotate_machine == Some(true))
            .map(|r| {
                r.health_check_interval_seconds
                    .filter(|s| *s > 0)
                    .map_or(HEALTH_CHECK_DEFAULT, secs)
            }),
        drift,
    };
    if drift.is_some() {
        for type_ in [DRIFT_JOB_SUCCEEDED, DRIFT_DETECTED] {
            if plan.draft.status_of(type_).is_none() {
                plan.draft.set(Cond::new(
                    type_,
                    Status::Unknown,
                    "DriftNotChecked",
                    "no drift check has run yet",
                ));
            }
        }
    }
    match schedule::due(&facts) {
        Due::Refresh(why) => Some((Op::Refresh, JobReason::Refresh(why))),
        Due::Drift => Some((Op::Drift, JobReason::DriftInterval)),
        Due::Wait(wait) => {
            if let Requeue::After(now) = plan.requeue {
                plan.requeue = Requeue::After(now.min(wait + Duration::from_secs(1)));
            }
            None
        }
        Due::Never => None,
    }
}
