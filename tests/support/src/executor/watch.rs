//! The pod watch: a task per pod seen, told of each change and of its end.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use super::{PodKey, PodRun, Shared, Tracked, lock};

const MANAGED_SELECTOR: &str = "captf.io/managed=true";

pub(super) async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<Pod> = match &shared.namespace {
        Some(namespace) => Api::namespaced(shared.client.clone(), namespace),
        None => Api::all(shared.client.clone()),
    };
    // A contained executor runs every pod of its namespace.
    let config = if shared.contained {
        watcher::Config::default()
    } else {
        watcher::Config::default().labels(MANAGED_SELECTOR)
    };
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // The UIDs listed since the watch (re)started: a pod deleted while the
    // watch was down is missing from the list and never reported deleted.
    let mut listed: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod)) => observe(&shared, pod),
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid {
                    forget(&shared, &uid);
                }
            }
            Ok(Event::Init) => listed = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Some(uid)) = (listed.as_mut(), pod.metadata.uid.clone()) {
                    listed.insert(uid);
                }
                observe(&shared, pod);
            }
            Ok(Event::InitDone) => {
                shared.synced.send_replace(true);
                if let Some(listed) = listed.take() {
                    let gone: Vec<String> = lock(&shared.pods)
                        .keys()
                        .filter(|uid| !listed.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        forget(&shared, &uid);
                    }
                }
            }
            Err(e) => shared.log(&format!("watching pods: {e}")),
        }
    }
}

fn observe(shared: &Arc<Shared>, pod: Pod) {
    let (Some(uid), Some(namespace), Some(name)) = (
        pod.metadata.uid.clone(),
        pod.metadata.namespace.clone(),
        pod.metadata.name.clone(),
    ) else {
        return;
    };
    let mut pods = lock(&shared.pods);
    if let Some(tracked) = pods.get(&uid) {
        tracked.updates.send_replace(Some(pod));
        return;
    }
    let key = PodKey { namespace, name };
    let (updates, rx) = watch::channel(Some(pod));
    let run = PodRun::new(shared.clone(), uid.clone(), key.clone(), rx);
    let task = tokio::spawn(run.run());
    pods.insert(
        uid,
        Tracked {
            key,
            updates,
            task,
            process: None,
            oom_killed: false,
        },
    );
}

/// The pod is gone from the API: its task kills what still runs.
fn forget(shared: &Shared, uid: &str) {
    if let Some(tracked) = lock(&shared.pods).remove(uid) {
        tracked.updates.send_replace(None);
    }
}
