//! CAPTF's two Leases (book: inside-the-job.md "Locks"; ref §7, §8.4,
//! §8.5): the run lease `captf-run-<suffix>` keeps two Jobs from running
//! for one object, and the cluster write lease makes machines and pools wait
//! while their TerraformCluster applies, destroys or restores.
//!
//! Both name the Job that holds them in `spec.holderIdentity` and carry no
//! ownerRefs, so the namespace sweep, not the garbage collector, removes
//! them. Every write carries the resourceVersion it read, so two managers
//! (or two reconciles) racing for a Lease cannot both win.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

use super::{lost_race, owner_labels};
use crate::error::{Categorized, Category, kube_category};
use crate::keys::{LEASE_ACQUIRED_AT, LEASE_LABEL, LEASE_OP};
use crate::names::{self, Kind, Op};

/// How long a holder Job may be missing before its Lease is taken over: it
/// covers the gap between taking the Lease and creating the Job.
pub const MISSING_GRACE: Duration = Duration::from_secs(30);
/// How long past its deadline a holder keeps its Lease whatever its Job
/// looks like.
pub const BACKSTOP: Duration = Duration::from_secs(600);
/// How many times a write that lost a race is retried after re-reading.
const WRITE_ATTEMPTS: usize = 5;

/// Who takes a Lease, for what.
#[derive(Clone, Copy, Debug)]
pub struct LeaseRequest<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    pub cluster_name: Option<&'a str>,
    pub op: Op,
    /// The Job that will hold the Lease.
    pub job: &'a str,
    pub now: Timestamp,
}

/// The run lease of the object, held by `req.job`.
pub fn run_lease(req: &LeaseRequest) -> Lease {
    let suffix = names::suffix(req.namespace, req.kind, req.name);
    lease(req, names::run_lease(&suffix), "run")
}

/// The write lease of the object's cluster, held by `req.job`; None when
/// the object belongs to no cluster.
pub fn cluster_write_lease(req: &LeaseRequest) -> Option<Lease> {
    let cluster = req.cluster_name?;
    Some(lease(
        req,
        names::cluster_write_lease(req.namespace, cluster),
        "cluster",
    ))
}

fn lease(req: &LeaseRequest, name: String, which: &str) -> Lease {
    let mut labels = owner_labels(req.kind, req.name, req.cluster_name);
    labels.insert(LEASE_LABEL.into(), which.into());
    Lease {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(req.namespace.into()),
            labels: Some(labels),
            annotations: Some(
                [
                    (LEASE_OP.into(), req.op.as_str().into()),
                    (LEASE_ACQUIRED_AT.into(), req.now.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(req.job.into()),
            acquire_time: Some(MicroTime(req.now)),
            ..Default::default()
        }),
    }
}

/// What became of the Job that holds a Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderJob {
    Active,
    Finished,
    /// The Job does not exist; `since` is how long, counted from when the
    /// Lease was taken.
    Missing {
        since: Duration,
    },
}

/// Whether a Lease held by `holder`, taken `acquired_age` ago, may be taken
/// over (ref §8.4): its Job has finished, has been missing for longer than
/// the grace period, or the Lease is older than the Job's `deadline` plus
/// the backstop.
pub fn may_take_over(holder: &HolderJob, acquired_age: Duration, deadline: Duration) -> bool {
    let expired = acquired_age >= deadline.saturating_add(BACKSTOP);
    expired
        || match holder {
            HolderJob::Active => false,
            HolderJob::Finished => true,
            HolderJob::Missing { since } => *since >= MISSING_GRACE,
        }
}

/// How long ago `lease` was taken: from its acquired-at annotation, else its
/// acquireTime, else its creation. A time in the future counts as now.
pub fn acquired_age(lease: &Lease, now: Timestamp) -> Duration {
    let annotated = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEASE_ACQUIRED_AT))
        .and_then(|at| at.parse::<Timestamp>().ok());
    let acquired = annotated
        .or_else(|| lease.spec.as_ref()?.acquire_time.as_ref().map(|t| t.0))
        .or_else(|| lease.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    Duration::try_from(now.duration_since(acquired)).unwrap_or(Duration::ZERO)
}

/// Whether a Job exists and has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Active,
    Finished,
    Missing,
}

