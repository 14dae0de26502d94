//! One reconcile pass of a workload object (ref §8.1, the steps this manager
//! runs so far), in the shape of every pass:
//!
//! 1. lifecycle: an externally managed object is skipped; then the
//!    finalizer (added, or the object released);
//! 2. observe: every read of the pass, once, into one plain value
//!    ([`observe`]);
//! 3. decide, pure: settle the Jobs that finished ([`settle`]), then the
//!    steps every pass takes ([`common`]) and the live ([`live`]) or
//!    deleting ([`deleting`]) decision, into one [`plan::Plan`];
//! 4. act: the plan's writes in order, then one status write ([`act`]).

mod act;
mod approvals;
mod cached;
mod common;
mod deleting;
mod dependencies;
mod drift;
mod finalizer;
mod launch;
mod live;
mod mapping;
mod observe;
mod owners;
mod plan;
mod record;
mod remediate;
mod settle;
mod start;
mod version;

pub use cached::Bookkept;
pub use launch::UndoneStarts;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, debug_span};

use super::conditions::{self, Cond, Status, Transition};
use super::decide::Finished;
use super::deletion::{self, Lifecycle};
use super::workload::Workload;
use super::{Context, Error, Settings};
use super::{history, ledger};
use crate::api::ActiveJob;
use crate::keys::BLOCK_MOVE;
use crate::names;
use crate::server::requests::counting;
use observe::Observed;
use plan::{Count, Draft, Note, Plan, Requeue, Write};

/// Everything a decision of a pass without an active Job looks at.
pub struct Pass<'a, K> {
    pub obj: &'a K,
    pub o: &'a Object,
    pub rest: &'a observe::Rest,
    pub settled: &'a settle::Settled,
    /// Finished Jobs, newest first, this pass's outcomes included.
    pub finished: &'a [Finished],
    pub jobs: &'a [k8s_openapi::api::batch::v1::Job],
    pub settings: &'a Settings,
    pub deleting: bool,
    /// A destroy succeeded: a missing state is cleaned up, not lost.
    pub destroyed: bool,
}

/// Who the pass is about.
pub struct Object {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub suffix: String,
    /// A non-controller owner reference to the object: on its backups, its
    /// adopted state, its durable inputs and its share of the mirror.
    pub owner: OwnerReference,
    /// Its namespace is being deleted, as observed: no event can be
    /// recorded there.
    pub namespace_terminating: bool,
}

impl Object {
    fn of<K: Workload>(obj: &K) -> Result<Object, Error> {
        let meta = obj.meta();
        let namespace = meta
            .namespace
            .clone()
            .ok_or(Error::MissingMetadata("namespace"))?;
        let name = meta.name.clone().ok_or(Error::MissingMetadata("name"))?;
        let uid = meta.uid.clone().ok_or(Error::MissingMetadata("uid"))?;
        Ok(Object {
            suffix: names::suffix(&namespace, K::KIND, &name),
            owner: OwnerReference {
                api_version: K::api_version(&()).into_owned(),
                kind: K::kind(&()).into_owned(),
                name: name.clone(),
                uid: uid.clone(),
                controller: None,
                block_owner_deletion: None,
            },
            namespace,
            name,
            uid,
            namespace_terminating: false,
        })
    }
}

/// How soon a pass that came before the stores listed is tried again.
const LISTING_RECHECK: std::time::Duration = std::time::Duration::from_millis(200);

pub async fn reconcile<K: Workload>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    // An unlisted store reads as "no such object" (a machine's cluster,
    // so its identity). Looked at again shortly rather than waited for
    // here: a pass holds one of the controller's slots, and the stores
    // list only while the controllers go on taking events.
    if !*ctx.listed.borrow() {
        return Ok(Action::requeue(LISTING_RECHECK));
    }
    let span = debug_span!("pass");
    let (outcome, requests) = counting(span, pass(obj.as_ref(), &ctx)).await;
    if let Some(requests) = requests {
        debug!(
            kind = %K::KIND.kind(),
            namespace = %obj.namespace().unwrap_or_default(),
            name = %obj.name_any(),
            requests,
            "pass"
        );
    }
    ctx.metrics.reconciled(K::KIND, outcome.is_err());
    outcome
}

async fn pass<K: Workload>(obj: &K, ctx: &Context) -> Result<Action, Error> {
    // Something else manages it: skipped entirely, status included (ref
    // §8.1 step 1).
    if owners::externally_managed(obj) {
        return Ok(Action::await_change());
    }
    let mut o = Object::of(obj)?;
    let deleting = match deletion::lifecycle(
        K::KIND,
        obj.meta().deletion_timestamp.is_some(),
        obj.finalizers(),
    ) {
        Lifecycle::AddFinalizer => {
            finalizer::add_finalizer(ctx, obj, &o).await?;
            // The write itself wakes the next pass.
            return Ok(Action::await_change());
        }
        Lifecycle::Released => return Ok(Action::await_change()),
        Lifecycle::Live => false,
        Lifecycle::Deleting => true,
    };
    let observed = observe::observe(ctx, obj, &o, deleting).await?;
    o.namespace_terminating = observed
        .rest
        .as_ref()
        .is_some_and(|r| r.namespace_terminating);
    let plan = decide(
        obj,
        &o,
        &observed,
        &ctx.settings,
        Timestamp::now(),
        deleting,
    );
    act::act(ctx, obj, &o, plan, deleting).await
}

