//! The built Jobs against their golden YAML.

use super::*;

fn golden_cases() -> Vec<(&'static str, Case)> {
    let cluster_defaults = JobPolicy {
        active_deadline_seconds: Some(7200),
        lock_timeout_seconds: Some(600),
        service_account_name: Some("cluster-runner".into()),
        image_pull_secrets: Some(vec![
            LocalObjectReference {
                name: "registry".into(),
            },
            LocalObjectReference {
                name: "mirror".into(),
            },
        ]),
        env: Some(vec![
            EnvVar {
                name: "HTTPS_PROXY".into(),
                value: Some("http://proxy:3128".into()),
                ..Default::default()
            },
            EnvVar {
                name: "TF_LOG".into(),
                value: Some("trace".into()),
                ..Default::default()
            },
            EnvVar {
                name: "REGION".into(),
                value: Some("from-cluster".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let machine_policy = JobPolicy {
        lock_timeout_seconds: Some(120),
        image_pull_secrets: Some(vec![LocalObjectReference {
            name: "mirror".into(),
        }]),
        env: Some(vec![
            EnvVar {
                name: "REGION".into(),
                value: Some("from-machine".into()),
                ..Default::default()
            },
            EnvVar {
                name: "KUBE_CONTEXT".into(),
                value: Some("x".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    vec![
        ("apply", Case::default()),
        (
            "destroy",
            Case {
                op: Op::Destroy,
                attempt: 2,
                force_unlock: Some("2b5c1e0e-3c4d-4e4f-8a9b-0c1d2e3f4a5b"),
                pull: Some(ImagePullPolicy::Always),
                ..Case::default()
            },
        ),
        (
            "refresh",
            Case {
                kind: Kind::MachinePool,
                name: "pool-a",
                op: Op::Refresh,
                identity: None,
                ..Case::default()
            },
        ),
        (
            "drift",
            Case {
                kind: Kind::Cluster,
                name: "prod",
                op: Op::Drift,
                attempt: 3,
                ..Case::default()
            },
        ),
        (
            "restore",
            Case {
                op: Op::Restore,
                restore: Some((
                    vec![
                        "captf-state-backup-0123456789abcdef-m-7".into(),
                        "captf-state-backup-0123456789abcdef-m-7-part-1".into(),
                    ],
                    4,
                )),
                ..Case::default()
            },
        ),
        (
            "plan",
            Case {
                kind: Kind::Cluster,
                name: "prod",
                cluster: None,
                op: Op::Plan,
                ..Case::default()
            },
        ),
        (
            "machine-cluster-defaults",
            Case {
                settings: resolve(Some(&machine_policy), Some(&cluster_defaults)),
                ..Case::default()
            },
        ),
        // A user context sets only its users: the hardened defaults stay.
        (
            "security-context",
            Case {
                settings: resolve(
                    Some(&JobPolicy {
                        security_context: Some(Box::new(SecurityContext {
                            run_as_user: Some(1000),
                            run_as_non_root: Some(true),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }),
                    None,
                ),
                ..Case::default()
            },
        ),
        (
            "pod-security-context",
            Case {
                settings: resolve(
                    None,
                    Some(&JobPolicy {
                        pod_security_context: Some(Box::new(PodSecurityContext {
                            run_as_user: Some(1000),
                            run_as_group: Some(1000),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }),
                ),
                ..Case::default()
            },
        ),
    ]
}

/// The Job, then the Secret; the Secret's data as text, so that a
/// change of the rendered root shows in review.
fn golden_yaml(built: &BuiltJob) -> String {
    let mut secret = built.run_secret.clone();
    secret.string_data = secret.data.take().map(|data| {
        data.into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect()
    });
    format!(
        "{}---\n{}",
        serde_saphyr::to_string(&built.job).unwrap(),
        serde_saphyr::to_string(&secret).unwrap()
    )
}

#[test]
fn golden_jobs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/jobs");
    let update = std::env::var_os("CAPTF_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (case, spec) in golden_cases() {
        let got = golden_yaml(&build_case(&spec));
        let path = dir.join(format!("{case}.yaml"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if got != want {
            stale.push(format!("{case}:\n{got}"));
        }
    }
    assert!(
        stale.is_empty(),
        "Jobs differ from tests/golden/jobs (CAPTF_UPDATE_GOLDEN=1 rewrites them):\n{}",
        stale.join("\n")
    );
}
