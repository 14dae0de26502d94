//! The namespace RBAC sweep (ref §8.6; book: inside-the-job.md "ServiceAccount
//! and RBAC"): a namespace with no TerraformCluster, TerraformMachine or
//! TerraformMachinePool left loses every `captf.io/managed=true`
//! ServiceAccount, RoleBinding and Lease; in any other namespace the
//! RoleBinding `captf-runner` is pruned to the accounts still in use.
//!
//! The sweep of an empty namespace also removes the protection of what is
//! left there (the runner RoleBinding's included), and what destroys of its
//! objects run from the manager's namespace left there ([`crate::jobs::away`]).
//!
//! The sweep of a namespace reads the API server directly (no cache, no
//! --watch-filter), logs and records no events; the periodic sweep visits
//! only the namespaces where the watches show something to sweep
//! ([`due`]). [`plan`] and [`kept_subjects`] decide; [`sweep`] reads
//! and writes. Objects being deleted still count: their finalizer may yet run
//! a destroy Job.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use kube::Resource;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions, PropagationPolicy,
};
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, info, warn};

use super::watches::{Watches, Workloads};
use super::workload::Workload;
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::error::{Categorized, Category, kube_category};
use crate::jobs::rbac;
use crate::keys::{
    CLUSTER_NAME_LABEL, MANAGED_LABEL, OWNER_NAMESPACE_LABEL, PROTECTED_LABEL, PROTECTION,
};
use crate::names::{self, Kind, RUNNER_RBAC};
use crate::protection;
use std::sync::Arc;

/// How many times a sweep of one namespace starts over after a write lost a
/// race (a managed object or the RoleBinding changed since it was read).
const ATTEMPTS: usize = 5;

/// A TerraformCluster, TerraformMachine or TerraformMachinePool as the sweep
/// sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFacts {
    pub kind: Kind,
    pub name: String,
    /// Its `cluster.x-k8s.io/cluster-name` label, when not empty.
    pub cluster_name: Option<String>,
    /// Its own `spec.jobs.serviceAccountName`.
    pub service_account: Option<String>,
}

/// A TerraformCluster as its machines and pools see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Its `cluster.x-k8s.io/cluster-name` label.
    pub cluster_name: Option<String>,
    /// Its `spec.defaults.jobs.serviceAccountName`.
    pub default_service_account: Option<String>,
}

/// What a namespace holds. A TerraformCluster is in both lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceFacts {
    pub workloads: Vec<WorkloadFacts>,
    pub clusters: Vec<ClusterFacts>,
}

/// What the sweep does to a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No workload is left: delete every managed ServiceAccount, RoleBinding
    /// and Lease.
    Empty,
    /// Keep only these accounts in the RoleBinding `captf-runner`.
    Prune { keep: BTreeSet<String> },
}

/// The clusters a machine or pool belongs to, as the reconciler finds them
/// (the TerraformCluster with the same cluster-name label); None when none
/// is found. Every match counts, where the reconciler takes the first.
fn clusters_of<'a>(
    workload: &WorkloadFacts,
    clusters: &'a [ClusterFacts],
) -> Option<Vec<&'a ClusterFacts>> {
    let wanted = names::label_value(workload.cluster_name.as_deref()?);
    let found: Vec<_> = clusters
        .iter()
        .filter(|c| c.cluster_name.as_deref() == Some(wanted.as_str()))
        .collect();
    (!found.is_empty()).then_some(found)
}

/// The machines and pools whose account depends on a cluster that is not
/// found: without one of their own, every cluster default is kept for them.
pub fn unresolved(facts: &NamespaceFacts) -> impl Iterator<Item = &WorkloadFacts> {
    facts.workloads.iter().filter(|w| {
        w.kind != Kind::Cluster
            && w.service_account.is_none()
            && clusters_of(w, &facts.clusters).is_none()
    })
}