/// The state of `job` as read (None: it does not exist). A Job has finished
/// once it has a Complete or Failed condition that is True; one being
/// deleted is still active while it exists, since its pod may run.
pub fn job_state(job: Option<&Job>) -> JobState {
    let Some(job) = job else {
        return JobState::Missing;
    };
    let finished = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        });
    if finished {
        JobState::Finished
    } else {
        JobState::Active
    }
}

/// Finds out what became of a Lease holder's Job; the Jobs of the Lease's
/// namespace answer it with a read.
pub trait HolderLookup: Sync {
    fn job_state(&self, job: &str) -> impl Future<Output = Result<JobState, kube::Error>> + Send;
}

impl HolderLookup for Api<Job> {
    async fn job_state(&self, job: &str) -> Result<JobState, kube::Error> {
        Ok(job_state(self.get_opt(job).await?.as_ref()))
    }
}

/// One step of taking the leases a Job start needs, in order (book:
/// inside-the-job.md; ref §8.5). A step that finds its Lease held ends the
/// start: the leases taken before it are given back, and the object waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Take the object's run lease: always.
    TakeRunLease,
    /// A TerraformCluster's apply, destroy or restore takes its cluster
    /// write lease.
    TakeClusterWriteLease,
    /// A machine or pool waits while its cluster's running Job holds the
    /// cluster write lease (WaitingForClusterOperation).
    WaitForClusterWriteLease,
}

/// The lease steps of a start: the run lease, then, with the gate on, for
/// an apply, destroy or restore of an object that names a cluster, the
/// cluster write lease (a cluster takes it; a machine or pool only checks
/// it). refresh, drift and plan are not gated.
pub fn gate(kind: Kind, op: Op, gate_on: bool, has_cluster: bool) -> Vec<Gate> {
    let gated = gate_on && has_cluster && matches!(op, Op::Apply | Op::Destroy | Op::Restore);
    match (gated, kind) {
        (false, _) => vec![Gate::TakeRunLease],
        (true, Kind::Cluster) => vec![Gate::TakeRunLease, Gate::TakeClusterWriteLease],
        (true, Kind::Machine | Kind::MachinePool) => {
            vec![Gate::TakeRunLease, Gate::WaitForClusterWriteLease]
        }
    }
}

/// The outcome of [`acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The Lease is held by the desired Job now (or was already).
    Taken,
    /// Another Job holds it and may keep it.
    HeldBy(String),
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the desired Lease has no name or no holder")]
    Incomplete,
    #[error("lease: {0}")]
    Api(#[from] kube::Error),
}

