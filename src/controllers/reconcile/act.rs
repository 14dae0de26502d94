//! Carrying out a plan: the writes in order, stopping at the first failure
//! (a failed backup copy excepted: the book retries it on the next pass);
//! then the events, the one status write (none when the status is the
//! object's already), the condition events, the
//! bookkept marks and the counters. Nothing here decides: a write's own
//! outcome only fills in what the plan left to it (the Job that exists,
//! the serial that is backed up, the lease that is held).

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::{debug, warn};

use super::finalizer::{delete_if_present, release_finalizer};
use super::launch::{self, Launched};
use super::plan::{Count, Note, Plan, Requeue, Write};
use super::record::record;
use super::version::{Version, stale};
use super::{Object, finish};
use crate::capi::autoscaling::{self, WriteBack};
use crate::capi::objects::{Machine, MachinePool};
use crate::controllers::conditions::{
    CREDENTIALS_MIRRORED, Cond, IDENTITY_ALLOWED, OUTPUTS_VALID, Status,
};
use crate::controllers::credentials;
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error, MANAGER};
use crate::jobs::durable;
use crate::jobs::leases;
use crate::keys::{
    BOOKKEPT, INPUTS_HASH, PROTECTED_LABEL, PROTECTION, REMEDIATE_MACHINE, REMEDIATION_REQUESTED,
    REPLICAS_MANAGED_BY, RESTORE_STATE,
};
use crate::metrics::{BackupResult, IdentityDenied};
use crate::names::{self, Kind};
use crate::protection;

/// How the writes go on after one of them.
pub enum Flow {
    Continue,
    /// A wait (a held lease, refused RBAC): the rest of the writes wait
    /// too, and the object is looked at again after this long (or the
    /// sync period).
    Wait(Option<Duration>),
    /// The finalizer is gone, and with it the object: no status to write.
    Released,
}

