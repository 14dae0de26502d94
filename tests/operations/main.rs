//! The operations of the book's step table as the manager runs them (ref
//! §8.2–§8.4) end to end: the manager, the local pod executor, real
//! OpenTofu and the real API server.

mod approval;
mod digest;
mod drift;
mod events;
mod remediation;
mod settings;
mod stuck;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

use std::time::Duration;

use captf_testkit::scenario::{Env, within};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

/// When the first Job whose name starts with `prefix` completed.
async fn completed_at(env: &Env, prefix: &str) -> Timestamp {
    let jobs = env.jobs_named(prefix).await;
    jobs[0]
        .status
        .as_ref()
        .and_then(|s| s.completion_time.clone())
        .expect("the Job completed")
        .0
}

/// How long after `since` the first Job whose name starts with `prefix`
/// was created, waiting up to `secs` for it.
async fn created_after(env: &Env, prefix: &str, since: Timestamp, secs: u64) -> Duration {
    let job = within(env, secs, &format!("a Job {prefix}"), || async {
        env.jobs_named(prefix).await.into_iter().next()
    })
    .await;
    let created = job.metadata.creation_timestamp.expect("created").0;
    Duration::try_from(created.duration_since(since)).expect("created after")
}

/// The runner's events in the test's namespace, in the order it sent them.
async fn runner_events(env: &Env) -> Vec<Event> {
    let mut events: Vec<Event> = Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .expect("listing events")
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("captf.io/runner"))
        .collect();
    events.sort_by_key(|e| e.metadata.name.clone());
    events
}

/// Waits until the manager's scrape has every one of `lines`: a pass counts
/// its metrics after it writes status, so status can show an outcome a
/// moment before the scrape does.
async fn scraped(env: &Env, lines: &[&str]) {
    within(env, 30, &format!("{lines:?} in /metrics"), || async {
        let metrics = env.manager.metrics().await;
        lines
            .iter()
            .all(|line| metrics.lines().any(|l| l == *line))
            .then_some(())
    })
    .await;
}