impl Categorized for LeaseError {
    fn category(&self) -> Category {
        match self {
            LeaseError::Incomplete => Category::Internal,
            LeaseError::Api(error) => kube_category(error),
        }
    }
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// Takes `desired` (built by [`run_lease`] or [`cluster_write_lease`]) for
/// its holder Job: creates it when absent, takes it when it is free, ours
/// already, or may be taken over from its holder (looked up in `holders`;
/// `deadline` is the holder Job's activeDeadlineSeconds), else reports who
/// holds it. One the watch has not `seen` is created first, unread: the
/// create is the check, and one there after all is read as any other.
pub async fn acquire(
    api: &Api<Lease>,
    desired: &Lease,
    holders: &impl HolderLookup,
    deadline: Duration,
    seen: bool,
) -> Result<Acquired, LeaseError> {
    let name = desired
        .metadata
        .name
        .as_deref()
        .ok_or(LeaseError::Incomplete)?;
    let ours = holder_of(desired).ok_or(LeaseError::Incomplete)?;
    let mut attempt = 0;
    let mut absent = !seen;
    loop {
        attempt += 1;
        let current = match std::mem::take(&mut absent) {
            true => None,
            false => api.get_opt(name).await?,
        };
        let written = match current {
            None => api.create(&PostParams::default(), desired).await,
            Some(current) => {
                if let Some(holder) = holder_of(&current) {
                    if holder == ours {
                        return Ok(Acquired::Taken);
                    }
                    let age = acquired_age(&current, Timestamp::now());
                    let holder_job = match holders.job_state(holder).await? {
                        JobState::Active => HolderJob::Active,
                        JobState::Finished => HolderJob::Finished,
                        JobState::Missing => HolderJob::Missing { since: age },
                    };
                    if !may_take_over(&holder_job, age, deadline) {
                        return Ok(Acquired::HeldBy(holder.to_owned()));
                    }
                }
                let mut next = desired.clone();
                next.metadata.resource_version = current.metadata.resource_version;
                api.replace(name, &PostParams::default(), &next).await
            }
        };
        match written {
            Ok(_) => return Ok(Acquired::Taken),
            // Someone else wrote first: read again to see who.
            Err(e) if attempt < WRITE_ATTEMPTS && lost_race(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Frees the Lease `name` if `holder_job` still holds it; a Lease held by
/// another Job, or gone, is left as it is.
pub async fn release(api: &Api<Lease>, name: &str, holder_job: &str) -> Result<(), LeaseError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut lease) = api.get_opt(name).await? else {
            return Ok(());
        };
        if holder_of(&lease) != Some(holder_job) {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        // The read resourceVersion stays, so a takeover in between wins.
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => return Ok(()),
            Err(e) if attempt < WRITE_ATTEMPTS && lost_race(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The Job holding the Lease `name`; None when it is free or absent.
pub async fn holder(api: &Api<Lease>, name: &str) -> Result<Option<String>, LeaseError> {
    Ok(api
        .get_opt(name)
        .await?
        .as_ref()
        .and_then(holder_of)
        .map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    #[test]
    fn the_gate_takes_the_run_lease_then_the_cluster_write_lease() {
        use Gate::*;
        let rows = [
            (
                Kind::Cluster,
                Op::Apply,
                true,
                true,
                vec![TakeRunLease, TakeClusterWriteLease],
            ),
            (
                Kind::Cluster,
                Op::Destroy,
                true,
                true,
                vec![TakeRunLease, TakeClusterWriteLease],
            ),
            (
                Kind::Cluster,
                Op::Restore,
                true,
                true,
                vec![TakeRunLease, TakeClusterWriteLease],
            ),
            (
                Kind::Machine,
                Op::Apply,
                true,
                true,
                vec![TakeRunLease, WaitForClusterWriteLease],
            ),
            (
                Kind::MachinePool,
                Op::Destroy,
                true,
                true,
                vec![TakeRunLease, WaitForClusterWriteLease],
            ),
            // Not gated: the flag off, no cluster, or an op the gate does not cover.
            (Kind::Cluster, Op::Apply, false, true, vec![TakeRunLease]),
            (Kind::Machine, Op::Apply, true, false, vec![TakeRunLease]),
            (Kind::Cluster, Op::Drift, true, true, vec![TakeRunLease]),
            (Kind::Machine, Op::Refresh, true, true, vec![TakeRunLease]),
            (Kind::Cluster, Op::Plan, true, true, vec![TakeRunLease]),
        ];
        for (kind, op, on, cluster, want) in rows {
            assert_eq!(
                gate(kind, op, on, cluster),
                want,
                "{kind:?} {op:?} {on} {cluster}"
            );
        }
    }

    const MIN: Duration = Duration::from_secs(60);

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn request(cluster_name: Option<&str>) -> LeaseRequest<'_> {
        LeaseRequest {
            kind: Kind::Machine,
            namespace: "ns",
            name: "worker-0",
            cluster_name,
            op: Op::Destroy,
            job: "captf-m-worker-0-destroy-a1-abcdef",
            now: at("2026-01-02T03:04:05Z"),
        }
    }

    #[test]
    fn take_over_rules() {
        let deadline = Duration::from_secs(3600);
        let old = deadline + BACKSTOP;
        let missing = |s: u64| HolderJob::Missing {
            since: Duration::from_secs(s),
        };
        let table: &[(HolderJob, Duration, bool)] = &[
            (HolderJob::Finished, Duration::ZERO, true),
            (HolderJob::Finished, MIN, true),
            (HolderJob::Active, Duration::ZERO, false),
            (HolderJob::Active, deadline, false),
            (HolderJob::Active, old - Duration::from_secs(1), false),
            (HolderJob::Active, old, true),
            (missing(0), Duration::ZERO, false),
            (missing(29), Duration::from_secs(29), false),
            (missing(30), Duration::from_secs(30), true),
            (missing(3600), Duration::from_secs(3600), true),
            // However the holder looks, a Lease past deadline + backstop goes.
            (missing(0), old, true),
        ];
        for (holder, age, want) in table {
            assert_eq!(
                may_take_over(holder, *age, deadline),
                *want,
                "{holder:?} {age:?}"
            );
        }
        // A deadline so large that adding the backstop would overflow.
        assert!(!may_take_over(
            &HolderJob::Active,
            Duration::from_secs(u64::MAX / 2),
            Duration::MAX
        ));
    }

    #[test]
    fn leases_carry_names_labels_and_holder() {
        let req = request(Some("prod"));
        let run = run_lease(&req);
        let suffix = names::suffix("ns", Kind::Machine, "worker-0");
        assert_eq!(run.metadata.name, Some(names::run_lease(&suffix)));
        assert_eq!(run.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(run.metadata.owner_references, None);
        let labels = run.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["captf.io/lease"], "run");
        assert_eq!(labels["captf.io/managed"], "true");
        assert_eq!(
            labels["captf.infrastructure.cluster.x-k8s.io/owner-kind"],
            "TerraformMachine"
        );
        assert_eq!(
            labels["captf.infrastructure.cluster.x-k8s.io/owner-name"],
            "worker-0"
        );
        assert_eq!(labels["cluster.x-k8s.io/cluster-name"], "prod");
        let annotations = run.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["captf.io/lease-op"], "destroy");
        assert_eq!(
            annotations["captf.io/lease-acquired-at"],
            "2026-01-02T03:04:05Z"
        );
        let spec = run.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(req.job));
        assert_eq!(spec.acquire_time, Some(MicroTime(req.now)));

        let cluster = cluster_write_lease(&req).unwrap();
        assert_eq!(
            cluster.metadata.name,
            Some(names::cluster_write_lease("ns", "prod"))
        );
        assert_eq!(
            cluster.metadata.labels.as_ref().unwrap()["captf.io/lease"],
            "cluster"
        );
        assert_eq!(cluster.spec, run.spec);

        assert_eq!(cluster_write_lease(&request(None)), None);
        let alone = run_lease(&request(None));
        assert!(
            !alone
                .metadata
                .labels
                .unwrap()
                .contains_key("cluster.x-k8s.io/cluster-name")
        );
    }

    #[test]
    fn acquired_age_falls_back_and_never_goes_negative() {
        let now = at("2026-01-02T03:05:05Z");
        let mut lease = run_lease(&request(None));
        assert_eq!(acquired_age(&lease, now), MIN);
        // A garbled annotation: acquireTime.
        lease
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(LEASE_ACQUIRED_AT.into(), "yesterday".into());
        lease.spec.as_mut().unwrap().acquire_time = Some(MicroTime(
            now.checked_sub(SignedDuration::from_secs(120)).unwrap(),
        ));
        assert_eq!(acquired_age(&lease, now), 2 * MIN);
        // Neither: the creation time.
        lease.spec.as_mut().unwrap().acquire_time = None;
        lease.metadata.creation_timestamp = Some(Time(
            now.checked_sub(SignedDuration::from_secs(600)).unwrap(),
        ));
        assert_eq!(acquired_age(&lease, now), 10 * MIN);
        lease.metadata.creation_timestamp = None;
        assert_eq!(acquired_age(&lease, now), Duration::ZERO);
        // A time in the future.
        let future = run_lease(&LeaseRequest {
            now: at("2027-01-01T00:00:00Z"),
            ..request(None)
        });
        assert_eq!(acquired_age(&future, now), Duration::ZERO);
    }

    #[test]
    fn job_states() {
        let with = |type_: &str, status: &str| Job {
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: status.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let table = [
            (None, JobState::Missing),
            (Some(Job::default()), JobState::Active),
            (Some(with("Complete", "True")), JobState::Finished),
            (Some(with("Failed", "True")), JobState::Finished),
            (Some(with("Failed", "False")), JobState::Active),
            (Some(with("FailureTarget", "True")), JobState::Active),
            (Some(with("Suspended", "True")), JobState::Active),
        ];
        for (job, want) in table {
            assert_eq!(job_state(job.as_ref()), want, "{job:?}");
        }
    }
}
