//! Starting a Job the decision built: the runner's RBAC, the lease steps
//! (each a guarded write that reads only the Lease it takes), the apply's
//! durable inputs, the Job and its per-run Secret. A lease held by another
//! Job ends the start without an error: the object waits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tracing::{info, warn};

use super::Object;
use super::cached;
use super::has_annotation;
use super::plan::{Draft, Note, Start};
use super::record::record;
use super::version::Version;
use crate::api::ActiveJob;
use crate::controllers::conditions::{self, Cond, RUNNER_RBAC_READY, Status};
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::jobs::away;
use crate::jobs::builder;
use crate::jobs::durable;
use crate::jobs::leases::{self, Acquired, Gate, JobState, LeaseRequest};
use crate::jobs::plans;
use crate::jobs::rbac;
use crate::keys::BLOCK_MOVE;
use crate::metrics::LeaseWait;
use crate::names;
use crate::outputs;

/// Lease waits re-check this often (ref §8.4).
pub const LEASE_RECHECK: Duration = Duration::from_secs(30);

/// What a start came to.
pub enum Launched {
    Started,
    /// A lease is held, or the RBAC refused: the draft says why.
    Waiting {
        recheck: Option<Duration>,
    },
}

/// How long a start that had to be undone waits before the next try. Its
/// Job's creation and deletion wake the object at once, and the API server
/// would refuse the same Secret again.
pub const UNDONE_START_WAIT: Duration = Duration::from_secs(10);

/// The objects whose last start was undone, and when: kept in memory only
/// (a restarted manager tries once more at once), an entry dropped on the
/// object's next start or once it is [`UNDONE_START_WAIT`] old.
#[derive(Default)]
pub struct UndoneStarts(Mutex<HashMap<String, Instant>>);

impl UndoneStarts {
    /// The wait left before the object of `uid` may start again.
    fn wait(&self, uid: &str) -> Option<Duration> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let left = UNDONE_START_WAIT.checked_sub(map.get(uid)?.elapsed())?;
        (!left.is_zero()).then_some(left)
    }

    fn undone(&self, uid: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, at| at.elapsed() < UNDONE_START_WAIT);
        map.insert(uid.to_owned(), Instant::now());
    }

    fn started(&self, uid: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(uid);
    }
}

