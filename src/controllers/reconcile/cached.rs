//! Observe's reads that the watches answer: the object's Jobs and their
//! pods, its namespace, its state, backups, durable inputs and lock. The
//! data of a Secret is read from the API server only when the metadata
//! watch shows it changed since it was last read; what a watched copy
//! cannot settle safely (a lock holder's pod never seen) is read live.
//! What the manager itself just wrote (the durable inputs, a state it
//! adopted, a backup it took, a Job it bookkept) is kept as written, so
//! that the watch events of its own writes cost no read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Namespace, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta};

use super::Object;
use crate::backups::{self, BackupInfo, Listed};
use crate::controllers::watches::{BackupSets, Labelled, Versions, key};
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::keys::{
    BACKUP_LABEL, BACKUP_SUFFIX_LABEL, BOOKKEPT, JOB_NAME_LABEL, OWNER_KIND_LABEL,
    OWNER_NAME_LABEL, OWNER_UID_LABEL,
};
use crate::locks::{self, Assessment, PodFact, Verdict};
use crate::names::{self, Kind};
use crate::state::{self, Snapshot};

/// The Jobs of this object: its owner labels, and an owner reference to
/// this very object (a same-named object created later has another UID).
pub fn jobs_of<K: Workload>(ctx: &Context, o: &Object) -> Vec<Job> {
    ctx.watches
        .jobs
        .labelled(&o.namespace, OWNER_NAME_LABEL, &names::label_value(&o.name))
        .into_iter()
        .filter(|j| {
            j.label(OWNER_KIND_LABEL) == Some(K::KIND.kind())
                && j.owner_references().iter().any(|r| r.uid == o.uid)
        })
        .map(|j| (*j).clone())
        .collect()
}

/// The Jobs this manager bookkept, by uid, until the watch shows them so
/// (kept a minute at most): a pass that comes before the watch takes them
/// as bookkept, as the API server has them, instead of listing the Jobs
/// live to find out.
#[derive(Default)]
pub struct Bookkept(Mutex<HashMap<String, (String, Instant)>>);

/// How long [`Bookkept`] keeps a Job: far longer than a watch lags.
const BOOKKEPT_KEPT: Duration = Duration::from_secs(60);

impl Bookkept {
    /// `job` as the bookkeeping write answered, with its value.
    pub fn wrote(&self, job: &Job, value: &str) {
        let Some(uid) = job.metadata.uid.clone() else {
            return;
        };
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (_, at)| at.elapsed() < BOOKKEPT_KEPT);
        map.insert(uid, (value.to_owned(), Instant::now()));
    }

    /// Marks the Jobs of `jobs` bookkept that this manager bookkept and
    /// the watch does not show so yet.
    pub fn mark(&self, jobs: &mut [Job]) {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return;
        }
        let shown = |j: &Job| {
            j.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(BOOKKEPT))
        };
        for job in jobs.iter_mut().filter(|j| !shown(j)) {
            let kept = job.metadata.uid.as_ref().and_then(|uid| map.get(uid));
            if let Some((value, _)) = kept.filter(|(_, at)| at.elapsed() < BOOKKEPT_KEPT) {
                job.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(BOOKKEPT.to_owned(), value.clone());
            }
        }
    }
}

/// The Jobs of this object run from the manager's namespace `away`: its
/// uid label.
pub fn away_jobs_of<K: Workload>(ctx: &Context, o: &Object, away: &str) -> Vec<Job> {
    ctx.watches
        .jobs
        .filter(|j| {
            j.metadata.namespace.as_deref() == Some(away)
                && j.label(OWNER_KIND_LABEL) == Some(K::KIND.kind())
                && j.label(OWNER_UID_LABEL) == Some(o.uid.as_str())
        })
        .into_iter()
        .map(|j| (*j).clone())
        .collect()
}

/// The object's Jobs read live (and those run from `away`): a finished Job
/// is settled from what the API server says, never from a watched copy
/// that may not show it bookkept yet (it would be counted twice).
pub async fn live_jobs_of<K: Workload>(
    ctx: &Context,
    o: &Object,
    away: Option<&str>,
) -> Result<Vec<Job>, Error> {
    let list = |ns: &str, selector: String| {
        let api = Api::<Job>::namespaced(ctx.client.clone(), ns);
        async move {
            api.list(&ListParams::default().labels(&selector))
                .await
                .map_err(Error::Kube)
        }
    };
    let kind = K::KIND.kind();
    let own = format!(
        "{OWNER_KIND_LABEL}={kind},{OWNER_NAME_LABEL}={}",
        names::label_value(&o.name)
    );
    let mut jobs: Vec<Job> = list(&o.namespace, own)
        .await?
        .items
        .into_iter()
        .filter(|j| j.owner_references().iter().any(|r| r.uid == o.uid))
        .collect();
    if let Some(away) = away {
        let by_uid = format!("{OWNER_KIND_LABEL}={kind},{OWNER_UID_LABEL}={}", o.uid);
        jobs.extend(list(away, by_uid).await?.items);
    }
    Ok(jobs)
}

