//! Settling the Jobs that finished since the last pass (ref §8.1 step 6):
//! each one's result goes to status, its leases and per-run Secret are
//! released, and the state a successful apply or restore wrote is adopted.
//! Pure: the writes go into the plan.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ContainerStateTerminated;
use kube::ResourceExt;

use super::plan::{Chunk, Count, Note, Plan, Write};
use super::{Object, annotation, approvals, drift};
use crate::api::SourceStatus;
use crate::controllers::decide::Finished;
use crate::controllers::ledger::{Outcome, Unsettled};
use crate::controllers::workload::Workload;
use crate::controllers::{bookkeeping, figures};
use crate::jobs::builder::SOURCE_CONTAINER;
use crate::jobs::digest;
use crate::keys::{DRIFT_REMEDIATION, INPUTS_HASH, RESTORE_SERIAL, RESTORE_STATE};
use crate::metrics::RestoreResult;
use crate::names::{self, Op};
use crate::state::{Snapshot, StateReadable};

/// What settling changed that the rest of the pass must take into account.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// This pass's outcomes.
    pub finished: Vec<Finished>,
    /// The state was adopted with this inputs hash (None: a restored
    /// backup that recorded none).
    pub adopted: Option<Option<String>>,
    /// A restore of this serial succeeded.
    pub restored: Option<String>,
    /// An apply succeeded.
    pub applied: bool,
}

fn image_of(job: &Job) -> Option<String> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == SOURCE_CONTAINER)?
        .image
        .clone()
}

/// The state chunks of `suffix` in a readable snapshot; None when the
/// state does not read (it is not adopted then, and the state step says
/// why).
pub fn chunks(snapshot: &Snapshot, o: &Object) -> Option<Vec<Chunk>> {
    let suffix = o.suffix.as_str();
    if !matches!(snapshot.readable, StateReadable::Read(_)) {
        return None;
    }
    let base = names::state_secret(suffix);
    Some(
        snapshot
            .secrets
            .iter()
            .filter_map(|s| {
                let name = s.name_any();
                let is_base = name == base;
                (is_base || names::state_chunk_index(suffix, &name).is_some()).then(|| {
                    let mut owners = s.owner_references().to_vec();
                    if !owners.iter().any(|r| r.uid == o.owner.uid) {
                        owners.push(o.owner.clone());
                    }
                    Chunk {
                        name,
                        resource_version: s.metadata.resource_version.clone(),
                        base: is_base,
                        owner_references: owners,
                        finalizers: s.finalizers().to_vec(),
                    }
                })
            })
            .collect(),
    )
}

