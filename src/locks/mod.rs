//! The backend's state lock and the stale-lock decision (book:
//! state-lock-and-stale-locks.md). A held lock is stale only when its lock
//! info parses, the hostname of its `Who` is a pod of this object's own
//! runner Jobs, and that pod is gone or has reached a terminal phase (as
//! the API server says, or as the pod watch saw it end: an ended pod never
//! runs again). Every other holder is left alone: unlocking a lock someone else
//! holds can corrupt a user's infrastructure.
//!
//! The decision is pure ([`assess`], then [`OwnHold::verdict`]); [`inspect`]
//! is the edge that reads the Lease and, only for an own-pod holder, the pod.

mod info;

pub use info::{Created, LockInfo};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::error::{Categorized, Category, kube_category};
use crate::keys::LOCK_INFO;
use crate::names::{self, Kind};
use info::clip;

/// How much of a text taken from the lock info goes into a message: anyone
/// who can write the Lease chooses it.
const MESSAGE_FIELD_MAX: usize = 200;

/// The lock ID to release: the lock info's ID, else the Lease's holder
/// identity.
pub fn lock_id(info: Option<&LockInfo>, holder_identity: Option<&str>) -> Option<String> {
    info.and_then(|i| i.id.clone())
        .or_else(|| holder_identity.filter(|h| !h.is_empty()).map(str::to_owned))
}

/// The holder's pod when `Who` names one of the object's own runner pods:
/// the part after the last `@`, checked by [`names::is_own_runner_pod`]. A
/// `Who` without `@` names no pod.
pub fn holder_pod(kind: Kind, name: &str, info: &LockInfo) -> Option<String> {
    let (_, host) = info.who.as_deref()?.rsplit_once('@')?;
    names::is_own_runner_pod(kind, name, host).then(|| host.to_owned())
}

/// The holder pod as read live from the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodFact {
    Gone,
    Pending,
    Running,
    Succeeded,
    Failed,
    /// deletionTimestamp set, whatever the phase: it may still be running
    /// the runtime inside its grace period.
    Terminating,
    /// Phase missing or unrecognised: counts as alive.
    Unknown,
}

impl PodFact {
    pub fn of(pod: Option<&Pod>) -> PodFact {
        let Some(pod) = pod else {
            return PodFact::Gone;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return PodFact::Terminating;
        }
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Pending") => PodFact::Pending,
            Some("Running") => PodFact::Running,
            Some("Succeeded") => PodFact::Succeeded,
            Some("Failed") => PodFact::Failed,
            _ => PodFact::Unknown,
        }
    }

    /// Whether the pod can no longer be running the runtime: it does not
    /// exist, or its containers have exited for good.
    fn ended(self) -> bool {
        match self {
            PodFact::Gone | PodFact::Succeeded | PodFact::Failed => true,
            PodFact::Pending | PodFact::Running | PodFact::Terminating | PodFact::Unknown => false,
        }
    }
}

/// What the state lock means for the object. `lease` is the lock Lease's
/// name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No Lease, or a Lease with no holder (the backend keeps the Lease
    /// after unlock).
    Free,
    /// Held, but the lock info is missing or does not parse: the holder is
    /// unknown, so the lock is never stale. `holder` is the holder identity.
    Unparsable { lease: String, holder: String },
    /// Held by something other than one of the object's own runner pods.
    Foreign {
        lease: String,
        /// `Who`, else the holder identity.
        holder: String,
        operation: Option<String>,
        created: Option<String>,
        /// The lock ID force-unlock takes.
        id: String,
    },
    /// Held by one of the object's own runner pods that may still run.
    Alive { lease: String, pod: String },
    /// Held by one of the object's own runner pods that has ended: the next
    /// Job force-unlocks `id`.
    Stale {
        lease: String,
        id: String,
        pod: String,
    },
}

/// The first step of the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assessment {
    /// Decided from the Lease alone.
    Settled(Verdict),
    /// Held by one of the object's own runner pods: its live state decides.
    OwnPod(OwnHold),
}

/// A lock held by one of the object's own runner pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnHold {
    lease: String,
    id: String,
    pod: String,
}

impl OwnHold {
    /// The pod to read live.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// The verdict given the pod's live state.
    pub fn verdict(self, fact: PodFact) -> Verdict {
        let OwnHold { lease, id, pod } = self;
        if fact.ended() {
            Verdict::Stale { lease, id, pod }
        } else {
            Verdict::Alive { lease, pod }
        }
    }
}

