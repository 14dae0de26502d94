//! Every read of a pass, once, into one plain value; nothing here writes.
//!
//! With a Job of the object active only the Jobs are read (and the pods of
//! finished Jobs not accounted yet): the state is not read and nothing is
//! decided while a runner works on it.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateTerminated, Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::Object;
use super::common::provisioned;
use super::owners::{self, Capi};
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, VariablesSource};
use crate::controllers::credentials;
use crate::controllers::ledger;
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::jobs::away;
use crate::jobs::durable;
use crate::jobs::variables::{self, SourceKind};
use crate::keys::{
    CLUSTER_NAME_LABEL, OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_UID_LABEL, VARIABLES_LABEL,
};
use crate::locks::{self, Verdict};
use crate::names::{self, Kind};
use crate::state;

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
    pub durable: Option<Secret>,
    pub credentials: credentials::Observed,
    pub snapshot: state::Snapshot,
    /// The object's backup Secrets.
    pub backups: Vec<Secret>,
    pub lock: Verdict,
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
    // Deleting, the namespace is read first: once it is being deleted the
    // object's Jobs may run from the manager's namespace too.
    let namespace = match deleting {
        true => Some(namespace_of(ctx, &o.namespace).await?),
        false => None,
    };
    let away = match &namespace {
        Some(ns) if terminating(ns.as_ref()) => ctx.settings.away.as_deref(),
        _ => None,
    };
    let mut jobs = jobs_of::<K>(ctx, o).await?;
    if let Some(away) = away {
        jobs.extend(away_jobs_of::<K>(ctx, o, away).await?);
    }
    let ledger = ledger::ledger(&jobs);
    let mut terminations = BTreeMap::new();
    let mut image_ids = BTreeMap::new();
    for u in &ledger.unsettled {
        let name = u.job.name_any();
        let ns = u.job.namespace().unwrap_or_else(|| o.namespace.clone());
        let (end, image_id) = terminated(ctx, &ns, &name).await?;
        if let Some(id) = image_id {
            image_ids.insert(name.clone(), id);
        }
        terminations.insert(name, end);
    }
    let stuck = match ledger.active {
        Some(job) => stuck(ctx, job, o).await?.then(|| job.clone()),
        None => None,
    };
    let rest = match ledger.active {
        Some(_) => None,
        None => Some(rest(ctx, obj, o, deleting, namespace).await?),
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

async fn namespace_of(ctx: &Context, ns: &str) -> Result<Option<Namespace>, Error> {
    Api::<Namespace>::all(ctx.client.clone())
        .get_opt(ns)
        .await
        .map_err(Error::Kube)
}

/// Being deleted, or already gone.
fn terminating(namespace: Option<&Namespace>) -> bool {
    namespace.is_none_or(|n| {
        n.metadata.deletion_timestamp.is_some()
            || n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
    })
}

async fn rest<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    deleting: bool,
    namespace: Option<Option<Namespace>>,
) -> Result<Rest, Error> {
    let ns = o.namespace.as_str();
    let namespace = match namespace {
        Some(read) => read,
        None => namespace_of(ctx, ns).await?,
    };
    let namespace_terminating = terminating(namespace.as_ref());
    let away = ctx
        .settings
        .away
        .as_deref()
        .filter(|_| namespace_terminating);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    // A machine's inputs are read until it is provisioned, then never again.
    let role_inputs = K::KIND != Kind::Machine || !provisioned(obj);
    let capi = owners::read(ctx, obj, ns, role_inputs).await?;
    let cluster = capi.terraform_cluster.clone();
    let durable = secrets
        .get_opt(&names::inputs_secret(K::KIND, &o.name))
        .await
        .map_err(Error::Kube)?
        .filter(|s| durable::owned_by(s, &o.uid));
    let recorded = durable.as_ref().and_then(durable::read);
    let backups = crate::backups::existing(&secrets, &o.suffix)
        .await
        .map_err(Error::Backup)?;
    let snapshot = state::snapshot(&secrets, &o.suffix).await?;
    let lock = locks::inspect(&ctx.client, ns, away, K::KIND, &o.name).await?;

    // A machine or pool whose cluster is gone still destroys with the
    // identity its apply used (ref §8.6: a missing owner never blocks a
    // deletion); the identity must still allow the namespace.
    let spec = obj.workspace();
    let identity = credentials::identity_name(spec, cluster.as_ref()).or(recorded
        .as_ref()
        .and_then(|d| d.identity.as_deref())
        .filter(|_| deleting));
    let labels = namespace
        .and_then(|n| n.metadata.labels)
        .unwrap_or_default();
    let credentials = credentials::observe(&ctx.client, ns, &labels, identity).await?;

    // A machine reads its sources only until it is applied (ref §1.2): it
    // is never applied again, so what they say later changes nothing, and
    // one deleted later must not make it unready.
    let applied = recorded.as_ref().is_some_and(|d| d.applied)
        || !backups.is_empty()
        || obj
            .workspace_status()
            .is_some_and(crate::controllers::assessment::applied_by_status);
    let sources = match spec.variables_from.as_deref() {
        Some(_) if K::KIND == Kind::Machine && applied => &[],
        sources => sources.unwrap_or_default(),
    };
    let sources = fetch_variables(&ctx.client, ns, sources).await?;
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
        sources,
        dependents,
        namespace_terminating,
        binding,
    })
}