/// The runner container's end, and the image ID its pod reported: from
/// the watched pods, else (the pod's last change not seen yet) read live.
/// Only a pod that `job` controls counts: anyone who can create pods in the
/// namespace can label one with the Job's name.
pub async fn terminated(
    ctx: &Context,
    ns: &str,
    job: &Job,
) -> Result<(Option<ContainerStateTerminated>, Option<String>), Error> {
    let (name, uid) = (job.name_any(), job.uid().unwrap_or_default());
    let seen = ctx.watches.pods.labelled(ns, JOB_NAME_LABEL, &name);
    if let Some(end) = runner_end(seen.iter().map(|p| p.as_ref()), &uid) {
        return Ok(end);
    }
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{JOB_NAME_LABEL}={name}")))
        .await
        .map_err(Error::Kube)?;
    Ok(runner_end(pods.items.iter(), &uid).unwrap_or((None, None)))
}

/// The runner container's end and image ID in the first of `pods` that the
/// Job of `job_uid` controls and whose runner terminated.
fn runner_end<'a>(
    pods: impl Iterator<Item = &'a Pod>,
    job_uid: &str,
) -> Option<(Option<ContainerStateTerminated>, Option<String>)> {
    pods.filter(|p| {
        !job_uid.is_empty()
            && p.owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && r.kind == "Job" && r.uid == job_uid)
    })
    .find_map(pod_runner_end)
}

/// The runner container's end and image ID, once it terminated.
fn pod_runner_end(pod: &Pod) -> Option<(Option<ContainerStateTerminated>, Option<String>)> {
    let c = crate::jobs::runner_terminated(pod)?;
    Some((
        c.state.as_ref().and_then(|s| s.terminated.clone()),
        Some(c.image_id.clone()).filter(|id| !id.is_empty()),
    ))
}

/// The namespace's metadata: watched, else (not seen yet) read live.
/// None when it does not exist.
pub async fn namespace(ctx: &Context, ns: &str) -> Result<Option<ObjectMeta>, Error> {
    let seen = ctx
        .watches
        .namespaces
        .get(&kube::runtime::reflector::ObjectRef::new(ns));
    if let Some(seen) = seen {
        return Ok(Some(seen.metadata.clone()));
    }
    live_namespace(ctx, ns).await
}

/// The namespace's metadata, read live: a deletion goes by what the API
/// server says now.
pub async fn live_namespace(ctx: &Context, ns: &str) -> Result<Option<ObjectMeta>, Error> {
    Ok(Api::<Namespace>::all(ctx.client.clone())
        .get_opt(ns)
        .await
        .map_err(Error::Kube)?
        .map(|n| n.metadata))
}

/// The state of `suffix` in `ns`. A copy read earlier serves while the
/// state Secrets keep their resourceVersions and `reuse` accepts it;
/// otherwise the Secrets are read (with their data, for this pass) and the
/// copy is kept without the data.
pub async fn state(
    ctx: &Context,
    ns: &str,
    suffix: &str,
    reuse: impl Fn(&Snapshot) -> bool,
) -> Result<Arc<Snapshot>, Error> {
    let selector = state::labels(suffix);
    let seen: Vec<_> = ctx
        .watches
        .state_secrets
        .labelled(ns, state::SUFFIX_LABEL, suffix)
        .into_iter()
        .filter(|s| selector.iter().all(|(k, v)| s.label(k) == Some(v.as_str())))
        .collect();
    let versions = Versions::of(seen.iter().map(AsRef::as_ref));
    let key = key(ns, suffix);
    let cache = &ctx.watches.derived.states;
    if let Some(kept) = cache.get(&key, &versions).filter(|s| reuse(s)) {
        return Ok(kept);
    }
    if versions.is_empty() && reuse(&Snapshot::not_found()) {
        return Ok(Arc::new(Snapshot::not_found()));
    }
    let read = state::snapshot(&Api::namespaced(ctx.client.clone(), ns), suffix).await?;
    cache.put(
        &key,
        Versions::of(read.secrets.iter().map(|s| &s.metadata)),
        Arc::new(read.without_data()),
    );
    Ok(Arc::new(read))
}

