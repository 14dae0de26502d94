//! One reconcile pass of a workload object (ref §8.1, the steps this manager
//! runs so far): bookkeeping of finished Jobs, the active Job, credentials,
//! runner RBAC, the state, the decision, and the Job start; then one status
//! apply. Deletion (the finalizer, destroy and cleanup) is not handled yet.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::bookkeeping::{self, Accounted, JobEnd};
use super::conditions::{self, Cond, RUNNER_RBAC_READY, STATE_READABLE, Status, Transition};
use super::credentials;
use super::decide::{self, Decision, Facts, Finished, StateFact};
use super::workload::Workload;
use super::{Context, Error, MANAGER};
use crate::api::{ActiveJob, SourceStatus, TerraformCluster, WorkspaceStatus};
use crate::jobs::builder::{self, JobRequest, RestoreRequest};
use crate::jobs::inputs::{self, InputsRequest};
use crate::jobs::leases::{self, Acquired, HolderLookup, JobState, LeaseRequest};
use crate::jobs::{ATTEMPT_LABEL, CLUSTER_NAME_LABEL, OP_LABEL, OWNER_KIND_LABEL, OWNER_NAME_LABEL, policy, rbac};
use crate::backups::{self, BackupDecision};
use crate::locks::{self, Verdict};
use crate::metrics::{self, JobLabels, ObjectLabels, StateReadErrorLabels};
use crate::names::{self, Kind, Op};
use crate::state::{self, StateReadable};

/// On a Job: its result has been accounted into status; the value is the
/// outcome the backoff needs (succeeded, failed, or interrupted).
const BOOKKEPT: &str = "captf.io/bookkept";
/// On an apply Job: the inputs hash it applies, adopted onto the state's
/// base Secret when it succeeds.
const INPUTS_HASH: &str = "captf.io/inputs-hash";

/// Asks for a restore of the backup with this serial (ref §2.1).
const RESTORE_STATE: &str = "captf.io/restore-state";
/// On a restore Job: the backup serial it pushes.
const RESTORE_SERIAL: &str = "captf.io/restore-serial";

/// Lease waits re-check this often (ref §8.4).
const LEASE_RECHECK: Duration = Duration::from_secs(30);

/// The facts of one pass and what it changes, applied at the end.
struct Pass<'a, K: Workload> {
    ctx: &'a Context,
    obj: &'a K,
    namespace: String,
    name: String,
    suffix: String,
    status: WorkspaceStatus,
    transitions: Vec<Transition>,
    now: Timestamp,
}

impl<K: Workload> Pass<'_, K> {
    fn set(&mut self, cond: Cond) {
        let generation = self.obj.meta().generation;
        let conditions = self.status.conditions.get_or_insert_default();
        if let Some(t) = conditions::set(conditions, cond, generation, self.now) {
            self.transitions.push(t);
        }
    }

    fn reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        self.obj.object_ref(&())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let event = Event { type_, reason: reason.into(), note: Some(note), action: reason.into(), secondary: None };
        // An event that cannot be recorded must not fail the pass.
        if let Err(e) = self.ctx.recorder.publish(&event, &self.reference()).await {
            debug!("recording event {reason}: {e}");
        }
    }

    fn labels(&self) -> ObjectLabels {
        ObjectLabels::new(metrics_kind(K::KIND), &self.namespace, &self.name)
    }
}

fn metrics_kind(kind: Kind) -> metrics::Kind {
    match kind {
        Kind::Cluster => metrics::Kind::TerraformCluster,
        Kind::Machine => metrics::Kind::TerraformMachine,
        Kind::MachinePool => metrics::Kind::TerraformMachinePool,
    }
}

fn metrics_op(op: Op) -> metrics::Op {
    match op {
        Op::Apply => metrics::Op::Apply,
        Op::Plan => metrics::Op::Plan,
        Op::Destroy => metrics::Op::Destroy,
        Op::Refresh => metrics::Op::Refresh,
        Op::Drift => metrics::Op::Drift,
        Op::Restore => metrics::Op::Restore,
    }
}

fn parse_op(s: &str) -> Option<Op> {
    Op::ALL.into_iter().find(|op| op.as_str() == s)
}

fn label<'a>(obj: &'a impl Resource, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(obj: &'a impl Resource, key: &str) -> Option<&'a str> {
    obj.meta().annotations.as_ref()?.get(key).map(String::as_str)
}

/// The Jobs of this object: its owner labels, and an owner reference to
/// this very object (a same-named object created later has another UID).
async fn jobs_of<K: Workload>(ctx: &Context, ns: &str, name: &str, uid: &str) -> Result<Vec<Job>, Error> {
    let selector = format!("{OWNER_KIND_LABEL}={},{OWNER_NAME_LABEL}={}", K::KIND.kind(), names::label_value(name));
    let list = Api::<Job>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::Kube)?;
    Ok(list
        .items
        .into_iter()
        .filter(|j| j.owner_references().iter().any(|o| o.uid == uid))
        .collect())
}