/// The decision from the lock Lease alone (`None` when it does not exist).
pub fn assess(kind: Kind, name: &str, lease: Option<&Lease>) -> Assessment {
    let Some(lease) = lease else {
        return Assessment::Settled(Verdict::Free);
    };
    let Some(holder) = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
    else {
        return Assessment::Settled(Verdict::Free);
    };
    let lease_name = lease.metadata.name.clone().unwrap_or_default();
    let parsed = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LOCK_INFO))
        .and_then(|json| LockInfo::parse(json).ok());
    let Some(info) = parsed else {
        return Assessment::Settled(Verdict::Unparsable {
            lease: lease_name,
            holder: holder.to_owned(),
        });
    };
    let id = lock_id(Some(&info), Some(holder)).unwrap_or_else(|| holder.to_owned());
    match holder_pod(kind, name, &info) {
        Some(pod) => Assessment::OwnPod(OwnHold {
            lease: lease_name,
            id,
            pod,
        }),
        None => Assessment::Settled(Verdict::Foreign {
            lease: lease_name,
            holder: info.who.unwrap_or_else(|| holder.to_owned()),
            operation: info.operation,
            created: info.created.map(|c| c.raw),
            id,
        }),
    }
}

impl Verdict {
    /// The message of the StateReadable=False/StateLocked condition (and of
    /// the other states, for logs and events).
    pub fn message(&self) -> String {
        let c = |s: &str| clip(s, MESSAGE_FIELD_MAX);
        match self {
            Verdict::Free => "the state lock is free".to_owned(),
            Verdict::Unparsable { lease, holder } => format!(
                "the state lock {lease} is held (lock ID {}), but its lock info is missing or \
                 does not parse, so its holder is unknown and CAPTF never unlocks it: release \
                 it with force-unlock once the holder is gone, or delete the Lease if \
                 force-unlock cannot read the lock info",
                c(holder)
            ),
            Verdict::Foreign {
                lease,
                holder,
                operation,
                created,
                id,
            } => {
                let operation = operation
                    .as_deref()
                    .map(|o| format!(" ({})", c(o)))
                    .unwrap_or_default();
                let since = created
                    .as_deref()
                    .map(|t| format!(" since {}", c(t)))
                    .unwrap_or_default();
                format!(
                    "the state lock {lease} is held by {}{operation}{since}; it is not one of \
                     this object's runner pods, so CAPTF never unlocks it: release it with \
                     force-unlock {} once the holder is gone",
                    c(holder),
                    c(id)
                )
            }
            Verdict::Alive { lease, pod } => format!(
                "the state lock {lease} is held by this object's runner pod {pod}, which may \
                 still be running"
            ),
            Verdict::Stale { lease, id, pod } => format!(
                "the state lock {lease} is held by this object's runner pod {pod}, which has \
                 ended: the next Job force-unlocks lock ID {}",
                c(id)
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("reading the state lock Lease {lease}: {source}")]
    Lease { lease: String, source: kube::Error },
    #[error("reading the lock holder's pod {pod}: {source}")]
    Pod { pod: String, source: kube::Error },
}

impl Categorized for LockError {
    fn category(&self) -> Category {
        match self {
            LockError::Lease { source, .. } | LockError::Pod { source, .. } => {
                kube_category(source)
            }
        }
    }
}

/// Reads the object's state lock Lease and, only when its holder is one of
/// the object's own runner pods, that pod, both live from the API server:
/// what a pass reads when the watches never saw the pod (a stale copy
/// could call a running pod gone).
/// `away` is where else the object's runner pods may be: the manager's
/// namespace, once destroys run from there ([`crate::jobs::away`]). A pod
/// found in neither is gone.
pub async fn inspect(
    client: &kube::Client,
    namespace: &str,
    away: Option<&str>,
    kind: Kind,
    name: &str,
) -> Result<Verdict, LockError> {
    let lease_name = names::state_lock_lease(&names::suffix(namespace, kind, name));
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(&lease_name)
        .await
        .map_err(|source| LockError::Lease {
            lease: lease_name.clone(),
            source,
        })?;
    match assess(kind, name, lease.as_ref()) {
        Assessment::Settled(verdict) => Ok(verdict),
        Assessment::OwnPod(hold) => {
            let mut pod = None;
            for ns in std::iter::once(namespace).chain(away) {
                pod = Api::<Pod>::namespaced(client.clone(), ns)
                    .get_opt(hold.pod())
                    .await
                    .map_err(|source| LockError::Pod {
                        pod: hold.pod().to_owned(),
                        source,
                    })?;
                if pod.is_some() {
                    break;
                }
            }
            Ok(hold.verdict(PodFact::of(pod.as_ref())))
        }
    }
}

#[cfg(test)]
mod tests;