pub async fn act<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    mut plan: Plan,
    deleting: bool,
) -> Result<Action, Error> {
    let mut failure = None;
    let mut backup_failed = false;
    let mut version = Version::read(obj);
    for write in std::mem::take(&mut plan.writes) {
        if backup_failed && matches!(write, Write::PruneBackups { .. }) {
            // Pruned against a set that was not written: next pass.
            continue;
        }
        let outcome = match write {
            Write::TakeBackup { set, observed } => {
                backup(ctx, obj, o, &mut plan, set, observed, &mut backup_failed).await;
                Ok(Flow::Continue)
            }
            write => perform(ctx, obj, o, &mut plan, &mut version, write).await,
        };
        match outcome {
            Ok(Flow::Continue) => {}
            Ok(Flow::Wait(recheck)) => {
                if let Some(after) = recheck {
                    plan.requeue = Requeue::After(after);
                }
                break;
            }
            Ok(Flow::Released) => return Ok(Action::await_change()),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    for line in &plan.logs {
        warn!(namespace = %o.namespace, name = %o.name, "{line}");
    }
    for note in &plan.notes {
        record(ctx, obj, o, note).await;
    }
    if let Some(gauges) = plan.gauges {
        ctx.metrics
            .state_read(K::KIND, &o.namespace, &o.name, gauges);
    }
    let started = finish(&mut plan, K::KIND, deleting);
    // A status the object already has costs no write.
    if obj.workspace_status() != Some(&plan.draft.status) || obj.kind_status() != plan.kind_status {
        apply_status::<K>(ctx, o, &plan, &version).await?;
    }
    observe_metrics::<K>(ctx, o, &plan);
    for t in &plan.draft.transitions {
        if let Some(note) = super::condition_note(t) {
            record(ctx, obj, o, &note).await;
        }
    }
    if started {
        record(
            ctx,
            obj,
            o,
            &Note::normal(
                "DeletionStarted",
                "the object is being deleted: destroy, then cleanup",
            ),
        )
        .await;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    // Marked only once the status that accounts for them is written.
    for (namespace, job, outcome) in &plan.bookkept {
        let patch = json!({"metadata": {"annotations": {BOOKKEPT: outcome.as_str()}}});
        let answer = Api::<Job>::namespaced(ctx.client.clone(), namespace)
            .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::Kube)?;
        ctx.bookkept.wrote(&answer, outcome.as_str());
    }
    for count in &plan.counts {
        match *count {
            Count::JobFinished(op, result) => ctx.metrics.job_finished(K::KIND, op, result),
            Count::StateReadError(reason) => ctx.metrics.state_read_error(K::KIND, reason),
            Count::Backups(result, n) => ctx.metrics.state_backups(K::KIND, result, n),
            Count::Restore(result) => ctx.metrics.state_restore(K::KIND, result),
            Count::PlanApproval(result) => ctx.metrics.plan_approval(K::KIND, result),
            Count::DestructiveApprovalConsumed => {
                ctx.metrics.destructive_approval_consumed(K::KIND)
            }
            Count::Drift {
                add,
                change,
                destroy,
            } => ctx.metrics.drift_found(K::KIND, add, change, destroy),
            Count::Attempts(op, n) => ctx.metrics.job_attempts(K::KIND, op, n),
            Count::Remediation(action) => ctx.metrics.remediation(action),
        }
    }
    Ok(match plan.requeue {
        Requeue::After(after) => Action::requeue(after),
        Requeue::OnChange => Action::await_change(),
    })
}

/// A backup copy: its serial is observed only once it is written; a
/// failed one leaves no partial set, is counted as skipped and is tried
/// again next pass.
async fn backup<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    plan: &mut Plan,
    set: crate::backups::BackupSet,
    observed: i64,
    failed: &mut bool,
) {
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace);
    match crate::backups::take(&secrets, &set).await {
        Ok(crate::backups::Taken::Already) => {
            plan.draft.status.observed_state_serial = Some(observed);
        }
        Ok(crate::backups::Taken::New(created)) => {
            if created.len() == set.secrets.len() {
                super::cached::took_backup(ctx, o, set.serial, &created);
            }
            plan.counts.push(Count::Backups(BackupResult::Taken, 1));
            plan.draft.status.observed_state_serial = Some(observed);
            let name = names::backup_secret(&o.suffix, set.serial);
            record(
                ctx,
                obj,
                o,
                &Note::normal(
                    "StateBackedUp",
                    format!("state serial {} backed up to {name}", set.serial),
                )
                .once(),
            )
            .await;
        }
        Err(e) => {
            warn!(namespace = %o.namespace, name = %o.name, "backing up state serial {} failed: {e}", set.serial);
            plan.counts.push(Count::Backups(BackupResult::Skipped, 1));
            let entries = plan.draft.status.state_backups.take().unwrap_or_default();
            let kept: Vec<_> = entries
                .into_iter()
                .filter(|b| u64::try_from(b.serial).ok() != Some(set.serial))
                .collect();
            // The CRD takes no empty list.
            plan.draft.status.state_backups = (!kept.is_empty()).then_some(kept);
            *failed = true;
        }
    }
    // The set's copy of the state, its bodies and the Secrets as created
    // are freed by now: handed back at once, as after a state's read.
    drop(set);
    crate::state::hand_back_freed_pages();
}

