//! What holds a deletion and its ways out: a failing destroy, machines still
//! there, a gone cluster, a corrupt or lost state, a stale lock.

use super::*;

#[tokio::test]
async fn a_destroy_that_fails_twice_then_succeeds_keeps_the_state_until_it_does() {
    let env = setup(MANAGER, "del-retry", &[], &[]).await;
    // The module's destroy fails while this file exists.
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    applied_pair(
        &env,
        vars(&[("destroy_gate", json!(gate.to_str().unwrap()))]),
    )
    .await;
    let suffix = env.suffix(Kind::Machine, "m");
    let statuses = Statuses::watch::<TerraformMachine>(&env, "m");
    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformMachine>("m").await;

    let mut failed = Vec::new();
    for attempt in 1..=2 {
        let what = format!("destroy attempt {attempt} failed");
        let job = within(&env, 240, &what, || async {
            // Meanwhile nothing is cleaned up.
            assert!(
                !env.state_secrets(&suffix).await.is_empty(),
                "the state went before a destroy succeeded{}",
                env.context()
            );
            assert!(
                !env.gone::<TerraformMachine>("m").await,
                "the machine went before a destroy succeeded{}",
                env.context()
            );
            let status = env.machine_status("m").await?;
            let run = status.last_run.as_ref()?;
            let failed = condition(&status, "ApplyJobSucceeded")
                == Some(("False", "DestroyFailed"))
                && run
                    .job
                    .starts_with(&format!("captf-m-m-destroy-a{attempt}-"));
            if !failed {
                return None;
            }
            env.jobs_named(&run.job).await.into_iter().find(job_failed)
        })
        .await;
        failed.push(job);
    }
    // The retry came after the one-minute backoff.
    let first_failed = failed_at(&failed[0]).unwrap();
    let second_started = failed[1].metadata.creation_timestamp.clone().unwrap().0;
    let waited = second_started.duration_since(first_failed).as_secs();
    assert!(
        waited >= 55,
        "the second destroy started {waited}s after the first failed"
    );
    within(&env, 30, "a JobFailed event per failed destroy", || async {
        (happened(&env, "JobFailed", Kind::Machine, "m").await >= 2).then_some(())
    })
    .await;
    assert_eq!(happened(&env, "JobFailed", Kind::Machine, "m").await, 2);
    let first = env
        .events_about("JobFailed", Kind::Machine, "m")
        .await
        .remove(0);
    let note = first.note.unwrap_or_default();
    assert!(
        note.starts_with(&format!("destroy Job {} failed", failed[0].name_any())),
        "{note}"
    );

    // Once the module lets it, the third (after two minutes) succeeds.
    std::fs::remove_file(&gate).unwrap();
    let third = within(&env, 240, "the third destroy Job", || async {
        assert!(
            !env.state_secrets(&suffix).await.is_empty(),
            "the state went before a destroy succeeded{}",
            env.context()
        );
        env.jobs_named("captf-m-m-destroy-a3-")
            .await
            .into_iter()
            .next()
    })
    .await;
    let second_failed = failed_at(&failed[1]).unwrap();
    let waited = third
        .metadata
        .creation_timestamp
        .clone()
        .unwrap()
        .0
        .duration_since(second_failed)
        .as_secs();
    assert!(
        waited >= 115,
        "the third destroy started {waited}s after the second failed"
    );
    env.wait_gone::<TerraformMachine>(240, "m").await;
    within(&env, 10, "the watch saw the deletion", || async {
        statuses.deleted().then_some(())
    })
    .await;
    assert_eq!(jobs.destroys(Kind::Machine, "m").len(), 3);
    let runs = statuses.runs("-destroy-");
    let errors: Vec<bool> = runs.iter().map(|r| r.error.is_some()).collect();
    assert_eq!(errors, [true, true, false], "{runs:?}");
    let last = statuses.last().unwrap();
    assert_eq!(
        condition(&last, "ApplyJobSucceeded"),
        Some(("True", "DestroySucceeded"))
    );
    once(&env, "Destroyed", Kind::Machine, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}

#[tokio::test]
async fn a_cluster_deleted_before_its_machines_waits_for_them() {
    let env = setup(MANAGER, "del-order", &[], &[]).await;
    applied_pair(&env, None).await;
    let write_lease = names::cluster_write_lease(&env.ns, "c");
    assert!(
        env.leases().get_opt(&write_lease).await.unwrap().is_some(),
        "the cluster's apply took its write lease"
    );

    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformCluster>("c").await;
    let status = within(&env, 20, "the cluster's deletion blocked", || async {
        env.cluster_status("c")
            .await
            .filter(|s| condition(s, "DeletionBlocked") == Some(("True", "DependentsExist")))
    })
    .await;
    assert_eq!(condition(&status, "Deleting").map(|(s, _)| s), Some("True"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        env.jobs_named("captf-c-c-destroy-").await.is_empty(),
        "the cluster's destroy started before its machine's"
    );

    env.delete::<TerraformMachine>("m").await;
    within(&env, 240, "the machine gone", || async {
        // Jobs first: a cluster destroy seen before the machine still
        // exists ran beside it.
        let cluster_destroy = !env.jobs_named("captf-c-c-destroy-").await.is_empty();
        let gone = env.gone::<TerraformMachine>("m").await;
        assert!(
            !cluster_destroy || gone,
            "the cluster's destroy started while its machine existed{}",
            env.context()
        );
        gone.then_some(())
    })
    .await;
    env.wait_gone::<TerraformCluster>(240, "c").await;
    assert_eq!(jobs.destroys(Kind::Machine, "m").len(), 1);
    let cluster_destroys = jobs.destroys(Kind::Cluster, "c");
    assert_eq!(cluster_destroys.len(), 1, "{cluster_destroys:?}");
    // Creation times are whole seconds.
    let machine_done = once(&env, "FinalizerRemoved", Kind::Machine, "m").await;
    let machine_done = machine_done.event_time.unwrap().0;
    assert!(
        cluster_destroys[0].1 > machine_done - SignedDuration::from_secs(1),
        "the cluster's destroy was created at {}, before the machine went at {machine_done}",
        cluster_destroys[0].1
    );
    once(&env, "Destroyed", Kind::Cluster, "c").await;
    cleaned_up(&env, Kind::Cluster, "c").await;
    assert!(
        env.leases().get_opt(&write_lease).await.unwrap().is_none(),
        "{write_lease} is left"
    );
}

/// A machine whose cluster went without it (its finalizer removed by hand)
/// has no identity to resolve any more: its destroy uses the one its apply
/// recorded in the durable inputs (ref §8.6).
#[tokio::test]
async fn a_machine_whose_cluster_is_gone_destroys_with_its_recorded_identity() {
    let env = setup(MANAGER, "del-orphan", &[], &[]).await;
    applied_pair(&env, None).await;
    let inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Machine, "m"))
        .await
        .unwrap();
    assert_eq!(
        inputs.annotations().get("captf.io/identity"),
        Some(&env.identity),
        "the apply recorded its identity"
    );
    let clusters = env.api::<TerraformCluster>();
    clusters
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    env.delete::<TerraformCluster>("c").await;
    env.wait_gone::<TerraformCluster>(30, "c").await;

    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformMachine>("m").await;
    env.wait_gone::<TerraformMachine>(240, "m").await;
    let destroyed = jobs.destroys(Kind::Machine, "m");
    assert_eq!(destroyed.len(), 1, "{destroyed:?}");
    once(&env, "Destroyed", Kind::Machine, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}

#[tokio::test]
async fn a_corrupt_state_at_deletion_holds_until_restored_then_destroys() {
    let env = setup(MANAGER, "del-corrupt", &[], &[]).await;
    applied_pair(&env, None).await;
    let state = names::state_secret(&env.suffix(Kind::Machine, "m"));
    let garbage = json!({"data": {"tfstate": ByteString(b"\x1f\x8b\x08\x00garbage".to_vec())}});
    env.secrets()
        .patch(&state, &PatchParams::default(), &Patch::Merge(&garbage))
        .await
        .unwrap();
    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformMachine>("m").await;

    held(&env, "StateCorrupt").await;
    let backup = newest_backup(&env).await;
    nothing_destroyed(&env, &backup).await;
    assert!(env.secrets().get_opt(&state).await.unwrap().is_some());

    // A restore by hand: the newest backup's bytes back into the state.
    let saved = env
        .secrets()
        .get(&backup)
        .await
        .unwrap()
        .data
        .unwrap()
        .remove("tfstate")
        .unwrap();
    let restore = json!({"data": {"tfstate": saved}});
    env.secrets()
        .patch(&state, &PatchParams::default(), &Patch::Merge(&restore))
        .await
        .unwrap();
    env.wait_gone::<TerraformMachine>(240, "m").await;
    assert_eq!(jobs.destroys(Kind::Machine, "m").len(), 1);
    once(&env, "Destroyed", Kind::Machine, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}

#[tokio::test]
async fn a_lost_state_at_deletion_holds_until_abandoned() {
    let env = setup(MANAGER, "del-lost", &[], &[]).await;
    let machine = applied_pair(&env, None).await;
    for chunk in env.state_secrets(&env.suffix(Kind::Machine, "m")).await {
        env.lose_secret(&chunk).await;
    }
    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformMachine>("m").await;

    held(&env, "StateLost").await;
    let backup = newest_backup(&env).await;
    nothing_destroyed(&env, &backup).await;

    // Only the object's own uid releases it.
    let abandon = |uid: &str| json!({"metadata": {"annotations": {ABANDON: uid}}});
    let machines = env.api::<TerraformMachine>();
    machines
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(abandon("00000000-0000-0000-0000-000000000000")),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let status = env
        .machine_status("m")
        .await
        .expect("the machine is still there");
    assert_eq!(
        condition(&status, "Deleting"),
        Some(("True", "DeletionHeld"))
    );
    assert!(env.events("InfrastructureAbandoned").await.is_empty());

    machines
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(abandon(machine.meta().uid.as_deref().unwrap())),
        )
        .await
        .unwrap();
    env.wait_gone::<TerraformMachine>(60, "m").await;
    assert_eq!(jobs.destroys(Kind::Machine, "m"), []);
    assert!(env.jobs_named("captf-m-m-destroy-").await.is_empty());
    let event = once(&env, "InfrastructureAbandoned", Kind::Machine, "m").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    once(&env, "FinalizerRemoved", Kind::Machine, "m").await;
    assert!(
        env.events_about("Destroyed", Kind::Machine, "m")
            .await
            .is_empty()
    );
    cleaned_up(&env, Kind::Machine, "m").await;
}

#[tokio::test]
async fn a_stale_lock_at_deletion_is_force_unlocked_by_the_destroy() {
    let env = setup(MANAGER, "del-lock", &[], &[]).await;
    applied_pair(&env, None).await;
    // Held by one of the machine's own runner pods, which does not exist.
    put_lock(&env, "m", "runner@captf-m-m-apply-a9-abcdef-zzzzz").await;
    let statuses = Statuses::watch::<TerraformMachine>(&env, "m");
    env.delete::<TerraformMachine>("m").await;

    let job = within(&env, 240, "the destroy Job", || async {
        env.jobs_named("captf-m-m-destroy-")
            .await
            .into_iter()
            .next()
    })
    .await;
    let containers = job.spec.unwrap().template.spec.unwrap().containers;
    let source = containers
        .iter()
        .find(|c| c.name == "source")
        .expect("a source container");
    assert!(
        source
            .args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--force-unlock")),
        "{:?}",
        source.args
    );

    env.wait_gone::<TerraformMachine>(240, "m").await;
    within(&env, 10, "the watch saw the deletion", || async {
        statuses.deleted().then_some(())
    })
    .await;
    let runs = statuses.runs("-destroy-");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(steps(&runs[0]), ["init", "force-unlock", "destroy"]);
    assert!(runs[0].error.is_none(), "{runs:?}");
    once(&env, "ForceUnlocked", Kind::Machine, "m").await;
    once(&env, "Destroyed", Kind::Machine, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}
