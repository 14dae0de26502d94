//! What plans and guarded applies leave behind once they finish (ref §3,
//! §4): `status.plan` for a plan that waits, ApplyJobSucceeded with the
//! command that approves it, and the approval annotations removed once the
//! apply they approved succeeded. Pure: the changes go into the plan.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::plan::{Count, Note, Plan, Write};
use super::{Object, annotation};
use crate::api::PlanPreview;
use crate::controllers::approval::{approve_command, empty};
use crate::controllers::conditions::{APPLY_JOB_SUCCEEDED, Cond, Status};
use crate::controllers::ledger::Outcome;
use crate::keys::{APPROVE_DESTRUCTIVE_PLAN, APPROVE_PLAN, APPROVED_PLAN, INPUTS_HASH};
use crate::metrics::ApprovalResult;
use crate::names::Op;
use crate::runner::plan::PlanReport;

/// The kind status field of the plan that waits.
const PLAN_FIELD: &str = "plan";
/// The CRD's limit on a listed change.
const RESOURCE_MAX: usize = 600;

/// `status.plan`, as the pass has it.
pub fn plan_preview(plan: &Plan) -> Option<PlanPreview> {
    serde_json::from_value(plan.kind_status.get(PLAN_FIELD)?.clone()).ok()
}

fn set_preview(plan: &mut Plan, preview: Option<PlanPreview>) {
    match preview.and_then(|p| serde_json::to_value(p).ok()) {
        Some(value) => plan.kind_status.insert(PLAN_FIELD.into(), value),
        None => plan.kind_status.remove(PLAN_FIELD),
    };
}

fn counts(p: &PlanPreview) -> String {
    format!(
        "add {}, change {}, destroy {}",
        p.add.unwrap_or(0),
        p.change.unwrap_or(0),
        p.destroy.unwrap_or(0)
    )
}

/// ApplyJobSucceeded while a saved plan waits for its approval.
pub fn awaiting(namespace: &str, name: &str, p: &PlanPreview) -> Cond {
    Cond::new(
        APPLY_JOB_SUCCEEDED,
        Status::Unknown,
        "PlanAwaitingApproval",
        format!(
            "plan {} of Job {} ({}) waits for approval: {}",
            p.plan_hash,
            p.job,
            counts(p),
            approve_command(namespace, name, APPROVE_PLAN, &p.plan_hash)
        ),
    )
}

fn preview(job: &Job, report: &PlanReport, now: Time) -> PlanPreview {
    let resources: Vec<String> = report
        .resources
        .iter()
        .map(|r| crate::runner::summary::bounded(r, RESOURCE_MAX))
        .collect();
    PlanPreview {
        inputs_hash: annotation(job, INPUTS_HASH).unwrap_or_default().to_owned(),
        job: job.name_any(),
        plan_hash: report.plan_hash.clone(),
        add: Some(report.add),
        change: Some(report.change),
        destroy: Some(report.destroy),
        truncated: report.truncated.then_some(true),
        resources: (!resources.is_empty()).then_some(resources),
        created_at: Some(now),
    }
}

/// What a finished Job of an approval flow sets in place of its plain
/// outcome: the condition and the event. None: the plain ones stand.
pub struct Settled {
    pub condition: Cond,
    pub note: Note,
}

/// Settles a finished plan, a blocked or plan-changed apply, and the
/// approvals a successful apply consumed.
pub fn settle(
    obj: &impl kube::Resource,
    o: &Object,
    finished: (&Job, Op, Outcome),
    report: Option<&PlanReport>,
    summary: &str,
    plan: &mut Plan,
) -> Option<Settled> {
    let (job, op, outcome) = finished;
    let name = job.name_any();
    let now = Time(plan.draft.now());
    let inputs_hash = annotation(job, INPUTS_HASH).unwrap_or_default();
    match (op, outcome) {
        (Op::Apply, Outcome::Blocked) => {
            let message = format!(
                "Job {name}: {summary}; to apply these inputs anyway: {}",
                approve_command(&o.namespace, &o.name, APPROVE_DESTRUCTIVE_PLAN, inputs_hash)
            );
            Some(Settled {
                condition: Cond::new(
                    APPLY_JOB_SUCCEEDED,
                    Status::False,
                    "DestructivePlanBlocked",
                    message.clone(),
                ),
                note: Note::warning("DestructivePlanBlocked", message).about(job),
            })
        }
        (Op::Apply, Outcome::PlanChanged) => {
            let fresh = report.map(|r| preview(job, r, now));
            let approve = match &fresh {
                Some(p) => format!(
                    "plan {} ({}) is saved; approve it: {}",
                    p.plan_hash,
                    counts(p),
                    approve_command(&o.namespace, &o.name, APPROVE_PLAN, &p.plan_hash)
                ),
                None => "a new plan follows".to_owned(),
            };
            let message = format!("Job {name}: {summary}; {approve}");
            plan.counts
                .push(Count::PlanApproval(ApprovalResult::Changed));
            set_preview(plan, fresh);
            Some(Settled {
                condition: Cond::new(
                    APPLY_JOB_SUCCEEDED,
                    Status::Unknown,
                    "PlanChanged",
                    message.clone(),
                ),
                note: Note::warning("PlanChanged", message).about(job),
            })
        }
        (Op::Plan, Outcome::Succeeded) => {
            let Some(p) = report.map(|r| preview(job, r, now)) else {
                let message = format!("plan Job {name} succeeded without reporting its plan");
                return Some(Settled {
                    condition: Cond::new(
                        APPLY_JOB_SUCCEEDED,
                        Status::False,
                        "ApplyFailed",
                        message.clone(),
                    ),
                    note: Note::warning("JobFailed", message).about(job),
                });
            };
            let condition = match empty(&p) {
                true => Cond::new(
                    APPLY_JOB_SUCCEEDED,
                    Status::Unknown,
                    "PlanAwaitingApproval",
                    format!(
                        "plan {} of Job {name} changes nothing: it is applied without approval",
                        p.plan_hash
                    ),
                ),
                false => awaiting(&o.namespace, &o.name, &p),
            };
            let note = Note::normal(
                "PlanReady",
                format!(
                    "Job {name} planned {} ({}): {}",
                    p.plan_hash,
                    counts(&p),
                    approve_command(&o.namespace, &o.name, APPROVE_PLAN, &p.plan_hash)
                ),
            )
            .about(job);
            set_preview(plan, Some(p));
            Some(Settled { condition, note })
        }
        (Op::Apply, Outcome::Succeeded) => {
            // Once an apply succeeded, no plan waits.
            set_preview(plan, None);
            if let Some(hash) = annotation(job, APPROVED_PLAN) {
                if annotation(obj, APPROVE_PLAN) == Some(hash) {
                    plan.writes.push(Write::Unannotate { key: APPROVE_PLAN });
                }
                plan.notes.push(
                    Note::normal(
                        "PlanApplied",
                        format!("Job {name} applied the approved plan {hash}"),
                    )
                    .about(job),
                );
            }
            if !inputs_hash.is_empty()
                && annotation(obj, APPROVE_DESTRUCTIVE_PLAN) == Some(inputs_hash)
            {
                plan.writes.push(Write::Unannotate {
                    key: APPROVE_DESTRUCTIVE_PLAN,
                });
                plan.counts.push(Count::DestructiveApprovalConsumed);
                plan.notes.push(
                    Note::normal(
                        "DestructivePlanApprovalConsumed",
                        format!("Job {name} applied the approved inputs {inputs_hash}; the approval is removed"),
                    )
                    .about(job),
                );
            }
            None
        }
        _ => None,
    }
}