/// The sweep of a namespace holding `facts`. The account in use by an object
/// is its own, else (machine or pool) its cluster's default, else
/// `captf-runner` (as `jobs::policy::resolve` picks it).
pub fn plan(facts: &NamespaceFacts) -> Plan {
    if facts.workloads.is_empty() {
        return Plan::Empty;
    }
    let or_default =
        |account: &Option<String>| account.clone().unwrap_or_else(|| RUNNER_RBAC.to_owned());
    let mut keep = BTreeSet::new();
    for workload in &facts.workloads {
        if let Some(own) = &workload.service_account {
            keep.insert(own.clone());
        } else if workload.kind == Kind::Cluster {
            // A TerraformCluster never takes its own defaults.
            keep.insert(RUNNER_RBAC.to_owned());
        } else if let Some(clusters) = clusters_of(workload, &facts.clusters) {
            keep.extend(
                clusters
                    .iter()
                    .map(|c| or_default(&c.default_service_account)),
            );
        } else {
            // Its cluster may appear any moment, with whichever defaults.
            keep.insert(RUNNER_RBAC.to_owned());
            keep.extend(
                facts
                    .clusters
                    .iter()
                    .map(|c| or_default(&c.default_service_account)),
            );
        }
    }
    Plan::Prune { keep }
}

/// The subjects of the managed RoleBinding of `namespace` once pruned to the
/// accounts `keep`: only ServiceAccounts of this namespace named there, in
/// their order, and the runner of the destroys run for this namespace from
/// the manager's namespace (the namespace is being deleted, and objects
/// are left only while they destroy).
pub fn kept_subjects(
    subjects: &[Subject],
    namespace: &str,
    keep: &BTreeSet<String>,
) -> Vec<Subject> {
    subjects
        .iter()
        .filter(|s| {
            s.kind == "ServiceAccount"
                && s.api_group.as_deref().unwrap_or_default().is_empty()
                && ((s.namespace.as_deref() == Some(namespace) && keep.contains(&s.name))
                    || s.name == names::away_runner(namespace))
        })
        .cloned()
        .collect()
}

/// `binding` pruned to `keep`, or None when it is not the runner binding
/// this manager writes (another name or roleRef) or loses no subject.
pub fn pruned(
    binding: &RoleBinding,
    namespace: &str,
    keep: &BTreeSet<String>,
) -> Option<RoleBinding> {
    let ours = rbac::role_binding(namespace, &BTreeSet::new());
    if binding.metadata.name != ours.metadata.name || binding.role_ref != ours.role_ref {
        return None;
    }
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    let kept = kept_subjects(subjects, namespace, keep);
    if kept.len() == subjects.len() {
        return None;
    }
    let mut updated = binding.clone();
    updated.subjects = Some(kept);
    Some(updated)
}

/// What a sweep of one namespace changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// The managed objects deleted, as (kind, name).
    pub deleted: Vec<(String, String)>,
    /// The accounts removed from the RoleBinding `captf-runner`.
    pub pruned: Vec<String>,
    /// The protected Secrets and Leases released, as (kind, name).
    pub released: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("namespace sweep: {0}")]
    Api(#[from] kube::Error),
}

impl Categorized for SweepError {
    fn category(&self) -> Category {
        match self {
            SweepError::Api(e) => kube_category(e),
        }
    }
}

/// CAPTF's objects of a namespace, without those it keeps in the
/// manager's namespace for another's objects: the sweep of that other
/// namespace takes them.
fn managed_selector() -> ListParams {
    ListParams::default().labels(&format!("{MANAGED_LABEL}=true,!{OWNER_NAMESPACE_LABEL}"))
}

fn protected_selector() -> ListParams {
    ListParams::default().labels(&format!("{PROTECTED_LABEL}=true"))
}

fn conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_conflict())
}

/// The facts of the workload objects of one kind.
async fn workloads<K: Workload>(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<K>, kube::Error> {
    Ok(Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items)
}

fn workload_facts<K: Workload>(object: &K) -> WorkloadFacts {
    WorkloadFacts {
        kind: K::KIND,
        name: object.meta().name.clone().unwrap_or_default(),
        cluster_name: object.cluster_name().map(str::to_owned),
        service_account: object
            .workspace()
            .jobs
            .as_ref()
            .and_then(|j| j.service_account_name.clone()),
    }
}

async fn read_facts(client: &kube::Client, namespace: &str) -> Result<NamespaceFacts, kube::Error> {
    let clusters = workloads::<TerraformCluster>(client, namespace).await?;
    let machines = workloads::<TerraformMachine>(client, namespace).await?;
    let pools = workloads::<TerraformMachinePool>(client, namespace).await?;
    Ok(facts_of(
        &clusters.iter().collect::<Vec<_>>(),
        &machines.iter().collect::<Vec<_>>(),
        &pools.iter().collect::<Vec<_>>(),
    ))
}

/// The facts of a namespace's workload objects.
pub fn facts_of(
    clusters: &[&TerraformCluster],
    machines: &[&TerraformMachine],
    pools: &[&TerraformMachinePool],
) -> NamespaceFacts {
    let mut facts = NamespaceFacts {
        clusters: clusters
            .iter()
            .map(|c| ClusterFacts {
                cluster_name: c
                    .meta()
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                    .cloned(),
                default_service_account: c
                    .spec
                    .defaults
                    .as_ref()
                    .and_then(|d| d.jobs.as_ref())
                    .and_then(|j| j.service_account_name.clone()),
            })
            .collect(),
        workloads: clusters.iter().map(|c| workload_facts(*c)).collect(),
    };
    facts
        .workloads
        .extend(machines.iter().map(|m| workload_facts(*m)));
    facts
        .workloads
        .extend(pools.iter().map(|p| workload_facts(*p)));
    facts
}

/// The metadata of the managed objects of one kind in `namespace`, or in
/// every namespace.
async fn managed<K>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<Vec<ObjectMeta>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    listed::<K>(client, namespace, &managed_selector()).await
}

