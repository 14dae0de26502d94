//! The runner's arguments: their order, the lock, restores, apply modes and events.

use super::*;

#[test]
fn runner_args_in_order() {
    let built = build_case(&Case::default());
    let job = built.job.metadata.name.as_deref().unwrap();
    let suffix = names::suffix("team-a", Kind::Machine, "worker-0");
    assert_eq!(
        args(&built),
        [
            "--op=apply".to_owned(),
            "--image=registry.example/modules/net:1.4.0".into(),
            format!("--job-name={job}"),
            "--lock-timeout=300s".into(),
            "--stop-timeout=570s".into(),
            format!("--backend-config=secret_suffix={suffix}"),
            "--backend-config=namespace=team-a".into(),
            "--backend-config=in_cluster_config=true".into(),
            concat!(
                r#"--backend-config=labels={"#,
                r#""captf.infrastructure.cluster.x-k8s.io/owner-kind"="TerraformMachine","#,
                r#""captf.infrastructure.cluster.x-k8s.io/owner-name"="worker-0","#,
                r#""captf.io/managed"="true","#,
                r#""cluster.x-k8s.io/cluster-name"="prod","#,
                r#""clusterctl.cluster.x-k8s.io/move"=""}"#
            )
            .into(),
        ]
    );
    // Without a cluster, no cluster-name label on the state.
    let alone = build_case(&Case {
        cluster: None,
        ..Case::default()
    });
    let labels = args(&alone).iter().find(|a| a.contains("labels=")).unwrap();
    assert!(!labels.contains("cluster-name"), "{labels}");
    assert!(
        !alone
            .job
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("cluster.x-k8s.io/cluster-name")
    );
}

#[test]
fn force_unlock_only_when_asked() {
    let plain = build_case(&Case::default());
    assert!(!args(&plain).iter().any(|a| a.starts_with("--force-unlock")));
    let unlocking = build_case(&Case {
        force_unlock: Some("lock-id-1"),
        ..Case::default()
    });
    let a = args(&unlocking);
    assert_eq!(
        a.iter().filter(|a| a.starts_with("--force-unlock")).count(),
        1
    );
    assert_eq!(
        a.last().map(String::as_str),
        Some("--force-unlock=lock-id-1")
    );
}

#[test]
fn lock_timeout_and_deadline_come_from_the_policy() {
    let own = JobPolicy {
        lock_timeout_seconds: Some(45),
        active_deadline_seconds: Some(900),
        service_account_name: Some("custom".into()),
        ..Default::default()
    };
    let built = build_case(&Case {
        settings: resolve(Some(&own), None),
        ..Case::default()
    });
    assert!(args(&built).contains(&"--lock-timeout=45s".to_owned()));
    assert_eq!(
        built.job.spec.as_ref().unwrap().active_deadline_seconds,
        Some(900)
    );
    assert_eq!(pod(&built).service_account_name.as_deref(), Some("custom"));
    let zero = build_case(&Case {
        settings: resolve(
            Some(&JobPolicy {
                lock_timeout_seconds: Some(0),
                ..Default::default()
            }),
            None,
        ),
        ..Case::default()
    });
    assert!(args(&zero).contains(&"--lock-timeout=0s".to_owned()));
}