/// The whole decision of a pass, from what it observed. Pure.
fn decide<K: Workload>(
    obj: &K,
    o: &Object,
    observed: &Observed,
    settings: &Settings,
    now: Timestamp,
    deleting: bool,
) -> Plan {
    let mut status = obj.workspace_status().cloned().unwrap_or_default();
    status.state_secret_suffix = Some(o.suffix.clone());
    status.observed_generation = obj.meta().generation;
    let draft = Draft::new(status, obj.meta().generation, now);
    let mut plan = Plan::new(draft, Requeue::After(settings.sync_period));
    plan.kind_status = obj.kind_status();
    let ledger = ledger::ledger(&observed.jobs);
    let (Some(rest), None) = (&observed.rest, ledger.active) else {
        // A runner works on the object: nothing is read or decided. The
        // Job's own status changes wake the next pass.
        if let Some(job) = &observed.stuck {
            let name = job.name_any();
            let namespace = job.namespace().unwrap_or_else(|| o.namespace.clone());
            plan.notes.push(
                Note::warning(
                    "StuckJobDeleted",
                    format!(
                        "Job {name} could not start for over a minute: its per-run Secret {} is missing; it is deleted and the object decides anew",
                        names::run_secret(&name)
                    ),
                )
                .about(job),
            );
            plan.writes.push(Write::DeleteJobs {
                namespace: namespace.clone(),
                names: vec![name.clone()],
            });
            plan.writes.push(Write::ReleaseLeases {
                job: name,
                namespace,
            });
            plan.requeue = Requeue::After(Duration::from_secs(1));
            return plan;
        }
        if let Some(job) = ledger.active {
            let op = ledger::op(job).unwrap_or(names::Op::Apply);
            plan.draft.status.active_job = Some(ActiveJob {
                name: job.name_any(),
                operation: op,
                attempt: i32::try_from(ledger::attempt(job)).unwrap_or(1).max(1),
                start_time: job.metadata.creation_timestamp.clone(),
            });
            if deleting {
                plan.deleting = Some(Cond::new(
                    conditions::DELETING,
                    Status::True,
                    "Deleting",
                    format!("waiting for Job {} to finish", job.name_any()),
                ));
            }
            // Looked at again once it could count as stuck; a Job that
            // starts wakes the object before that.
            if let Some(created) = job.metadata.creation_timestamp.as_ref() {
                let age = Duration::try_from(created.0.duration_until(now)).unwrap_or_default();
                if let Some(left) = observe::STUCK_AFTER.checked_sub(age) {
                    plan.requeue = Requeue::After(left + Duration::from_secs(1));
                }
            }
        }
        return plan;
    };
    plan.draft.status.active_job = None;
    let settled = settle::settle(
        obj,
        o,
        &ledger.unsettled,
        &observed.terminations,
        &observed.image_ids,
        Some(&rest.snapshot),
        &mut plan,
    );
    // Each success took 1 + the failures of its op since the success
    // before it (ref §5 captf_job_attempts).
    for done in settled.finished.iter().filter(|f| f.succeeded) {
        let failures = ledger
            .finished
            .iter()
            .filter(|f| f.op == done.op)
            .take_while(|f| !f.succeeded)
            .filter(|f| f.counts_for_backoff)
            .count();
        plan.counts.push(Count::Attempts(
            done.op,
            u32::try_from(failures)
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        ));
    }
    let finished = ledger::with_settled(ledger.finished, &settled.finished);
    if deleting && !settled.finished.is_empty() {
        // The outcome is written before anything is cleaned up, so that
        // status shows the destroy that made cleanup safe.
        plan.requeue = Requeue::After(Duration::from_secs(1));
        return plan;
    }
    let destroyed = finished
        .iter()
        .any(|f| f.op == names::Op::Destroy && f.succeeded);
    let pass = Pass {
        obj,
        o,
        rest,
        settled: &settled,
        finished: &finished,
        jobs: &observed.jobs,
        settings,
        deleting,
        destroyed,
    };
    let c = common::steps(&pass, &mut plan);
    // A drift or refresh success is exported only while checks are
    // scheduled (ref §5).
    let checked = !deleting && !c.paused && drift::scheduled(&pass);
    for op in names::Op::ALL {
        let newest = finished.iter().find(|f| f.op == op && f.succeeded);
        let shown = checked || !matches!(op, names::Op::Drift | names::Op::Refresh);
        plan.last_success
            .push((op, newest.filter(|_| shown).map(|f| f.finished_at)));
    }
    match deleting {
        false => {
            let succeeded = |op: names::Op| {
                settled
                    .finished
                    .iter()
                    .find(|f| f.op == op && f.succeeded)
                    .map(|f| f.finished_at)
            };
            let sampled = [names::Op::Apply, names::Op::Refresh, names::Op::Drift]
                .into_iter()
                .any(|op| succeeded(op).is_some());
            drift::sample::<K>(succeeded(names::Op::Apply), sampled, &mut plan);
            remediate::plan(&pass, &c, &mut plan);
            live::plan(&pass, &c, &mut plan);
            // Last, so that a Job that cannot be deleted keeps no other
            // write from happening.
            let pruned = history::prune(
                &observed.jobs,
                &o.namespace,
                c.settings.successful_jobs_history_limit,
                c.settings.failed_jobs_history_limit,
            );
            if !pruned.is_empty() {
                plan.logs
                    .push(format!("out of the Job history: {}", pruned.join(", ")));
                plan.writes.push(Write::DeleteJobs {
                    namespace: o.namespace.clone(),
                    names: pruned,
                });
            }
        }
        true => deleting::plan(&pass, &c, &mut plan),
    }
    // No Job is active: block-move goes, unless this pass starts one.
    let starts = plan.writes.iter().any(|w| matches!(w, Write::Start(_)));
    if has_annotation(obj, BLOCK_MOVE) && !starts {
        plan.writes.push(Write::Unannotate { key: BLOCK_MOVE });
    }
    plan
}