/// Keeps the state as read with the metadata of the manager's own
/// adoption (`patched`: each chunk's version as read, and the chunk as the
/// patch answered), so that the watch events of those writes cost no read
/// of the state. Sound only because each patch was guarded by the version
/// read and changed metadata alone: the data at the new versions is the
/// data read. Anything else (a version not the one kept, an unguarded
/// patch) keeps nothing, and the next pass reads the state.
pub fn adopted(ctx: &Context, o: &Object, patched: Vec<(Option<String>, Secret)>) {
    let key = key(&o.namespace, &o.suffix);
    let cache = &ctx.watches.derived.states;
    let Some(kept) = cache.last(&key) else {
        return;
    };
    let mut secrets = kept.secrets.clone();
    for (read_at, answer) in patched {
        let Some(chunk) = secrets
            .iter_mut()
            .find(|s| s.metadata.name == answer.metadata.name)
        else {
            return;
        };
        if read_at.is_none() || chunk.metadata.resource_version != read_at {
            return;
        }
        chunk.metadata = answer.metadata;
    }
    let adopted = Snapshot {
        readable: kept.readable.clone(),
        secrets,
    }
    .without_data();
    cache.put(
        &key,
        Versions::of(adopted.secrets.iter().map(|s| &s.metadata)),
        Arc::new(adopted),
    );
}

/// The object's backups: the backup Secrets of its suffix that it owns, as
/// the metadata watch shows them (a Secret anyone labelled as a backup is
/// never listed, pruned or restored), and each set as judged from its data.
/// A set's data is read only when its own Secrets changed since it was last
/// judged, so a new backup reads one set, not all of them.
pub async fn backups(
    ctx: &Context,
    ns: &str,
    suffix: &str,
    owner_uid: &str,
) -> Result<Arc<Listed>, Error> {
    let secrets: Vec<Secret> = ctx
        .watches
        .managed_secrets
        .labelled(ns, BACKUP_SUFFIX_LABEL, suffix)
        .iter()
        .filter(|s| s.label(BACKUP_LABEL) == Some("true"))
        .map(|s| s.to_meta())
        .filter(|metadata| backups::owned_by(metadata, owner_uid))
        .map(|metadata| Secret {
            metadata,
            ..Default::default()
        })
        .collect();
    if secrets.is_empty() {
        return Ok(Arc::new(Listed::default()));
    }
    let key = key(ns, suffix);
    let cache = &ctx.watches.derived.backups;
    let before = cache.last(&key);
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let mut judged = BackupSets::default();
    for (serial, chunks) in backups::by_serial(&secrets, suffix) {
        let versions = Versions::of(chunks.iter().map(|s| &s.metadata));
        let kept = before
            .as_ref()
            .and_then(|b| b.get(serial))
            .filter(|(at, _)| *at == versions)
            .map(|(_, info)| info.clone());
        let info = match kept {
            Some(info) => info,
            None => {
                let names: Vec<&str> = chunks
                    .iter()
                    .filter_map(|s| s.metadata.name.as_deref())
                    .collect();
                let read = backups::read_set(&api, &names)
                    .await
                    .map_err(Error::Backup)?;
                let read: Vec<Secret> = read
                    .into_iter()
                    .filter(|s| backups::owned_by(&s.metadata, owner_uid))
                    .collect();
                // Gone since it was seen: an empty set, incomplete.
                backups::list(&read, suffix)
                    .into_iter()
                    .find(|i| i.serial == serial)
                    .unwrap_or_else(|| BackupInfo::gone(serial))
            }
        };
        judged.insert(serial, (versions, info));
    }
    let infos = judged.newest_first().cloned().collect();
    cache.put(&key, Versions::default(), Arc::new(judged));
    Ok(Arc::new(Listed { secrets, infos }))
}

/// Keeps a backup set this manager just created whole as judged from the
/// Secrets as created, so that the watch event of its own write costs no
/// read.
pub fn took_backup(ctx: &Context, o: &Object, serial: u64, created: &[Secret]) {
    let Some(info) = backups::list(created, &o.suffix)
        .into_iter()
        .find(|i| i.serial == serial)
    else {
        return;
    };
    let key = key(&o.namespace, &o.suffix);
    let cache = &ctx.watches.derived.backups;
    let mut judged = cache.last(&key).map(|b| (*b).clone()).unwrap_or_default();
    judged.insert(
        serial,
        (Versions::of(created.iter().map(|s| &s.metadata)), info),
    );
    cache.put(&key, Versions::default(), Arc::new(judged));
}

/// The durable inputs Secret of the object, when it exists.
pub async fn durable<K: Workload>(ctx: &Context, o: &Object) -> Result<Option<Arc<Secret>>, Error> {
    let name = names::inputs_secret(K::KIND, &o.name);
    let Some(seen) = ctx.watches.managed_secrets.get(&o.namespace, &name) else {
        return Ok(None);
    };
    let versions = Versions::of([seen.as_ref()]);
    let key = key(&o.namespace, &o.suffix);
    let cache = &ctx.watches.derived.durable;
    if let Some(kept) = cache.get(&key, &versions) {
        return Ok(Some(kept));
    }
    let read = Api::<Secret>::namespaced(ctx.client.clone(), &o.namespace)
        .get_opt(&name)
        .await
        .map_err(Error::Kube)?
        .map(|mut secret| {
            secret.metadata.managed_fields = None;
            Arc::new(secret)
        });
    if let Some(read) = &read {
        cache.put(&key, Versions::of([&read.metadata]), read.clone());
    }
    Ok(read)
}