async fn listed<K>(
    client: &kube::Client,
    namespace: Option<&str>,
    selector: &ListParams,
) -> Result<Vec<ObjectMeta>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api = match namespace {
        Some(ns) => Api::<K>::namespaced(client.clone(), ns),
        None => Api::<K>::all(client.clone()),
    };
    Ok(api
        .list_metadata(selector)
        .await?
        .items
        .into_iter()
        .map(|o| o.metadata)
        .collect())
}

/// Deletes `objects` as they were listed: an object changed since (say,
/// relabelled) makes this a Conflict rather than a deletion.
async fn delete_listed<K>(
    client: &kube::Client,
    namespace: &str,
    objects: &[ObjectMeta],
    swept: &mut Swept,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    for meta in objects {
        let Some(name) = meta.name.as_deref() else {
            continue;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: meta.resource_version.clone(),
                uid: meta.uid.clone(),
            }),
            // A Job's pods and Secrets go with it.
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => swept
                .deleted
                .push((K::kind(&()).into_owned(), name.to_owned())),
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One pass over `namespace`. The managed objects are read before the
/// workloads: whatever a reconcile writes after they are read carries a new
/// resourceVersion, so the guarded writes below fail rather than undo it.
/// Removes the protection from every protected object of the namespace.
async fn release_listed<K>(
    client: &kube::Client,
    namespace: &str,
    swept: &mut Swept,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    for meta in listed::<K>(client, Some(namespace), &protected_selector()).await? {
        let Some(name) = meta.name else { continue };
        if !meta.finalizers.iter().flatten().any(|f| f == PROTECTION) {
            continue;
        }
        protection::unprotect(&api, &name).await?;
        swept.released.push((K::kind(&()).into_owned(), name));
    }
    Ok(())
}

/// What the destroys of `namespace`'s objects left in the manager's
/// namespace `away`: their Jobs (their pods, per-run Secrets and
/// credentials copies go with them), the Leases they took and the
/// namespace's away runner account.
async fn away_leftovers(
    client: &kube::Client,
    away: &str,
    namespace: &str,
    swept: &mut Swept,
) -> Result<(), kube::Error> {
    let of_namespace = ListParams::default().labels(&format!(
        "{MANAGED_LABEL}=true,{OWNER_NAMESPACE_LABEL}={namespace}"
    ));
    let jobs = listed::<Job>(client, Some(away), &of_namespace).await?;
    let accounts = listed::<ServiceAccount>(client, Some(away), &of_namespace).await?;
    let leases = listed::<Lease>(client, Some(away), &of_namespace).await?;
    delete_listed::<Job>(client, away, &jobs, swept).await?;
    delete_listed::<ServiceAccount>(client, away, &accounts, swept).await?;
    delete_listed::<Lease>(client, away, &leases, swept).await?;
    Ok(())
}

async fn sweep_once(
    client: &kube::Client,
    namespace: &str,
    away: Option<&str>,
    swept: &mut Swept,
) -> Result<(), kube::Error> {
    let accounts = managed::<ServiceAccount>(client, Some(namespace)).await?;
    let leases = managed::<Lease>(client, Some(namespace)).await?;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .list(&managed_selector())
        .await?
        .items;
    let facts = read_facts(client, namespace).await?;
    match plan(&facts) {
        Plan::Empty => {
            let binding_meta: Vec<_> = bindings.into_iter().map(|b| b.metadata).collect();
            delete_listed::<ServiceAccount>(client, namespace, &accounts, swept).await?;
            delete_listed::<RoleBinding>(client, namespace, &binding_meta, swept).await?;
            delete_listed::<Lease>(client, namespace, &leases, swept).await?;
            // No object is left to destroy from what they protect.
            release_listed::<Secret>(client, namespace, swept).await?;
            release_listed::<Lease>(client, namespace, swept).await?;
            release_listed::<RoleBinding>(client, namespace, swept).await?;
            if let Some(away) = away {
                away_leftovers(client, away, namespace, swept).await?;
            }
        }
        Plan::Prune { keep } => {
            for workload in unresolved(&facts) {
                debug!(
                    namespace,
                    kind = workload.kind.kind(),
                    name = workload.name,
                    cluster = workload.cluster_name,
                    "cluster not found; keeping every cluster's default runner account"
                );
            }
            let api = Api::<RoleBinding>::namespaced(client.clone(), namespace);
            for binding in &bindings {
                let Some(updated) = pruned(binding, namespace, &keep) else {
                    continue;
                };
                // Carries the listed resourceVersion.
                api.replace(RUNNER_RBAC, &PostParams::default(), &updated)
                    .await?;
                let kept: BTreeSet<_> =
                    updated.subjects.iter().flatten().map(|s| &s.name).collect();
                swept.pruned.extend(
                    binding
                        .subjects
                        .iter()
                        .flatten()
                        .filter(|s| !kept.contains(&s.name))
                        .map(|s| s.name.clone()),
                );
            }
        }
    }
    Ok(())
}

/// Sweeps `namespace`, starting over when a write lost a race.
/// `away` is the manager's namespace, where destroys of objects of a
/// namespace being deleted run.
pub async fn sweep(
    client: &kube::Client,
    namespace: &str,
    away: Option<&str>,
) -> Result<Swept, SweepError> {
    let mut swept = Swept::default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match sweep_once(client, namespace, away, &mut swept).await {
            Ok(()) => break,
            Err(e) if attempt < ATTEMPTS && conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if swept == Swept::default() {
        debug!(namespace, "namespace sweep: nothing to do");
    } else {
        info!(namespace, deleted = ?swept.deleted, pruned = ?swept.pruned, released = ?swept.released, "namespace sweep");
    }
    Ok(swept)
}

/// Sweeps at once, then every `period`, forever.
/// How long the asks for a sweep gather before the namespaces they name
/// are swept, once each.
const GATHER: Duration = Duration::from_secs(1);

/// Sweeps the namespaces `asked` names, those asked for within [`GATHER`]
/// of each other once each; failures are retried by the periodic sweep.
pub async fn when_asked(
    client: kube::Client,
    away: Option<String>,
    mut asked: UnboundedReceiver<String>,
) {
    while let Some(first) = asked.recv().await {
        let mut namespaces = BTreeSet::from([first]);
        let gathering = tokio::time::sleep(GATHER);
        tokio::pin!(gathering);
        loop {
            tokio::select! {
                () = &mut gathering => break,
                next = asked.recv() => match next {
                    Some(ns) => {
                        namespaces.insert(ns);
                    }
                    None => break,
                },
            }
        }
        for namespace in namespaces {
            if let Err(e) = sweep(&client, &namespace, away.as_deref()).await {
                warn!(namespace, "namespace sweep: {e}");
            }
        }
    }
}

/// Sweeps, once the watches have listed and then every `period`, the
/// namespaces (within `scope`) where the watches show something to sweep;
/// an idle manager makes no request for it. `away` is the manager's
/// namespace.
pub async fn periodically(
    client: kube::Client,
    watches: Arc<Watches>,
    workloads: Workloads,
    scope: Option<String>,
    away: Option<String>,
    period: Duration,
) {
    watches.wait_synced().await;
    loop {
        sweep_due(
            &client,
            &watches,
            &workloads,
            scope.as_deref(),
            away.as_deref(),
        )
        .await;
        tokio::time::sleep(period).await;
    }
}

/// One round of [`periodically`]; returns the namespaces swept.
pub async fn sweep_due(
    client: &kube::Client,
    watches: &Watches,
    workloads: &Workloads,
    scope: Option<&str>,
    away: Option<&str>,
) -> BTreeSet<String> {
    let due = due::due(watches, workloads, scope, away);
    for namespace in &due {
        if let Err(e) = sweep(client, namespace, away).await {
            warn!(namespace, "namespace sweep: {e}");
        }
    }
    due
}

mod due;

#[cfg(test)]
mod tests;