async fn perform<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    plan: &mut Plan,
    version: &mut Version,
    write: Write,
) -> Result<Flow, Error> {
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace);
    let leases_api = Api::<Lease>::namespaced(ctx.client.clone(), &o.namespace);
    match write {
        Write::Mirror(w) => {
            match credentials::write(&ctx.client, &o.namespace, &w).await {
                Ok(()) => {}
                // The objects of a namespace share its mirror, so their
                // passes race to write it: the one that lost reads the
                // mirror again (in a second) instead of reporting a failure.
                Err(kube::Error::Api(e)) if e.code == 409 => return Err(Error::Stale),
                Err(e) => {
                    let why = format!("writing Secret {}: {e}", w.name());
                    plan.draft.set(Cond::new(
                        CREDENTIALS_MIRRORED,
                        Status::False,
                        "MirrorFailed",
                        why.clone(),
                    ));
                    return Err(Error::Mirror(why));
                }
            }
        }
        Write::Adopt {
            chunks,
            inputs_hash,
        } => {
            let mut patched = Vec::with_capacity(chunks.len());
            for chunk in chunks {
                let mut metadata = json!({
                    "ownerReferences": chunk.owner_references,
                    "resourceVersion": chunk.resource_version,
                });
                if chunk.base {
                    // Only the base is protected: Terraform deletes surplus
                    // chunks itself, and one held back would break its
                    // next read.
                    let mut finalizers = chunk.finalizers;
                    if !finalizers.iter().any(|f| f == PROTECTION) {
                        finalizers.push(PROTECTION.to_owned());
                    }
                    metadata["annotations"] = json!({ INPUTS_HASH: inputs_hash });
                    metadata["finalizers"] = json!(finalizers);
                    metadata["labels"] = json!({ PROTECTED_LABEL: "true" });
                }
                let answer = secrets
                    .patch(
                        &chunk.name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({ "metadata": metadata })),
                    )
                    .await
                    .map_err(Error::Kube)?;
                patched.push((chunk.resource_version, answer));
            }
            super::cached::adopted(ctx, o, patched);
            let lock = names::state_lock_lease(&o.suffix);
            let seen = ctx.watches.lock_leases.get(&o.namespace, &lock);
            protection::protect_existing(&leases_api, &lock, seen.as_deref())
                .await
                .map_err(Error::Kube)?;
        }
        Write::MarkApplied { digest } => {
            let written = durable::mark_applied(&secrets, K::KIND, &o.name, digest.as_deref())
                .await
                .map_err(Error::Kube)?;
            if let Some(written) = written {
                super::cached::wrote_durable(ctx, o, written);
            }
        }
        Write::Patch(patch) => version.patch::<K>(ctx, o, patch).await?,
        Write::Annotate { key, value } => {
            let patch = json!({"metadata": {"annotations": {key: value}}});
            version.patch::<K>(ctx, o, patch).await?;
        }
        Write::RemediateMachine { machine, reason } => {
            let patch = json!({"metadata": {"annotations": {
                REMEDIATE_MACHINE: reason.as_ref().map(|_| ""),
                REMEDIATION_REQUESTED: reason,
            }}});
            Api::<Machine>::namespaced(ctx.client.clone(), &o.namespace)
                .patch(&machine, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::Kube)?;
        }
        Write::MachinePoolReplicas { pool, write_back } => {
            write_machine_pool(ctx, obj, o, &pool, &write_back).await?;
        }
        Write::Unannotate { key } => {
            let patch = json!({"metadata": {"annotations": {key: null}}});
            version.patch::<K>(ctx, o, patch).await?;
        }
        Write::RemoveRestoreRequest { serial } => {
            debug!(%serial, "the restore request is answered");
            let patch = json!({"metadata": {"annotations": {RESTORE_STATE: null}}});
            version.patch::<K>(ctx, o, patch).await?;
        }
        Write::ReleaseLeases { job, namespace } => {
            let api = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
            leases::release(&api, &names::run_lease(&o.suffix), &job).await?;
            if let (Kind::Cluster, Some(cluster)) = (K::KIND, obj.cluster_name()) {
                let gate = names::cluster_write_lease(&o.namespace, cluster);
                leases::release(&api, &gate, &job).await?;
            }
        }
        Write::DeleteRunSecret { job, namespace } => {
            let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
            delete_if_present(&api, &names::run_secret(&job), None).await?
        }
        Write::TakeBackup { .. } => {}
        Write::PruneBackups {
            sets,
            secrets: doomed,
        } => {
            crate::backups::delete_sets(&secrets, &doomed)
                .await
                .map_err(Error::Backup)?;
            plan.counts.push(Count::Backups(BackupResult::Pruned, sets));
        }
        Write::Start(start) => {
            return Ok(
                match launch::launch(ctx, obj, o, &mut plan.draft, version, *start).await? {
                    Launched::Started => Flow::Continue,
                    Launched::Waiting { recheck } => Flow::Wait(recheck),
                },
            );
        }
        Write::DeleteSecrets(names) => {
            for name in names {
                delete_if_present(&secrets, &name, None).await?;
            }
        }
        Write::DeleteDurable { uid } => {
            let name = names::inputs_secret(K::KIND, &o.name);
            delete_if_present(&secrets, &name, Some(uid)).await?;
        }
        Write::DeleteState(secrets_read) => {
            for read in secrets_read {
                protection::delete_as_read(&secrets, &read)
                    .await
                    .map_err(Error::Kube)?;
            }
        }
        Write::DeleteLock(read) => protection::delete_as_read(&leases_api, &read)
            .await
            .map_err(Error::Kube)?,
        Write::DeleteLeases { namespace, names } => {
            let api = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
            for name in names {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(Error::Kube(e)),
                }
            }
        }
        Write::DeleteJobs { namespace, names } => {
            let api = Api::<Job>::namespaced(ctx.client.clone(), &namespace);
            for name in names {
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(Error::Kube(e)),
                }
            }
        }
        Write::ReleaseBackups(names) => {
            // The garbage collector takes them with the object.
            for name in names {
                protection::unprotect(&secrets, &name)
                    .await
                    .map_err(Error::Kube)?;
            }
        }
        Write::ReleaseMirrors => {
            let removed = credentials::drop_user(&ctx.client, &o.namespace, &o.uid)
                .await
                .map_err(Error::Kube)?;
            for mirror in removed {
                let note =
                    format!("credentials mirror {mirror} deleted: this object was its last user");
                record(ctx, obj, o, &Note::normal("MirrorRemoved", note)).await;
            }
        }
        Write::RemoveFinalizer { why } => {
            release_finalizer(ctx, obj, o, why).await?;
            return Ok(Flow::Released);
        }
    }
    Ok(Flow::Continue)
}

