//! One reconcile pass of a workload object (ref §8.1, the steps this manager
//! runs so far). The finalizer is the top-level step; then bookkeeping of
//! finished Jobs and the active Job; then, for a live object, credentials,
//! the state, backups, the decision, runner RBAC and the Job start, or, for
//! one being deleted, the destroy or the cleanup (`deletion` decides);
//! then one status apply.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateTerminated, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation, TestOperation};

use super::bookkeeping::{self, Accounted, JobEnd};
use super::conditions::{self, Cond, RUNNER_RBAC_READY, STATE_READABLE, Status, Transition};
use super::credentials;
use super::decide::{self, Decision, Facts, Finished, StateFact};
use super::deletion::{self, DestroyInputs, Hold, Lifecycle, Step, Why};
use super::sweep;
use super::workload::Workload;
use super::{Context, Error, MANAGER};
use crate::api::{
    ActiveJob, SourceStatus, TerraformCluster, TerraformMachine, TerraformMachinePool,
    VariablesSource, WorkspaceStatus,
};
use crate::backups::{self, BackupDecision};
use crate::jobs::builder::{self, JobRequest, RestoreRequest};
use crate::jobs::durable;
use crate::jobs::inputs::{self, InputsError, InputsRequest};
use crate::jobs::leases::{self, Acquired, HolderLookup, JobState, LeaseRequest};
use crate::jobs::variables::{self, SourceKind};
use crate::jobs::{
    ATTEMPT_LABEL, CLUSTER_NAME_LABEL, OP_LABEL, OWNER_KIND_LABEL, OWNER_NAME_LABEL, policy, rbac,
};
use crate::locks::{self, Verdict};
use crate::metrics::{self, JobLabels, ObjectLabels, StateReadErrorLabels};
use crate::names::{self, Kind, Op};
use crate::role::Role;
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
/// A held deletion re-checks this often (ref Appendix B).
const HELD_RECHECK: Duration = Duration::from_secs(60);

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
    /// While deleting: the Deleting condition, set once at the end of the
    /// pass so that its reason changes at most once per pass.
    deleting: Option<Cond>,
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
        self.record(type_, reason, note, None).await;
    }

    /// An event about one of the object's Jobs, which is its related
    /// object: events of distinct Jobs are never merged into one series.
    async fn job_event(&self, type_: EventType, reason: &str, note: String, job: &Job) {
        self.record(type_, reason, note, Some(job.object_ref(&())))
            .await;
    }

    async fn record(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary,
        };
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
    obj.meta()
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The Jobs of this object: its owner labels, and an owner reference to
/// this very object (a same-named object created later has another UID).
async fn jobs_of<K: Workload>(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<Vec<Job>, Error> {
    let selector = format!(
        "{OWNER_KIND_LABEL}={},{OWNER_NAME_LABEL}={}",
        K::KIND.kind(),
        names::label_value(name)
    );
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
async fn terminated(
    ctx: &Context,
    ns: &str,
    job: &str,
) -> Result<Option<ContainerStateTerminated>, Error> {
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
    label(job, ATTEMPT_LABEL)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// The TerraformCluster a machine or pool belongs to. Until Cluster API
/// owners are resolved (a later issue), it is the TerraformCluster of the
/// namespace with the same cluster-name label.
async fn cluster_of<K: Workload>(
    ctx: &Context,
    obj: &K,
    ns: &str,
) -> Result<Option<TerraformCluster>, Error> {
    if K::KIND == Kind::Cluster {
        return Ok(None);
    }
    let Some(cluster) = obj.cluster_name() else {
        return Ok(None);
    };
    let list = Api::<TerraformCluster>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "{CLUSTER_NAME_LABEL}={}",
            names::label_value(cluster)
        )))
        .await
        .map_err(Error::Kube)?;
    Ok(list.items.into_iter().next())
}

/// Reads each `variablesFrom` source of the object (a ConfigMap's `data`
/// and `binaryData`, a Secret's `data`); a source without the opt-in label
/// reads as missing.
async fn fetch_variables<'a>(
    client: &kube::Client,
    ns: &str,
    sources: &'a [VariablesSource],
) -> Result<Vec<variables::Fetched<'a>>, Error> {
    let opted_in = |meta: &kube::api::ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(variables::SOURCE_LABEL))
            .is_some_and(|v| v == "true")
    };
    let mut fetched = Vec::with_capacity(sources.len());
    for source in sources {
        let data = match variables::reference(source) {
            Some((SourceKind::ConfigMap, name)) => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(Error::Kube)?
                .filter(|c| opted_in(&c.metadata))
                .map(|c| {
                    let text = c.data.unwrap_or_default().into_iter();
                    let binary = c.binary_data.unwrap_or_default().into_iter();
                    text.map(|(k, v)| (k, v.into_bytes()))
                        .chain(binary.map(|(k, v)| (k, v.0)))
                        .collect()
                }),
            Some((SourceKind::Secret, name)) => Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(Error::Kube)?
                .filter(|s| opted_in(&s.metadata))
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect()
                }),
            // merge reports the entry.
            None => None,
        };
        fetched.push(variables::Fetched { source, data });
    }
    Ok(fetched)
}

