//! SIGTERM forwarded to the runtime, and a runtime that ignores it killed
//! after the stop timeout.

use super::*;

/// Reads the runner's standard output until a line contains `needle`.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    needle: &str,
) {
    let found = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no line with {needle:?}");
}

#[tokio::test]
async fn sigterm_is_forwarded_to_the_runtime_and_reported_interrupted() {
    let object = Object::new("runner-sigterm").await;
    let root = root_module(
        &[("sleep_seconds", false), ("message", false)],
        &["message"],
    );
    let pod = Pod::new(
        "slow-noop",
        &root,
        &json!({"sleep_seconds": 300, "message": "slow"}),
    );
    // A stop timeout shorter than the wait below, so that a runtime that
    // does not stop shows as killed rather than as a hung test.
    let mut child = pod
        .runner(&object, "apply", &["--stop-timeout=60s"])
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut BufReader::new(stderr), &mut text)
            .await
            .unwrap();
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for_line(&mut lines, "(local-exec): Executing:").await;
    // The provisioner's command is starting; a stop request that arrives
    // before it runs is not what this test is about.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("the runner stops within its stop timeout")
        .unwrap();
    drain.await.unwrap();
    let stderr = stderr.await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}: {stderr}");

    let result = pod.result();
    let names: Vec<&str> = result.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["init", "validate", "apply"]);
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Interrupted);
    assert_eq!(error.step.as_deref(), Some("apply"));
    let summary = error.summary.unwrap();
    assert!(
        summary.starts_with(
            "SIGTERM received during apply and forwarded to the runtime, which exited "
        ),
        "{summary}"
    );
    // The runtime stopped on its own terms: it released the state lock.
    let lease = object
        .leases()
        .get(&captf::names::state_lock_lease(&object.suffix))
        .await
        .unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "the lock is still held by {holder}");
}

#[tokio::test]
async fn a_runtime_that_ignores_sigterm_is_killed_after_the_stop_timeout() {
    let object = Object::new("runner-sigkill").await;
    let pod = Pod::new("runner-basic", &basic_root(), &json!({}));
    // A hung runtime: it answers `version` and then ignores SIGTERM in its
    // first step. `exec` keeps the ignored disposition, so SIGKILL is what
    // ends the sleep.
    let runtime = pod.root().join("captf/runtime");
    std::fs::remove_file(&runtime).unwrap();
    std::fs::write(
        &runtime,
        "#!/bin/sh\n\
         if [ \"$1\" = version ]; then echo '{\"terraform_version\":\"0.0.0\"}'; exit 0; fi\n\
         trap '' TERM\n\
         echo started\n\
         exec sleep 300\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut cmd = pod.runner(&object, "apply", &["--stop-timeout=2s"]);
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for_line(&mut lines, "started").await;

    let started = Instant::now();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(status.code(), Some(1));
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(30),
        "{took:?}"
    );

    let result = pod.result();
    assert_eq!(result.runtime_version.as_deref(), Some("0.0.0"));
    let init = &result.steps[0];
    assert_eq!((init.name.as_str(), init.exit_code), ("init", 137));
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Interrupted);
    assert_eq!(
        error.summary.as_deref(),
        Some(
            "SIGTERM received during init and forwarded to the runtime, which did not stop within 2s and was killed"
        )
    );
}