/// The value of the annotation `key`.
pub fn annotation<'a>(obj: &'a impl kube::Resource, key: &str) -> Option<&'a str> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether the object carries the annotation `key`.
pub fn has_annotation(obj: &impl kube::Resource, key: &str) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// The conditions set last: Deleting (once per pass) and Ready. True when
/// the deletion starts in this pass (DeletionStarted is due).
fn finish(plan: &mut Plan, kind: names::Kind, deleting: bool) -> bool {
    let mut started = false;
    if deleting {
        let cond = plan.deleting.take().unwrap_or_else(|| {
            Cond::new(
                conditions::DELETING,
                Status::True,
                "Deleting",
                "the object is being deleted",
            )
        });
        let was_true =
            plan.draft.status_of(conditions::DELETING).map(|(s, _)| s) == Some(Status::True);
        plan.draft.set(cond);
        started = !was_true;
    }
    let ready = match deleting {
        true => Cond::new(
            conditions::READY,
            Status::False,
            "Deleting",
            "the object is being deleted",
        ),
        false => {
            let provisioned = plan
                .draft
                .status
                .initialization
                .as_ref()
                .and_then(|i| i.provisioned)
                .unwrap_or(false);
            let conditions = plan.draft.status.conditions.as_deref().unwrap_or_default();
            conditions::ready(conditions, kind, provisioned)
        }
    };
    plan.draft.set(ready);
    started
}

/// The event of a condition's transition (ref §4). Ready has its own
/// summary and no event; Paused has Paused and Resumed. Any other change
/// of status or reason is a ConditionChanged, a Warning when it enters a
/// bad state. A condition set for the first time is news only when it
/// starts out bad: a new object's dozen first settings are not changes.
fn condition_note(t: &Transition) -> Option<Note> {
    let was = t.from.as_ref().map(|(status, _)| *status);
    match t.type_ {
        conditions::READY => return None,
        conditions::PAUSED => {
            return match (was, t.to) {
                (Some(Status::True), Status::True) | (_, Status::Unknown) => None,
                (_, Status::True) => Some(Note::normal(
                    "Paused",
                    "the object is paused: no Job starts until it is resumed",
                )),
                (Some(Status::True), Status::False) => {
                    Some(Note::normal("Resumed", "the object is no longer paused"))
                }
                (_, Status::False) => None,
            };
        }
        _ => {}
    }
    let bad = conditions::bad(t.type_, t.to, t.reason);
    if t.from.is_none() && !bad {
        return None;
    }
    let from = match &t.from {
        Some((status, reason)) => format!("{}/{reason}", status.as_str()),
        None => "unset".to_string(),
    };
    let to = format!("{}/{}", t.to.as_str(), t.reason);
    let note = format!("{}: {from} -> {to}", t.type_);
    let note = match bad {
        true => Note::warning("ConditionChanged", note),
        false => Note::normal("ConditionChanged", note),
    };
    // One series per condition and state it changed to, so that a
    // describe shows each change rather than the first one counted.
    Some(note.action(format!("{}={to}", t.type_)))
}

#[cfg(test)]
mod tests;