/// The final state of a Job's runner container, from its pod.
async fn terminated(ctx: &Context, ns: &str, job: &str) -> Result<Option<ContainerStateTerminated>, Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .map_err(Error::Kube)?;
    Ok(pods.items.into_iter().find_map(|p| {
        p.status?
            .container_statuses?
            .into_iter()
            .find(|c| c.name == "source")?
            .state?
            .terminated
    }))
}

fn job_op(job: &Job) -> Option<Op> {
    label(job, OP_LABEL).and_then(parse_op)
}

fn job_attempt(job: &Job) -> u32 {
    label(job, ATTEMPT_LABEL).and_then(|a| a.parse().ok()).unwrap_or(0)
}

/// The TerraformCluster a machine or pool belongs to. Until Cluster API
/// owners are resolved (a later issue), it is the TerraformCluster of the
/// namespace with the same cluster-name label.
async fn cluster_of<K: Workload>(ctx: &Context, obj: &K, ns: &str) -> Result<Option<TerraformCluster>, Error> {
    if K::KIND == Kind::Cluster {
        return Ok(None);
    }
    let Some(cluster) = obj.cluster_name() else { return Ok(None) };
    let list = Api::<TerraformCluster>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={}", names::label_value(cluster))))
        .await
        .map_err(Error::Kube)?;
    Ok(list.items.into_iter().next())
}

pub async fn reconcile<K: Workload>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let meta = obj.meta();
    let namespace = meta.namespace.clone().ok_or(Error::MissingMetadata("namespace"))?;
    let name = meta.name.clone().ok_or(Error::MissingMetadata("name"))?;
    let uid = meta.uid.clone().ok_or(Error::MissingMetadata("uid"))?;
    if meta.deletion_timestamp.is_some() {
        // Deletion comes with the finalizer (destroy, then cleanup).
        return Ok(Action::await_change());
    }
    let suffix = names::suffix(&namespace, K::KIND, &name);
    let mut pass = Pass {
        ctx: &ctx,
        obj: obj.as_ref(),
        namespace: namespace.clone(),
        name: name.clone(),
        suffix: suffix.clone(),
        status: obj.workspace_status().cloned().unwrap_or_default(),
        transitions: Vec::new(),
        now: Timestamp::now(),
    };
    pass.status.state_secret_suffix = Some(suffix.clone());
    pass.status.observed_generation = meta.generation;

    let jobs = jobs_of::<K>(&ctx, &namespace, &name, &uid).await?;
    let mut newly_bookkept: Vec<(String, &'static str)> = Vec::new();
    let mut finished: Vec<(Finished, u32)> = Vec::new();
    let mut active: Option<&Job> = None;
    let mut pending: Vec<(&Job, Op, JobEnd)> = Vec::new();
    for job in &jobs {
        let Some(op) = job_op(job) else { continue };
        match bookkeeping::job_end(job) {
            None => active = Some(job),
            Some(end) => match annotation(job, BOOKKEPT) {
                Some(outcome) => finished.push((
                    Finished { op, succeeded: outcome == "succeeded", counts_for_backoff: outcome == "failed", finished_at: end.at },
                    job_attempt(job),
                )),
                None => pending.push((job, op, end)),
            },
        }
    }
    // Oldest first, so that the newest outcome is the one status keeps.
    pending.sort_by_key(|(_, _, end)| end.at);
    for (job, op, end) in pending {
        let job_name = job.name_any();
        let term = terminated(&ctx, &namespace, &job_name).await?;
        let accounted = bookkeeping::account(&job_name, op, &end, term.as_ref());
        account(&mut pass, job, op, &accounted).await?;
        let outcome = if accounted.succeeded { "succeeded" } else if accounted.counts_for_backoff { "failed" } else { "interrupted" };
        finished.push((
            Finished { op, succeeded: accounted.succeeded, counts_for_backoff: accounted.counts_for_backoff, finished_at: end.at },
            job_attempt(job),
        ));
        newly_bookkept.push((job_name, outcome));
    }
    finished.sort_by_key(|(f, _)| std::cmp::Reverse(f.finished_at));

    let action = if let Some(job) = active {
        pass.status.active_job = Some(ActiveJob {
            name: job.name_any(),
            operation: bookkeeping::operation(job_op(job).unwrap_or(Op::Apply)),
            attempt: i32::try_from(job_attempt(job)).unwrap_or(1).max(1),
            start_time: job.metadata.creation_timestamp.clone(),
        });
        // The Job's own status changes wake the reconcile.
        Action::requeue(ctx.settings.sync_period)
    } else {
        pass.status.active_job = None;
        idle(&mut pass, &finished.into_iter().map(|(f, _)| f).collect::<Vec<_>>(), &jobs, &uid).await?
    };

    let ready = conditions::ready(pass.status.conditions.as_deref().unwrap_or_default());
    pass.set(ready);
    apply_status(&pass).await?;
    for t in std::mem::take(&mut pass.transitions) {
        condition_event(&pass, &t).await;
    }
    // Marked only once the status that accounts for them is written.
    let jobs_api = Api::<Job>::namespaced(ctx.client.clone(), &namespace);
    for (job, outcome) in newly_bookkept {
        let patch = json!({"metadata": {"annotations": {BOOKKEPT: outcome}}});
        jobs_api.patch(&job, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(Error::Kube)?;
    }
    Ok(action)
}

/// Records one finished Job: status, events, metrics, the state's adoption
/// after a successful apply, and the release of its leases and per-run
/// Secret.
async fn account<K: Workload>(pass: &mut Pass<'_, K>, job: &Job, op: Op, accounted: &Accounted) -> Result<(), Error> {
    let ctx = pass.ctx;
    let job_name = job.name_any();
    pass.status.last_run = Some(accounted.last_run.clone());
    pass.set(accounted.condition.clone());
    if let Some(version) = &accounted.runtime_version {
        let source = pass.status.source.get_or_insert_with(SourceStatus::default);
        source.runtime_version = Some(version.clone());
    }
    let kind = metrics_kind(K::KIND);
    let result = match accounted.error_kind {
        None => metrics::JobResult::Succeeded,
        Some("deadline") => metrics::JobResult::Deadline,
        Some("interrupted") => metrics::JobResult::Interrupted,
        Some(_) => metrics::JobResult::Failed,
    };
    ctx.metrics.jobs.get_or_create(&JobLabels { kind, op: metrics_op(op), result }).inc();
    if accounted.succeeded {
        if let Some(image) = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.iter().find(|c| c.name == "source"))
            .and_then(|c| c.image.clone())
        {
            pass.status.source.get_or_insert_with(SourceStatus::default).image = Some(image);
        }
        pass.event(EventType::Normal, "JobSucceeded", format!("{} Job {job_name} succeeded", op.as_str())).await;
        if matches!(op, Op::Apply | Op::Restore) {
            if let Some(hash) = annotation(job, INPUTS_HASH) {
                adopt(pass, hash).await?;
            }
        }
        if let (Op::Restore, Some(serial)) = (op, annotation(job, RESTORE_SERIAL)) {
            restored(pass, serial, &job_name).await?;
        }
    } else {
        let summary = accounted.last_run.error.as_ref().and_then(|e| e.summary.clone()).unwrap_or_default();
        pass.event(EventType::Warning, "JobFailed", format!("{} Job {job_name} failed: {summary}", op.as_str())).await;
        if op == Op::Restore {
            ctx.metrics.state_restores.get_or_create(&metrics::RestoreLabels { kind, result: metrics::RestoreResult::Failed }).inc();
            pass.event(EventType::Warning, "StateRestoreFailed", format!("restore Job {job_name} failed: {summary}")).await;
        }
    }
    release(pass, &job_name).await?;
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &pass.namespace);
    match secrets.delete(&names::run_secret(&job_name), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    Ok(())
}