pub async fn reconcile<K: Workload>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let meta = obj.meta();
    let namespace = meta
        .namespace
        .clone()
        .ok_or(Error::MissingMetadata("namespace"))?;
    let name = meta.name.clone().ok_or(Error::MissingMetadata("name"))?;
    let uid = meta.uid.clone().ok_or(Error::MissingMetadata("uid"))?;
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let deleting =
        match deletion::lifecycle(K::KIND, meta.deletion_timestamp.is_some(), &finalizers) {
            Lifecycle::AddFinalizer => {
                add_finalizer(&ctx, obj.as_ref(), &namespace, &name).await?;
                // The write itself wakes the next pass.
                return Ok(Action::await_change());
            }
            Lifecycle::Released => return Ok(Action::await_change()),
            Lifecycle::Live => false,
            Lifecycle::Deleting => true,
        };
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
        deleting: None,
    };
    pass.status.state_secret_suffix = Some(suffix.clone());
    pass.status.observed_generation = meta.generation;
    if deleting {
        pass.deleting = Some(Cond::new(
            conditions::DELETING,
            Status::True,
            "Deleting",
            "the object is being deleted",
        ));
    }

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
                    Finished {
                        op,
                        succeeded: outcome == "succeeded",
                        counts_for_backoff: outcome == "failed",
                        finished_at: end.at,
                    },
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
        let outcome = if accounted.succeeded {
            "succeeded"
        } else if accounted.counts_for_backoff {
            "failed"
        } else {
            "interrupted"
        };
        finished.push((
            Finished {
                op,
                succeeded: accounted.succeeded,
                counts_for_backoff: accounted.counts_for_backoff,
                finished_at: end.at,
            },
            job_attempt(job),
        ));
        newly_bookkept.push((job_name, outcome));
    }
    finished.sort_by_key(|(f, _)| std::cmp::Reverse(f.finished_at));

    let action = if let Some(job) = active {
        if deleting {
            pass.deleting = Some(Cond::new(
                conditions::DELETING,
                Status::True,
                "Deleting",
                format!("waiting for Job {} to finish", job.name_any()),
            ));
        }
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
        let finished: Vec<Finished> = finished.into_iter().map(|(f, _)| f).collect();
        if !deleting {
            idle(&mut pass, &finished, &jobs, &uid).await?
        } else if !newly_bookkept.is_empty() {
            // The outcome is written before anything is cleaned up, so
            // that status shows the destroy that made cleanup safe.
            Action::requeue(Duration::from_secs(1))
        } else {
            match deleting_pass(&mut pass, &finished, &jobs, &uid).await? {
                Some(action) => action,
                // The finalizer is gone: so is the object, and its status.
                None => return Ok(Action::await_change()),
            }
        }
    };

    if let Some(cond) = pass.deleting.take() {
        let before = pass.transitions.len();
        pass.set(cond);
        if pass.transitions[before..].iter().any(|t| {
            t.from
                .as_ref()
                .is_none_or(|(status, _)| *status != Status::True)
        }) {
            pass.event(
                EventType::Normal,
                "DeletionStarted",
                "the object is being deleted: destroy, then cleanup".into(),
            )
            .await;
        }
    }
    let ready = if deleting {
        Cond::new(
            conditions::READY,
            Status::False,
            "Deleting",
            "the object is being deleted",
        )
    } else {
        conditions::ready(pass.status.conditions.as_deref().unwrap_or_default())
    };
    pass.set(ready);
    apply_status(&pass).await?;
    for t in std::mem::take(&mut pass.transitions) {
        condition_event(&pass, &t).await;
    }
    // Marked only once the status that accounts for them is written.
    let jobs_api = Api::<Job>::namespaced(ctx.client.clone(), &namespace);
    for (job, outcome) in newly_bookkept {
        let patch = json!({"metadata": {"annotations": {BOOKKEPT: outcome}}});
        jobs_api
            .patch(&job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::Kube)?;
    }
    Ok(action)
}

/// Records one finished Job: status, events, metrics, the state's adoption
/// after a successful apply, and the release of its leases and per-run
/// Secret.
async fn account<K: Workload>(
    pass: &mut Pass<'_, K>,
    job: &Job,
    op: Op,
    accounted: &Accounted,
) -> Result<(), Error> {
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
    ctx.metrics
        .jobs
        .get_or_create(&JobLabels {
            kind,
            op: metrics_op(op),
            result,
        })
        .inc();
    if accounted.succeeded {
        if let Some(image) = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.iter().find(|c| c.name == "source"))
            .and_then(|c| c.image.clone())
        {
            pass.status
                .source
                .get_or_insert_with(SourceStatus::default)
                .image = Some(image);
        }
        pass.job_event(
            EventType::Normal,
            "JobSucceeded",
            format!("{} Job {job_name} succeeded", op.as_str()),
            job,
        )
        .await;
        if matches!(op, Op::Apply | Op::Restore)
            && let Some(hash) = annotation(job, INPUTS_HASH)
        {
            adopt(pass, hash).await?;
        }
        if op == Op::Apply {
            let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &pass.namespace);
            durable::mark_applied(&secrets, K::KIND, &pass.name)
                .await
                .map_err(Error::Kube)?;
        }
        if let (Op::Restore, Some(serial)) = (op, annotation(job, RESTORE_SERIAL)) {
            restored(pass, serial, &job_name).await?;
        }
    } else {
        let summary = accounted
            .last_run
            .error
            .as_ref()
            .and_then(|e| e.summary.clone())
            .unwrap_or_default();
        pass.job_event(
            EventType::Warning,
            "JobFailed",
            format!("{} Job {job_name} failed: {summary}", op.as_str()),
            job,
        )
        .await;
        if op == Op::Restore {
            ctx.metrics
                .state_restores
                .get_or_create(&metrics::RestoreLabels {
                    kind,
                    result: metrics::RestoreResult::Failed,
                })
                .inc();
            pass.job_event(
                EventType::Warning,
                "StateRestoreFailed",
                format!("restore Job {job_name} failed: {summary}"),
                job,
            )
            .await;
        }
    }
    release(pass, &job_name).await?;
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &pass.namespace);
    match secrets
        .delete(&names::run_secret(&job_name), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    Ok(())
}

