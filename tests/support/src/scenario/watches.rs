//! Watches that run while a test goes on, so that nothing is missed
//! between two polls: every status an object was written with, every Job.

use super::*;

/// A watch running in the background while this lives.
struct Watching(tokio::task::JoinHandle<()>);

impl Watching {
    /// Hands every event of a watch of `api` to `seen`.
    fn start<K>(
        api: Api<K>,
        config: watcher::Config,
        mut seen: impl FnMut(watcher::Event<K>) + Send + 'static,
    ) -> Watching
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let stream = watcher(api, config).default_backoff();
        Watching(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Ok(event) = event {
                    seen(event);
                }
            }
        }))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every status an object was written with, in order, as a watch sees
/// them (nothing is missed between two polls), and whether the watch saw
/// it deleted.
pub struct Statuses {
    seen: Arc<Mutex<(Vec<WorkspaceStatus>, bool)>>,
    _watching: Watching,
}

impl Statuses {
    pub fn watch<K: Workload>(env: &Env, name: &str) -> Statuses {
        let seen = Arc::new(Mutex::new((Vec::new(), false)));
        let sink = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let watching = Watching::start(env.api::<K>(), config, move |event| {
            let mut seen = sink.lock().unwrap();
            match event {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    seen.0.extend(o.workspace_status().cloned())
                }
                watcher::Event::Delete(_) => seen.1 = true,
                _ => {}
            }
        });
        Statuses {
            seen,
            _watching: watching,
        }
    }

    pub fn all(&self) -> Vec<WorkspaceStatus> {
        self.seen.lock().unwrap().0.clone()
    }

    /// The last status written.
    pub fn last(&self) -> Option<WorkspaceStatus> {
        self.all().pop()
    }

    /// Whether the watch saw the object deleted: then it saw every status.
    pub fn deleted(&self) -> bool {
        self.seen.lock().unwrap().1
    }

    /// The newest record of each run whose Job name contains `pattern`
    /// (`-destroy-`), in the order they were first seen.
    pub fn runs(&self, pattern: &str) -> Vec<LastRun> {
        let mut runs: Vec<LastRun> = Vec::new();
        for run in self
            .all()
            .into_iter()
            .filter_map(|s| s.last_run)
            .filter(|r| r.job.contains(pattern))
        {
            match runs.iter_mut().find(|r| r.job == run.job) {
                Some(known) => *known = run,
                None => runs.push(run),
            }
        }
        runs
    }
}

/// Every Job of the namespace a watch saw, even those collected since,
/// with its creation time.
pub struct JobsSeen {
    seen: Arc<Mutex<BTreeMap<String, Timestamp>>>,
    _watching: Watching,
}

impl JobsSeen {
    pub fn watch(env: &Env) -> JobsSeen {
        Self::watch_in(env, &env.ns)
    }

    /// The Jobs of namespace `ns`.
    pub fn watch_in(env: &Env, ns: &str) -> JobsSeen {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let sink = seen.clone();
        let api = Api::<Job>::namespaced(env.client.clone(), ns);
        let watching = Watching::start(api, watcher::Config::default(), move |event| {
            if let watcher::Event::Apply(job) | watcher::Event::InitApply(job) = event {
                let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
                sink.lock()
                    .unwrap()
                    .insert(job.name_any(), created.unwrap_or_default());
            }
        });
        JobsSeen {
            seen,
            _watching: watching,
        }
    }

    /// The destroy Jobs of an object the watch saw, oldest first.
    pub fn destroys(&self, kind: Kind, name: &str) -> Vec<(String, Timestamp)> {
        self.named(&format!("captf-{}-{name}-destroy-", kind.short()))
    }

    /// The Jobs whose names begin with `prefix`, oldest first.
    pub fn named(&self, prefix: &str) -> Vec<(String, Timestamp)> {
        let seen = self.seen.lock().unwrap();
        let mut jobs: Vec<(String, Timestamp)> = seen
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(n, t)| (n.clone(), *t))
            .collect();
        jobs.sort_by_key(|(name, created)| (*created, name.clone()));
        jobs
    }
}
