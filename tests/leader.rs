//! Leader election against the real API server (DESIGN "Processes"; ref
//! §6.1): with `--leader-elect`, only the replica holding the Lease
//! `controller-leader-election-captf` reconciles; a standby is ready and
//! takes over when the leader dies (after the lease duration) or stops
//! (at once: it releases the Lease); a leader that finds the Lease taken
//! exits instead of reconciling beside the new holder.

use std::time::{Duration, Instant};

use captf::api::{TerraformMachine, TerraformMachineSpec};
use captf::server::leader::LEASE;
use captf_testkit::controlplane;
use captf_testkit::manager::{Manager, install_crds};
use captf_testkit::scenario::{labels, noop};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");
/// Short enough for a test, with the flags' own proportions.
const LEASE_DURATION: Duration = Duration::from_secs(10);

/// A replica named `pod` in `ns` (its Lease's namespace too).
fn replica(ns: &str, pod: &str) -> Manager {
    let scope = format!("--namespace={ns}");
    Manager::start_with_env(
        controlplane::shared(),
        MANAGER.as_ref(),
        &[
            &scope,
            "--leader-elect",
            "--leader-elect-lease-duration=10s",
            "--leader-elect-renew-deadline=6s",
            "--leader-elect-retry-period=1s",
            "--shutdown-delay=0s",
        ],
        &[("POD_NAME", pod), ("POD_NAMESPACE", ns)],
    )
}

/// The Lease's holder and transitions.
async fn lease(api: &Api<Lease>) -> Option<(String, i32)> {
    let spec = api.get_opt(LEASE).await.unwrap()?.spec?;
    Some((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    ))
}

/// Waits up to `limit` until the Lease is held by `pod`; returns how long
/// it took and the transitions.
async fn held_by(
    api: &Api<Lease>,
    pod: &str,
    limit: Duration,
    logs: &[&Manager],
) -> (Duration, i32) {
    let start = Instant::now();
    loop {
        if let Some((holder, transitions)) = lease(api).await
            && holder.starts_with(&format!("{pod}_"))
        {
            return (start.elapsed(), transitions);
        }
        if start.elapsed() > limit {
            let logs: Vec<String> = logs.iter().map(|m| m.log()).collect();
            panic!(
                "{pod} did not lead within {limit:?}: {:?}\n{}",
                lease(api).await,
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a machine and waits until a reconcile gave it its finalizer.
async fn reconciled(machines: &Api<TerraformMachine>, name: &str, logs: &[&Manager]) {
    let mut m = TerraformMachine::new(
        name,
        TerraformMachineSpec {
            workspace: noop(None),
            ..Default::default()
        },
    );
    m.metadata.labels = labels("c");
    machines.create(&PostParams::default(), &m).await.unwrap();
    let start = Instant::now();
    while machines
        .get(name)
        .await
        .unwrap()
        .metadata
        .finalizers
        .is_none_or(|f| f.is_empty())
    {
        if start.elapsed() > Duration::from_secs(30) {
            let logs: Vec<String> = logs.iter().map(|m| m.log()).collect();
            panic!("{name} was never reconciled:\n{}", logs.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a manager's log says it started the reconcilers.
fn reconciling(manager: &Manager) -> bool {
    manager.log().contains("starting the reconcilers")
}

#[tokio::test]
async fn one_replica_leads_and_a_standby_takes_over() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "leader").await;
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let machines = Api::<TerraformMachine>::namespaced(client.clone(), &ns);

    let mut a = replica(&ns, "a");
    a.wait_ready().await;
    held_by(&leases, "a", Duration::from_secs(30), &[&a]).await;
    let mut b = replica(&ns, "b");
    // A standby serves its webhooks and is ready without watching.
    b.wait_ready().await;
    reconciled(&machines, "m1", &[&a, &b]).await;
    // Longer than the lease duration: a renews, b never takes over.
    let until = Instant::now() + LEASE_DURATION + Duration::from_secs(2);
    while Instant::now() < until {
        let (holder, transitions) = lease(&leases).await.unwrap();
        assert!(holder.starts_with("a_"), "{holder}");
        assert_eq!(transitions, 0);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(reconciling(&a));
    assert!(!reconciling(&b), "a standby reconciles:\n{}", b.log());
    assert!(b.ready());

    // A leader that dies keeps the Lease until it expires; then b leads.
    let killed = Instant::now();
    a.kill();
    let (_, transitions) = held_by(&leases, "b", Duration::from_secs(30), &[&b]).await;
    let took = killed.elapsed();
    assert!(
        took >= LEASE_DURATION - Duration::from_secs(2),
        "b took over after {took:?}"
    );
    assert_eq!(transitions, 1);
    b.wait_ready().await;
    reconciled(&machines, "m2", &[&b]).await;
    println!("took over from a killed leader after {took:?}");

    // A leader that stops releases the Lease: c leads well before it
    // would have expired.
    let mut c = replica(&ns, "c");
    c.wait_ready().await;
    b.stop();
    let stopped = Instant::now();
    assert_eq!(b.exited().map(|s| s.success()), Some(true), "{}", b.log());
    assert!(b.log().contains("released"), "{}", b.log());
    let (after, transitions) = held_by(&leases, "c", Duration::from_secs(30), &[&c]).await;
    assert!(
        after < LEASE_DURATION - Duration::from_secs(2),
        "c took over {after:?} after b stopped"
    );
    assert_eq!(
        transitions, 1,
        "a released Lease is taken, not changed hands"
    );
    reconciled(&machines, "m3", &[&c]).await;
    println!(
        "took over from a stopped leader after {:?}",
        stopped.elapsed()
    );

    // Someone else takes the Lease: c stops leading and exits with an error,
    // leaving the Lease to its new holder.
    leases
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 60}}),
            ),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = c.exited() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "c still runs after losing the Lease:\n{}",
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "{status}");
    let log = c.log();
    assert!(
        log.contains("leader election lost: the Lease is held by intruder"),
        "{log}"
    );
    assert_eq!(lease(&leases).await.unwrap().0, "intruder");
}
