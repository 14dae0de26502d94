//! Every read of a pass, once, into one plain value; nothing here writes.
//!
//! With a Job of the object active only the Jobs are read (and the pods of
//! finished Jobs not accounted yet): the state is not read and nothing is
//! decided while a runner works on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta};

use super::common::provisioned;
use super::owners::{self, Capi};
use super::{Object, cached};
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, VariablesSource};
use crate::backups::Listed;
use crate::controllers::credentials;
use crate::controllers::ledger;
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::jobs::away;
use crate::jobs::durable;
use crate::jobs::variables::{self, SourceKind};
use crate::keys::CLUSTER_NAME_LABEL;
use crate::locks::Verdict;
use crate::names::{self, Kind};
use crate::protection::AsRead;
use crate::state::{self, StateReadable};

/// What one pass read.
pub struct Observed {
    /// The object's Jobs (its owner labels and an owner reference to this
    /// very object).
    pub jobs: Vec<Job>,
    /// The runner container's end, for each finished Job not yet
    /// accounted, by Job name.
    pub terminations: BTreeMap<String, Option<ContainerStateTerminated>>,
    /// The image ID the runner container's pod reported, by Job name.
    pub image_ids: BTreeMap<String, String>,
    /// Read only with no Job of the object active.
    pub rest: Option<Rest>,
    /// The active Job, when it can never start: over a minute old, its
    /// per-run Secret missing, and none of its pods ever ran a container.
    pub stuck: Option<Job>,
}

/// How long a Job may go without a pod before it counts as stuck.
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What a pass without an active Job reads.
pub struct Rest {
    /// A machine's or pool's TerraformCluster.
    pub cluster: Option<TerraformCluster>,
    /// The Cluster API objects the object depends on.
    pub capi: Capi,
    /// The durable inputs Secret, when CAPTF wrote it for this object.
    pub durable: Option<Arc<Secret>>,
    pub credentials: credentials::Observed,
    pub snapshot: Arc<state::Snapshot>,
    /// The object's backups.
    pub backups: Arc<Listed>,
    pub lock: Verdict,
    /// The state lock Lease as the watch last saw it.
    pub lock_lease: Option<AsRead>,
    /// Each `variablesFrom` source's data, in spec order; None when missing
    /// or not opted in. Empty for a machine that was applied.
    pub sources: Vec<Option<BTreeMap<String, Vec<u8>>>>,
    /// A TerraformCluster being deleted: its machines and pools left.
    pub dependents: usize,
    /// The namespace is being deleted (or already gone): nothing can be
    /// created in it.
    pub namespace_terminating: bool,
    /// The namespace's runner RoleBinding, read once it is being deleted
    /// and the object too: a destroy from the manager's namespace needs it.
    pub binding: Option<away::Binding>,
}

pub async fn observe<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    deleting: bool,
) -> Result<Observed, Error> {
    // Deleting, the namespace is read first, live: once it is being
    // deleted the object's Jobs may run from the manager's namespace too.
    let namespace = match deleting {
        true => Some(cached::live_namespace(ctx, &o.namespace).await?),
        false => None,
    };
    let away = match &namespace {
        Some(ns) if cached::terminating(ns.as_ref()) => ctx.settings.away.as_deref(),
        _ => None,
    };
    let mut jobs = cached::jobs_of::<K>(ctx, o);
    if let Some(away) = away {
        jobs.extend(cached::away_jobs_of::<K>(ctx, o, away));
    }
    ctx.bookkept.mark(&mut jobs);
    // A Job to settle: the Jobs as the API server has them now.
    if !ledger::ledger(&jobs).unsettled.is_empty() {
        jobs = cached::live_jobs_of::<K>(ctx, o, away).await?;
    }
    let ledger = ledger::ledger(&jobs);
    let mut terminations = BTreeMap::new();
    let mut image_ids = BTreeMap::new();
    for u in &ledger.unsettled {
        let name = u.job.name_any();
        let ns = u.job.namespace().unwrap_or_else(|| o.namespace.clone());
        let (end, image_id) = cached::terminated(ctx, &ns, u.job).await?;
        if let Some(id) = image_id {
            image_ids.insert(name.clone(), id);
        }
        terminations.insert(name, end);
    }
    let stuck = match ledger.active {
        Some(job) => stuck(ctx, job, o).await?.then(|| job.clone()),
        None => None,
    };
    let settling = !ledger.unsettled.is_empty();
    let rest = match ledger.active {
        Some(_) => None,
        None => Some(rest(ctx, obj, o, deleting, settling, namespace).await?),
    };
    Ok(Observed {
        jobs,
        terminations,
        image_ids,
        rest,
        stuck,
    })
}

/// Whether the active `job` can never start (ref §8.1 step 7). Its
/// per-run Secret and pods are read only once it is a minute old.
async fn stuck(ctx: &Context, job: &Job, o: &Object) -> Result<bool, Error> {
    let old = job.creation_timestamp().is_some_and(|t| {
        let age = t.0.duration_until(k8s_openapi::jiff::Timestamp::now());
        std::time::Duration::try_from(age).is_ok_and(|a| a >= STUCK_AFTER)
    });
    if !old {
        return Ok(false);
    }
    let name = job.name_any();
    let ns = job.namespace().unwrap_or_else(|| o.namespace.clone());
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get_metadata_opt(&names::run_secret(&name))
        .await
        .map_err(Error::Kube)?;
    if secret.is_some() {
        return Ok(false);
    }
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await
        .map_err(Error::Kube)?;
    let ran = pods.items.iter().any(|p| {
        let status = p.status.as_ref();
        status
            .into_iter()
            .flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
            })
            .any(|c| {
                c.state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            })
    });
    Ok(!ran)
}

