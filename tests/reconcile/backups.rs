//! State backups and restore (book: terraform-state.md "State backups",
//! "Restore").

use super::*;

async fn set_greeting(env: &Env, cluster: &str, greeting: &str) {
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"greeting": greeting}}})),
        )
        .await
        .unwrap();
}

async fn backup_serials(env: &Env, cluster: &str) -> Vec<i64> {
    env.cluster_status(cluster)
        .await
        .and_then(|s| s.state_backups)
        .unwrap_or_default()
        .iter()
        .map(|b| b.serial)
        .collect()
}

#[tokio::test]
async fn each_new_serial_is_backed_up_and_state_backups_zero_takes_none() {
    let mut env = setup(MANAGER, "backups", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let first = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    set_greeting(&env, "c", "two").await;
    let second = applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "three").await;
    let third = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;
    assert!(first < second && second < third);
    let serials = backup_serials(&env, "c").await;
    assert_eq!(
        serials,
        [third as i64, second as i64, first as i64],
        "newest first"
    );
    assert!(!env.events("StateBackedUp").await.is_empty());

    // With --state-backups=0 no new backup is taken and the old ones stay.
    env.restart_manager(&["--state-backups=0"]).await;
    set_greeting(&env, "c", "four").await;
    let status = within(&env, 240, "the fourth apply", || async {
        env.cluster_status("c").await.filter(|s| {
            applied(s)
                && s.last_run
                    .as_ref()
                    .is_some_and(|r| r.job.contains("-apply-a4-"))
                && s.observed_state_serial > Some(third as i64)
        })
    })
    .await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let fourth = status.observed_state_serial.unwrap() as u64;
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    assert!(
        secrets
            .get_opt(&names::backup_secret(&suffix, fourth))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        backup_serials(&env, "c").await,
        [third as i64, second as i64, first as i64]
    );

    // The fourth serial has no backup: a restore would lose it, so none runs.
    ask_restore(&env, "c", second.to_string()).await;
    let status = within(&env, 60, "the restore refused", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "CurrentStateNotBackedUp"))
        })
    })
    .await;
    let message = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "RestoreJobSucceeded")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(&format!("serial {fourth}")), "{message}");
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().contains("-restore-"))
    );
}

#[tokio::test]
async fn state_backups_two_prunes_to_the_newest_two() {
    let env = setup(MANAGER, "prune", &[], &["--state-backups=2"]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let first = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    // A whole set with a high serial, labelled as the object's backup but
    // not owned by it: never listed, never pruned, never restored.
    let forged = forged_backup(&secrets, &names::backup_secret(&suffix, first), 900).await;
    set_greeting(&env, "c", "two").await;
    let second = applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "three").await;
    let third = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;
    let serials = within(&env, 30, "the oldest pruned", || async {
        let s = backup_serials(&env, "c").await;
        (s.len() == 2).then_some(s)
    })
    .await;
    assert_eq!(serials, [third as i64, second as i64]);
    assert!(
        secrets
            .get_opt(&names::backup_secret(&suffix, first))
            .await
            .unwrap()
            .is_none()
    );
    assert!(secrets.get_opt(&forged).await.unwrap().is_some());
    ask_restore(&env, "c", "900").await;
    within(&env, 60, "RestoreBackupNotFound", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "RestoreBackupNotFound"))
        })
    })
    .await;
}

/// Asks for a restore of `serial` (any value: the annotation is free text).
async fn ask_restore(env: &Env, cluster: &str, serial: impl ToString) {
    let annotation =
        json!({"metadata": {"annotations": {"captf.io/restore-state": serial.to_string()}}});
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(cluster, &PatchParams::default(), &Patch::Merge(annotation))
        .await
        .unwrap();
}

/// A copy of the single-Secret backup `of`, as the set of `serial`, whole
/// and consistent, without the owner reference; its name.
async fn forged_backup(secrets: &Api<Secret>, of: &str, serial: u64) -> String {
    let real = secrets.get(of).await.unwrap();
    let mut annotations = real.metadata.annotations.clone().unwrap_or_default();
    let digest = annotations["captf.io/state-backup-digest"].clone();
    annotations.insert("captf.io/state-backup-serial".into(), serial.to_string());
    annotations.insert(
        "captf.io/state-backup-set".into(),
        format!("{serial}-{}", &digest[..12]),
    );
    let suffix = real.labels()["captf.io/state-backup-suffix"].clone();
    let name = names::backup_secret(&suffix, serial);
    let forged = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: real.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        data: real.data.clone(),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &forged)
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn a_corrupt_state_is_never_backed_up() {
    let env = setup(MANAGER, "nobackup", &[], &[]).await;
    Api::<TerraformClusterIdentity>::all(env.client.clone())
        .patch(
            &env.identity,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedNamespaces": {"list": ["elsewhere"]}}})),
        )
        .await
        .unwrap();
    put_state(&env, Kind::Machine, "bad", b"\x1f\x8b\x08\x00garbage").await;
    env.cluster("c", NOOP, None).await;
    env.machine("bad", "c", None).await;
    within(&env, 60, "the corrupt state reported", || async {
        env.machine_status("bad")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("False", "StateCorrupt")))
    })
    .await;
    // The counters move after the status write: wait for them.
    let skipped = within(&env, 30, "the skipped backup counted", || async {
        let metrics = env.manager.metrics().await;
        metrics
            .lines()
            .find(|l| {
                l.starts_with("captf_state_backups_total{")
                    && l.contains("result=\"skipped\"")
                    && l.contains("TerraformMachine")
            })
            .map(str::to_owned)
    })
    .await;
    assert!(skipped.ends_with(" 1"), "{skipped}");
    let backups = Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default().labels("captf.io/state-backup=true"))
        .await
        .unwrap();
    assert!(backups.items.is_empty());
}