pub async fn launch<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    draft: &mut Draft,
    version: &mut Version,
    start: Start,
) -> Result<Launched, Error> {
    let ready = match &start.away {
        Some(away) => away_rbac(ctx, o, draft, &away.namespace).await?,
        None => runner_rbac(ctx, o, draft, &start.service_account).await?,
    };
    if !ready {
        return Ok(Launched::Waiting { recheck: None });
    }
    // The credentials copied beside a Job run away: the mirror's data.
    let mirror = match start.away.as_ref().and_then(|a| a.mirror.as_deref()) {
        Some(name) => match Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace)
            .get_opt(name)
            .await
            .map_err(Error::Kube)?
        {
            Some(mirror) => Some(mirror),
            // Gone since the pass saw it: the next pass decides anew.
            None => return Ok(Launched::Waiting { recheck: None }),
        },
        None => None,
    };
    if let Some(left) = ctx.undone_starts.wait(&o.uid) {
        return Ok(Launched::Waiting {
            recheck: Some(left),
        });
    }
    let job_name = start.job.metadata.name.clone().unwrap_or_default();
    // Where the Job, its per-run Secret and the leases it takes go.
    let site = start.away.as_ref().map_or(&o.namespace, |a| &a.namespace);
    let leases_api = Api::<Lease>::namespaced(ctx.client.clone(), site);
    let jobs_api = Api::<Job>::namespaced(ctx.client.clone(), site);
    let request = LeaseRequest {
        kind: K::KIND,
        namespace: &o.namespace,
        name: &o.name,
        cluster_name: start.cluster_name.as_deref(),
        op: start.op,
        job: &job_name,
        now: draft.now(),
    };
    let run_lease = names::run_lease(&o.suffix);
    for step in &start.gate {
        let waiting = match step {
            Gate::TakeRunLease => match leases::acquire(
                &leases_api,
                &sited(leases::run_lease(&request), site),
                &jobs_api,
                start.deadline,
                ctx.watches.leases.get(site, &run_lease).is_some(),
            )
            .await?
            {
                Acquired::Taken => None,
                Acquired::HeldBy(holder) => Some((
                    "WaitingForRunLease",
                    format!("Job {holder} holds the run lease {run_lease}"),
                    LeaseWait::RunLease,
                    None,
                )),
            },
            Gate::TakeClusterWriteLease => {
                let Some(lease) = leases::cluster_write_lease(&request) else {
                    continue;
                };
                let lease = sited(lease, site);
                let gate = lease.metadata.name.clone().unwrap_or_default();
                let seen = ctx.watches.leases.get(site, &gate).is_some();
                match leases::acquire(&leases_api, &lease, &jobs_api, start.deadline, seen).await? {
                    Acquired::Taken => None,
                    Acquired::HeldBy(holder) => Some((
                        "WaitingForRunLease",
                        format!("Job {holder} holds the cluster write lease {gate}"),
                        LeaseWait::RunLease,
                        None,
                    )),
                }
            }
            Gate::WaitForClusterWriteLease => {
                let Some(cluster) = start.cluster_name.as_deref() else {
                    continue;
                };
                // The cluster's Jobs run in the namespace.
                let gate = names::cluster_write_lease(&o.namespace, cluster);
                let home_leases = Api::<Lease>::namespaced(ctx.client.clone(), &o.namespace);
                let home_jobs = Api::<Job>::namespaced(ctx.client.clone(), &o.namespace);
                match leases::holder(&home_leases, &gate).await? {
                    // A Job that cannot be read counts as running: never go
                    // ahead of the cluster on a guess.
                    Some(holder)
                        if !matches!(
                            leases::HolderLookup::job_state(&home_jobs, &holder).await,
                            Ok(JobState::Finished | JobState::Missing)
                        ) =>
                    {
                        Some((
                            "WaitingForClusterOperation",
                            format!(
                                "the cluster's Job {holder} holds the cluster write lease {gate}"
                            ),
                            LeaseWait::ClusterOperation,
                            Some(format!("waiting for the cluster's Job {holder}")),
                        ))
                    }
                    _ => None,
                }
            }
        };
        if let Some((reason, message, metric, note)) = waiting {
            if *step != Gate::TakeRunLease {
                leases::release(&leases_api, &run_lease, &job_name).await?;
            }
            let changed = draft.set(Cond::new(start.condition, Status::Unknown, reason, message));
            // The cluster operation wait is counted and told once per wait;
            // a run lease wait on every pass that meets it.
            match note {
                Some(note) if changed => {
                    record(
                        ctx,
                        obj,
                        o,
                        &Note::normal("WaitingForClusterOperation", note),
                    )
                    .await;
                    ctx.metrics.lease_wait(K::KIND, metric);
                }
                Some(_) => {}
                None => ctx.metrics.lease_wait(K::KIND, metric),
            }
            return Ok(Launched::Waiting {
                recheck: Some(LEASE_RECHECK),
            });
        }
    }

    // Set directly, before the Job exists, so that clusterctl move never
    // carries the object away from a running Job (ref §8.1 step 11).
    if !has_annotation(obj, BLOCK_MOVE) {
        let patch = serde_json::json!({"metadata": {"annotations": {BLOCK_MOVE: "true"}}});
        let patched = version.patch::<K>(ctx, o, patch).await;
        if let Err(e) = patched {
            release(ctx, o, &start, &job_name).await?;
            return Err(e);
        }
    }
    if start.saves_plan {
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace);
        let owner = plans::Owner {
            kind: K::KIND,
            namespace: &o.namespace,
            name: &o.name,
            cluster_name: start.cluster_name.as_deref(),
            owner: &o.owner,
        };
        if let Err(e) = plans::ensure(&secrets, &owner).await {
            release(ctx, o, &start, &job_name).await?;
            return Err(Error::PlanSecrets(e));
        }
    }
    if let Some(record) = start.durable.clone() {
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace);
        let seen = cached::durable_seen::<K>(ctx, o);
        match durable::write(&secrets, record, &o.uid, seen).await {
            Ok(written) => cached::wrote_durable(ctx, o, written),
            Err(e) => {
                release(ctx, o, &start, &job_name).await?;
                return Err(Error::Durable(e));
            }
        }
    }
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), site);
    let created = match jobs_api.create(&PostParams::default(), &start.job).await {
        Ok(created) => created,
        // Another pass created it first: that pass owns the start.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Ok(Launched::Waiting {
                recheck: Some(LEASE_RECHECK),
            });
        }
        Err(e) => {
            release(ctx, o, &start, &job_name).await?;
            return Err(Error::Kube(e));
        }
    };
    let mut secret = start.run_secret.clone();
    if builder::own_run_secret(&mut secret, &created).is_err() {
        return Err(Error::MissingMetadata("uid on the created Job"));
    }
    let mut secrets_of_run = vec![secret];
    if let Some(mirror) = &mirror {
        let copy = away::credentials(mirror, &created, &o.namespace)
            .map_err(|_| Error::MissingMetadata("uid on the created Job"))?;
        secrets_of_run.push(copy);
    }
    for secret in &secrets_of_run {
        match secrets.create(&PostParams::default(), secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                // Its pod would wait for the Secret, holding the run lease,
                // and no later pass creates it for an active Job: the start
                // is undone, and a later pass starts afresh.
                let only_this = DeleteParams {
                    preconditions: created.metadata.uid.clone().map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                if let Err(undo) = jobs_api.delete(&job_name, &only_this).await {
                    warn!(namespace = %site, job = %job_name, "deleting the Job whose per-run Secret could not be created: {undo}");
                }
                ctx.undone_starts.undone(&o.uid);
                release(ctx, o, &start, &job_name).await?;
                return Err(Error::Kube(e));
            }
        }
    }
    ctx.undone_starts.started(&o.uid);
    if start.op == names::Op::Apply {
        let current = draft.status_of(conditions::INFRASTRUCTURE_HEALTHY);
        if let Some(cond) = outputs::apply_started(current) {
            draft.set(cond);
        }
    }
    info!(namespace = %o.namespace, name = %o.name, job = %job_name, job_namespace = %site, "started {} Job: {}", start.op.as_str(), start.why);
    for note in start.job_notes {
        record(ctx, obj, o, &note.about(&created)).await;
    }
    for note in &start.notes {
        record(ctx, obj, o, note).await;
    }
    if start.counts.force_unlock {
        ctx.metrics.force_unlock(K::KIND);
    }
    if start.counts.plan_approved {
        ctx.metrics
            .plan_approval(K::KIND, crate::metrics::ApprovalResult::Approved);
    }
    ctx.metrics.op_decided(
        K::KIND,
        start.op,
        start.counts.reason,
        start.counts.inputs_changed,
    );
    let attempt = created
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::keys::ATTEMPT_LABEL))
        .and_then(|a| a.parse::<i32>().ok())
        .unwrap_or(1);
    draft.status.active_job = Some(ActiveJob {
        name: job_name,
        operation: start.op,
        attempt,
        start_time: Some(Time(draft.now())),
    });
    Ok(Launched::Started)
}

