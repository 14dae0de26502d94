//! Which namespaces the periodic sweep visits: those whose watched objects
//! show something to sweep. The sweep itself then reads the API server
//! afresh; a namespace with nothing to do costs no request.

use std::collections::BTreeSet;

use kube::Resource;

use super::{Plan, facts_of, plan, pruned};
use crate::controllers::watches::{Labelled, Watches, Workloads};
use crate::keys::{OWNER_NAMESPACE_LABEL, PROTECTED_LABEL};
use crate::names::RUNNER_RBAC;

/// Not kept in the manager's namespace for another namespace's objects.
fn ours(o: &impl Labelled) -> bool {
    o.label(OWNER_NAMESPACE_LABEL).is_none()
}

fn namespaces<K: Labelled>(objects: Vec<std::sync::Arc<K>>) -> impl Iterator<Item = String> {
    objects
        .into_iter()
        .filter_map(|o| o.object_namespace().map(str::to_owned))
}

/// The namespaces (within `scope`) where a sweep would change something,
/// as the watches see them.
pub fn due(
    watches: &Watches,
    workloads: &Workloads,
    scope: Option<&str>,
    away: Option<&str>,
) -> BTreeSet<String> {
    // What the live sweep looks for: CAPTF's accounts, bindings and Leases
    // (not those kept in the manager's namespace for another's objects),
    // protected Secrets, and what destroys left in the manager's namespace.
    let mut found: BTreeSet<String> = BTreeSet::new();
    found.extend(namespaces(watches.accounts.filter(ours)));
    found.extend(namespaces(watches.bindings.filter(ours)));
    found.extend(namespaces(watches.leases.filter(ours)));
    found.extend(namespaces(
        watches
            .managed_secrets
            .filter(|s| s.label(PROTECTED_LABEL) == Some("true")),
    ));
    let mut leftovers: BTreeSet<String> = BTreeSet::new();
    if let Some(away) = away {
        let in_away = |ns: Option<&str>| ns == Some(away);
        leftovers.extend(
            watches
                .accounts
                .filter(|a| in_away(a.meta().namespace.as_deref()))
                .iter()
                .filter_map(|a| a.label(OWNER_NAMESPACE_LABEL).map(str::to_owned)),
        );
        leftovers.extend(
            watches
                .jobs
                .filter(|j| in_away(j.meta().namespace.as_deref()))
                .iter()
                .filter_map(|j| j.label(OWNER_NAMESPACE_LABEL).map(str::to_owned)),
        );
    }
    found
        .into_iter()
        .chain(leftovers.iter().cloned())
        .filter(|ns| scope.is_none_or(|s| s == ns))
        .filter(|ns| leftovers.contains(ns) || sweeps_something(watches, workloads, ns))
        .collect()
}

/// Whether the sweep of `ns`, where CAPTF left something, would change it:
/// nothing uses what is left, or the runner binding has a subject to lose.
fn sweeps_something(watches: &Watches, workloads: &Workloads, ns: &str) -> bool {
    let clusters = workloads.0.state();
    let machines = workloads.1.state();
    let pools = workloads.2.state();
    let in_ns = |meta: &kube::api::ObjectMeta| meta.namespace.as_deref() == Some(ns);
    let facts = facts_of(
        &clusters
            .iter()
            .filter(|c| in_ns(c.meta()))
            .map(|c| c.as_ref())
            .collect::<Vec<_>>(),
        &machines
            .iter()
            .filter(|m| in_ns(m.meta()))
            .map(|m| m.as_ref())
            .collect::<Vec<_>>(),
        &pools
            .iter()
            .filter(|p| in_ns(p.meta()))
            .map(|p| p.as_ref())
            .collect::<Vec<_>>(),
    );
    match plan(&facts) {
        Plan::Empty => true,
        Plan::Prune { keep } => watches
            .bindings
            .filter(|b| in_ns(b.meta()) && b.meta().name.as_deref() == Some(RUNNER_RBAC))
            .iter()
            .any(|b| pruned(b, ns, &keep).is_some()),
    }
}
