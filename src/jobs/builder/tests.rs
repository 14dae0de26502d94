use std::path::PathBuf;

use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{LocalObjectReference, PodSecurityContext};
use serde_json::json;

use super::*;
use crate::api::{JobPolicy, Variables};
use crate::jobs::inputs::{self, InputsRequest};
use crate::jobs::policy::{self, resolve};

fn n(attempt: u32) -> NonZeroU32 {
    NonZeroU32::new(attempt).unwrap()
}

fn rendered(kind: Kind, name: &str, cluster: Option<&str>) -> RenderedInputs {
    let variables: Variables =
        serde_json::from_value(json!({ "region": "eu-west-1", "size": 2 })).unwrap();
    inputs::render(&InputsRequest {
        kind,
        namespace: "team-a",
        name,
        cluster_name: cluster,
        image: "registry.example/modules/net:1.4.0",
        template: None,
        variables: Some(&variables),
        sensitive: &[],
        role: &[],
    })
    .unwrap()
}

/// What a case varies; the rest is one TerraformMachine of cluster
/// "prod" with an identity.
struct Case {
    kind: Kind,
    name: &'static str,
    cluster: Option<&'static str>,
    op: Op,
    attempt: u32,
    settings: JobSettings,
    identity: Option<&'static str>,
    force_unlock: Option<&'static str>,
    pull: Option<ImagePullPolicy>,
    restore: Option<(Vec<String>, u64)>,
    mode: ApplyMode<'static>,
    events: bool,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            kind: Kind::Machine,
            name: "worker-0",
            cluster: Some("prod"),
            op: Op::Apply,
            attempt: 1,
            settings: resolve(None, None),
            identity: Some("aws"),
            force_unlock: None,
            pull: None,
            restore: None,
            mode: ApplyMode::Direct,
            events: false,
        }
    }
}

fn build_case(case: &Case) -> BuiltJob {
    let inputs = rendered(case.kind, case.name, case.cluster);
    let attempt = n(case.attempt);
    let hash6 = hash6(&inputs.inputs_hash, case.op, attempt, 0);
    let restore = case
        .restore
        .as_ref()
        .map(|(chunks, resources)| RestoreRequest {
            chunk_secrets: chunks,
            resources: *resources,
            serial: 41,
        });
    build(&JobRequest {
        kind: case.kind,
        namespace: "team-a",
        name: case.name,
        uid: "6f1f1c1e-7a52-4c4e-9d83-2a7f0f6c1b11",
        cluster_name: case.cluster,
        op: case.op,
        attempt,
        hash6: &hash6,
        image: "registry.example/modules/net:1.4.0",
        image_pull_policy: case.pull,
        runner_image: "registry.example/captf/runner:0.1.0",
        settings: &case.settings,
        identity: case.identity,
        force_unlock: case.force_unlock,
        inputs: &inputs,
        restore,
        mode: case.mode,
        events: case.events,
    })
}