/// The per-object series and the counters of transitions, from what the
/// pass wrote.
fn observe_metrics<K: Workload>(ctx: &Context, o: &Object, plan: &Plan) {
    let m = &ctx.metrics;
    let (ns, name) = (o.namespace.as_str(), o.name.as_str());
    m.conditions(K::KIND, ns, name, &plan.draft.status);
    let active = plan.draft.status.active_job.as_ref().map(|j| j.operation);
    m.active_job(K::KIND, ns, name, active);
    if let Some(bytes) = plan.inputs_bytes {
        m.inputs_bytes(K::KIND, ns, name, bytes);
    }
    for (op, at) in &plan.last_success {
        m.last_success(K::KIND, ns, name, *op, *at);
    }
    if K::KIND == Kind::Machine {
        let samples = plan
            .kind_status
            .get(super::drift::UNHEALTHY_SAMPLES)
            .and_then(|v| v.as_u64());
        m.unhealthy_samples(ns, name, samples);
    }
    for (op, result, figures) in &plan.figures {
        m.job_accounted(K::KIND, *op, *result, figures);
    }
    for t in &plan.draft.transitions {
        if t.to != Status::False {
            continue;
        }
        match (t.type_, t.reason) {
            (IDENTITY_ALLOWED, "IdentityNotFound") => m.identity_denied(IdentityDenied::NotFound),
            (IDENTITY_ALLOWED, "NamespaceNotAllowed") => {
                m.identity_denied(IdentityDenied::Namespace)
            }
            (OUTPUTS_VALID, reason) => m.outputs_invalid(K::KIND, reason),
            _ => {}
        }
    }
}

/// The whole computed status, applied server-side: what this pass no
/// longer sets is removed.
/// Conditioned on the version the pass built on.
async fn apply_status<K: Workload>(
    ctx: &Context,
    o: &Object,
    plan: &Plan,
    version: &Version,
) -> Result<(), Error> {
    let mut status = serde_json::to_value(&plan.draft.status).map_err(Error::Encode)?;
    if let Some(fields) = status.as_object_mut() {
        fields.extend(plan.kind_status.clone());
    }
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"resourceVersion": version.get()},
        "status": status,
    });
    Api::<K>::namespaced(ctx.client.clone(), &o.namespace)
        .patch_status(
            &o.name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(stale)?;
    Ok(())
}

/// Claims or releases a MachinePool's replicas and writes the module's
/// count back to it, in one merge patch.
async fn write_machine_pool<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    pool: &str,
    w: &WriteBack,
) -> Result<(), Error> {
    let mut patch = json!({});
    if w.claim {
        patch["metadata"] = json!({"annotations": {REPLICAS_MANAGED_BY: autoscaling::CLAIM}});
    }
    if w.release {
        patch["metadata"] = json!({"annotations": {REPLICAS_MANAGED_BY: null}});
    }
    if let Some((_, to)) = w.replicas {
        patch["spec"] = json!({"replicas": to});
    }
    Api::<MachinePool>::namespaced(ctx.client.clone(), &o.namespace)
        .patch(pool, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::Kube)?;
    if let Some((from, to)) = w.replicas {
        let from = from.map_or_else(|| "unset".to_string(), |n| n.to_string());
        let note = format!("MachinePool {pool} spec.replicas {from} → {to}");
        record(ctx, obj, o, &Note::normal("ReplicasWrittenBack", note)).await;
    }
    Ok(())
}