/// Keeps the durable inputs as this manager just wrote them, so that the
/// watch event of its own write costs no read.
pub fn wrote_durable(ctx: &Context, o: &Object, mut written: Secret) {
    written.metadata.managed_fields = None;
    ctx.watches.derived.durable.put(
        &key(&o.namespace, &o.suffix),
        Versions::of([&written.metadata]),
        Arc::new(written),
    );
}

/// Whether the watch has seen the durable inputs of the object.
pub fn durable_seen<K: Workload>(ctx: &Context, o: &Object) -> bool {
    let name = names::inputs_secret(K::KIND, &o.name);
    ctx.watches
        .managed_secrets
        .get(&o.namespace, &name)
        .is_some()
}

/// The verdict on the object's state lock. The Lease is the watched copy;
/// when one of the object's own runner pods holds it, a pod seen ended
/// settles it (an ended pod never runs again), one seen running counts as
/// alive (its end wakes the object), and one never seen is read live: only
/// the API server can say it is gone.
pub async fn lock(
    ctx: &Context,
    o: &Object,
    kind: Kind,
    away: Option<&str>,
) -> Result<Verdict, Error> {
    let lease = ctx
        .watches
        .lock_leases
        .get(&o.namespace, &names::state_lock_lease(&o.suffix));
    match locks::assess(kind, &o.name, lease.as_deref()) {
        Assessment::Settled(verdict) => Ok(verdict),
        Assessment::OwnPod(hold) => {
            let seen = std::iter::once(o.namespace.as_str())
                .chain(away)
                .find_map(|ns| ctx.watches.pods.get(ns, hold.pod()));
            match seen {
                Some(pod) => Ok(hold.verdict(PodFact::of(Some(pod.as_ref())))),
                None => Ok(locks::inspect(&ctx.client, &o.namespace, away, kind, &o.name).await?),
            }
        }
    }
}

/// Whether a namespace's metadata says it is being deleted, or it is gone.
pub fn terminating(namespace: Option<&ObjectMeta>) -> bool {
    namespace.is_none_or(|n| n.deletion_timestamp.is_some())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(owner: Option<(&str, &str, bool)>, exit_code: i32) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.owner_references = owner.map(|(kind, uid, controller)| {
            vec![OwnerReference {
                kind: kind.into(),
                uid: uid.into(),
                controller: Some(controller),
                ..Default::default()
            }]
        });
        pod.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: crate::jobs::builder::SOURCE_CONTAINER.into(),
                image_id: "sha256:abc".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn only_a_pod_the_job_controls_gives_its_result() {
        let exit = |pods: &[Pod], uid: &str| {
            runner_end(pods.iter(), uid).map(|(end, _)| end.map(|e| e.exit_code))
        };
        let own = pod(Some(("Job", "job-uid", true)), 0);
        let forged = [
            pod(None, 7),
            pod(Some(("Job", "other-uid", true)), 7),
            pod(Some(("Job", "job-uid", false)), 7),
            pod(Some(("ReplicaSet", "job-uid", true)), 7),
        ];
        assert_eq!(exit(&forged, "job-uid"), None);
        let mut all = forged.to_vec();
        all.push(own);
        assert_eq!(exit(&all, "job-uid"), Some(Some(0)));
        // A Job without a uid (never from the API server) controls nothing.
        assert_eq!(exit(&all, ""), None);
    }

    #[test]
    fn a_job_bookkept_here_counts_as_bookkept_before_the_watch_shows_it() {
        let job = |uid: &str, bookkept: Option<&str>| {
            let mut j = Job::default();
            j.metadata.uid = Some(uid.into());
            j.metadata.annotations =
                bookkept.map(|v| [(BOOKKEPT.to_string(), v.to_string())].into());
            j
        };
        let kept = Bookkept::default();
        let mut jobs = vec![job("a", None)];
        kept.mark(&mut jobs);
        assert_eq!(jobs, vec![job("a", None)], "nothing bookkept yet");
        kept.wrote(&job("a", Some("succeeded")), "succeeded");
        let mut jobs = vec![job("a", None), job("b", None), job("c", Some("failed"))];
        kept.mark(&mut jobs);
        assert_eq!(
            jobs,
            vec![
                job("a", Some("succeeded")),
                job("b", None),
                job("c", Some("failed"))
            ]
        );
    }
}
