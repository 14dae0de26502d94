//! Force-unlocking a state: unlocked already, held by another holder, or
//! left by an init that never created the state.

use super::*;

#[tokio::test]
async fn force_unlock_of_an_unlocked_state_succeeds() {
    let object = Object::new("runner-unlock").await;
    let vars = json!({"message": "first", "password": "hunter2-password"});
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    run(&pod, &object, "apply", &[]).await.assert_ok();

    // The lock's Lease exists and is free: the stale lock is gone already.
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(&pod, &object, "apply", &["--force-unlock=6c4a1e22-stale"]).await;
    ran.assert_ok();
    assert_eq!(
        ran.step_names(),
        ["init", "force-unlock", "validate", "apply"]
    );
    assert_eq!(
        ran.args("force-unlock"),
        ["force-unlock", "-force", "6c4a1e22-stale"]
    );
    assert_eq!(ran.exit_code("force-unlock"), 1);
    assert!(
        ran.stderr.contains(
            "step force-unlock exited 1 and counts as succeeded: the state is already unlocked"
        ),
        "{}",
        ran.stderr
    );
}

#[tokio::test]
async fn force_unlock_of_a_lock_held_by_another_holder_is_not_an_error() {
    let object = Object::new("runner-relocked").await;
    let vars = json!({"message": "first", "password": "hunter2-password"});
    run(
        &Pod::new("runner-basic", &basic_root(), &vars),
        &object,
        "apply",
        &[],
    )
    .await
    .assert_ok();

    // Someone else holds the lock now, under another ID.
    let name = captf::names::state_lock_lease(&object.suffix);
    let mut lease = object.leases().get(&name).await.unwrap();
    let info = json!({"ID": "other-holder-id", "Operation": "OperationTypeApply", "Info": "",
                      "Who": "someone@elsewhere", "Version": "1.12.6", "Created": "2026-01-01T00:00:00Z",
                      "Path": ""});
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("app.terraform.io/lock-info".into(), info.to_string());
    lease.spec.get_or_insert_default().holder_identity = Some("other-holder-id".into());
    object
        .leases()
        .replace(&name, &PostParams::default(), &lease)
        .await
        .unwrap();

    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(
        &pod,
        &object,
        "destroy",
        &["--force-unlock=6c4a1e22-stale", "--lock-timeout=1s"],
    )
    .await;
    assert_eq!(
        ran.step_names(),
        ["init", "force-unlock", "destroy"],
        "{}",
        ran.stderr
    );
    assert!(
        ran.stderr.contains("step force-unlock exited 1 and counts as succeeded: the lock is now held under another ID"),
        "{}",
        ran.stderr
    );
    // The other holder's lock is left alone: destroy waits for it, then fails.
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("destroy"))
    );
    assert!(
        error
            .summary
            .unwrap()
            .contains("Error acquiring the state lock")
    );
    let lease = object.leases().get(&name).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("other-holder-id")
    );
}

/// The lock an init leaves when it is cut off between taking the lock and
/// creating the empty state (an API server restart did it in CI): the Lease
/// is held and there is no state Secret.
async fn lock_without_state(object: &Object, id: &str) -> String {
    let name = captf::names::state_lock_lease(&object.suffix);
    let info = json!({"ID": id, "Operation": "init", "Info": "",
                      "Who": "runner@captf-m-test-apply-1-abcde", "Version": "1.12.6",
                      "Created": "2026-01-01T00:00:00Z", "Path": ""});
    let mut lease = Lease::default();
    lease.metadata.name = Some(name.clone());
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("app.terraform.io/lock-info".into(), info.to_string());
    lease.spec.get_or_insert_default().holder_identity = Some(id.into());
    object
        .leases()
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    assert!(
        object
            .secrets()
            .get_opt(&captf::names::state_secret(&object.suffix))
            .await
            .unwrap()
            .is_none()
    );
    name
}

#[tokio::test]
async fn a_stale_lock_left_by_an_interrupted_init_is_released_and_init_runs_again() {
    let object = Object::new("runner-initlock").await;
    let name = lock_without_state(&object, "stale-init-id").await;

    let vars = json!({"message": "first", "password": "hunter2-password"});
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(&pod, &object, "apply", &["--force-unlock=stale-init-id"]).await;
    ran.assert_ok();
    assert_eq!(
        ran.step_names(),
        ["init", "init", "force-unlock", "validate", "apply"]
    );
    assert_eq!(ran.exit_code("init"), 1, "the first init fails on the lock");
    assert!(
        ran.stderr.contains(&format!(
            "init failed while Lease {name} was held under the stale lock stale-init-id: released it, and init runs again"
        )),
        "{}",
        ran.stderr
    );
    assert!(object.state().await["serial"].as_u64().is_some());
    let lease = object.leases().get(&name).await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity, None);
}

#[tokio::test]
async fn an_init_lock_under_another_id_is_left_alone() {
    let object = Object::new("runner-initother").await;
    let name = lock_without_state(&object, "someone-elses-id").await;

    let vars = json!({"message": "first", "password": "hunter2-password"});
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(&pod, &object, "apply", &["--force-unlock=stale-init-id"]).await;
    assert_eq!(ran.step_names(), ["init"], "{}", ran.stderr);
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("init"))
    );
    assert!(!ran.stderr.contains("released it"), "{}", ran.stderr);
    let lease = object.leases().get(&name).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("someone-elses-id")
    );
}