/// `settling`: a finished Job is being settled now, so the state is read
/// afresh (its apply may just have written it).
async fn rest<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    deleting: bool,
    settling: bool,
    namespace: Option<Option<ObjectMeta>>,
) -> Result<Rest, Error> {
    let ns = o.namespace.as_str();
    let namespace = match namespace {
        Some(read) => read,
        None => cached::namespace(ctx, ns).await?,
    };
    let namespace_terminating = cached::terminating(namespace.as_ref());
    let away = ctx
        .settings
        .away
        .as_deref()
        .filter(|_| namespace_terminating);
    // A machine's inputs are read until it is provisioned, then never again.
    let role_inputs = K::KIND != Kind::Machine || !provisioned(obj);
    let capi = owners::read(ctx, obj, ns, role_inputs).await?;
    let cluster = capi.terraform_cluster.clone();
    let durable = cached::durable::<K>(ctx, o)
        .await?
        .filter(|s| durable::owned_by(s, &o.uid));
    let recorded = durable.as_deref().and_then(durable::read);
    let backups = cached::backups(ctx, ns, &o.suffix, &o.uid).await?;
    // A kept copy of the state serves only an idle pass whose status has
    // seen its serial: anything else (a backup to take, an apply to adopt,
    // a deletion) reads the data.
    let observed_serial = obj.workspace_status().and_then(|s| s.observed_state_serial);
    let snapshot = cached::state(ctx, ns, &o.suffix, |kept| {
        !deleting
            && !settling
            && match &kept.readable {
                StateReadable::Read(st) => i64::try_from(st.serial).ok() == observed_serial,
                _ => true,
            }
    })
    .await?;
    let lock = cached::lock(ctx, o, K::KIND, away).await?;
    let lock_lease = ctx
        .watches
        .lock_leases
        .get(ns, &names::state_lock_lease(&o.suffix))
        .and_then(|lease| AsRead::of(&lease.metadata));

    // A machine or pool whose cluster is gone still destroys with the
    // identity its apply used (ref §8.6: a missing owner never blocks a
    // deletion); the identity must still allow the namespace.
    let spec = obj.workspace();
    let identity = credentials::identity_name(spec, cluster.as_ref()).or(recorded
        .as_ref()
        .and_then(|d| d.identity.as_deref())
        .filter(|_| deleting));
    let labels = namespace.and_then(|n| n.labels).unwrap_or_default();
    let credentials =
        credentials::observe(&ctx.watches, &ctx.client, ns, &labels, identity).await?;

    // A machine reads its sources only until it is applied (ref §1.2): it
    // is never applied again, so what they say later changes nothing, and
    // one deleted later must not make it unready.
    let applied = recorded.as_ref().is_some_and(|d| d.applied)
        || !backups.secrets.is_empty()
        || obj
            .workspace_status()
            .is_some_and(crate::controllers::assessment::applied_by_status);
    let sources = match spec.variables_from.as_deref() {
        Some(_) if K::KIND == Kind::Machine && applied => &[],
        sources => sources.unwrap_or_default(),
    };
    let sources = fetch_variables(ctx, ns, sources);
    let binding = match deleting && namespace_terminating {
        true => Some(away::Binding::of(
            Api::<RoleBinding>::namespaced(ctx.client.clone(), ns)
                .get_opt(names::RUNNER_RBAC)
                .await
                .map_err(Error::Kube)?
                .as_ref(),
        )),
        false => None,
    };
    let dependents = match (K::KIND, deleting) {
        (Kind::Cluster, true) => dependents(ctx, obj, ns).await?,
        _ => 0,
    };
    Ok(Rest {
        cluster,
        capi,
        durable,
        credentials,
        snapshot,
        backups,
        lock,
        lock_lease,
        sources,
        dependents,
        namespace_terminating,
        binding,
    })
}

fn cluster_selector(cluster: &str) -> String {
    format!("{CLUSTER_NAME_LABEL}={}", names::label_value(cluster))
}

/// TerraformMachines and TerraformMachinePools of a TerraformCluster's
/// cluster in its namespace (ref §8.6).
async fn dependents<K: Workload>(ctx: &Context, obj: &K, ns: &str) -> Result<usize, Error> {
    let Some(cluster) = obj.cluster_name() else {
        return Ok(0);
    };
    let selector = ListParams::default().labels(&cluster_selector(cluster));
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

/// Each `variablesFrom` source of the object, from the watch of labelled
/// ConfigMaps and Secrets (a ConfigMap's `data` and `binaryData`, a
/// Secret's `data`); a source without the opt-in label is not watched, and
/// reads as missing.
fn fetch_variables(
    ctx: &Context,
    ns: &str,
    sources: &[VariablesSource],
) -> Vec<Option<BTreeMap<String, Vec<u8>>>> {
    let watches = &ctx.watches;
    sources
        .iter()
        .map(|source| match variables::reference(source) {
            Some((SourceKind::ConfigMap, name)) => {
                watches.variables_config_maps.get(ns, name).map(|c| {
                    let text = c.data.iter().flatten();
                    let binary = c.binary_data.iter().flatten();
                    text.map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                        .chain(binary.map(|(k, v)| (k.clone(), v.0.clone())))
                        .collect()
                })
            }
            Some((SourceKind::Secret, name)) => watches.variables_secrets.get(ns, name).map(|s| {
                s.data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect()
            }),
            // merge reports the entry.
            None => None,
        })
        .collect()
}