/// The value of `captf_state_backups_total` for TerraformClusters and
/// `result`, 0 before the first count.
fn cluster_backups(metrics: &str, result: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("captf_state_backups_total{")
                && l.contains("kind=\"TerraformCluster\"")
                && l.contains(&format!("result=\"{result}\""))
        })
        .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// The serial of the state Secret of `suffix`, read without the manager's
/// reader: gunzip and the document's `serial`.
async fn state_serial(env: &Env, suffix: &str) -> (i64, Vec<u8>) {
    use std::io::Read;
    let secret = env
        .secrets()
        .get(&names::state_secret(suffix))
        .await
        .unwrap();
    let tfstate = secret.data.unwrap()["tfstate"].0.clone();
    let mut document = String::new();
    flate2::read::GzDecoder::new(tfstate.as_slice())
        .read_to_string(&mut document)
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    (doc["serial"].as_i64().unwrap(), tfstate)
}

/// A Job whose per-run Secret is refused is deleted at once and its run
/// lease released: left, its pod would wait for the Secret until the
/// deadline, and no later pass creates the Secret for an active Job. The
/// next start waits 10 s, so the Job's own events do not spin the pass.
#[tokio::test]
async fn a_job_whose_run_secret_is_refused_is_undone_and_started_again() {
    let env = setup(MANAGER, "runsecret", &[], &[]).await;
    let probe = refusal::creating_secret(env.secrets(), "captf-run-probe");
    let refusal = Refusal::install(
        &env.client,
        &env.ns,
        &["CREATE"],
        "secrets",
        "!object.metadata.name.startsWith('captf-run-')",
        probe,
    )
    .await;
    env.cluster("c", NOOP, None).await;
    let refused = |log: &str| {
        log.lines()
            .filter(|l| l.contains("reconcile failed") && l.contains("\"captf-run-"))
            .count()
    };
    within(&env, 60, "a start refused", || async {
        (refused(&env.manager.log()) > 0).then_some(())
    })
    .await;
    let first = refused(&env.manager.log());
    tokio::time::sleep(Duration::from_secs(15)).await;
    let tries = refused(&env.manager.log()) - first;
    assert!(tries <= 3, "{tries} starts in 15 s");
    let left: Vec<String> = env
        .jobs()
        .await
        .iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .map(|j| j.name_any())
        .collect();
    assert_eq!(left, Vec::<String>::new(), "{}", env.context());
    let lease = names::run_lease(&env.suffix(Kind::Cluster, "c"));
    let held = env
        .leases()
        .get_opt(&lease)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity);
    assert_eq!(held, None, "the run lease is still held");

    // Once Secrets may be created, a start goes through and applies.
    refusal.remove().await;
    within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
}

