//! The decision of a live pass without an active Job (ref §8.2): a
//! requested restore first, then an apply when one is due, backing off
//! after failures. Pure.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;

use super::annotation;
use super::approvals::{self, plan_preview};
use super::common::{Common, Unrendered};
use super::drift;
use super::observe::Rest;
use super::plan::{Plan, Requeue, Write};
use super::settle::Settled;
use super::start;
use super::{Object, Pass};
use crate::backups::restore::{self, Current, Request};
use crate::controllers::approval::{self, Gated};
use crate::controllers::conditions::{self, Cond, Status};
use crate::controllers::decide::{self, Decision, Facts, JobReason};
use crate::controllers::ledger;
use crate::controllers::workload::Workload;
use crate::jobs::builder::ApplyMode;
use crate::jobs::digest;
use crate::keys::{APPROVE_DESTRUCTIVE_PLAN, APPROVE_PLAN};
use crate::keys::{RESTORE_SERIAL, RESTORE_STATE};
use crate::names::Op;
use crate::state::StateReadable;

/// The restore the object asks for, when it has to start now; the
/// conditions say why one that cannot start waits.
fn restore_due<K: Workload>(
    obj: &K,
    o: &Object,
    rest: &Rest,
    settled: &Settled,
    jobs: &[Job],
    plan: &mut Plan,
) -> Result<Option<restore::Push>, ()> {
    let raw = obj
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESTORE_STATE))
        .map(String::as_str);
    // A restore that succeeded in this pass has answered the request.
    let Some(raw) = raw.filter(|r| settled.restored.as_deref() != Some(*r)) else {
        return Ok(None);
    };
    let failed_before = jobs.iter().any(|j| {
        ledger::op(j) == Some(Op::Restore)
            && j.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(RESTORE_SERIAL))
                .map(String::as_str)
                == Some(raw)
            && ledger::job_end(j).is_some_and(|e| !e.succeeded)
    });
    let current = match &rest.snapshot.readable {
        StateReadable::Read(state) => Current::Read {
            serial: state.serial,
        },
        _ => Current::NothingToKeep,
    };
    let observed = obj
        .workspace_status()
        .and_then(|s| s.observed_state_serial)
        .and_then(|s| u64::try_from(s).ok());
    let request = restore::request(
        raw,
        &o.suffix,
        &rest.backups,
        failed_before,
        current,
        observed,
    );
    match request {
        Request::Push(push) => Ok(Some(push)),
        // This pass backs the state up: the restore follows once the set
        // is seen whole.
        Request::NotBackedUp(_)
            if plan
                .writes
                .iter()
                .any(|w| matches!(w, Write::TakeBackup { .. })) =>
        {
            Err(())
        }
        Request::NotBackedUp(why) => {
            plan.draft.set(Cond::new(
                conditions::RESTORE_JOB_SUCCEEDED,
                Status::False,
                "CurrentStateNotBackedUp",
                why,
            ));
            Err(())
        }
        Request::NotFound(why) => {
            plan.draft.set(Cond::new(
                conditions::RESTORE_JOB_SUCCEEDED,
                Status::False,
                "RestoreBackupNotFound",
                why,
            ));
            Err(())
        }
        Request::FailedBefore => Err(()),
    }
}

/// The refresh or drift check the schedule calls for now, unless its
/// failures back off; only from a readable state.
fn scheduled<K: Workload>(p: &Pass<'_, K>, c: &Common, plan: &mut Plan) -> Option<(Op, JobReason)> {
    if !matches!(c.assessment.fact, decide::StateFact::Read { .. }) {
        return None;
    }
    let (op, reason) = drift::due(p, plan)?;
    let limit = c.settings.failed_jobs_history_limit;
    if let Some((wait, failures)) = decide::backing_off(p.finished, op, limit, plan.draft.now()) {
        plan.logs.push(format!(
            "{} due ({}) but backing off after {failures} failures",
            op.as_str(),
            reason.as_str()
        ));
        plan.requeue = Requeue::After(wait + Duration::from_secs(1));
        return None;
    }
    Some((op, reason))
}