/// Adopts the state a successful apply or restore wrote (book:
/// terraform-state.md): an owner reference to the object on every chunk,
/// so that the state moves with a clusterctl move and is collected with
/// the object should its finalizer be removed by hand, and the applied
/// inputs hash on the base Secret. Terraform's own writes carry neither.
async fn adopt<K: Workload>(pass: &mut Pass<'_, K>, hash: &str) -> Result<(), Error> {
    let ctx = pass.ctx;
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &pass.namespace);
    let snapshot = state::snapshot(&secrets, &pass.suffix).await?;
    if !matches!(snapshot.readable, StateReadable::Read(_)) {
        // Read again, and reported, in this pass's state step.
        return Ok(());
    }
    let owner = owner_reference(pass.obj)?;
    let base = names::state_secret(&pass.suffix);
    for chunk in &snapshot.secrets {
        let name = chunk.name_any();
        let is_base = name == base;
        if !is_base && names::state_chunk_index(&pass.suffix, &name).is_none() {
            continue;
        }
        let mut owners = chunk.owner_references().to_vec();
        if !owners.iter().any(|o| o.uid == owner.uid) {
            owners.push(owner.clone());
        }
        let mut metadata =
            json!({"ownerReferences": owners, "resourceVersion": chunk.metadata.resource_version});
        if is_base {
            metadata["annotations"] = json!({INPUTS_HASH: hash});
        }
        secrets
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": metadata})),
            )
            .await
            .map_err(Error::Kube)?;
    }
    pass.event(
        EventType::Normal,
        "StateAdopted",
        format!("adopted the state of the apply with inputs hash {hash}"),
    )
    .await;
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
    let count = |result| {
        ctx.metrics
            .state_backups
            .get_or_create(&metrics::BackupLabels { kind, result })
            .inc()
    };
    let serial = match &snapshot.readable {
        StateReadable::Read(st) => i64::try_from(st.serial).ok().filter(|s| *s >= 1),
        _ => None,
    };
    match backups::should_back_up(
        &snapshot.readable,
        pass.status.observed_state_serial,
        keep,
        false,
    ) {
        BackupDecision::Take { serial: taken } => {
            if let StateReadable::Read(st) = &snapshot.readable {
                let owner = backups::Owner {
                    reference: owner_reference(pass.obj)?,
                    kind: K::KIND,
                    name: &pass.name,
                    cluster_name: pass.obj.cluster_name(),
                };
                let source_job = pass.status.last_run.as_ref().map(|r| r.job.clone());
                let outcome = match backups::plan_backup(
                    &pass.suffix,
                    st,
                    &snapshot.secrets,
                    &owner,
                    source_job.as_deref(),
                    pass.now,
                ) {
                    Ok(set) => backups::take(secrets, &set)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match outcome {
                    Ok(()) => {
                        count(metrics::BackupResult::Taken);
                        pass.status.observed_state_serial = serial;
                        let name = names::backup_secret(&pass.suffix, taken);
                        pass.event(
                            EventType::Normal,
                            "StateBackedUp",
                            format!("state serial {taken} backed up to {name}"),
                        )
                        .await;
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
    let existing = backups::existing(secrets, &pass.suffix)
        .await
        .map_err(Error::Backup)?;
    let mut infos = backups::list(&existing, &pass.suffix);
    let pruned = backups::prune(&infos, keep);
    if !pruned.is_empty() {
        backups::delete_serials(secrets, &pass.suffix, &pruned)
            .await
            .map_err(Error::Backup)?;
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
async fn restored<K: Workload>(
    pass: &mut Pass<'_, K>,
    serial: &str,
    job: &str,
) -> Result<(), Error> {
    let ctx = pass.ctx;
    if annotation(pass.obj, RESTORE_STATE) == Some(serial) {
        let api = Api::<K>::namespaced(ctx.client.clone(), &pass.namespace);
        let patch = json!({"metadata": {
            "annotations": {RESTORE_STATE: null},
            "resourceVersion": pass.obj.meta().resource_version,
        }});
        api.patch(&pass.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::Kube)?;
    }
    ctx.metrics
        .state_restores
        .get_or_create(&metrics::RestoreLabels {
            kind: metrics_kind(K::KIND),
            result: metrics::RestoreResult::Succeeded,
        })
        .inc();
    pass.event(
        EventType::Normal,
        "StateRestored",
        format!("Job {job} restored the state from backup serial {serial}"),
    )
    .await;
    Ok(())
}

/// What a restore request asks for, once checked against the backups.
enum RestoreDue {
    /// Push this complete backup set.
    Push {
        serial: String,
        chunks: Vec<String>,
        resources: u64,
        inputs_hash: Option<String>,
    },
    /// Nothing to start now; the condition says why.
    Wait,
}

/// The restore the `captf.io/restore-state` annotation asks for (ref
/// §8.2: it goes before any apply): a serial with no complete backup gives
/// RestoreBackupNotFound and no Job, and a serial whose restore failed is
/// not tried again.
async fn restore_due<K: Workload>(
    pass: &mut Pass<'_, K>,
    raw: &str,
    jobs: &[Job],
    secrets: &Api<Secret>,
) -> Result<RestoreDue, Error> {
    let failed_before = jobs.iter().any(|j| {
        job_op(j) == Some(Op::Restore)
            && annotation(j, RESTORE_SERIAL) == Some(raw)
            && bookkeeping::job_end(j).is_some_and(|e| !e.succeeded)
    });
    if failed_before {
        return Ok(RestoreDue::Wait);
    }
    let not_found = |why: String| {
        Cond::new(
            conditions::RESTORE_JOB_SUCCEEDED,
            Status::False,
            "RestoreBackupNotFound",
            why,
        )
    };
    let Some(serial) = raw.parse::<u64>().ok().filter(|s| *s >= 1) else {
        pass.set(not_found(format!(
            "{RESTORE_STATE} is {raw:?}, not a state serial"
        )));
        return Ok(RestoreDue::Wait);
    };
    let existing = backups::existing(secrets, &pass.suffix)
        .await
        .map_err(Error::Backup)?;
    let complete = backups::list(&existing, &pass.suffix)
        .into_iter()
        .any(|i| i.serial == serial && i.complete);
    if !complete {
        pass.set(not_found(format!(
            "no complete backup of state serial {serial} ({})",
            names::backup_secret(&pass.suffix, serial)
        )));
        return Ok(RestoreDue::Wait);
    }
    let mut chunks: Vec<(u64, &Secret)> = existing
        .iter()
        .filter_map(|s| {
            Some((
                names::backup_chunk_index(&pass.suffix, serial, s.metadata.name.as_deref()?)?,
                s,
            ))
        })
        .collect();
    chunks.sort_by_key(|(i, _)| *i);
    let first = chunks.first().map(|(_, s)| *s);
    let resources = first
        .and_then(|s| annotation(s, backups::RESOURCES_ANNOTATION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let inputs_hash = first
        .and_then(|s| annotation(s, INPUTS_HASH))
        .map(str::to_string);
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
    if K::KIND == Kind::Cluster
        && let Some(cluster) = pass.obj.cluster_name()
    {
        leases::release(
            &api,
            &names::cluster_write_lease(&pass.namespace, cluster),
            job,
        )
        .await?;
    }
    Ok(())
}

/// What every pass without an active Job gathers first: the cluster, the
/// credentials, the state, the Job policy and the inputs rendered now.
struct Gathered {
    /// The identity allows the namespace and its credentials are mirrored.
    credentials: bool,
    identity: Option<String>,
    secrets: Api<Secret>,
    view: StateView,
    settings: policy::JobSettings,
    rendered: Result<inputs::RenderedInputs, inputs::InputsError>,
}

/// The state as one pass sees it.
struct StateView {
    snapshot: state::Snapshot,
    fact: StateFact,
    /// A stale lock's ID, for the next Job to force-unlock.
    force_unlock: Option<String>,
    /// StateReadable turned to an unreadable reason in this pass.
    entered_unreadable: bool,
    /// An apply succeeded once (the durable inputs' marker, or a backup).
    ever_applied: bool,
    /// Applied once, and no state Secret is left: [`StateView::fact`]
    /// says Unreadable, so that nothing is applied over it.
    lost: bool,
    durable: Option<durable::Recorded>,
}

/// Which pass gathers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    /// `destroyed`: a destroy of the object succeeded, so a missing state
    /// is cleaned up, not lost.
    Deleting {
        destroyed: bool,
    },
}

async fn gather<K: Workload>(
    pass: &mut Pass<'_, K>,
    uid: &str,
    phase: Phase,
) -> Result<Gathered, Error> {
    let ctx = pass.ctx;
    let obj = pass.obj;
    let ns = pass.namespace.clone();
    let cluster = cluster_of(ctx, obj, &ns).await?;
    let spec = obj.workspace();
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    let durable = match secrets
        .get_opt(&names::inputs_secret(K::KIND, &pass.name))
        .await
        .map_err(Error::Kube)?
    {
        Some(s) if durable::owned_by(&s, uid) => durable::read(&s),
        _ => None,
    };

    // A machine or pool whose cluster is gone still destroys with the
    // identity its apply used (ref §8.6: a missing owner never blocks a
    // deletion); the identity must still allow the namespace.
    let recorded = durable
        .as_ref()
        .and_then(|d| d.identity.as_deref())
        .filter(|_| phase != Phase::Live);
    let identity = credentials::identity_name(spec, cluster.as_ref()).or(recorded);
    let creds = credentials::ensure(&ctx.client, &ns, identity, owner_reference(obj)?).await?;
    let credentials = creds.allowed.status == Status::True && creds.identity.is_some();
    let identity = creds.identity.clone();
    pass.set(creds.allowed);
    pass.set(creds.mirrored);

    let destroyed = phase == Phase::Deleting { destroyed: true };
    let view = read_state(pass, &secrets, durable, destroyed).await?;

    let settings = policy::resolve(
        spec.jobs.as_ref(),
        cluster
            .as_ref()
            .and_then(|c| c.spec.defaults.as_ref())
            .and_then(|d| d.jobs.as_ref()),
    );
    // A machine reads its sources only until it is applied (ref §1.2): it
    // is never applied again, so what they say later changes nothing, and
    // one deleted later must not make it unready.
    let sources = match spec.variables_from.as_deref() {
        Some(_) if K::KIND == Kind::Machine && view.ever_applied => &[],
        sources => sources.unwrap_or_default(),
    };
    let fetched = fetch_variables(&ctx.client, &ns, sources).await?;
    let rendered = match variables::merge(&fetched, spec.variables.as_ref(), Role::from(K::KIND)) {
        Ok(merged) => {
            pass.set(Cond::new(
                conditions::DEPENDENCIES_READY,
                Status::True,
                "DependenciesReady",
                "",
            ));
            inputs::render(&InputsRequest {
                kind: K::KIND,
                namespace: &ns,
                name: &pass.name,
                cluster_name: obj.cluster_name(),
                image: &spec.source.image,
                template: annotation(obj, "cluster.x-k8s.io/cloned-from-name"),
                variables: Some(&merged.variables),
                sensitive: &merged.sensitive,
            })
        }
        Err(e) => {
            pass.set(Cond::new(
                conditions::DEPENDENCIES_READY,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            Err(InputsError::Variables(e))
        }
    };
    Ok(Gathered {
        credentials,
        identity,
        secrets,
        view,
        settings,
        rendered,
    })
}

/// Reads the state (StateReadable, its gauges, events and counter) and
/// the state lock, checked only here, with no Job of the object active
/// (book: state-lock-and-stale-locks.md).
async fn read_state<K: Workload>(
    pass: &mut Pass<'_, K>,
    secrets: &Api<Secret>,
    durable: Option<durable::Recorded>,
    destroyed: bool,
) -> Result<StateView, Error> {
    let ctx = pass.ctx;
    let snapshot = state::snapshot(secrets, &pass.suffix).await?;
    let ever_applied = durable.as_ref().is_some_and(|d| d.applied)
        || !backups::existing(secrets, &pass.suffix)
            .await
            .map_err(Error::Backup)?
            .is_empty();
    let labels = pass.labels();
    let reason = snapshot.readable.reason();
    let mut status = match reason.status() {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    };
    let mut reason = reason.as_str();
    let mut message = snapshot.readable.message();
    let lost = ever_applied && !destroyed && snapshot.readable == StateReadable::NotFound;
    let fact = match &snapshot.readable {
        StateReadable::NotFound if lost => {
            // Applied once and gone: nothing may run from the spec alone
            // (a machine would be created twice) until it is restored.
            (status, reason) = (Status::False, "StateLost");
            ctx.metrics.state_bytes.remove(&labels);
            ctx.metrics.state_resources.remove(&labels);
            message = format!(
                "state Secret {} is missing although the object was applied; restore it from a backup",
                names::state_secret(&pass.suffix)
            );
            StateFact::Unreadable
        }
        StateReadable::NotFound => {
            ctx.metrics.state_bytes.remove(&labels);
            ctx.metrics.state_resources.remove(&labels);
            StateFact::NotFound
        }
        StateReadable::Read(st) => {
            ctx.metrics
                .state_bytes
                .get_or_create(&labels)
                .set(i64::try_from(st.compressed_bytes).unwrap_or(i64::MAX));
            ctx.metrics
                .state_resources
                .get_or_create(&labels)
                .set(i64::try_from(st.managed_resources).unwrap_or(i64::MAX));
            let serial = i64::try_from(st.serial).ok().filter(|s| *s >= 1);
            if serial.is_some()
                && serial != pass.status.observed_state_serial
                && let Some(note) = st.near_secret_limit_note()
            {
                pass.event(EventType::Warning, state::NEAR_SECRET_LIMIT_REASON, note)
                    .await;
            }
            let hash = snapshot
                .base(&pass.suffix)
                .and_then(|b| annotation(b, INPUTS_HASH))
                .map(str::to_string);
            StateFact::Read { inputs_hash: hash }
        }
        StateReadable::Unreadable(_) => StateFact::Unreadable,
    };
    let mut readable = Cond::new(STATE_READABLE, status, reason, message);
    let mut read_error = match lost {
        true => Some((metrics::StateReadError::Lost, "StateLost")),
        false => snapshot
            .readable
            .metric_reason()
            .and_then(|r| {
                metrics::StateReadError::ALL
                    .iter()
                    .copied()
                    .find(|m| m.as_str() == r)
            })
            .map(|m| (m, "StateUnreadable")),
    };

    let force_unlock = match locks::inspect(&ctx.client, &pass.namespace, K::KIND, &pass.name)
        .await?
    {
        Verdict::Free | Verdict::Alive { .. } => None,
        Verdict::Stale { id, pod, .. } => {
            debug!(%pod, "the state lock is stale: the next Job force-unlocks it");
            Some(id)
        }
        held @ (Verdict::Foreign { .. } | Verdict::Unparsable { .. }) => {
            // Never unlocked; Jobs keep starting, and each waits
            // lockTimeoutSeconds for the lock and fails.
            if fact != StateFact::Unreadable {
                readable = Cond::new(STATE_READABLE, Status::False, "StateLocked", held.message());
                read_error = Some((metrics::StateReadError::Locked, "StateLocked"));
            }
            None
        }
    };
    let before = pass.transitions.len();
    let note = readable.message.clone();
    pass.set(readable);
    let transitioned = pass.transitions.len() > before;
    let entered_unreadable =
        transitioned && matches!(snapshot.readable, StateReadable::Unreadable(_));
    if let (true, Some((metric_reason, event))) = (transitioned, read_error) {
        ctx.metrics
            .state_read_errors
            .get_or_create(&StateReadErrorLabels {
                kind: metrics_kind(K::KIND),
                reason: metric_reason,
            })
            .inc();
        pass.event(EventType::Warning, event, note).await;
    }
    Ok(StateView {
        snapshot,
        fact,
        force_unlock,
        entered_unreadable,
        ever_applied,
        lost,
        durable,
    })
}

/// Whether a Job may start: the credentials are there and the runner's
/// RBAC is in place. When not, the conditions say why.
async fn may_start<K: Workload>(pass: &mut Pass<'_, K>, g: &Gathered) -> Result<bool, Error> {
    if !g.credentials {
        // IdentityAllowed or CredentialsMirrored says why.
        return Ok(false);
    }
    let account = &g.settings.service_account_name;
    match rbac::ensure(&pass.ctx.client, &pass.namespace, account).await {
        Ok(()) => {
            pass.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::True,
                "RBACReady",
                format!(
                    "ServiceAccount {account} is bound to ClusterRole {}",
                    names::RUNNER_RBAC
                ),
            ));
            Ok(true)
        }
        Err(e @ (rbac::RbacError::NotOptedIn(_) | rbac::RbacError::ForeignRoleBinding { .. })) => {
            pass.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            Ok(false)
        }
        Err(e) => {
            pass.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            Err(e.into())
        }
    }
}

/// The part of a live pass without an active Job: backups, the restore
/// request, the decision, and the Job start.
async fn idle<K: Workload>(
    pass: &mut Pass<'_, K>,
    finished: &[Finished],
    jobs: &[Job],
    uid: &str,
) -> Result<Action, Error> {
    let ctx = pass.ctx;
    let g = gather(pass, uid, Phase::Live).await?;
    backup(
        pass,
        &g.secrets,
        &g.view.snapshot,
        g.view.entered_unreadable,
    )
    .await?;
    let rendered = match &g.rendered {
        Ok(r) => r,
        // DependenciesReady says it.
        Err(InputsError::Variables(_)) => return Ok(Action::requeue(ctx.settings.sync_period)),
        Err(e) => {
            pass.set(Cond::new(
                conditions::APPLY_JOB_SUCCEEDED,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            return Ok(Action::requeue(ctx.settings.sync_period));
        }
    };

    let restore = match annotation(pass.obj, RESTORE_STATE) {
        Some(raw) => match restore_due(pass, raw, jobs, &g.secrets).await? {
            RestoreDue::Wait => return Ok(Action::requeue(ctx.settings.sync_period)),
            due @ RestoreDue::Push { .. } => Some(due),
        },
        None => None,
    };

    let decision = decide::decide(&Facts {
        state: g.view.fact.clone(),
        inputs_hash: Some(rendered.inputs_hash.clone()),
        mutable: K::MUTABLE,
        finished: finished.to_vec(),
        failed_jobs_history_limit: g.settings.failed_jobs_history_limit,
        now: pass.now,
    });
    let reason = match (&restore, decision) {
        (Some(_), _) => decide::JobReason::RestoreRequested,
        (None, Decision::Idle) => return Ok(Action::requeue(ctx.settings.sync_period)),
        (
            None,
            Decision::Backoff {
                wait,
                failures,
                reason,
            },
        ) => {
            debug!(
                failures,
                ?wait,
                "apply due ({}) but backing off",
                reason.as_str()
            );
            return Ok(Action::requeue(wait + Duration::from_secs(1)));
        }
        (None, Decision::Apply(reason)) => reason,
    };
    if g.credentials
        && pass
            .status
            .conditions
            .as_deref()
            .and_then(|c| conditions::status_of(c, conditions::APPLY_JOB_SUCCEEDED))
            .is_none()
    {
        pass.set(Cond::new(
            conditions::APPLY_JOB_SUCCEEDED,
            Status::Unknown,
            "NoApplyYet",
            "no apply has run yet",
        ));
    }
    if !may_start(pass, &g).await? {
        return Ok(Action::requeue(ctx.settings.sync_period));
    }

    let image = pass.obj.workspace().source.image.clone();
    let base = Start {
        op: Op::Apply,
        rendered,
        image: &image,
        settings: &g.settings,
        identity: g.identity.as_deref(),
        force_unlock: g.view.force_unlock.as_deref(),
        reason,
        restore: None,
    };
    match &restore {
        Some(RestoreDue::Push {
            serial,
            chunks,
            resources,
            inputs_hash,
        }) => {
            let restore = Restore {
                serial,
                request: RestoreRequest {
                    chunk_secrets: chunks,
                    resources: *resources,
                },
                inputs_hash: inputs_hash.as_deref(),
            };
            start(
                pass,
                Start {
                    op: Op::Restore,
                    restore: Some(restore),
                    ..base
                },
                jobs,
                uid,
            )
            .await
        }
        _ => start(pass, base, jobs, uid).await,
    }
}

/// A pass of an object being deleted with no Job of it active (book:
/// terraform-state.md "State on deletion"; ref §8.6): wait for dependents,
/// hold, destroy, or clean up. None once the finalizer is removed.
async fn deleting_pass<K: Workload>(
    pass: &mut Pass<'_, K>,
    finished: &[Finished],
    jobs: &[Job],
    uid: &str,
) -> Result<Option<Action>, Error> {
    let ctx = pass.ctx;
    let ns = pass.namespace.clone();
    let dependents = if K::KIND == Kind::Cluster {
        dependents(ctx, pass.obj, &ns).await?
    } else {
        0
    };
    if K::KIND == Kind::Cluster && dependents == 0 {
        pass.set(Cond::new(
            conditions::DELETION_BLOCKED,
            Status::False,
            "NotBlocked",
            "no machine or pool of the cluster is left",
        ));
    }
    let destroyed = finished.iter().any(|f| f.op == Op::Destroy && f.succeeded);
    let g = gather(pass, uid, Phase::Deleting { destroyed }).await?;
    let facts = deletion::Facts {
        kind: K::KIND,
        dependents,
        abandoned: pass
            .obj
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(deletion::ABANDON))
            .is_some_and(|v| v == uid),
        state: if g.view.lost {
            StateFact::NotFound
        } else {
            g.view.fact.clone()
        },
        ever_applied: g.view.ever_applied,
        durable_inputs: g.view.durable.is_some(),
        renders: g.rendered.is_ok(),
        finished: finished.to_vec(),
        failed_jobs_history_limit: g.settings.failed_jobs_history_limit,
        now: pass.now,
    };
    let inputs = match deletion::next(&facts) {
        Step::WaitForDependents(n) => {
            let cluster = pass.obj.cluster_name().unwrap_or_default();
            pass.set(Cond::new(
                conditions::DELETION_BLOCKED,
                Status::True,
                "DependentsExist",
                format!("{n} TerraformMachine or TerraformMachinePool objects of cluster {cluster} remain"),
            ));
            return Ok(Some(Action::requeue(ctx.settings.sync_period)));
        }
        Step::Cleanup(why) => {
            cleanup(pass, &g.view.snapshot, why, uid).await?;
            return Ok(None);
        }
        Step::Hold(hold) => {
            let why = match hold {
                Hold::Lost => format!(
                    "the state Secret {} is missing although the object was applied",
                    names::state_secret(&pass.suffix)
                ),
                Hold::Unreadable => format!(
                    "the state cannot be read ({})",
                    g.view.snapshot.readable.reason().as_str()
                ),
            };
            let message = format!(
                "deletion held: {why}, so no destroy can run and every Secret is kept. Restore the state from a backup \
                 (status.stateBackups, Secrets {}-<serial>) into {}, and the destroy runs; or, to remove the object without \
                 a destroy and leave its infrastructure behind, annotate it {}={uid}",
                names::backup_secret(&pass.suffix, 0).trim_end_matches("-0"),
                names::state_secret(&pass.suffix),
                deletion::ABANDON,
            );
            let held_before = pass
                .obj
                .workspace_status()
                .and_then(|s| s.conditions.as_deref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == conditions::DELETING && c.reason == "DeletionHeld")
                });
            if !held_before {
                pass.event(EventType::Warning, "DeletionHeld", message.clone())
                    .await;
            }
            pass.deleting = Some(Cond::new(
                conditions::DELETING,
                Status::True,
                "DeletionHeld",
                message,
            ));
            return Ok(Some(Action::requeue(HELD_RECHECK)));
        }
        Step::MissingInputs => {
            let message = format!(
                "durable inputs Secret {} is missing or damaged: no destroy can be built; restore it, or annotate the object {}={uid} to remove it without a destroy",
                names::inputs_secret(K::KIND, &pass.name),
                deletion::ABANDON,
            );
            let before = pass.transitions.len();
            pass.set(Cond::new(
                conditions::APPLY_JOB_SUCCEEDED,
                Status::False,
                "DestroyFailed",
                message.clone(),
            ));
            if pass.transitions.len() > before {
                pass.event(EventType::Warning, "JobFailed", message).await;
            }
            return Ok(Some(Action::requeue(ctx.settings.sync_period)));
        }
        Step::Backoff { wait, failures } => {
            debug!(failures, ?wait, "destroy due but backing off");
            return Ok(Some(Action::requeue(wait + Duration::from_secs(1))));
        }
        Step::Destroy(inputs) => inputs,
    };
    let (rendered, image) = match (inputs, &g.view.durable, &g.rendered) {
        (DestroyInputs::Durable, Some(d), _) => (&d.inputs, d.image.clone()),
        (_, _, Ok(r)) => (r, None),
        // next() chose Durable only with durable inputs, Current only when the spec renders.
        _ => return Ok(Some(Action::requeue(ctx.settings.sync_period))),
    };
    if !may_start(pass, &g).await? {
        return Ok(Some(Action::requeue(ctx.settings.sync_period)));
    }
    let image = image.unwrap_or_else(|| pass.obj.workspace().source.image.clone());
    let start_ = Start {
        op: Op::Destroy,
        rendered,
        image: &image,
        settings: &g.settings,
        identity: g.identity.as_deref(),
        force_unlock: g.view.force_unlock.as_deref(),
        reason: decide::JobReason::Deleting,
        restore: None,
    };
    start(pass, start_, jobs, uid).await.map(Some)
}

/// TerraformMachines and TerraformMachinePools of a TerraformCluster's
/// cluster in its namespace (ref §8.6).
async fn dependents<K: Workload>(ctx: &Context, obj: &K, ns: &str) -> Result<usize, Error> {
    let Some(cluster) = obj.cluster_name() else {
        return Ok(0);
    };
    let selector = ListParams::default().labels(&format!(
        "{CLUSTER_NAME_LABEL}={}",
        names::label_value(cluster)
    ));
    let machines = Api::<TerraformMachine>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&selector)
        .await
        .map_err(Error::Kube)?;
    let pools = Api::<TerraformMachinePool>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&selector)
        .await
        .map_err(Error::Kube)?;
    Ok(machines.items.len() + pools.items.len())
}

/// Cleanup (ref §8.6), in order, each step idempotent so that a pass cut
/// short anywhere is finished by the next: the state Secrets and the lock
/// Lease; the durable inputs Secret; the run lease and a cluster's write
/// lease; the object's share of the credentials mirror; the finalizer.
/// Backups are left to the garbage collector, with the object.
async fn cleanup<K: Workload>(
    pass: &mut Pass<'_, K>,
    snapshot: &state::Snapshot,
    why: Why,
    uid: &str,
) -> Result<(), Error> {
    let ctx = pass.ctx;
    let ns = pass.namespace.clone();
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    let leases = Api::<Lease>::namespaced(ctx.client.clone(), &ns);
    for secret in &snapshot.secrets {
        let name = secret.name_any();
        if name == names::state_secret(&pass.suffix)
            || names::state_chunk_index(&pass.suffix, &name).is_some()
        {
            delete_if_present(&secrets, &name).await?;
        }
    }
    delete_if_present(&leases, &names::state_lock_lease(&pass.suffix)).await?;
    let inputs = names::inputs_secret(K::KIND, &pass.name);
    if secrets
        .get_opt(&inputs)
        .await
        .map_err(Error::Kube)?
        .is_some_and(|s| durable::owned_by(&s, uid))
    {
        delete_if_present(&secrets, &inputs).await?;
    }
    delete_if_present(&leases, &names::run_lease(&pass.suffix)).await?;
    if let (Kind::Cluster, Some(cluster)) = (K::KIND, pass.obj.cluster_name()) {
        delete_if_present(&leases, &names::cluster_write_lease(&ns, cluster)).await?;
    }
    for mirror in credentials::release(&ctx.client, &ns, uid)
        .await
        .map_err(Error::Kube)?
    {
        pass.event(
            EventType::Normal,
            "MirrorRemoved",
            format!("credentials mirror {mirror} deleted: this object was its last user"),
        )
        .await;
    }
    match why {
        Why::Destroyed => {
            pass.event(
                EventType::Normal,
                "Destroyed",
                "the destroy succeeded and cleanup ran".into(),
            )
            .await
        }
        Why::Abandoned => {
            pass.event(
                EventType::Warning,
                "InfrastructureAbandoned",
                format!("{} names this object: cleaned up without a destroy; its infrastructure is left as it is", deletion::ABANDON),
            )
            .await;
        }
        Why::NeverApplied => {}
    }
    remove_finalizer(pass).await?;
    ctx.metrics.forget(metrics_kind(K::KIND), &ns, &pass.name);
    pass.event(
        EventType::Normal,
        "FinalizerRemoved",
        format!("finalizer {} removed", deletion::finalizer(K::KIND)),
    )
    .await;
    info!(namespace = %ns, name = %pass.name, "deleted ({})", match why {
        Why::Destroyed => "destroyed",
        Why::NeverApplied => "never applied",
        Why::Abandoned => "abandoned",
    });
    // The namespace may be empty now; a failed sweep is retried by the
    // periodic one.
    if let Err(e) = sweep::sweep(&ctx.client, &ns).await {
        warn!(namespace = %ns, "namespace sweep: {e}");
    }
    Ok(())
}

async fn delete_if_present<R>(api: &Api<R>, name: &str) -> Result<(), Error>
where
    R: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Adds the finalizer, guarded by the resourceVersion read.
async fn add_finalizer<K: Workload>(
    ctx: &Context,
    obj: &K,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let mut finalizers = obj.meta().finalizers.clone().unwrap_or_default();
    finalizers.push(deletion::finalizer(K::KIND).to_string());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.meta().resource_version}});
    Api::<K>::namespaced(ctx.client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// Removes the finalizer at the index it was read at, tested first, so
/// that a list changed meanwhile fails the write instead of removing
/// another controller's entry.
async fn remove_finalizer<K: Workload>(pass: &Pass<'_, K>) -> Result<(), Error> {
    let ours = deletion::finalizer(K::KIND);
    let Some(index) = pass
        .obj
        .meta()
        .finalizers
        .iter()
        .flatten()
        .position(|f| f == ours)
    else {
        return Ok(());
    };
    let index = index.to_string();
    let path = || PointerBuf::from_tokens(["metadata", "finalizers", index.as_str()]);
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path(),
            value: json!(ours),
        }),
        PatchOperation::Remove(RemoveOperation { path: path() }),
    ]);
    match Api::<K>::namespaced(pass.ctx.client.clone(), &pass.namespace)
        .patch(
            &pass.name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// What a Job start needs besides the pass.
struct Start<'a> {
    op: Op,
    rendered: &'a inputs::RenderedInputs,
    /// The module image: the spec's, or for a destroy the one applied.
    image: &'a str,
    settings: &'a policy::JobSettings,
    identity: Option<&'a str>,
    /// A stale lock's ID, force-unlocked by this Job after init.
    force_unlock: Option<&'a str>,
    reason: decide::JobReason,
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
async fn start<K: Workload>(
    pass: &mut Pass<'_, K>,
    start: Start<'_>,
    jobs: &[Job],
    uid: &str,
) -> Result<Action, Error> {
    let Start {
        op,
        rendered,
        image,
        settings,
        identity,
        force_unlock,
        reason,
        restore,
    } = start;
    let job_condition = if op == Op::Restore {
        conditions::RESTORE_JOB_SUCCEEDED
    } else {
        conditions::APPLY_JOB_SUCCEEDED
    };
    let ctx = pass.ctx;
    let obj = pass.obj;
    let ns = pass.namespace.clone();
    let attempt = builder::next_attempt(op, jobs);
    let hash6 = builder::hash6(&rendered.inputs_hash, op, attempt, 0);
    let job_name = names::job(K::KIND, &pass.name, op, attempt, &hash6);
    let leases_api = Api::<Lease>::namespaced(ctx.client.clone(), &ns);
    let jobs_api = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let deadline =
        Duration::from_secs(u64::try_from(settings.active_deadline_seconds).unwrap_or(0));
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
    if let Acquired::HeldBy(holder) = leases::acquire(
        &leases_api,
        &leases::run_lease(&request),
        &jobs_api,
        deadline,
    )
    .await?
    {
        pass.set(Cond::new(
            job_condition,
            Status::Unknown,
            "WaitingForRunLease",
            format!("Job {holder} holds the run lease {run_lease}"),
        ));
        wait_metric(pass, metrics::LeaseWait::RunLease);
        return Ok(Action::requeue(LEASE_RECHECK));
    }
    if let (true, Some(cluster)) = (ctx.settings.cluster_operation_gate, obj.cluster_name()) {
        let gate = names::cluster_write_lease(&ns, cluster);
        if K::KIND == Kind::Cluster {
            if let Some(lease) = leases::cluster_write_lease(&request)
                && let Acquired::HeldBy(holder) =
                    leases::acquire(&leases_api, &lease, &jobs_api, deadline).await?
            {
                leases::release(&leases_api, &run_lease, &job_name).await?;
                pass.set(Cond::new(
                    job_condition,
                    Status::Unknown,
                    "WaitingForRunLease",
                    format!("Job {holder} holds the cluster write lease {gate}"),
                ));
                wait_metric(pass, metrics::LeaseWait::RunLease);
                return Ok(Action::requeue(LEASE_RECHECK));
            }
        } else if let Some(holder) = leases::holder(&leases_api, &gate).await? {
            // A Job that cannot be read counts as running: never go ahead
            // of the cluster on a guess.
            let running = !matches!(
                jobs_api.job_state(&holder).await,
                Ok(JobState::Finished | JobState::Missing)
            );
            if running {
                leases::release(&leases_api, &run_lease, &job_name).await?;
                pass.set(Cond::new(
                    job_condition,
                    Status::Unknown,
                    "WaitingForClusterOperation",
                    format!("the cluster's Job {holder} holds the cluster write lease {gate}"),
                ));
                if pass
                    .transitions
                    .last()
                    .is_some_and(|t| t.reason == "WaitingForClusterOperation")
                {
                    pass.event(
                        EventType::Normal,
                        "WaitingForClusterOperation",
                        format!("waiting for the cluster's Job {holder}"),
                    )
                    .await;
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
        image,
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
    if op == Op::Apply {
        // Written at the start, whether or not the apply succeeds: a
        // destroy must find what may have been created.
        let record = durable::Record {
            kind: K::KIND,
            namespace: &ns,
            name: &pass.name,
            cluster_name: obj.cluster_name(),
            owner: owner_reference(obj)?,
            inputs: rendered,
            image,
            identity,
        };
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
        if let Err(e) = durable::write(&secrets, durable::build(&record), uid).await {
            release(pass, &job_name).await?;
            return Err(Error::Durable(e));
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
        ctx.metrics
            .lock_force_unlocks
            .get_or_create(&metrics::KindLabels {
                kind: metrics_kind(K::KIND),
            })
            .inc();
        pass.job_event(
            EventType::Warning,
            "ForceUnlocked",
            format!("Job {job_name} force-unlocks the stale state lock {id} left by an ended runner pod of this object"),
            &created,
        )
        .await;
    }
    if reason == decide::JobReason::InputsChanged {
        ctx.metrics
            .inputs_hash_changes
            .get_or_create(&metrics::KindLabels {
                kind: metrics_kind(K::KIND),
            })
            .inc();
        pass.event(
            EventType::Normal,
            "InputsChanged",
            format!(
                "inputs hash {} differs from the state's",
                rendered.inputs_hash
            ),
        )
        .await;
    }
    ctx.metrics
        .reconcile_op_decisions
        .get_or_create(&metrics::DecisionLabels {
            kind: metrics_kind(K::KIND),
            op: metrics_op(op),
            reason: reason.metric(),
        })
        .inc();
    pass.job_event(
        EventType::Normal,
        "JobCreated",
        format!(
            "{} Job {job_name} (attempt {attempt}, image {image}): {}",
            op.as_str(),
            reason.as_str()
        ),
        &created,
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
    pass.ctx
        .metrics
        .lease_waits
        .get_or_create(&metrics::LeaseWaitLabels {
            kind: metrics_kind(K::KIND),
            reason,
        })
        .inc();
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
    api.patch_status(
        &pass.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
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
    let type_ = if t.to == Status::False {
        EventType::Warning
    } else {
        EventType::Normal
    };
    pass.event(
        type_,
        "ConditionChanged",
        format!("{}: {from} -> {}/{}", t.type_, t.to.as_str(), t.reason),
    )
    .await;
}
