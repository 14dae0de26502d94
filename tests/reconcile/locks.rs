//! Stale state locks (book: state-lock-and-stale-locks.md).

use super::*;

/// The state lock Lease of a machine: its holder identity, and the `Who`
/// and `Operation` of its lock info.
async fn lock_holder(env: &Env, machine: &str) -> Option<(String, String, String)> {
    let suffix = names::suffix(&env.ns, Kind::Machine, machine);
    let lease = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
        .get_opt(&names::state_lock_lease(&suffix))
        .await
        .ok()??;
    let holder = lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())?;
    let info: serde_json::Value =
        serde_json::from_str(lease.annotations().get("app.terraform.io/lock-info")?).ok()?;
    Some((
        holder,
        info["Who"].as_str()?.to_string(),
        info["Operation"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Waits until the machine's apply holds the state lock; returns its
/// `Who`. The apply's lock, not init's: init takes the lock briefly too,
/// and a runner killed after init let go leaves no lock behind.
async fn apply_lock_holder(env: &Env, machine: &str) -> String {
    within(env, 240, "the apply holding the state lock", || async {
        lock_holder(env, machine)
            .await
            .filter(|(_, _, operation)| operation == "OperationTypeApply")
            .map(|(_, who, _)| who)
    })
    .await
}

async fn machine_jobs(env: &Env, machine: &str) -> Vec<Job> {
    let prefix = format!("captf-m-{machine}-");
    env.jobs()
        .await
        .into_iter()
        .filter(|j| j.name_any().starts_with(&prefix))
        .collect()
}

/// Starts a slow machine apply and kills its runner mid-apply (reported
/// OOMKilled), so that the runner's pod ends while its lock is held.
/// Returns the pod's name.
async fn kill_mid_apply(env: &Env, machine: &str) -> String {
    env.cluster("c", NOOP, None).await;
    env.machine(machine, "c", vars(&[("sleep_seconds", json!(60))]))
        .await;
    let who = apply_lock_holder(env, machine).await;
    let pod = who.rsplit('@').next().unwrap().to_string();
    assert!(
        names::is_own_runner_pod(Kind::Machine, machine, &pod),
        "{who}"
    );
    // The retry need not be slow.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 0}}})),
        )
        .await
        .unwrap();
    assert!(
        env.executor.kill_oom(&env.ns, &pod),
        "the runner of {pod} was not running"
    );
    within(env, 60, "the killed Job failed", || async {
        machine_jobs(env, machine)
            .await
            .into_iter()
            .find(job_failed)
    })
    .await;
    assert!(
        lock_holder(env, machine).await.is_some(),
        "the killed runner's lock is still held"
    );
    pod
}

/// After the kill, the next Job force-unlocks and applies.
async fn next_job_force_unlocks(env: &Env, machine: &str) {
    let status = within(env, 240, "the retry applied", || async {
        env.machine_status(machine).await.filter(applied)
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(
        run.job.starts_with(&format!("captf-m-{machine}-apply-a2-")),
        "{}",
        run.job
    );
    let steps = steps(&run);
    assert_eq!(steps, ["init", "force-unlock", "validate", "apply"]);
    let events = env.events("ForceUnlocked").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        events[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&run.job)),
        "{:?}",
        events[0].note
    );
    assert_eq!(lock_holder(env, machine).await, None);
    let metrics = env.manager.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "captf_lock_force_unlocks_total{kind=\"TerraformMachine\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("force_unlock"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn an_oom_killed_runner_leaves_a_stale_lock_that_the_next_job_force_unlocks() {
    let env = setup(MANAGER, "oomlock", &[], &[]).await;
    kill_mid_apply(&env, "m").await;
    next_job_force_unlocks(&env, "m").await;
}

#[tokio::test]
async fn a_runner_pod_deleted_outright_leaves_a_stale_lock_that_the_next_job_force_unlocks() {
    let env = setup(MANAGER, "gonelock", &[], &[]).await;
    let pod = kill_mid_apply(&env, "m").await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns);
    pods.delete(
        &pod,
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    within(&env, 30, "the pod gone", || async {
        pods.get_opt(&pod).await.unwrap().is_none().then_some(())
    })
    .await;
    next_job_force_unlocks(&env, "m").await;
}

/// An init cut off between taking the lock and creating the empty state
/// (an API server restart did it in CI) leaves a lock and no state: init
/// cannot run while it is held, and force-unlock needs init. The Job that
/// was given the stale lock releases it itself and runs init again.
#[tokio::test]
async fn a_stale_lock_with_no_state_yet_is_released_by_the_next_job() {
    let env = setup(MANAGER, "initlock", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    // One of the machine's own runner pods, which does not exist.
    put_lock(&env, "m", "runner@captf-m-m-apply-a1-abc123-x7k2p").await;
    env.machine("m", "c", None).await;
    let status = within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let run = status.last_run.unwrap();
    let steps = steps(&run);
    assert_eq!(steps, ["init", "init", "force-unlock", "validate", "apply"]);
    assert_eq!(env.events("ForceUnlocked").await.len(), 1);
    assert_eq!(lock_holder(&env, "m").await, None);
}

#[tokio::test]
async fn a_terminating_runner_pod_keeps_its_lock_until_it_is_gone() {
    let env = setup(MANAGER, "termlock", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    let jobs = captf::api::JobPolicy {
        lock_timeout_seconds: Some(3),
        ..Default::default()
    };
    env.create_machine(
        "m",
        "c",
        WorkspaceSpec {
            jobs: Some(jobs),
            ..noop(vars(&[("sleep_seconds", json!(60))]))
        },
    )
    .await;
    let who = apply_lock_holder(&env, "m").await;
    let pod = who.rsplit('@').next().unwrap().to_string();
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 0}}})),
        )
        .await
        .unwrap();
    // The runner dies hard and its pod stays terminating. The deletion goes
    // first: a pod whose runner ended before it was deleted has exited, and
    // its lock is rightly stale. The kill follows at once, before the
    // executor passes the deletion's SIGTERM on (a runtime stopped that way
    // would release its lock).
    env.executor.hold_terminating(&env.ns, &pod, true);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns);
    pods.delete(&pod, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    assert!(env.executor.kill_oom(&env.ns, &pod));
    // The retry (after the 1m backoff) must not force-unlock: it waits 3 s
    // for the lock and fails.
    let retry = within(&env, 180, "the retry failed on the lock", || async {
        let status = env.machine_status("m").await?;
        let run = status.last_run?;
        (run.job.contains("-apply-a2-") && run.error.is_some()).then_some(run)
    })
    .await;
    assert!(
        !retry
            .steps
            .iter()
            .flatten()
            .any(|s| s.name == "force-unlock"),
        "{retry:?}"
    );
    assert!(env.events("ForceUnlocked").await.is_empty());
    assert!(
        pods.get_opt(&pod)
            .await
            .unwrap()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    );
    assert!(lock_holder(&env, "m").await.is_some());
    // Once the pod is gone the lock is stale, and the next Job frees it.
    env.executor.hold_terminating(&env.ns, &pod, false);
    within(&env, 60, "the pod gone", || async {
        pods.get_opt(&pod).await.unwrap().is_none().then_some(())
    })
    .await;
    let status = within(&env, 300, "the third attempt applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(run.job.contains("-apply-a3-"), "{}", run.job);
    assert!(run.steps.iter().flatten().any(|s| s.name == "force-unlock"));
    assert_eq!(env.events("ForceUnlocked").await.len(), 1);
}

#[tokio::test]
async fn foreign_locks_are_reported_and_never_unlocked() {
    let env = setup(MANAGER, "foreignlock", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    // Each machine's lock is held by something that is not one of its own
    // runner pods.
    let holders = [
        ("alice", "alice@laptop"),
        // A pod of the object "foo-apply", whose name begins like foo's.
        ("foo", "runner@captf-m-foo-apply-apply-a1-abc123-x7k2p"),
        // This object's prefix, but not the whole pattern (no pod suffix).
        ("bar", "runner@captf-m-bar-apply-a1-abc123"),
        // No @ at all.
        ("baz", "captf-m-baz-apply-a1-abc123-x7k2p"),
    ];
    let mut leases = Vec::new();
    for (machine, who) in holders {
        leases.push(put_lock(&env, machine, who).await);
        let jobs = captf::api::JobPolicy {
            lock_timeout_seconds: Some(2),
            ..Default::default()
        };
        env.create_machine(
            machine,
            "c",
            WorkspaceSpec {
                jobs: Some(jobs),
                ..noop(None)
            },
        )
        .await;
    }
    for ((machine, who), lease) in holders.iter().zip(&leases) {
        // Jobs keep starting; each waits for the lock and fails.
        let status = within(
            &env,
            240,
            "a Job failed on the lock, reported StateLocked",
            || async {
                env.machine_status(machine).await.filter(|s| {
                    condition(s, "StateReadable") == Some(("False", "StateLocked"))
                        && condition(s, "ApplyJobSucceeded") == Some(("False", "ApplyFailed"))
                })
            },
        )
        .await;
        let message = &status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "StateReadable")
            .unwrap()
            .message;
        assert!(
            message.contains(who)
                && message.contains("OperationTypeApply")
                && message.contains("2026-12-02T10:00:00"),
            "{message}"
        );
        let steps = steps(status.last_run.as_ref().unwrap());
        assert!(!steps.contains(&"force-unlock"), "{machine}: {steps:?}");
        // The Lease is exactly as written: never unlocked.
        let now = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
            .get(&lease.name_any())
            .await
            .unwrap();
        assert_eq!(
            now.metadata.resource_version, lease.metadata.resource_version,
            "{machine}'s lock was touched"
        );
    }
    assert!(env.events("ForceUnlocked").await.is_empty());
    let locked = env.events("StateLocked").await;
    assert_eq!(
        locked.len(),
        holders.len(),
        "one StateLocked event per object"
    );
}