fn pod(built: &BuiltJob) -> &PodSpec {
    built
        .job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn source(built: &BuiltJob) -> &Container {
    &pod(built).containers[0]
}

fn args(built: &BuiltJob) -> &[String] {
    source(built).args.as_deref().unwrap()
}

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
                        security_context: Some(SecurityContext {
                            run_as_user: Some(1000),
                            run_as_non_root: Some(true),
                            ..Default::default()
                        }),
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
                        pod_security_context: Some(PodSecurityContext {
                            run_as_user: Some(1000),
                            run_as_group: Some(1000),
                            ..Default::default()
                        }),
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

#[test]
fn shape_of_an_apply_job() {
    let built = build_case(&Case::default());
    let job = &built.job;
    let name = job.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("captf-m-worker-0-apply-a1-"), "{name}");
    assert_eq!(
        built.run_secret.metadata.name.as_deref(),
        Some(format!("captf-run-{name}").as_str())
    );
    let labels = job.metadata.labels.as_ref().unwrap();
    for (k, v) in [
        ("captf.io/managed", "true"),
        (
            "captf.infrastructure.cluster.x-k8s.io/owner-kind",
            "TerraformMachine",
        ),
        (
            "captf.infrastructure.cluster.x-k8s.io/owner-name",
            "worker-0",
        ),
        ("cluster.x-k8s.io/cluster-name", "prod"),
        ("captf.infrastructure.cluster.x-k8s.io/op", "apply"),
        ("captf.infrastructure.cluster.x-k8s.io/attempt", "1"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(
        spec.template.metadata.as_ref().unwrap().labels.as_ref(),
        Some(labels)
    );
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.ttl_seconds_after_finished, None);
    assert_eq!(spec.active_deadline_seconds, Some(3600));
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        (
            "infrastructure.cluster.x-k8s.io/v1alpha1",
            "TerraformMachine",
            "worker-0"
        )
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );

    let pod = pod(&built);
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.termination_grace_period_seconds, Some(600));
    assert_eq!(pod.service_account_name.as_deref(), Some("captf-runner"));
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_eq!(pod.image_pull_secrets, None);
    assert_eq!(
        pod.security_context,
        Some(policy::default_pod_security_context())
    );

    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, "runner");
    assert_eq!(
        init.image.as_deref(),
        Some("registry.example/captf/runner:0.1.0")
    );
    assert_eq!(
        init.command.as_deref().unwrap(),
        ["/runner", "copy", "/captf/bin/runner"]
    );
    let init_mounts: Vec<_> = init
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
        .collect();
    assert_eq!(init_mounts, [("runner", "/captf/bin", None)]);

    let main = source(&built);
    assert_eq!(main.name, "source");
    assert_eq!(
        main.image.as_deref(),
        Some("registry.example/modules/net:1.4.0")
    );
    assert_eq!(main.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        main.command.as_deref().unwrap(),
        ["/captf/bin/runner", "run"]
    );
    assert_eq!(
        main.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(main.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(main.resources, Some(policy::default_resources()));
    assert_eq!(
        main.security_context,
        Some(policy::default_security_context())
    );
    let mounts: Vec<_> = main
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m.name.as_str(),
                m.mount_path.as_str(),
                m.read_only == Some(true),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("runner", "/captf/bin", true),
            ("work", "/captf/work", false),
            ("tmp", "/tmp", false),
            ("config", "/captf/config", true),
            ("creds", "/var/run/captf/credentials", true),
        ]
    );
    let env_from = main.env_from.as_ref().unwrap();
    assert_eq!(
        env_from[0].secret_ref.as_ref().unwrap().name,
        "captf-creds-aws"
    );

    let volumes = pod.volumes.as_ref().unwrap();
    let config = volumes.iter().find(|v| v.name == "config").unwrap();
    let config = config.secret.as_ref().unwrap();
    assert_eq!(config.secret_name, built.run_secret.metadata.name);
    assert_eq!(config.default_mode, Some(0o440));
    let creds = volumes.iter().find(|v| v.name == "creds").unwrap();
    let creds = creds.secret.as_ref().unwrap();
    assert_eq!(creds.secret_name.as_deref(), Some("captf-creds-aws"));
    assert_eq!(
        (creds.default_mode, creds.optional),
        (Some(0o440), Some(false))
    );

    let data = built.run_secret.data.as_ref().unwrap();
    let inputs = rendered(Kind::Machine, "worker-0", Some("prod"));
    assert_eq!(data["main.tf.json"].0, inputs.main_tf_json);
    assert_eq!(data["terraform.tfvars.json"].0, inputs.tfvars_json);
    assert_eq!(data.len(), 2);
    assert_eq!(built.run_secret.metadata.owner_references, None);
    let secret_labels = built.run_secret.metadata.labels.as_ref().unwrap();
    assert_eq!(secret_labels["captf.io/managed"], "true");
    assert_eq!(
        secret_labels["captf.infrastructure.cluster.x-k8s.io/owner-name"],
        "worker-0"
    );
}

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
fn long_names_use_the_hash_rule() {
    let name = "a-very-long-machine-name-that-does-not-fit-the-job-name";
    let built = build_case(&Case {
        name,
        ..Case::default()
    });
    let job = built.job.metadata.name.as_deref().unwrap();
    assert!(job.len() <= 57, "{job}");
    assert!(!job.contains(name), "{job}");
    assert!(
        job.starts_with("captf-m-") && job.contains("-apply-a1-"),
        "{job}"
    );
    assert_eq!(
        built.run_secret.metadata.name.as_deref(),
        Some(format!("captf-run-{job}").as_str())
    );
    // The owner reference and the label keep the real name, which fits a
    // label value.
    assert_eq!(
        built.job.metadata.owner_references.as_ref().unwrap()[0].name,
        name
    );
    assert_eq!(
        built.job.metadata.labels.as_ref().unwrap()["captf.infrastructure.cluster.x-k8s.io/owner-name"],
        name
    );
}

