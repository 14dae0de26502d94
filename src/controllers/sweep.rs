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
//! It reads the API server directly (no cache, no --watch-filter), logs and
//! records no events. [`plan`] and [`kept_subjects`] decide; [`sweep`] reads
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

use super::workload::Workload;
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::error::{Categorized, Category, kube_category};
use crate::jobs::rbac;
use crate::keys::{
    CLUSTER_NAME_LABEL, MANAGED_LABEL, OWNER_NAMESPACE_LABEL, PROTECTED_LABEL, PROTECTION,
};
use crate::names::{self, Kind, RUNNER_RBAC};
use crate::protection;

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
    #[error("namespace sweep failed in {}", failures(.0))]
    Incomplete(Vec<(String, SweepError)>),
}

fn failures(failed: &[(String, SweepError)]) -> String {
    failed
        .iter()
        .map(|(ns, e)| format!("{ns} ({e})"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Categorized for SweepError {
    fn category(&self) -> Category {
        match self {
            SweepError::Api(e) => kube_category(e),
            // Another pass may succeed where any namespace failed for a
            // passing reason.
            SweepError::Incomplete(failed) => {
                let categories: Vec<_> = failed.iter().map(|(_, e)| e.category()).collect();
                if categories.contains(&Category::Transient) {
                    Category::Transient
                } else {
                    categories.first().copied().unwrap_or(Category::Transient)
                }
            }
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
        workloads: clusters.iter().map(workload_facts).collect(),
    };
    facts.workloads.extend(machines.iter().map(workload_facts));
    facts.workloads.extend(pools.iter().map(workload_facts));
    Ok(facts)
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

/// Sweeps the namespace `scope` (--namespace), or else every namespace that
/// holds a managed ServiceAccount, RoleBinding or Lease. A failing namespace
/// does not stop the others.
pub async fn sweep_all(
    client: &kube::Client,
    scope: Option<&str>,
    away: Option<&str>,
) -> Result<(), SweepError> {
    let mut namespaces: BTreeSet<String> = match scope {
        Some(ns) => BTreeSet::from([ns.to_owned()]),
        None => {
            let mut found = managed::<ServiceAccount>(client, None).await?;
            found.extend(managed::<RoleBinding>(client, None).await?);
            found.extend(managed::<Lease>(client, None).await?);
            found.extend(listed::<Secret>(client, None, &protected_selector()).await?);
            found.into_iter().filter_map(|m| m.namespace).collect()
        }
    };
    // The namespaces whose objects' destroys left something in the
    // manager's namespace, gone or not.
    if let Some(away) = away {
        let labelled = ListParams::default().labels(OWNER_NAMESPACE_LABEL);
        let mut found = listed::<ServiceAccount>(client, Some(away), &labelled).await?;
        found.extend(listed::<Job>(client, Some(away), &labelled).await?);
        namespaces.extend(
            found
                .into_iter()
                .filter_map(|m| m.labels?.remove(OWNER_NAMESPACE_LABEL))
                .filter(|ns| scope.is_none_or(|s| s == ns)),
        );
    }
    let mut failed = Vec::new();
    for namespace in namespaces {
        if let Err(e) = sweep(client, &namespace, away).await {
            failed.push((namespace, e));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(SweepError::Incomplete(failed))
    }
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

pub async fn periodically(
    client: kube::Client,
    scope: Option<String>,
    away: Option<String>,
    period: Duration,
) {
    loop {
        if let Err(e) = sweep_all(&client, scope.as_deref(), away.as_deref()).await {
            warn!("{e}");
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(
        kind: Kind,
        name: &str,
        cluster: Option<&str>,
        account: Option<&str>,
    ) -> WorkloadFacts {
        WorkloadFacts {
            kind,
            name: name.into(),
            cluster_name: cluster.map(Into::into),
            service_account: account.map(Into::into),
        }
    }

    fn cluster(label: Option<&str>, default: Option<&str>) -> ClusterFacts {
        ClusterFacts {
            cluster_name: label.map(Into::into),
            default_service_account: default.map(Into::into),
        }
    }

    fn keep(names: &[&str]) -> Plan {
        Plan::Prune {
            keep: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    #[test]
    fn plans() {
        use Kind::{Cluster, Machine, MachinePool};
        let long = "c".repeat(70);
        let long_hashed = names::label_value(&long);
        let table: Vec<(&str, NamespaceFacts, Plan)> = vec![
            ("nothing left", NamespaceFacts::default(), Plan::Empty),
            (
                "a cluster with no account of its own",
                NamespaceFacts {
                    workloads: vec![workload(Cluster, "prod", Some("prod"), None)],
                    clusters: vec![cluster(Some("prod"), Some("deployer"))],
                },
                keep(&["captf-runner"]),
            ),
            (
                "a cluster's own account",
                NamespaceFacts {
                    workloads: vec![workload(Cluster, "prod", Some("prod"), Some("builder"))],
                    clusters: vec![cluster(Some("prod"), None)],
                },
                keep(&["builder"]),
            ),
            (
                "a machine takes its cluster's default",
                NamespaceFacts {
                    workloads: vec![
                        workload(Cluster, "prod", Some("prod"), Some("builder")),
                        workload(Machine, "m", Some("prod"), None),
                    ],
                    clusters: vec![cluster(Some("prod"), Some("deployer"))],
                },
                keep(&["builder", "deployer"]),
            ),
            (
                "a pool's own account wins over the default",
                NamespaceFacts {
                    workloads: vec![workload(MachinePool, "p", Some("prod"), Some("mine"))],
                    clusters: vec![cluster(Some("prod"), Some("deployer"))],
                },
                keep(&["mine"]),
            ),
            (
                "a cluster without defaults gives captf-runner",
                NamespaceFacts {
                    workloads: vec![workload(Machine, "m", Some("prod"), None)],
                    clusters: vec![
                        cluster(Some("prod"), None),
                        cluster(Some("other"), Some("x")),
                    ],
                },
                keep(&["captf-runner"]),
            ),
            (
                "a missing cluster keeps every default and captf-runner",
                NamespaceFacts {
                    workloads: vec![workload(Machine, "m", Some("gone"), None)],
                    clusters: vec![
                        cluster(Some("a"), Some("deployer")),
                        cluster(Some("b"), None),
                        cluster(None, Some("unlabelled")),
                    ],
                },
                keep(&["captf-runner", "deployer", "unlabelled"]),
            ),
            (
                "no cluster label is a cluster not found",
                NamespaceFacts {
                    workloads: vec![workload(MachinePool, "p", None, None)],
                    clusters: vec![cluster(Some("a"), Some("deployer"))],
                },
                keep(&["captf-runner", "deployer"]),
            ),
            (
                "an unresolved object with its own account needs no default",
                NamespaceFacts {
                    workloads: vec![workload(Machine, "m", Some("gone"), Some("mine"))],
                    clusters: vec![cluster(Some("a"), Some("deployer"))],
                },
                keep(&["mine"]),
            ),
            (
                "every cluster with the label counts",
                NamespaceFacts {
                    workloads: vec![workload(Machine, "m", Some("prod"), None)],
                    clusters: vec![
                        cluster(Some("prod"), Some("one")),
                        cluster(Some("prod"), Some("two")),
                    ],
                },
                keep(&["one", "two"]),
            ),
            (
                "a long cluster name matches its hashed label",
                NamespaceFacts {
                    workloads: vec![workload(Machine, "m", Some(&long), None)],
                    clusters: vec![
                        cluster(Some(&long_hashed), Some("hashed")),
                        cluster(Some("other"), Some("unrelated")),
                    ],
                },
                keep(&["hashed"]),
            ),
        ];
        for (what, facts, want) in table {
            assert_eq!(plan(&facts), want, "{what}");
        }
    }

    #[test]
    fn unresolved_objects() {
        let facts = NamespaceFacts {
            workloads: vec![
                workload(Kind::Cluster, "c", Some("gone"), None),
                workload(Kind::Machine, "found", Some("prod"), None),
                workload(Kind::Machine, "own", Some("gone"), Some("x")),
                workload(Kind::Machine, "lost", Some("gone"), None),
                workload(Kind::MachinePool, "unlabelled", None, None),
            ],
            clusters: vec![cluster(Some("prod"), None)],
        };
        let names: Vec<_> = unresolved(&facts).map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["lost", "unlabelled"]);
    }

    fn sa(namespace: &str, name: &str) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            api_group: None,
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn subjects_kept() {
        let user = Subject {
            kind: "User".into(),
            name: "captf-runner".into(),
            namespace: None,
            api_group: Some("rbac.authorization.k8s.io".into()),
        };
        let mut grouped = sa("ns", "captf-runner");
        grouped.api_group = Some("example.com".into());
        let subjects = vec![
            sa("ns", "builder"),
            sa("ns", "captf-runner"),
            sa("other", "captf-runner"),
            user,
            grouped,
            sa("ns", "deployer"),
        ];
        let table: &[(&[&str], Vec<Subject>)] = &[
            (&["captf-runner"], vec![sa("ns", "captf-runner")]),
            (
                &["deployer", "captf-runner", "absent"],
                vec![sa("ns", "captf-runner"), sa("ns", "deployer")],
            ),
            (&[], vec![]),
        ];
        for (names, want) in table {
            assert_eq!(
                kept_subjects(&subjects, "ns", &set(names)),
                *want,
                "{names:?}"
            );
        }
    }

    #[test]
    fn only_the_runner_binding_is_pruned_and_only_when_it_changes() {
        let binding = rbac::role_binding("ns", &set(&["builder", "captf-runner"]));
        let updated = pruned(&binding, "ns", &set(&["captf-runner"])).unwrap();
        assert_eq!(updated.subjects, Some(vec![sa("ns", "captf-runner")]));
        assert_eq!(
            updated.metadata, binding.metadata,
            "the resourceVersion guard stays"
        );
        assert_eq!(updated.role_ref, binding.role_ref);

        assert_eq!(
            pruned(&binding, "ns", &set(&["builder", "captf-runner", "x"])),
            None
        );
        let emptied = pruned(&binding, "ns", &set(&["x"])).unwrap();
        assert_eq!(emptied.subjects, Some(vec![]));
        let mut none = binding.clone();
        none.subjects = None;
        assert_eq!(pruned(&none, "ns", &set(&[])), None);

        let mut renamed = binding.clone();
        renamed.metadata.name = Some("something-else".into());
        assert_eq!(pruned(&renamed, "ns", &set(&[])), None);
        let mut foreign = binding;
        foreign.role_ref.name = "admin".into();
        assert_eq!(pruned(&foreign, "ns", &set(&[])), None);
    }

    #[test]
    fn categories() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(SweepError::Api(status(409)).category(), Category::Transient);
        assert_eq!(SweepError::Api(status(403)).category(), Category::Invalid);
        let incomplete = SweepError::Incomplete(vec![
            ("a".into(), SweepError::Api(status(403))),
            ("b".into(), SweepError::Api(status(500))),
        ]);
        assert_eq!(incomplete.category(), Category::Transient);
        assert!(incomplete.to_string().contains("a ("), "{incomplete}");
        let refused = SweepError::Incomplete(vec![("a".into(), SweepError::Api(status(403)))]);
        assert_eq!(refused.category(), Category::Invalid);
    }
}