/// The Jobs of this object: its owner labels, and an owner reference to
/// this very object (a same-named object created later has another UID).
async fn jobs_of<K: Workload>(ctx: &Context, o: &Object) -> Result<Vec<Job>, Error> {
    let selector = format!(
        "{OWNER_KIND_LABEL}={},{OWNER_NAME_LABEL}={}",
        K::KIND.kind(),
        names::label_value(&o.name)
    );
    let list = Api::<Job>::namespaced(ctx.client.clone(), &o.namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::Kube)?;
    Ok(list
        .items
        .into_iter()
        .filter(|j| j.owner_references().iter().any(|r| r.uid == o.uid))
        .collect())
}

/// The Jobs of this object run from the manager's namespace `away`: its
/// uid label.
async fn away_jobs_of<K: Workload>(
    ctx: &Context,
    o: &Object,
    away: &str,
) -> Result<Vec<Job>, Error> {
    let selector = format!(
        "{OWNER_KIND_LABEL}={},{OWNER_UID_LABEL}={}",
        K::KIND.kind(),
        o.uid
    );
    let list = Api::<Job>::namespaced(ctx.client.clone(), away)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::Kube)?;
    Ok(list.items)
}

/// The final state of a Job's runner container, from its pod.
/// The runner container's end, and the image ID its pod reported.
async fn terminated(
    ctx: &Context,
    ns: &str,
    job: &str,
) -> Result<(Option<ContainerStateTerminated>, Option<String>), Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .map_err(Error::Kube)?;
    let source = pods.items.into_iter().find_map(|p| {
        p.status?.container_statuses?.into_iter().find(|c| {
            c.name == crate::jobs::builder::SOURCE_CONTAINER
                && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
        })
    });
    Ok(match source {
        Some(c) => (
            c.state.and_then(|s| s.terminated),
            Some(c.image_id).filter(|id| !id.is_empty()),
        ),
        None => (None, None),
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

/// Reads each `variablesFrom` source of the object (a ConfigMap's `data`
/// and `binaryData`, a Secret's `data`); a source without the opt-in label
/// reads as missing.
async fn fetch_variables(
    client: &kube::Client,
    ns: &str,
    sources: &[VariablesSource],
) -> Result<Vec<Option<BTreeMap<String, Vec<u8>>>>, Error> {
    fn opted_in(obj: &impl Resource) -> bool {
        obj.meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(VARIABLES_LABEL))
            .is_some_and(|v| v == "true")
    }
    let mut fetched = Vec::with_capacity(sources.len());
    for source in sources {
        let data = match variables::reference(source) {
            Some((SourceKind::ConfigMap, name)) => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(Error::Kube)?
                .filter(opted_in)
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
                .filter(opted_in)
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
        fetched.push(data);
    }
    Ok(fetched)
}
