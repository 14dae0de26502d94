//! The identities' Secrets. They are the users' own Secrets, without a
//! label of CAPTF's, so each is watched alone, by name, from its first
//! read on: a handful of watches for the few identities of a cluster,
//! rather than a watch of every Secret or a read on every pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;
use tracing::warn;

/// How long a first read waits for its watch to list, before it reads
/// the Secret directly (a watch that cannot list, say for want of RBAC,
/// must not hold passes up).
const FIRST_LIST: Duration = Duration::from_secs(2);

type Watched = HashMap<(String, String), (Store<Secret>, JoinHandle<()>)>;

pub struct Sources {
    client: kube::Client,
    watched: Mutex<Watched>,
}

impl Sources {
    pub fn new(client: kube::Client) -> Sources {
        Sources {
            client,
            watched: Mutex::default(),
        }
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Secret `namespace/name`, as its watch last saw it.
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, kube::Error> {
        let store = self
            .watched()
            .entry((namespace.to_owned(), name.to_owned()))
            .or_insert_with(|| self.watch(namespace, name))
            .0
            .clone();
        let listed = || matches!(store.wait_until_ready().now_or_never(), Some(Ok(())));
        let deadline = tokio::time::Instant::now() + FIRST_LIST;
        while !listed() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if listed() {
            return Ok(store.get(&ObjectRef::new(name).within(namespace)));
        }
        Ok(Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
            .map(Arc::new))
    }

    fn watch(&self, namespace: &str, name: &str) -> (Store<Secret>, JoinHandle<()>) {
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (reader, writer) = reflector::store();
        let events = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    warn!("watch of an identity's Secret: {e}");
                }
            }
        });
        (reader, task)
    }

    pub fn stop(&self) {
        for (_, task) in self.watched().values() {
            task.abort();
        }
    }
}