#[tokio::test]
async fn a_refused_backup_copy_is_retried_on_the_next_reconcile() {
    let env = setup(MANAGER, "backup-retry", &[], &["--sync-period=10s"]).await;
    let probe = refusal::creating_secret(env.secrets(), "captf-state-backup-probe");
    let refusal = Refusal::install(
        &env.client,
        &env.ns,
        &["CREATE"],
        "secrets",
        "!object.metadata.name.startsWith('captf-state-backup-')",
        probe,
    )
    .await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let suffix = env.suffix(Kind::Cluster, "c");
    let (serial, tfstate) = state_serial(&env, &suffix).await;
    assert!(serial >= 1);

    // Two passes and more: every copy is refused, nothing of it stays, and
    // the serial stays unobserved.
    let until = tokio::time::Instant::now() + Duration::from_secs(25);
    while tokio::time::Instant::now() < until {
        let names: Vec<String> = env
            .secrets()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.name_any())
            .filter(|n| n.starts_with("captf-state-backup-"))
            .collect();
        assert_eq!(names, Vec::<String>::new(), "no partial set");
        let status = env.cluster_status("c").await.unwrap();
        assert!(applied(&status), "{}", env.context());
        let listed = status.state_backups.unwrap_or_default();
        assert!(listed.is_empty(), "no backup listed: {listed:?}");
        assert_ne!(status.observed_state_serial, Some(serial));
        assert!(
            env.events_about("StateBackedUp", Kind::Cluster, "c")
                .await
                .is_empty()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let metrics = env.manager.metrics().await;
    let skipped = cluster_backups(&metrics, "skipped");
    assert!(skipped >= 2.0, "{metrics}");
    assert_eq!(cluster_backups(&metrics, "taken"), 0.0, "{metrics}");
    println!("refused copies counted as skipped: {skipped}");

    // Once creates go through, a later pass takes the backup.
    refusal.remove().await;
    let status = within(&env, 60, "the backup taken", || async {
        env.cluster_status("c")
            .await
            .filter(|s| s.observed_state_serial == Some(serial))
    })
    .await;
    let backups = status.state_backups.unwrap();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(backups[0].serial, serial);
    let backup = env
        .secrets()
        .get(&names::backup_secret(&suffix, serial as u64))
        .await
        .unwrap();
    assert_eq!(backup.data.unwrap()["tfstate"].0, tfstate);
    assert_eq!(
        env.events_about("StateBackedUp", Kind::Cluster, "c")
            .await
            .len(),
        1
    );
    let metrics = env.manager.metrics().await;
    assert_eq!(cluster_backups(&metrics, "taken"), 1.0, "{metrics}");
}

// ---- Restore (book: terraform-state.md "Restore") ----

#[tokio::test]
async fn a_state_secret_deleted_by_hand_is_restored_from_a_backup() {
    let env = setup(MANAGER, "restore", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let serial = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let before = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    let clusters = Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns);
    // Two more serials, the last from the first inputs again: the oldest
    // backup is restored over newer ones.
    set_greeting(&env, "c", "two").await;
    applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "one").await;
    let newest = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;

    // A serial without a backup: no Job, RestoreBackupNotFound.
    ask_restore(&env, "c", "999").await;
    within(&env, 60, "RestoreBackupNotFound", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "RestoreBackupNotFound"))
        })
    })
    .await;
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().contains("-restore-"))
    );

    // The state Secret is deleted by hand, and the backup restored.
    env.lose_secret(&names::state_secret(&suffix)).await;
    ask_restore(&env, "c", serial.to_string()).await;
    let status = within(&env, 240, "the restore", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("True", "StateRestored"))
                && condition(s, "StateReadable") == Some(("True", "StateRead"))
        })
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(run.job.starts_with("captf-c-c-restore-a1-"), "{}", run.job);
    let steps = steps(&run);
    assert_eq!(steps, ["init", "state-push", "state-list"]);
    within(&env, 30, "the annotation removed", || async {
        let c = clusters.get("c").await.ok()?;
        (!c.annotations().contains_key("captf.io/restore-state")).then_some(())
    })
    .await;
    assert_eq!(env.events("StateRestored").await.len(), 1);
    // Pushed above every serial the object had, so that no serial (and no
    // backup name) stands for two states; and that state is backed up.
    let (restored, _) = state_serial(&env, &suffix).await;
    assert!(restored > newest as i64, "{restored} after {newest}");
    within(&env, 60, "the restored state backed up", || async {
        let serials = backup_serials(&env, "c").await;
        (serials.first() == Some(&restored)).then_some(())
    })
    .await;
    let after = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    assert_eq!(
        after.annotations().get("captf.io/inputs-hash"),
        before.annotations().get("captf.io/inputs-hash")
    );

    // Unchanged inputs over the restored state: nothing to apply.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let applies: Vec<String> = env
        .jobs()
        .await
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.contains("-apply-"))
        .collect();
    assert_eq!(applies.len(), 3, "{applies:?}");
}

/// A backup taken before inputs hashes were recorded (or whose chunk 0
/// lost the annotation) is still adopted once restored: every chunk gets
/// the object's owner reference in the pass that records the restore,
/// before anything else runs over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_without_an_inputs_hash_is_adopted() {
    let env = setup(MANAGER, "restore-nohash", &[], &[]).await;
    let cluster = env
        .cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let serial = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let backup = names::backup_secret(&suffix, serial);
    secrets
        .patch(
            &backup,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"captf.io/inputs-hash": null}}})),
        )
        .await
        .unwrap();
    env.lose_secret(&names::state_secret(&suffix)).await;
    ask_restore(&env, "c", serial.to_string()).await;
    within(&env, 240, "the restore", || async {
        env.cluster_status("c")
            .await
            .filter(|s| condition(s, "RestoreJobSucceeded") == Some(("True", "StateRestored")))
    })
    .await;
    let uid = cluster.uid().unwrap();
    let state = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    assert!(
        state.owner_references().iter().any(|o| o.uid == uid),
        "the restored state is owned by the cluster: {:?}",
        state.owner_references()
    );
    assert!(
        !state.annotations().contains_key("captf.io/inputs-hash"),
        "no inputs hash is claimed for the restored state"
    );
}
