//! The runner's environment: fixed names first, then the policy's.

use super::*;

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
