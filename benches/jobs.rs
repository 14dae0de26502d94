//! Jobs for real, through the pod stand-in and real OpenTofu.
//!
//! ```sh
//! cargo bench --bench jobs
//! cargo bench --bench jobs -- --machines 200 --pods 16 --handoffs 3
//! ```
//!
//! `--machines` TerraformMachines of the noop module (200 by default) are
//! created at once in a cluster already applied; the stand-in runs at most
//! `--pods` pods at a time, as a node of that capacity would. Printed:
//!
//! - the time until every machine is applied;
//! - the manager's CPU (from /proc) against the CPU of the pods' processes
//!   (the runner, the tofu it runs and the init container, from
//!   `getrusage(RUSAGE_CHILDREN)` of this process, which runs them), per
//!   Job and as a ratio;
//! - the apply Jobs each machine had (a Job started twice shows here) and
//!   whether each machine's status names its one Job (bookkeeping lost
//!   shows here);
//! - `--handoffs` times, a stale lock handed on: a machine is deleted
//!   while its apply holds the lock, the runner is killed (its pod reported
//!   OOMKilled, Failed), and the time from its pod's phase change to the
//!   destroy Job, and to that Job's runner holding the lock, polled every
//!   20 ms; then once the same for a failed apply's retry, which waits its
//!   backoff.
//!
//! The runner is the one `make runner` builds (a debug build, statically
//! linked), as in the tests; most of a pod's CPU is tofu's.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does
//! nothing.

use std::time::{Duration, Instant};

use captf::api::TerraformMachine;
use captf::names::{self, Kind};
use captf_testkit::manager::metric_total;
use captf_testkit::scenario::{Env, JobsSeen, NOOP, applied, setup, vars};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

struct Options {
    machines: usize,
    pods: usize,
    handoffs: usize,
}

fn options() -> Options {
    let mut o = Options {
        machines: 200,
        pods: 16,
        handoffs: 3,
    };
    let args: Vec<String> = std::env::args().collect();
    for pair in args.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--machines", Some(v)) => o.machines = v,
            ("--pods", Some(v)) => o.pods = v,
            ("--handoffs", Some(v)) => o.handoffs = v,
            _ => {}
        }
    }
    o
}