/// A lease taken where the Job runs.
fn sited(mut lease: Lease, site: &str) -> Lease {
    lease.metadata.namespace = Some(site.to_owned());
    lease
}

/// Gives back the leases a start took before it failed.
async fn release(ctx: &Context, o: &Object, start: &Start, job: &str) -> Result<(), Error> {
    let site = start.away.as_ref().map_or(&o.namespace, |a| &a.namespace);
    let api = Api::<Lease>::namespaced(ctx.client.clone(), site);
    leases::release(&api, &names::run_lease(&o.suffix), job).await?;
    if start.gate.contains(&Gate::TakeClusterWriteLease)
        && let Some(cluster) = start.cluster_name.as_deref()
    {
        leases::release(
            &api,
            &names::cluster_write_lease(&o.namespace, cluster),
            job,
        )
        .await?;
    }
    Ok(())
}

/// The away runner account of the object's namespace, bound there; false
/// when the namespace's RoleBinding cannot take it.
async fn away_rbac(
    ctx: &Context,
    o: &Object,
    draft: &mut Draft,
    away: &str,
) -> Result<bool, Error> {
    let account = names::away_runner(&o.namespace);
    match away::ensure_rbac(&ctx.client, &o.namespace, away).await {
        Ok(()) => {
            draft.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::True,
                "RBACReady",
                format!(
                    "ServiceAccount {away}/{account} is bound to ClusterRole {} in namespace {}, for a destroy from namespace {away}",
                    names::RUNNER_RBAC,
                    o.namespace
                ),
            ));
            Ok(true)
        }
        Err(e) => {
            draft.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::False,
                "RBACFailed",
                e.to_string(),
            ));
            match e {
                away::AwayError::Refused { .. } => Ok(false),
                e => Err(Error::Away(e)),
            }
        }
    }
}

/// The runner's ServiceAccount and RoleBinding; false when RBAC refuses
/// (an override account not opted in, a RoleBinding that is not ours).
async fn runner_rbac(
    ctx: &Context,
    o: &Object,
    draft: &mut Draft,
    account: &str,
) -> Result<bool, Error> {
    let seen = rbac::in_place(
        &o.namespace,
        account,
        ctx.watches.accounts.get(&o.namespace, account).is_some(),
        ctx.watches
            .bindings
            .get(&o.namespace, names::RUNNER_RBAC)
            .as_deref(),
    );
    let ensured = match seen {
        true => Ok(()),
        false => rbac::ensure(&ctx.client, &o.namespace, account).await,
    };
    match ensured {
        Ok(()) => {
            draft.set(Cond::new(
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
        Err(e) => {
            draft.set(Cond::new(
                RUNNER_RBAC_READY,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            match e {
                rbac::RbacError::NotOptedIn(_) | rbac::RbacError::ForeignRoleBinding { .. } => {
                    Ok(false)
                }
                e => Err(e.into()),
            }
        }
    }
}
