//! What one reconcile pass costs the API server, as the manager counts it:
//! each pass logs `requests=N` at debug level, the requests its client made
//! while the pass ran. An idle pass of an applied object makes none, and a
//! pass that starts an apply a bounded number; a change that adds a read or
//! a write to every pass fails here.

use std::time::Duration;

use captf::api::TerraformMachine;
use captf::names::Kind;
use captf_testkit::manager::metric_total;
use captf_testkit::scenario::{
    NOOP, applied, big_state, condition, many_machines, put_state, setup, vars, within,
};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// The requests of an idle pass of an applied object: none. Everything
/// it reads (its Jobs, durable inputs, backups, state, lock, identity,
/// namespace, the identity's Secret, the mirror, its Cluster API owners)
/// comes from the watches, and an unchanged status is not written.
const IDLE: [(&str, &str, u32); 2] = [("TerraformCluster", "c1", 0), ("TerraformMachine", "m1", 0)];

/// The most requests the pass that starts the first apply makes: its
/// first reads of the data of the state and of the identity's Secret (the
/// bootstrap Secret and, for a machine, the cluster's state too); the
/// mirror (created, or this user added), the runner RBAC (written only
/// when the watches do not show it in place), the run lease and the
/// durable inputs (each created unread), the Job and its per-run Secret;
/// the block-move annotation; the status; and one request for each event
/// (JobCreated; a condition's first setting is none). Which object creates
/// the shared mirror and RBAC first varies, so this is a bound: 14 and 12
/// requests when measured (26 and 30 before the runner RBAC, the leases
/// and the durable inputs were taken from the watches first, and before
/// first settings stopped being events).
const START_AT_MOST: [u32; 2] = [18, 18];

/// The `requests` of each `pass` line the manager logged for `kind`/`name`,
/// in order, with whether the pass started a Job.
fn passes(log: &str, kind: &str, name: &str) -> Vec<(u32, bool)> {
    let mut passes = Vec::new();
    let mut started = false;
    for line in log.lines() {
        let ours = line.contains(&format!("name={name}"));
        if ours && line.contains("started apply Job") {
            started = true;
        }
        if ours && line.contains(&format!("kind={kind}")) && line.contains(" pass ") {
            let requests = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("requests="))
                .and_then(|n| n.parse().ok())
                .expect("a requests field");
            passes.push((requests, std::mem::take(&mut started)));
        }
    }
    passes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_costs_a_fixed_number_of_requests() {
    let env = setup(MANAGER, "requests", &[("K", "v")], &["--sync-period=3s"]).await;
    env.cluster("c1", NOOP, vars(&[("greeting", json!("hi"))]))
        .await;
    env.machine("m1", "c1", None).await;
    within(&env, 240, "both applied", || async {
        let c = env.cluster_status("c1").await.filter(applied)?;
        let m = env.machine_status("m1").await.filter(applied)?;
        Some((c, m))
    })
    .await;
    // Once both show as applied, the passes that settled their Jobs are
    // over, and the one after them writes what the outputs gave: five more
    // passes of each (at --sync-period=3s) end with idle ones.
    let seen = env.manager.log();
    let before = |kind, name| passes(&seen, kind, name).len();
    let (c0, m0) = (
        before("TerraformCluster", "c1"),
        before("TerraformMachine", "m1"),
    );
    let log = within(&env, 60, "five passes after the applies", || async {
        let log = env.manager.log();
        let more = |kind, name, n0| passes(&log, kind, name).len() >= n0 + 5;
        (more("TerraformCluster", "c1", c0) && more("TerraformMachine", "m1", m0)).then_some(log)
    })
    .await;
    for ((kind, name, idle), start_at_most) in IDLE.into_iter().zip(START_AT_MOST) {
        let p = passes(&log, kind, name);
        let start = p.iter().find(|(_, s)| *s).map(|(n, _)| *n);
        let last: Vec<u32> = p.iter().rev().take(3).map(|(n, _)| *n).collect();
        println!("{kind} {name}: every pass {p:?}; start pass {start:?}, idle passes {last:?}");
        assert_eq!(last, [idle; 3], "{kind} {name}: the idle passes");
        assert!(
            start.is_some_and(|n| n <= start_at_most),
            "{kind} {name}: the start pass made {start:?} requests"
        );
    }
}

/// The request budget at rest, pinned at small N (the scale run of `make
/// bench` measures it at 2,000 objects): fifty machines that can never be
/// applied (their identity does not allow the namespace), ten of them with
/// a state written by hand, each reconciled once per --sync-period. Over
/// two resyncs the manager's client makes at most 5 requests in all (a
/// watch that the API server closed and that reopens counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_of_fifty_objects_at_rest_makes_at_most_five_requests() {
    const PERIOD: u64 = 4;
    let period = format!("--sync-period={PERIOD}s");
    let env = setup(MANAGER, "at-rest", &[], &[&period]).await;
    let identity = format!("{}-elsewhere", env.ns);
    env.identity_allowing(&identity, "elsewhere").await;
    many_machines(&env.client, &env.ns, 50, &identity).await;
    for i in 0..10 {
        put_state(
            &env,
            Kind::Machine,
            &format!("m-{i}"),
            &big_state(64 * 1024),
        )
        .await;
    }
    within(
        &env,
        120,
        "every machine refused and its state read",
        || async {
            let listed = env
                .api::<TerraformMachine>()
                .list(&Default::default())
                .await
                .ok()?;
            let refused = |m: &TerraformMachine| {
                m.status.as_ref().is_some_and(|s| {
                    condition(&s.workspace, "IdentityAllowed").is_some_and(|(st, _)| st == "False")
                })
            };
            let read = |m: &TerraformMachine| {
                m.status
                    .as_ref()
                    .and_then(|s| s.workspace.observed_state_serial)
                    == Some(7)
            };
            let with_state = listed.items.iter().filter(|m| read(m)).count();
            (listed.items.len() == 50 && listed.items.iter().all(refused) && with_state == 10)
                .then_some(())
        },
    )
    .await;
    // A resync after the last status write: every object at rest.
    tokio::time::sleep(Duration::from_secs(PERIOD + 1)).await;
    let before = env.manager.metrics().await;
    tokio::time::sleep(Duration::from_secs(2 * PERIOD)).await;
    let after = env.manager.metrics().await;
    let passes = metric_total(&after, "controller_runtime_reconcile_total")
        - metric_total(&before, "controller_runtime_reconcile_total");
    let requests = metric_total(&after, "rest_client_requests_total")
        - metric_total(&before, "rest_client_requests_total");
    println!("{passes} passes, {requests} requests over two resyncs");
    assert!(passes >= 50.0, "only {passes} passes in two resyncs");
    assert!(
        requests <= 5.0,
        "{requests} requests over {passes} passes at rest"
    );
}