pub fn settle<K: Workload>(
    obj: &K,
    o: &Object,
    unsettled: &[Unsettled<'_>],
    terminations: &BTreeMap<String, Option<ContainerStateTerminated>>,
    image_ids: &BTreeMap<String, String>,
    snapshot: Option<&Snapshot>,
    plan: &mut Plan,
) -> Settled {
    let mut settled = Settled::default();
    for u in unsettled {
        let job = u.job;
        let name = job.name_any();
        let term = terminations.get(&name).and_then(Option::as_ref);
        let a = bookkeeping::account(&name, u.op, &u.end, term);
        let status = &mut plan.draft.status;
        status.last_run = Some(a.last_run.clone());
        if let Some(version) = &a.runtime_version {
            status
                .source
                .get_or_insert_with(SourceStatus::default)
                .runtime_version = Some(version.clone());
        }
        plan.counts.push(Count::JobFinished(u.op, a.result));
        plan.figures.push((
            u.op,
            a.result,
            figures::of(
                job,
                &u.end,
                term,
                a.document.as_ref(),
                a.last_run.error.as_ref(),
            ),
        ));
        let op = u.op.as_str();
        let summary = a
            .last_run
            .error
            .as_ref()
            .and_then(|e| e.summary.clone())
            .unwrap_or_default();
        let special = approvals::settle(
            obj,
            o,
            (job, u.op, a.outcome),
            a.plan.as_ref(),
            &summary,
            plan,
        );
        drift::settle(
            obj.drift().1,
            (job, u.op, a.outcome, u.end.at),
            annotation(job, DRIFT_REMEDIATION).is_some(),
            a.plan.as_ref(),
            plan,
        );
        let note = match special {
            Some(s) => {
                plan.draft.set(s.condition);
                Some(s.note)
            }
            None => {
                plan.draft.set(a.condition.clone());
                None
            }
        };
        if a.outcome == Outcome::Succeeded {
            if let Some(image) = image_of(job) {
                plan.draft
                    .status
                    .source
                    .get_or_insert_with(SourceStatus::default)
                    .image = Some(image);
            }
            plan.notes.push(
                note.unwrap_or_else(|| {
                    Note::normal("JobSucceeded", format!("{op} Job {name} succeeded")).about(job)
                })
                .once(),
            );
            if u.op == Op::Apply {
                pin(job, image_ids.get(&name), plan);
            }
            succeeded(obj, o, u.op, job, snapshot, plan, &mut settled);
        } else {
            plan.notes.push(
                note.unwrap_or_else(|| {
                    Note::warning("JobFailed", format!("{op} Job {name} failed: {summary}"))
                        .about(job)
                })
                .once(),
            );
            if u.op == Op::Restore {
                plan.counts.push(Count::Restore(RestoreResult::Failed));
                plan.notes.push(
                    Note::warning(
                        "StateRestoreFailed",
                        format!("restore Job {name} failed: {summary}"),
                    )
                    .about(job),
                );
            }
        }
        let namespace = job.namespace().unwrap_or_else(|| o.namespace.clone());
        plan.writes.push(Write::ReleaseLeases {
            job: name.clone(),
            namespace: namespace.clone(),
        });
        plan.writes.push(Write::DeleteRunSecret {
            job: name.clone(),
            namespace: namespace.clone(),
        });
        plan.bookkept.push((namespace, name, a.outcome));
        settled
            .finished
            .push(a.outcome.finished(u.job, u.op, u.end.at));
    }
    settled
}

/// The digest a successful apply's pod ran, recorded with the applied
/// marker on the durable inputs (ref §8.9).
fn pin(job: &Job, image_id: Option<&String>, plan: &mut Plan) {
    let name = job.name_any();
    let image = image_of(job).unwrap_or_default();
    let digest = image_id.and_then(|id| digest::of_image_id(id));
    plan.draft
        .status
        .source
        .get_or_insert_with(SourceStatus::default)
        .image_digest = image_id
        .filter(|id| !id.is_empty() && id.len() <= 512)
        .cloned();
    plan.notes.push(match &digest {
        Some(d) => Note::normal("DigestPinned", format!("Job {name} ran {image} as {d}")),
        None => Note::warning(
            "DigestUnknown",
            format!("Job {name} ran {image}, but its pod reported no image digest to pin"),
        ),
    });
    plan.writes.push(Write::MarkApplied { digest });
}

/// Adoption after an apply or a restore, the applied marker, and the end
/// of a restore request.
fn succeeded<K: Workload>(
    obj: &K,
    o: &Object,
    op: Op,
    job: &Job,
    snapshot: Option<&Snapshot>,
    plan: &mut Plan,
    settled: &mut Settled,
) {
    if !matches!(op, Op::Apply | Op::Restore) {
        return;
    }
    let hash = annotation(job, INPUTS_HASH).map(str::to_owned);
    if let Some(chunks) = snapshot.and_then(|s| chunks(s, o)) {
        let note = match &hash {
            Some(h) => format!(
                "adopted the state of the {} with inputs hash {h}",
                op.as_str()
            ),
            None => "adopted the restored state; its backup recorded no inputs hash".to_owned(),
        };
        plan.writes.push(Write::Adopt {
            chunks,
            inputs_hash: hash.clone(),
        });
        plan.notes
            .push(Note::normal("StateAdopted", note).about(job).once());
        settled.adopted = Some(hash);
    }
    if op == Op::Apply {
        settled.applied = true;
        return;
    }
    let Some(serial) = annotation(job, RESTORE_SERIAL) else {
        return;
    };
    if annotation(obj, RESTORE_STATE) == Some(serial) {
        plan.writes.push(Write::RemoveRestoreRequest {
            serial: serial.to_owned(),
        });
    }
    plan.counts.push(Count::Restore(RestoreResult::Succeeded));
    plan.notes.push(
        Note::normal(
            "StateRestored",
            format!(
                "Job {} restored the state from backup serial {serial}",
                job.name_any()
            ),
        )
        .once(),
    );
    settled.restored = Some(serial.to_owned());
}
