//! The credentials, the image's environment and the accounts Jobs run
//! under: what reaches tofu, what a runner may read, and override accounts.

use super::*;

#[tokio::test]
async fn credentials_and_image_environment_never_steer_tofu() {
    let poison = [
        ("TF_WORKSPACE", "poisoned"),
        ("TF_VAR_greeting", "poisoned"),
        ("TF_CLI_ARGS", "-no-such-flag"),
        ("KUBE_CONFIG_PATH", "/nonexistent"),
        ("SAFE_VALUE", "kept"),
    ];
    let env = setup(MANAGER, "env", &poison, &[]).await;
    env.cluster("c", POISONED, vars(&[("dump_env", json!(true))]))
        .await;
    let status = within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let job = status.last_run.unwrap().job;
    let pod = within(&env, 30, "the Job's pod", || async {
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns)
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
            .await
            .ok()?;
        pods.items.into_iter().next().map(|p| p.name_any())
    })
    .await;
    let seen = std::fs::read_to_string(
        env.executor
            .pod_dir(&env.ns, &pod)
            .join("captf/work/root/seen-env"),
    )
    .expect("the module's environment dump");
    for name in [
        "TF_WORKSPACE",
        "TF_VAR_greeting",
        "TF_VAR_message",
        "TF_CLI_ARGS",
        "KUBE_CONFIG_PATH",
    ] {
        assert!(
            !seen.lines().any(|l| l.starts_with(&format!("{name}="))),
            "{name} reached tofu:\n{seen}"
        );
    }
    assert!(!seen.contains("poisoned"));
    assert!(seen.lines().any(|l| l == "SAFE_VALUE=kept"), "{seen}");
    assert!(
        seen.lines()
            .any(|l| l.starts_with("TF_DATA_DIR=") && l.ends_with("/captf/work/.terraform")),
        "{seen}"
    );
}

#[tokio::test]
async fn the_runner_account_cannot_read_secrets_of_another_namespace() {
    let env = setup(MANAGER, "rbac", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let other = captf_testkit::namespace(&env.client, "rbac-other").await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("private".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &other)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let sa = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns);
    let token = sa
        .create_token_request(
            names::RUNNER_RBAC,
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(600),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("a token");
    let runner = client_with_token(&token).await;
    let own = Api::<Secret>::namespaced(runner.clone(), &env.ns)
        .list(&ListParams::default())
        .await;
    assert!(
        own.is_ok(),
        "the runner reads its own namespace's Secrets: {own:?}"
    );
    match Api::<Secret>::namespaced(runner, &other)
        .get("private")
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403),
        other => panic!("expected 403, got {other:?}"),
    }
}

/// A client of the test control plane that authenticates with `token`.
async fn client_with_token(token: &str) -> kube::Client {
    use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
    let mut kubeconfig = Kubeconfig::read_from(controlplane::shared().kubeconfig()).unwrap();
    for user in &mut kubeconfig.auth_infos {
        user.auth_info = Some(AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        });
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn state_readable_gauges_counter_and_events() {
    // The identity allows another namespace only, so no Job ever starts and
    // the hand-written states stay as written.
    let env = setup(MANAGER, "stateread", &[], &[]).await;
    let api = Api::<TerraformClusterIdentity>::all(env.client.clone());
    api.patch(
        &env.identity,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"allowedNamespaces": {"list": ["elsewhere"]}}})),
    )
    .await
    .unwrap();
    let big = big_state(940 * 1024);
    assert!(big.len() > 921_600);
    put_state(&env, Kind::Machine, "big", &big).await;
    put_state(&env, Kind::Machine, "bad", b"\x1f\x8b\x08\x00garbage").await;
    env.cluster("c", NOOP, None).await;
    env.machine("big", "c", None).await;
    env.machine("bad", "c", None).await;

    let big_status = within(&env, 60, "the big state read", || async {
        env.machine_status("big")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("True", "StateRead")))
    })
    .await;
    assert_eq!(big_status.observed_state_serial, Some(7));
    assert_eq!(
        condition(&big_status, "IdentityAllowed"),
        Some(("False", "NamespaceNotAllowed"))
    );
    within(&env, 60, "the corrupt state reported", || async {
        env.machine_status("bad")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("False", "StateCorrupt")))
    })
    .await;
    let near = within(&env, 30, "the near-limit Warning", || async {
        let e = env.events("StateNearSecretLimit").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(near.len(), 1, "once per serial");
    assert_eq!(near[0].type_.as_deref(), Some("Warning"));
    let unreadable = env.events("StateUnreadable").await;
    assert_eq!(unreadable.len(), 1);
    assert!(env.jobs().await.is_empty(), "no Job may start");

    let metrics = env.manager.metrics().await;
    let line = |prefix: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(prefix)
                    && l.contains(&format!("namespace=\"{}\"", env.ns))
                    && l.contains("name=\"big\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    assert_eq!(
        line("captf_state_bytes{"),
        Some(big.len() as f64),
        "{metrics}"
    );
    assert_eq!(line("captf_state_resources{"), Some(0.0));
    let corrupt = metrics
        .lines()
        .find(|l| {
            l.starts_with("captf_state_read_errors_total{")
                && l.contains("reason=\"corrupt\"")
                && l.contains("kind=\"TerraformMachine\"")
        })
        .unwrap_or_else(|| panic!("no corrupt counter:\n{metrics}"));
    assert!(corrupt.ends_with(" 1"), "{corrupt}");
    // Every pass is counted as controller-runtime counts reconciles.
    let passes = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"controller_runtime_reconcile_total{controller="terraformmachine",result="success"} "#,
            )
        })
        .and_then(|n| n.parse::<f64>().ok());
    assert!(passes.is_some_and(|n| n >= 2.0), "{metrics}");

    // Another pass over the same corrupt state counts nothing new.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.events("StateUnreadable").await.len(), 1);
}

#[tokio::test]
async fn an_override_account_runs_jobs_only_once_opted_in() {
    let env = setup(MANAGER, "optin", &[], &[]).await;
    let accounts = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns);
    let custom = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("custom".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &custom)
        .await
        .unwrap();
    env.cluster("c", NOOP, None).await;
    let jobs = captf::api::JobPolicy {
        service_account_name: Some("custom".into()),
        ..Default::default()
    };
    env.create_machine(
        "m",
        "c",
        WorkspaceSpec {
            jobs: Some(jobs),
            ..noop(None)
        },
    )
    .await;
    within(&env, 60, "the refusal", || async {
        env.machine_status("m").await.filter(|s| {
            condition(s, "RunnerRBACReady") == Some(("False", "ServiceAccountNotOptedIn"))
        })
    })
    .await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().starts_with("captf-m-")),
        "no Job without the opt-in"
    );

    accounts
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"captf.io/runner": "true"}}})),
        )
        .await
        .unwrap();
    // The account is not watched: a change of the object starts the next pass.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let job = env
        .jobs()
        .await
        .into_iter()
        .find(|j| j.name_any().starts_with("captf-m-m-apply-"))
        .unwrap();
    let sa = job
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .service_account_name;
    assert_eq!(sa.as_deref(), Some("custom"));
    let binding =
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.client.clone(), &env.ns)
            .get(names::RUNNER_RBAC)
            .await
            .unwrap();
    let subjects: Vec<String> = binding
        .subjects
        .into_iter()
        .flatten()
        .map(|s| s.name)
        .collect();
    assert!(
        subjects.contains(&"custom".to_string()) && subjects.contains(&"captf-runner".to_string()),
        "{subjects:?}"
    );
}
