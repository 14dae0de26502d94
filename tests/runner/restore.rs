//! Restore: a backup pushed and listed, a corrupt one refused.

use super::*;

#[tokio::test]
async fn restore_pushes_the_backup_and_lists_it() {
    let object = Object::new("runner-restore").await;
    let vars = json!({"message": "kept", "password": "hunter2-password"});
    run(
        &Pod::new("runner-basic", &basic_root(), &vars),
        &object,
        "apply",
        &[],
    )
    .await
    .assert_ok();
    let before = object.state().await;

    // The backup: the state Secret's gzip payload, in two chunks. Then the
    // state is lost.
    let state_name = captf::names::state_secret(&object.suffix);
    let secret = object.secrets().get(&state_name).await.unwrap();
    let gz = secret.data.unwrap()["tfstate"].0.clone();
    object
        .secrets()
        .delete(&state_name, &DeleteParams::default())
        .await
        .unwrap();

    // A restore root is backend-only.
    let backend_only = json!({"terraform": {"backend": {"kubernetes": {}}}});
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    let restore = pod.root().join("captf/config/restore");
    std::fs::create_dir(&restore).unwrap();
    let (a, b) = gz.split_at(gz.len() / 2);
    std::fs::write(restore.join("0"), a).unwrap();
    std::fs::write(restore.join("1"), b).unwrap();
    let ran = run(
        &pod,
        &object,
        "restore",
        &["--restore-chunks=2", "--restore-resources=1"],
    )
    .await;
    ran.assert_ok();
    assert_eq!(ran.step_names(), ["init", "state-push", "state-list"]);
    assert_eq!(lock_timeout_steps(&ran), ["init", "state-push"]);
    let file = pod.work().join("restore.tfstate");
    assert_eq!(
        ran.args("state-push"),
        [
            "state",
            "push",
            "-force",
            "-lock-timeout=30s",
            &file.display().to_string()
        ]
    );
    assert_eq!(ran.args("state-list"), ["state", "list"]);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        !pod.work().join("root/restore").exists(),
        "the chunks are not copied"
    );
    let after = object.state().await;
    assert_eq!(after["lineage"], before["lineage"]);
    assert_eq!(after["resources"], before["resources"]);

    // A backup said to hold resources must list at least one once pushed.
    let empty = json!({"version": 4, "terraform_version": "1.12.6", "serial": 1,
                       "lineage": "empty-lineage", "outputs": {}, "resources": []});
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, empty.to_string().as_bytes()).unwrap();
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    std::fs::create_dir(pod.root().join("captf/config/restore")).unwrap();
    std::fs::write(
        pod.root().join("captf/config/restore/0"),
        enc.finish().unwrap(),
    )
    .unwrap();
    let ran = run(
        &pod,
        &object,
        "restore",
        &["--restore-chunks=1", "--restore-resources=3"],
    )
    .await;
    assert_eq!(ran.code, Some(1));
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("state-list"))
    );
    assert_eq!(
        error.summary.as_deref(),
        Some("the restored state lists no resource, but the backup had 3")
    );
}

#[tokio::test]
async fn a_corrupt_backup_fails_the_push() {
    let object = Object::new("runner-corrupt").await;
    let backend_only = json!({"terraform": {"backend": {"kubernetes": {}}}});
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    std::fs::create_dir(pod.root().join("captf/config/restore")).unwrap();
    std::fs::write(pod.root().join("captf/config/restore/0"), b"not gzip").unwrap();
    let ran = run(&pod, &object, "restore", &["--restore-chunks=1"]).await;
    assert_eq!(ran.code, Some(1));
    assert!(ran.result.steps.is_empty());
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("state-push"))
    );
    assert!(
        error
            .summary
            .unwrap()
            .starts_with("the backup is not a valid gzip stream")
    );
}