/// CPU seconds of this process's children that have ended.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The holder of the machine's state lock and its lock-info's operation.
async fn lock_of(leases: &Api<Lease>, suffix: &str) -> Option<(String, String)> {
    let lease = leases
        .get_opt(&names::state_lock_lease(suffix))
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity.filter(|h| !h.is_empty())?;
    let info: serde_json::Value = serde_json::from_str(
        lease
            .metadata
            .annotations?
            .get("app.terraform.io/lock-info")?,
    )
    .ok()?;
    Some((holder, info["Who"].as_str()?.to_string()))
        .filter(|_| info["Operation"] == "OperationTypeApply")
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let o = options();
    let env = setup(MANAGER, "bench-jobs", &[], &[]).await;
    env.executor.limit_pods(o.pods);
    env.cluster("c", NOOP, None).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !env.cluster_status("c").await.is_some_and(|s| applied(&s)) {
        assert!(Instant::now() < deadline, "the cluster was not applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let jobs = JobsSeen::watch(&env);
    let machines = Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns);

    let (manager_before, pods_before) = (env.manager.usage().cpu_seconds, children_cpu());
    let scrape_before = env.manager.metrics().await;
    let started = Instant::now();
    futures::stream::iter(0..o.machines)
        .map(|i| {
            let env = &env;
            async move {
                env.machine(&format!("m-{i}"), "c", None).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(3600);
    let statuses = loop {
        let list = machines.list(&ListParams::default()).await.unwrap().items;
        let done = list
            .iter()
            .filter(|m| m.status.as_ref().is_some_and(|s| applied(&s.workspace)))
            .count();
        if done == o.machines {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} applied",
            o.machines
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let all_applied = started.elapsed();
    // The last pods' processes are reaped once their status is written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let manager_cpu = env.manager.usage().cpu_seconds - manager_before;
    let pods_cpu = children_cpu() - pods_before;
    let scrape_after = env.manager.metrics().await;
    let counted =
        |family: &str| metric_total(&scrape_after, family) - metric_total(&scrape_before, family);
    let passes = counted("controller_runtime_reconcile_total");
    let requests = counted("rest_client_requests_total");

    let mut twice = Vec::new();
    let mut unbooked = Vec::new();
    for m in &statuses {
        let name = m.metadata.name.clone().unwrap_or_default();
        let applies = jobs.named(&format!("captf-m-{name}-apply-"));
        if applies.len() != 1 {
            twice.push(format!("{name}: {applies:?}"));
        }
        let booked = m
            .status
            .as_ref()
            .and_then(|s| s.workspace.last_run.as_ref())
            .map(|r| r.job.clone());
        if applies.first().map(|(j, _)| j) != booked.as_ref() {
            unbooked.push(format!("{name}: status names {booked:?}"));
        }
    }
    let n = o.machines as f64;
    println!(
        "jobs: {} TerraformMachines created at once ({:.1} s to create), the pod stand-in running at most {} pods",
        o.machines,
        created.as_secs_f64(),
        o.pods
    );
    println!(
        "  every machine applied {:.0} s after the first was created ({:.1} Jobs a minute)",
        all_applied.as_secs_f64(),
        n / all_applied.as_secs_f64() * 60.0
    );
    println!(
        "  CPU per Job: manager {:.1} ms, pods (runner, tofu, init) {:.0} ms; manager ÷ pods = {:.3} (goal < 0.05)",
        manager_cpu / n * 1e3,
        pods_cpu / n * 1e3,
        manager_cpu / pods_cpu
    );
    println!(
        "  per Job: {:.1} passes, {:.1} API requests by the manager",
        passes / n,
        requests / n
    );
    println!(
        "  events per Job, by reason: {}",
        events_by_reason(&env, n).await
    );
    println!(
        "  machines with other than one apply Job: {} {:?}",
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    println!(
        "  machines whose status does not name their Job: {} {:?}",
        unbooked.len(),
        unbooked.iter().take(5).collect::<Vec<_>>()
    );

    // The rows of `make bench`'s table.
    println!(
        "| jobs ({} machines) | manager CPU ÷ pods' CPU, per Job | {:.3} | < 0.05 |",
        o.machines,
        manager_cpu / pods_cpu
    );
    println!(
        "| jobs ({} machines) | machines with a Job started twice, or not bookkept | {} , {} | 0 , 0 |",
        o.machines,
        twice.len(),
        unbooked.len()
    );
    handoffs(&env, &o).await;
}

/// The events of the bench's namespace per Job, by reason, most first.
async fn events_by_reason(env: &Env, jobs: f64) -> String {
    let events = Api::<Event>::namespaced(env.client.clone(), &env.ns);
    let mut by_reason = std::collections::BTreeMap::<String, usize>::new();
    for e in events.list(&ListParams::default()).await.unwrap().items {
        *by_reason.entry(e.reason.unwrap_or_default()).or_default() += 1;
    }
    let mut counts: Vec<_> = by_reason.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts
        .iter()
        .map(|(reason, n)| format!("{reason} {:.2}", *n as f64 / jobs))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kills runners holding their apply's lock; measures the handoff. The
/// machine is deleted while its apply runs, so the next Job is its destroy,
/// which no backoff delays (a failed apply's retry waits its backoff, a
/// minute after the first failure, ref §8.4; measured once at the end).
async fn handoffs(env: &Env, o: &Options) {
    let mut to_job = Vec::new();
    let mut to_lock = Vec::new();
    for i in 0..o.handoffs {
        let (job, lock) = handoff(env, &format!("held-{i}"), true).await;
        to_job.push(job);
        to_lock.push(lock);
    }
    let show = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.0}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  stale lock handed on at deletion, from the holder pod's Failed phase: to the destroy Job [{}] ms (goal < 2000); to its runner holding the lock [{}] ms",
        show(&to_job),
        show(&to_lock)
    );
    if let Some(worst) = to_job.iter().max() {
        println!(
            "| jobs | stale lock: holder pod Failed to the next Job, worst of {} | {:.0} ms | < 2000 ms |",
            to_job.len(),
            ms(*worst)
        );
    }
    if o.handoffs > 0 {
        let (job, lock) = handoff(env, "retried", false).await;
        println!(
            "  stale lock handed on to the apply's retry (after its backoff): to the Job {:.0} ms, to its runner holding the lock {:.0} ms",
            ms(job),
            ms(lock)
        );
    }
}

/// Starts a slow apply of `name`, kills its runner while it holds the
/// lock, and returns the time from the pod's Failed phase to the next Job
/// (the destroy when `delete`, else the apply's retry) and to that Job's
/// runner holding the lock.
async fn handoff(env: &Env, name: &str, delete: bool) -> (Duration, Duration) {
    let leases = Api::<Lease>::namespaced(env.client.clone(), &env.ns);
    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns);
    let machines = Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns);
    let suffix = names::suffix(&env.ns, Kind::Machine, name);
    env.machine(name, "c", vars(&[("sleep_seconds", json!(60))]))
        .await;
    let (_, who) = poll(
        "the apply to hold the lock",
        Duration::from_secs(600),
        || lock_of(&leases, &suffix),
    )
    .await;
    let pod = who.rsplit('@').next().unwrap_or_default().to_string();
    let next = if delete {
        env.delete::<TerraformMachine>(name).await;
        format!("captf-m-{name}-destroy-")
    } else {
        // The retry need not sleep.
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 0}}})),
            )
            .await
            .unwrap();
        format!("captf-m-{name}-apply-a2-")
    };
    assert!(
        env.executor.kill_oom(&env.ns, &pod),
        "{pod} was not running"
    );
    poll("the killed pod Failed", Duration::from_secs(60), || async {
        let p = pods.get_opt(&pod).await.ok()??;
        (p.status?.phase.as_deref() == Some("Failed")).then_some(())
    })
    .await;
    let failed = Instant::now();
    poll("the next Job", Duration::from_secs(600), || async {
        (!env.jobs_named(&next).await.is_empty()).then_some(())
    })
    .await;
    let to_job = failed.elapsed();
    poll(
        "the next runner holding the lock",
        Duration::from_secs(600),
        || async {
            let (_, who) = lock_of(&leases, &suffix).await?;
            (!who.ends_with(&format!("@{pod}"))).then_some(())
        },
    )
    .await;
    (to_job, failed.elapsed())
}

/// Polls `probe` every 20 ms until it answers, for at most `limit`;
/// `what` names what a timeout waited for.
async fn poll<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