pub fn plan<K: Workload>(p: &Pass<'_, K>, c: &Common, plan: &mut Plan) {
    let Pass {
        obj,
        o,
        rest,
        settled,
        finished,
        jobs,
        settings,
        ..
    } = *p;
    let idle = Requeue::After(settings.sync_period);
    plan.requeue = idle;
    let rendered = match &c.rendered {
        Ok(r) => r,
        // DependenciesReady says it.
        Err(Unrendered::Waiting) => return,
        Err(Unrendered::Invalid(e)) => {
            plan.draft.set(Cond::new(
                conditions::APPLY_JOB_SUCCEEDED,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            return;
        }
    };
    let Ok(restore) = restore_due(obj, o, rest, settled, jobs, plan) else {
        return;
    };
    let decision = decide::decide(&Facts {
        state: c.assessment.fact.clone(),
        inputs_hash: Some(rendered.inputs_hash.clone()),
        mutable: K::MUTABLE,
        finished: finished.to_vec(),
        failed_jobs_history_limit: c.settings.failed_jobs_history_limit,
        now: plan.draft.now(),
        restore_requested: restore.is_some(),
        remediate: drift::remediate(p, c, plan),
    });
    let (op, reason) = match decision {
        Decision::Idle => match scheduled(p, c, plan) {
            Some(due) => due,
            None => return,
        },
        Decision::Backoff {
            wait,
            failures,
            reason,
        } => {
            plan.logs.push(format!(
                "apply due ({}) but backing off after {failures} failures",
                reason.as_str()
            ));
            plan.requeue = Requeue::After(wait + Duration::from_secs(1));
            return;
        }
        Decision::Restore => (Op::Restore, JobReason::RestoreRequested),
        Decision::Apply(reason) => (Op::Apply, reason),
    };
    let preview = plan_preview(plan);
    let mode = match op {
        Op::Apply => approval::gate(&approval::Facts {
            policy: obj.approval(),
            reason,
            inputs_hash: &rendered.inputs_hash,
            finished,
            approve_destructive: annotation(obj, APPROVE_DESTRUCTIVE_PLAN),
            approve_plan: annotation(obj, APPROVE_PLAN),
            plan: preview.as_ref(),
            failed_jobs_history_limit: c.settings.failed_jobs_history_limit,
            now: plan.draft.now(),
        }),
        _ => Gated::Apply(ApplyMode::Direct),
    };
    let (op, mode, reason) = match mode {
        Gated::Apply(mode) => (op, mode, reason),
        Gated::Plan => (Op::Plan, ApplyMode::Direct, reason),
        Gated::PlanBackoff { wait, failures } => {
            plan.logs.push(format!(
                "plan due ({}) but backing off after {failures} failures",
                reason.as_str()
            ));
            plan.requeue = Requeue::After(wait + Duration::from_secs(1));
            return;
        }
        // ApplyJobSucceeded, set when the guarded apply stopped, says why.
        // A blocked remediation does not keep drift checks from running.
        Gated::Blocked => {
            plan.requeue = Requeue::After(approval::APPROVAL_RECHECK);
            if reason != JobReason::Remediation {
                return;
            }
            match scheduled(p, c, plan) {
                Some((op, why)) => (op, ApplyMode::Direct, why),
                None => return,
            }
        }
        Gated::AwaitingApproval(waiting) => {
            let told = matches!(
                plan.draft.status_of(conditions::APPLY_JOB_SUCCEEDED),
                Some((Status::Unknown, "PlanAwaitingApproval" | "PlanChanged"))
            );
            if !told {
                plan.draft
                    .set(approvals::awaiting(&o.namespace, &o.name, waiting));
            }
            plan.requeue = Requeue::After(approval::APPROVAL_RECHECK);
            return;
        }
    };
    if c.paused {
        plan.logs.push(format!(
            "{} due ({}) but paused",
            op.as_str(),
            reason.as_str()
        ));
        return;
    }
    let Some(identity) = c.credentials.identity.as_deref() else {
        // IdentityAllowed or CredentialsMirrored says why.
        return;
    };
    if plan
        .draft
        .status_of(conditions::APPLY_JOB_SUCCEEDED)
        .is_none()
    {
        plan.draft.set(Cond::new(
            conditions::APPLY_JOB_SUCCEEDED,
            Status::Unknown,
            "NoApplyYet",
            "no apply has run yet",
        ));
    }
    if reason == JobReason::Remediation {
        plan.draft.set(Cond::new(
            conditions::DRIFT_DETECTED,
            Status::True,
            "DriftRemediating",
            "a remediation apply runs",
        ));
    }
    let pinned = c.durable.as_ref().and_then(|d| d.digest.as_deref());
    let (image, unknown) = digest::image_for(K::KIND, op, &obj.workspace().source.image, pinned);
    if unknown {
        plan.notes.push(super::deleting::digest_unknown(&image));
    }
    let start = start::build(
        obj,
        o,
        settings,
        &start::Request {
            op,
            rendered,
            image: &image,
            policy: &c.settings,
            identity: Some(identity),
            force_unlock: c.assessment.force_unlock.as_deref(),
            reason,
            restore: restore.as_ref(),
            jobs,
            mode,
        },
    );
    plan.writes.push(Write::Start(Box::new(start)));
}