#[test]
fn env_is_fixed_then_policy_without_reserved_names() {
    let own = JobPolicy {
        env: Some(
            [
                ("TF_VAR_x", "1"),
                ("REGION", "eu"),
                ("KUBE_NAMESPACE", "evil"),
                ("TFX", "y"),
            ]
            .into_iter()
            .map(|(name, value)| EnvVar {
                name: name.into(),
                value: Some(value.into()),
                ..Default::default()
            })
            .collect(),
        ),
        ..Default::default()
    };
    let built = build_case(&Case {
        settings: resolve(Some(&own), None),
        ..Case::default()
    });
    let env: Vec<_> = source(&built)
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
        .collect();
    assert_eq!(
        env,
        [
            ("TF_IN_AUTOMATION", "1"),
            ("TF_INPUT", "0"),
            ("HOME", "/captf/work"),
            ("TMPDIR", "/tmp"),
            ("KUBE_NAMESPACE", "team-a"),
            ("CHECKPOINT_DISABLE", "1"),
            ("REGION", "eu"),
            ("TFX", "y"),
        ]
    );
}

#[test]
fn secret_env_names_the_variables_a_secret_fills() {
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVarSource, SecretKeySelector};
    let from = |secret: bool| EnvVarSource {
        secret_key_ref: secret.then(|| SecretKeySelector {
            name: "db".into(),
            key: "password".into(),
            optional: None,
        }),
        config_map_key_ref: (!secret).then(|| ConfigMapKeySelector {
            name: "settings".into(),
            key: "region".into(),
            optional: None,
        }),
        ..Default::default()
    };
    let own = JobPolicy {
        env: Some(vec![
            EnvVar {
                name: "DB_PASSWORD".into(),
                value_from: Some(from(true)),
                ..Default::default()
            },
            EnvVar {
                name: "REGION".into(),
                value_from: Some(from(false)),
                ..Default::default()
            },
            EnvVar {
                name: "PLAIN".into(),
                value: Some("not-secret".into()),
                ..Default::default()
            },
            EnvVar {
                name: "API_TOKEN".into(),
                value_from: Some(from(true)),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let built = build_case(&Case {
        settings: resolve(Some(&own), None),
        ..Case::default()
    });
    let secret_env: Vec<&str> = args(&built)
        .iter()
        .filter(|a| a.starts_with("--secret-env"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        secret_env,
        ["--secret-env=DB_PASSWORD", "--secret-env=API_TOKEN"]
    );
    // The values never reach the arguments.
    assert!(!args(&built).iter().any(|a| a.contains("not-secret")));
    assert!(
        !args(&build_case(&Case::default()))
            .iter()
            .any(|a| a.starts_with("--secret-env"))
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
fn no_identity_no_credentials() {
    let built = build_case(&Case {
        identity: None,
        ..Case::default()
    });
    let main = source(&built);
    assert_eq!(main.env_from, None);
    assert!(
        !main
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == "creds")
    );
    assert!(
        !pod(&built)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "creds")
    );
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

#[test]
fn pull_policy_and_pull_secrets() {
    for (policy, want) in [
        (None, "IfNotPresent"),
        (Some(ImagePullPolicy::IfNotPresent), "IfNotPresent"),
        (Some(ImagePullPolicy::Always), "Always"),
        (Some(ImagePullPolicy::Never), "Never"),
    ] {
        let built = build_case(&Case {
            pull: policy,
            ..Case::default()
        });
        assert_eq!(source(&built).image_pull_policy.as_deref(), Some(want));
        // The runner image keeps the kubelet's default.
        assert_eq!(
            pod(&built).init_containers.as_ref().unwrap()[0].image_pull_policy,
            None
        );
    }
    let own = JobPolicy {
        image_pull_secrets: Some(vec![LocalObjectReference { name: "reg".into() }]),
        ..Default::default()
    };
    let built = build_case(&Case {
        settings: resolve(Some(&own), None),
        ..Case::default()
    });
    assert_eq!(pod(&built).image_pull_secrets, own.image_pull_secrets);
}

#[test]
fn run_secret_is_owned_by_the_created_job() {
    let mut built = build_case(&Case::default());
    assert_eq!(
        own_run_secret(&mut built.run_secret, &built.job),
        Err(JobNotCreated)
    );
    let mut created = built.job.clone();
    created.metadata.uid = Some("job-uid".into());
    own_run_secret(&mut built.run_secret, &created).unwrap();
    let owner = &built.run_secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        (
            "batch/v1",
            "Job",
            created.metadata.name.as_deref().unwrap(),
            "job-uid"
        )
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
}

#[test]
fn hash6_depends_on_every_part() {
    let base = hash6("h2:abc", Op::Apply, n(1), 0);
    assert_eq!(base, hash6("h2:abc", Op::Apply, n(1), 0));
    let others = [
        hash6("h2:abd", Op::Apply, n(1), 0),
        hash6("h2:abc", Op::Plan, n(1), 0),
        hash6("h2:abc", Op::Apply, n(2), 0),
        hash6("h2:abc", Op::Apply, n(1), 1),
    ];
    let all: std::collections::BTreeSet<_> =
        others.iter().chain([&base]).map(Hash6::as_str).collect();
    assert_eq!(all.len(), 5);
    assert_eq!(base, Hash6::of(b"h2:abc\napply\n1\n0"));
}

#[test]
fn next_attempt_counts_retained_jobs_of_the_op() {
    let job = |op: &str, attempt: &str| Job {
        metadata: ObjectMeta {
            labels: Some(
                [
                    (OP_LABEL.to_owned(), op.to_owned()),
                    (ATTEMPT_LABEL.to_owned(), attempt.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        status: Some(JobStatus {
            conditions: Some(vec![JobCondition::default()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let jobs = [
        job("apply", "1"),
        job("apply", "3"),
        job("destroy", "7"),
        job("apply", "x"),
        job("apply", "-2"),
        Job::default(),
    ];
    let table: &[(Op, &[Job], u32)] = &[
        (Op::Apply, &jobs, 4),
        (Op::Destroy, &jobs, 8),
        (Op::Drift, &jobs, 1),
        (Op::Apply, &[], 1),
        (Op::Apply, &jobs[..1], 2),
    ];
    for (op, jobs, want) in table {
        assert_eq!(next_attempt(*op, jobs.iter()).get(), *want, "{op:?}");
    }
    let max = [job("apply", &u32::MAX.to_string())];
    assert_eq!(next_attempt(Op::Apply, max.iter()).get(), u32::MAX);
}
