//! A failing module, preflight failures of the image's layout, and usage
//! errors.

use super::*;

#[tokio::test]
async fn a_failing_module_reports_a_redacted_summary() {
    let object = Object::new("runner-fail").await;
    let credential = "cr3dential-value";
    let password = "p4ssw0rd-value";
    let pod = Pod::new(
        "runner-fail",
        &root_module(&[("password", true)], &[]),
        &json!({"password": password}),
    );
    pod.credential("CAPTF_TEST_CREDENTIAL", &format!("{credential}\n"));
    let mut cmd = pod.runner(&object, "apply", &[]);
    cmd.env("CAPTF_TEST_CREDENTIAL", credential);
    let out = cmd.output().await.unwrap();
    let logs = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{logs}");
    let result = pod.result();
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Step);
    assert_eq!(error.step.as_deref(), Some("apply"));
    let summary = error.summary.unwrap();
    assert!(
        summary.contains("Error: credential (sensitive) and password (sensitive)"),
        "{summary}\n{logs}"
    );
    assert!(summary.len() <= 512);
    assert_eq!(result.steps.last().unwrap().exit_code, 1);
    // The runtime's own output, passed through, is redacted too.
    assert!(logs.contains("(sensitive)"), "{logs}");
    assert!(
        !logs.contains(credential) && !logs.contains(password),
        "{logs}"
    );
}

#[tokio::test]
async fn preflight_failures_are_image_layout() {
    let object = Object::new("runner-layout").await;
    let main = basic_root();

    let no_module = Pod::new("runner-basic", &main, &json!({}));
    let module = no_module.root().join("captf/module");
    std::fs::remove_dir_all(&module).unwrap();
    std::fs::create_dir_all(module.join("nested.tf")).unwrap();
    std::fs::write(module.join("README.md"), "no configuration here").unwrap();

    let no_runtime = Pod::new("runner-basic", &main, &json!({}));
    let runtime = no_runtime.root().join("captf/runtime");
    std::fs::remove_file(&runtime).unwrap();
    std::fs::write(&runtime, "#!/bin/sh\n").unwrap();

    for (pod, want) in [
        (
            &no_module,
            "has no .tf, .tf.json, .tofu or .tofu.json file at its top level",
        ),
        (&no_runtime, "is not an executable file"),
    ] {
        let ran = run(pod, &object, "apply", &[]).await;
        assert_eq!(ran.code, Some(1));
        let error = ran.result.error.unwrap();
        assert_eq!(error.kind, RunErrorKind::ImageLayout);
        assert!(
            error.summary.as_deref().unwrap().contains(want),
            "{error:?}"
        );
        assert!(ran.result.steps.is_empty());
        assert_eq!(
            ran.result.job.as_deref(),
            Some("captf-m-test-apply-a1-abcdef")
        );
        assert!(!pod.work().join("root").exists(), "nothing ran");
    }
}

#[tokio::test]
async fn usage_errors_exit_2() {
    for args in [
        &["run"][..],
        &["run", "--op=upgrade"],
        &["run", "--op=apply", "--lock-timeout=5"],
        &["run", "--op=restore"],
        &["run", "--op=apply", "stray"],
        &["frobnicate"],
    ] {
        let out = tokio::process::Command::new(RUNNER)
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