/// Adopts the state a successful apply wrote (ref terraform-state.md): the
/// applied inputs hash on the base Secret.
///
/// The owner references the book also puts on every chunk wait for the
/// finalizer (destroy first, then cleanup): without it, deleting the object
/// would let the garbage collector delete the state of infrastructure that
/// still exists.
async fn adopt<K: Workload>(pass: &mut Pass<'_, K>, hash: &str) -> Result<(), Error> {
    let ctx = pass.ctx;
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &pass.namespace);
    let snapshot = state::snapshot(&secrets, &pass.suffix).await?;
    if !matches!(snapshot.readable, StateReadable::Read(_)) {
        // Read again, and reported, in this pass's state step.
        return Ok(());
    }
    if let Some(base) = snapshot.base(&pass.suffix) {
        let patch = json!({"metadata": {
            "annotations": {INPUTS_HASH: hash},
            "resourceVersion": base.metadata.resource_version,
        }});
        secrets.patch(&base.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(Error::Kube)?;
    }
    pass.event(EventType::Normal, "StateAdopted", format!("adopted the state of the apply with inputs hash {hash}")).await;
    Ok(())
}

/// Versioned backups (book: terraform-state.md "State backups"): a serial
/// not observed before is copied verbatim into its backup set, older sets
/// are pruned to `--state-backups`, and status lists the complete ones. A
/// serial counts as observed only once its backup exists (or backups are
/// off), so a failed copy is retried on the next pass.
async fn backup<K: Workload>(
    pass: &mut Pass<'_, K>,
    secrets: &Api<Secret>,
    snapshot: &state::Snapshot,
    entered_unreadable: bool,
) -> Result<(), Error> {
    let ctx = pass.ctx;
    let keep = ctx.settings.state_backups;
    let kind = metrics_kind(K::KIND);
    let count = |result| ctx.metrics.state_backups.get_or_create(&metrics::BackupLabels { kind, result }).inc();
    let serial = match &snapshot.readable {
        StateReadable::Read(st) => i64::try_from(st.serial).ok().filter(|s| *s >= 1),
        _ => None,
    };
    match backups::should_back_up(&snapshot.readable, pass.status.observed_state_serial, keep, false) {
        BackupDecision::Take { serial: taken } => {
            if let StateReadable::Read(st) = &snapshot.readable {
                let owner = backups::Owner {
                    reference: owner_reference(pass.obj)?,
                    kind: K::KIND,
                    name: &pass.name,
                    cluster_name: pass.obj.cluster_name(),
                };
                let source_job = pass.status.last_run.as_ref().map(|r| r.job.clone());
                let outcome = match backups::plan_backup(&pass.suffix, st, &snapshot.secrets, &owner, source_job.as_deref(), pass.now) {
                    Ok(set) => backups::take(secrets, &set).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match outcome {
                    Ok(()) => {
                        count(metrics::BackupResult::Taken);
                        pass.status.observed_state_serial = serial;
                        let name = names::backup_secret(&pass.suffix, taken);
                        pass.event(EventType::Normal, "StateBackedUp", format!("state serial {taken} backed up to {name}")).await;
                    }
                    Err(why) => {
                        // Retried next pass: the serial stays unobserved.
                        warn!(namespace = %pass.namespace, name = %pass.name, "backing up state serial {taken} failed: {why}");
                        count(metrics::BackupResult::Skipped);
                    }
                }
            }
        }
        BackupDecision::Skip { reason } => {
            if serial.is_some() {
                // Unchanged, or backups are off: the serial is observed.
                pass.status.observed_state_serial = serial;
            }
            if entered_unreadable {
                warn!(namespace = %pass.namespace, name = %pass.name, "the state is not backed up: it is {reason}");
                count(metrics::BackupResult::Skipped);
            }
        }
    }
    let existing = backups::existing(secrets, &pass.suffix).await.map_err(Error::Backup)?;
    let mut infos = backups::list(&existing, &pass.suffix);
    let pruned = backups::prune(&infos, keep);
    if !pruned.is_empty() {
        backups::delete_serials(secrets, &pass.suffix, &pruned).await.map_err(Error::Backup)?;
        for _ in &pruned {
            count(metrics::BackupResult::Pruned);
        }
        infos.retain(|i| !pruned.contains(&i.serial));
    }
    let entries = backups::status_entries(&infos);
    pass.status.state_backups = (!entries.is_empty()).then_some(entries);
    Ok(())
}

/// A restore succeeded: the request annotation goes (if it still asks for
/// this serial) and StateRestored is recorded.
async fn restored<K: Workload>(pass: &mut Pass<'_, K>, serial: &str, job: &str) -> Result<(), Error> {
    let ctx = pass.ctx;
    if annotation(pass.obj, RESTORE_STATE) == Some(serial) {
        let api = Api::<K>::namespaced(ctx.client.clone(), &pass.namespace);
        let patch = json!({"metadata": {
            "annotations": {RESTORE_STATE: null},
            "resourceVersion": pass.obj.meta().resource_version,
        }});
        api.patch(&pass.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(Error::Kube)?;
    }
    ctx.metrics
        .state_restores
        .get_or_create(&metrics::RestoreLabels { kind: metrics_kind(K::KIND), result: metrics::RestoreResult::Succeeded })
        .inc();
    pass.event(EventType::Normal, "StateRestored", format!("Job {job} restored the state from backup serial {serial}")).await;
    Ok(())
}

/// What a restore request asks for, once checked against the backups.
enum RestoreDue {
    /// Push this complete backup set.
    Push { serial: String, chunks: Vec<String>, resources: u64, inputs_hash: Option<String> },
    /// Nothing to start now; the condition says why.
    Wait,
}

/// The restore the `captf.io/restore-state` annotation asks for (ref
/// §8.2: it goes before any apply): a serial with no complete backup gives
/// RestoreBackupNotFound and no Job, and a serial whose restore failed is
/// not tried again.
async fn restore_due<K: Workload>(pass: &mut Pass<'_, K>, raw: &str, jobs: &[Job], secrets: &Api<Secret>) -> Result<RestoreDue, Error> {
    let failed_before = jobs.iter().any(|j| {
        job_op(j) == Some(Op::Restore)
            && annotation(j, RESTORE_SERIAL) == Some(raw)
            && bookkeeping::job_end(j).is_some_and(|e| !e.succeeded)
    });
    if failed_before {
        return Ok(RestoreDue::Wait);
    }
    let not_found = |why: String| Cond::new(conditions::RESTORE_JOB_SUCCEEDED, Status::False, "RestoreBackupNotFound", why);
    let Some(serial) = raw.parse::<u64>().ok().filter(|s| *s >= 1) else {
        pass.set(not_found(format!("{RESTORE_STATE} is {raw:?}, not a state serial")));
        return Ok(RestoreDue::Wait);
    };
    let existing = backups::existing(secrets, &pass.suffix).await.map_err(Error::Backup)?;
    let complete = backups::list(&existing, &pass.suffix).into_iter().any(|i| i.serial == serial && i.complete);
    if !complete {
        pass.set(not_found(format!("no complete backup of state serial {serial} ({})", names::backup_secret(&pass.suffix, serial))));
        return Ok(RestoreDue::Wait);
    }
    let mut chunks: Vec<(u64, &Secret)> = existing
        .iter()
        .filter_map(|s| Some((names::backup_chunk_index(&pass.suffix, serial, s.metadata.name.as_deref()?)?, s)))
        .collect();
    chunks.sort_by_key(|(i, _)| *i);
    let first = chunks.first().map(|(_, s)| *s);
    let resources = first
        .and_then(|s| annotation(s, backups::RESOURCES_ANNOTATION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let inputs_hash = first.and_then(|s| annotation(s, INPUTS_HASH)).map(str::to_string);
    Ok(RestoreDue::Push {
        serial: serial.to_string(),
        chunks: chunks.iter().map(|(_, s)| s.name_any()).collect(),
        resources,
        inputs_hash,
    })
}

fn owner_reference<K: Workload>(obj: &K) -> Result<OwnerReference, Error> {
    let meta = obj.meta();
    Ok(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().ok_or(Error::MissingMetadata("name"))?,
        uid: meta.uid.clone().ok_or(Error::MissingMetadata("uid"))?,
        controller: None,
        block_owner_deletion: None,
    })
}

/// Releases the run lease and the cluster write lease held by `job`.
async fn release<K: Workload>(pass: &Pass<'_, K>, job: &str) -> Result<(), Error> {
    let api = Api::<Lease>::namespaced(pass.ctx.client.clone(), &pass.namespace);
    leases::release(&api, &names::run_lease(&pass.suffix), job).await?;
    if K::KIND == Kind::Cluster {
        if let Some(cluster) = pass.obj.cluster_name() {
            leases::release(&api, &names::cluster_write_lease(&pass.namespace, cluster), job).await?;
        }
    }
    Ok(())
}

/// The part of a pass without an active Job: credentials, RBAC, state,
/// decision, and the Job start.
async fn idle<K: Workload>(
    pass: &mut Pass<'_, K>,
    finished: &[Finished],
    jobs: &[Job],
    uid: &str,
) -> Result<Action, Error> {
    let ctx = pass.ctx;
    let obj = pass.obj;
    let ns = pass.namespace.clone();
    let cluster = cluster_of(ctx, obj, &ns).await?;
    let spec = obj.workspace();

    let identity = credentials::identity_name(spec, cluster.as_ref());
    let creds = credentials::ensure(&ctx.client, &ns, identity, owner_reference(obj)?).await?;
    let allowed = creds.allowed.status == Status::True;
    pass.set(creds.allowed);
    pass.set(creds.mirrored);

    // The state.
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    let snapshot = state::snapshot(&secrets, &pass.suffix).await?;
    let labels = pass.labels();
    let reason = snapshot.readable.reason();
    let state_fact = match &snapshot.readable {
        StateReadable::NotFound => {
            ctx.metrics.state_bytes.remove(&labels);
            ctx.metrics.state_resources.remove(&labels);
            StateFact::NotFound
        }
        StateReadable::Read(st) => {
            ctx.metrics.state_bytes.get_or_create(&labels).set(i64::try_from(st.compressed_bytes).unwrap_or(i64::MAX));
            ctx.metrics.state_resources.get_or_create(&labels).set(i64::try_from(st.managed_resources).unwrap_or(i64::MAX));
            let serial = i64::try_from(st.serial).ok().filter(|s| *s >= 1);
            if serial.is_some() && serial != pass.status.observed_state_serial {
                if let Some(note) = st.near_secret_limit_note() {
                    pass.event(EventType::Warning, state::NEAR_SECRET_LIMIT_REASON, note).await;
                }
            }
            let hash = snapshot.base(&pass.suffix).and_then(|b| annotation(b, INPUTS_HASH)).map(str::to_string);
            StateFact::Read { inputs_hash: hash }
        }
        StateReadable::Unreadable(_) => StateFact::Unreadable,
    };
    let status = match reason.status() {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    };
    let mut readable = Cond::new(STATE_READABLE, status, reason.as_str(), snapshot.readable.message());
    let mut read_error = snapshot
        .readable
        .metric_reason()
        .and_then(|r| metrics::StateReadError::ALL.iter().copied().find(|m| m.as_str() == r))
        .map(|m| (m, "StateUnreadable"));

    // The state lock (book: state-lock-and-stale-locks.md), checked only
    // here, with no Job of the object active.
    let force_unlock = match locks::inspect(&ctx.client, &ns, K::KIND, &pass.name).await? {
        Verdict::Free | Verdict::Alive { .. } => None,
        Verdict::Stale { id, pod, .. } => {
            debug!(%pod, "the state lock is stale: the next Job force-unlocks it");
            Some(id)
        }
        held @ (Verdict::Foreign { .. } | Verdict::Unparsable { .. }) => {
            // Never unlocked; Jobs keep starting, and each waits
            // lockTimeoutSeconds for the lock and fails.
            if !matches!(snapshot.readable, StateReadable::Unreadable(_)) {
                readable = Cond::new(STATE_READABLE, Status::False, "StateLocked", held.message());
                read_error = Some((metrics::StateReadError::Locked, "StateLocked"));
            }
            None
        }
    };
    let before = pass.transitions.len();
    let note = readable.message.clone();
    pass.set(readable);
    let entered_unreadable = pass.transitions.len() > before && matches!(snapshot.readable, StateReadable::Unreadable(_));
    if let (true, Some((metric_reason, event))) = (pass.transitions.len() > before, read_error) {
        ctx.metrics
            .state_read_errors
            .get_or_create(&StateReadErrorLabels { kind: metrics_kind(K::KIND), reason: metric_reason })
            .inc();
        pass.event(EventType::Warning, event, note).await;
    }

    backup(pass, &secrets, &snapshot, entered_unreadable).await?;

    // The inputs and the Job policy.
    let settings = policy::resolve(
        spec.jobs.as_ref(),
        cluster.as_ref().and_then(|c| c.spec.defaults.as_ref()).and_then(|d| d.jobs.as_ref()),
    );
    let template = annotation(obj, "cluster.x-k8s.io/cloned-from-name");
    let rendered = inputs::render(&InputsRequest {
        kind: K::KIND,
        namespace: &ns,
        name: &pass.name,
        cluster_name: obj.cluster_name(),
        image: &spec.source.image,
        template,
        variables: spec.variables.as_ref(),
    });
    let rendered = match rendered {
        Ok(r) => r,
        Err(e) => {
            let reason = e.reason();
            pass.set(Cond::new(conditions::APPLY_JOB_SUCCEEDED, Status::False, reason, e.to_string()));
            return Ok(Action::requeue(ctx.settings.sync_period));
        }
    };

    let restore = match annotation(obj, RESTORE_STATE) {
        Some(raw) => match restore_due(pass, raw, jobs, &secrets).await? {
            RestoreDue::Wait => return Ok(Action::requeue(ctx.settings.sync_period)),
            due @ RestoreDue::Push { .. } => Some(due),
        },
        None => None,
    };

    let decision = decide::decide(&Facts {
        state: state_fact,
        inputs_hash: Some(rendered.inputs_hash.clone()),
        mutable: K::MUTABLE,
        finished: finished.to_vec(),
        failed_jobs_history_limit: settings.failed_jobs_history_limit,
        now: pass.now,
    });
    let reason = match (&restore, decision) {
        (Some(_), _) => decide::ApplyReason::RestoreRequested,
        (None, Decision::Idle) => return Ok(Action::requeue(ctx.settings.sync_period)),
        (None, Decision::Backoff { wait, failures, reason }) => {
            debug!(failures, ?wait, "apply due ({}) but backing off", reason.as_str());
            return Ok(Action::requeue(wait + Duration::from_secs(1)));
        }
        (None, Decision::Apply(reason)) => reason,
    };
    if !allowed || creds.identity.is_none() {
        // IdentityAllowed or CredentialsMirrored says why; nothing starts.
        return Ok(Action::requeue(ctx.settings.sync_period));
    }
    if matches!(pass.status.conditions.as_deref().and_then(|c| conditions::status_of(c, conditions::APPLY_JOB_SUCCEEDED)), None) {
        pass.set(Cond::new(conditions::APPLY_JOB_SUCCEEDED, Status::Unknown, "NoApplyYet", "no apply has run yet"));
    }

    // Runner RBAC.
    match rbac::ensure(&ctx.client, &ns, &settings.service_account_name).await {
        Ok(()) => pass.set(Cond::new(RUNNER_RBAC_READY, Status::True, "RBACReady", format!("ServiceAccount {} is bound to ClusterRole {}", settings.service_account_name, names::RUNNER_RBAC))),
        Err(e @ (rbac::RbacError::NotOptedIn(_) | rbac::RbacError::ForeignRoleBinding { .. })) => {
            pass.set(Cond::new(RUNNER_RBAC_READY, Status::False, e.reason(), e.to_string()));
            return Ok(Action::requeue(ctx.settings.sync_period));
        }
        Err(e) => {
            pass.set(Cond::new(RUNNER_RBAC_READY, Status::False, e.reason(), e.to_string()));
            return Err(e.into());
        }
    }

    let identity = creds.identity.as_deref();
    let force_unlock = force_unlock.as_deref();
    match &restore {
        Some(RestoreDue::Push { serial, chunks, resources, inputs_hash }) => {
            let restore = Restore { serial, request: RestoreRequest { chunk_secrets: chunks, resources: *resources }, inputs_hash: inputs_hash.as_deref() };
            let start_ = Start { op: Op::Restore, rendered: &rendered, settings: &settings, identity, force_unlock, reason, restore: Some(restore) };
            start(pass, start_, jobs, uid).await
        }
        _ => start(pass, Start { op: Op::Apply, rendered: &rendered, settings: &settings, identity, force_unlock, reason, restore: None }, jobs, uid).await,
    }
}

/// What a Job start needs besides the pass.
struct Start<'a> {
    op: Op,
    rendered: &'a inputs::RenderedInputs,
    settings: &'a policy::JobSettings,
    identity: Option<&'a str>,
    /// A stale lock's ID, force-unlocked by this Job after init.
    force_unlock: Option<&'a str>,
    reason: decide::ApplyReason,
    restore: Option<Restore<'a>>,
}

/// The backup a restore Job pushes.
struct Restore<'a> {
    serial: &'a str,
    request: RestoreRequest<'a>,
    /// The inputs hash recorded with the backup, adopted after the restore.
    inputs_hash: Option<&'a str>,
}

/// Takes the leases and creates the Job and its per-run Secret.
async fn start<K: Workload>(pass: &mut Pass<'_, K>, start: Start<'_>, jobs: &[Job], uid: &str) -> Result<Action, Error> {
    let Start { op, rendered, settings, identity, force_unlock, reason, restore } = start;
    let job_condition = if op == Op::Restore { conditions::RESTORE_JOB_SUCCEEDED } else { conditions::APPLY_JOB_SUCCEEDED };
    let ctx = pass.ctx;
    let obj = pass.obj;
    let ns = pass.namespace.clone();
    let attempt = builder::next_attempt(op, jobs);
    let hash6 = builder::hash6(&rendered.inputs_hash, op, attempt, 0);
    let job_name = names::job(K::KIND, &pass.name, op, attempt, &hash6);
    let leases_api = Api::<Lease>::namespaced(ctx.client.clone(), &ns);
    let jobs_api = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let deadline = Duration::from_secs(u64::try_from(settings.active_deadline_seconds).unwrap_or(0));
    let request = LeaseRequest {
        kind: K::KIND,
        namespace: &ns,
        name: &pass.name,
        cluster_name: obj.cluster_name(),
        op,
        job: &job_name,
        now: pass.now,
    };
    let run_lease = names::run_lease(&pass.suffix);
    if let Acquired::HeldBy(holder) = leases::acquire(&leases_api, &leases::run_lease(&request), &jobs_api, deadline).await? {
        pass.set(Cond::new(job_condition, Status::Unknown, "WaitingForRunLease", format!("Job {holder} holds the run lease {run_lease}")));
        wait_metric(pass, metrics::LeaseWait::RunLease);
        return Ok(Action::requeue(LEASE_RECHECK));
    }
    if let (true, Some(cluster)) = (ctx.settings.cluster_operation_gate, obj.cluster_name()) {
        let gate = names::cluster_write_lease(&ns, cluster);
        if K::KIND == Kind::Cluster {
            if let Some(lease) = leases::cluster_write_lease(&request) {
                if let Acquired::HeldBy(holder) = leases::acquire(&leases_api, &lease, &jobs_api, deadline).await? {
                    leases::release(&leases_api, &run_lease, &job_name).await?;
                    pass.set(Cond::new(job_condition, Status::Unknown, "WaitingForRunLease", format!("Job {holder} holds the cluster write lease {gate}")));
                    wait_metric(pass, metrics::LeaseWait::RunLease);
                    return Ok(Action::requeue(LEASE_RECHECK));
                }
            }
        } else if let Some(holder) = leases::holder(&leases_api, &gate).await? {
            // A Job that cannot be read counts as running: never go ahead
            // of the cluster on a guess.
            let running = !matches!(jobs_api.job_state(&holder).await, Ok(JobState::Finished | JobState::Missing));
            if running {
                leases::release(&leases_api, &run_lease, &job_name).await?;
                pass.set(Cond::new(job_condition, Status::Unknown, "WaitingForClusterOperation", format!("the cluster's Job {holder} holds the cluster write lease {gate}")));
                if pass.transitions.last().is_some_and(|t| t.reason == "WaitingForClusterOperation") {
                    pass.event(EventType::Normal, "WaitingForClusterOperation", format!("waiting for the cluster's Job {holder}")).await;
                    wait_metric(pass, metrics::LeaseWait::ClusterOperation);
                }
                return Ok(Action::requeue(LEASE_RECHECK));
            }
        }
    }

    let built = builder::build(&JobRequest {
        kind: K::KIND,
        namespace: &ns,
        name: &pass.name,
        uid,
        cluster_name: obj.cluster_name(),
        op,
        attempt,
        hash6: &hash6,
        image: &obj.workspace().source.image,
        image_pull_policy: obj.workspace().source.image_pull_policy,
        runner_image: &ctx.settings.runner_image,
        settings,
        identity,
        force_unlock,
        inputs: rendered,
        restore: restore.as_ref().map(|r| r.request),
    });
    let mut job = built.job;
    let annotations = job.metadata.annotations.get_or_insert_default();
    match &restore {
        Some(r) => {
            annotations.insert(RESTORE_SERIAL.into(), r.serial.to_string());
            if let Some(hash) = r.inputs_hash {
                annotations.insert(INPUTS_HASH.into(), hash.to_string());
            }
        }
        None => {
            annotations.insert(INPUTS_HASH.into(), rendered.inputs_hash.clone());
        }
    }
    let created = match jobs_api.create(&PostParams::default(), &job).await {
        Ok(created) => created,
        // Another pass created it first: that pass owns the start.
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Action::requeue(LEASE_RECHECK)),
        Err(e) => {
            release(pass, &job_name).await?;
            return Err(Error::Kube(e));
        }
    };
    let mut secret = built.run_secret;
    if builder::own_run_secret(&mut secret, &created).is_err() {
        return Err(Error::MissingMetadata("uid on the created Job"));
    }
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    info!(namespace = %ns, name = %pass.name, job = %job_name, "started {} Job: {}", op.as_str(), reason.as_str());
    if let Some(id) = force_unlock {
        ctx.metrics.lock_force_unlocks.get_or_create(&metrics::KindLabels { kind: metrics_kind(K::KIND) }).inc();
        pass.event(
            EventType::Warning,
            "ForceUnlocked",
            format!("Job {job_name} force-unlocks the stale state lock {id} left by an ended runner pod of this object"),
        )
        .await;
    }
    if reason == decide::ApplyReason::InputsChanged {
        ctx.metrics.inputs_hash_changes.get_or_create(&metrics::KindLabels { kind: metrics_kind(K::KIND) }).inc();
        pass.event(EventType::Normal, "InputsChanged", format!("inputs hash {} differs from the state's", rendered.inputs_hash)).await;
    }
    ctx.metrics
        .reconcile_op_decisions
        .get_or_create(&metrics::DecisionLabels { kind: metrics_kind(K::KIND), op: metrics_op(op), reason: reason.metric() })
        .inc();
    pass.event(
        EventType::Normal,
        "JobCreated",
        format!("{} Job {job_name} (attempt {attempt}, image {}): {}", op.as_str(), obj.workspace().source.image, reason.as_str()),
    )
    .await;
    pass.status.active_job = Some(ActiveJob {
        name: job_name,
        operation: bookkeeping::operation(op),
        attempt: i32::try_from(attempt.get()).unwrap_or(i32::MAX),
        start_time: Some(Time(pass.now)),
    });
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// Counts one wait for a lease.
fn wait_metric<K: Workload>(pass: &Pass<'_, K>, reason: metrics::LeaseWait) {
    pass.ctx.metrics.lease_waits.get_or_create(&metrics::LeaseWaitLabels { kind: metrics_kind(K::KIND), reason }).inc();
}

/// The whole computed status, applied server-side: what this pass no
/// longer sets is removed.
async fn apply_status<K: Workload>(pass: &Pass<'_, K>) -> Result<(), Error> {
    let api = Api::<K>::namespaced(pass.ctx.client.clone(), &pass.namespace);
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": pass.status,
    });
    api.patch_status(&pass.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// ConditionChanged (ref §4), Warning when a condition turns False.
async fn condition_event<K: Workload>(pass: &Pass<'_, K>, t: &Transition) {
    if t.type_ == conditions::READY {
        return;
    }
    let from = match &t.from {
        Some((status, reason)) => format!("{}/{reason}", status.as_str()),
        None => "unset".to_string(),
    };
    let type_ = if t.to == Status::False { EventType::Warning } else { EventType::Normal };
    pass.event(type_, "ConditionChanged", format!("{}: {from} -> {}/{}", t.type_, t.to.as_str(), t.reason)).await;
}