#[test]
fn restore_projects_the_chunks_and_runs_a_backend_only_root() {
    let chunks: Vec<String> = vec![
        "backup-a".into(),
        "backup-a-part-1".into(),
        "backup-a-part-2".into(),
    ];
    let built = build_case(&Case {
        op: Op::Restore,
        restore: Some((chunks.clone(), 12)),
        ..Case::default()
    });
    let a = args(&built);
    assert_eq!(
        a[a.len() - 3..],
        [
            "--restore-chunks=3".to_owned(),
            "--restore-resources=12".to_owned(),
            "--restore-serial=41".to_owned()
        ]
    );
    let config = pod(&built)
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "config")
        .unwrap();
    assert_eq!(config.secret, None);
    let projected = config.projected.as_ref().unwrap();
    assert_eq!(projected.default_mode, Some(0o440));
    let sources = projected.sources.as_ref().unwrap();
    assert_eq!(sources.len(), 4);
    let first = sources[0].secret.as_ref().unwrap();
    assert_eq!(Some(&first.name), built.run_secret.metadata.name.as_ref());
    assert_eq!(first.items, None, "every key of the per-run Secret");
    for (i, chunk) in chunks.iter().enumerate() {
        let s = sources[i + 1].secret.as_ref().unwrap();
        assert_eq!(&s.name, chunk);
        let items = s.items.as_ref().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("tfstate", format!("restore/{i}").as_str())
        );
    }
    let data = built.run_secret.data.as_ref().unwrap();
    assert_eq!(data["main.tf.json"].0, BACKEND_ONLY_MAIN_TF_JSON);
    assert_eq!(data["terraform.tfvars.json"].0, EMPTY_TFVARS_JSON);

    // Other operations carry no restore flags.
    for op in [Op::Apply, Op::Plan, Op::Destroy, Op::Refresh, Op::Drift] {
        let built = build_case(&Case {
            op,
            ..Case::default()
        });
        assert!(
            !args(&built).iter().any(|a| a.starts_with("--restore")),
            "{op:?}"
        );
        assert_eq!(args(&built)[0], format!("--op={}", op.as_str()));
    }
}

#[test]
fn apply_modes_and_the_plan_key() {
    let cluster = |op, mode| Case {
        kind: Kind::Cluster,
        name: "prod",
        cluster: None,
        op,
        mode,
        ..Case::default()
    };
    let plan_flags = |built: &BuiltJob| -> Vec<String> {
        args(built)
            .iter()
            .filter(|a| {
                [
                    "--guarded",
                    "--allow",
                    "--approved",
                    "--plan-",
                    "--inputs-hash",
                ]
                .iter()
                .any(|p| a.starts_with(p))
            })
            .cloned()
            .collect()
    };
    let key_mounted = |built: &BuiltJob| {
        let mounted = source(built)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == PLAN_KEY_VOLUME && m.mount_path == PLAN_KEY_DIR);
        let volume = pod(built)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == PLAN_KEY_VOLUME)
            .and_then(|v| v.secret.clone());
        assert_eq!(mounted, volume.is_some());
        volume.map(|v| v.secret_name.unwrap())
    };
    let hash = rendered(Kind::Cluster, "prod", None).inputs_hash;
    // (op, mode, flags, plan key mounted)
    for (op, mode, flags, key) in [
        (Op::Apply, ApplyMode::Direct, vec![], false),
        (
            Op::Apply,
            ApplyMode::Guarded {
                allow_destructive: false,
            },
            vec!["--guarded".to_string()],
            false,
        ),
        (
            Op::Apply,
            ApplyMode::Guarded {
                allow_destructive: true,
            },
            vec!["--guarded".into(), "--allow-destructive".into()],
            false,
        ),
        (
            Op::Apply,
            ApplyMode::Approved { plan_hash: "p1:ab" },
            vec![
                "--approved-plan=p1:ab".into(),
                "--plan-secret=captf-plan-c-prod".into(),
                format!("--inputs-hash={hash}"),
            ],
            true,
        ),
        (
            Op::Plan,
            ApplyMode::Direct,
            vec![
                "--plan-secret=captf-plan-c-prod".into(),
                format!("--inputs-hash={hash}"),
            ],
            true,
        ),
        // Only an apply has a mode.
        (
            Op::Destroy,
            ApplyMode::Approved { plan_hash: "p1:ab" },
            vec![],
            false,
        ),
    ] {
        let built = build_case(&cluster(op, mode));
        assert_eq!(plan_flags(&built), flags, "{op:?} {mode:?}");
        assert_eq!(
            key_mounted(&built).as_deref(),
            key.then_some("captf-plankey-c-prod"),
            "{op:?} {mode:?}"
        );
    }
}

#[test]
fn runner_events_name_the_object() {
    let on = build_case(&Case {
        events: true,
        ..Case::default()
    });
    assert!(
        args(&on).contains(
            &"--events-for=TerraformMachine/worker-0/6f1f1c1e-7a52-4c4e-9d83-2a7f0f6c1b11"
                .to_string()
        ),
        "{:?}",
        args(&on)
    );
    let off = build_case(&Case::default());
    assert!(!args(&off).iter().any(|a| a.starts_with("--events-for")));
}
