use k8s_openapi::api::core::v1::Capabilities;
use serde_json::Value;

use super::*;

#[test]
fn lock_timeout_against_deadline() {
    // (lock, deadline, refused)
    let table = [
        (Some(600), Some(300), true),
        (Some(3600), None, true),
        (None, Some(200), true),
        (None, Some(300), true),
        (Some(60), Some(300), false),
        (None, None, false),
        (Some(3599), None, false),
        (None, Some(301), false),
        (Some(0), Some(1), false),
        (Some(1), Some(1), true),
        // 0 means unset: the default of 3600 applies.
        (Some(3000), Some(0), false),
        (Some(3600), Some(0), true),
    ];
    for (lock, deadline, refused) in table {
        let got = lock_timeout_below_deadline("spec.jobs", lock, deadline);
        assert_eq!(got.is_some(), refused, "{lock:?} {deadline:?}: {got:?}");
    }
    let message = lock_timeout_below_deadline("spec.jobs", Some(3600), None)
        .unwrap()
        .message();
    assert_eq!(
        message,
        "spec.jobs.lockTimeoutSeconds: must be less than activeDeadlineSeconds, so that waiting for the state lock cannot use up the Job's deadline (got lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default)"
    );
}

#[test]
fn restore_serial_shapes() {
    let table = [
        ("7", Some(7)),
        ("1", Some(1)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("07", None),
        ("0", None),
        ("-1", None),
        ("+1", None),
        ("abc", None),
        ("", None),
        (" 7", None),
        ("7 ", None),
        ("٣", None),
    ];
    for (value, want) in table {
        assert_eq!(parse_restore_serial(value), want, "{value:?}");
    }
}

#[test]
fn restore_state_on_create_and_update() {
    let backups = [5, 7];
    // (new, old on UPDATE, deleting, refused, forbidden)
    type Row<'a> = (Option<&'a str>, Option<Option<&'a str>>, bool, bool, bool);
    let table: &[Row] = &[
        (None, None, false, false, false),
        (Some("7"), None, false, false, false),
        // CREATE checks only the shape, listed or not.
        (Some("9"), None, false, false, false),
        (Some("07"), None, false, true, false),
        (Some("7"), Some(None), false, false, false),
        (Some("9"), Some(None), false, true, false),
        (Some("9"), Some(Some("7")), false, true, false),
        // Unchanged: not re-checked (the backup may have been pruned since).
        (Some("9"), Some(Some("9")), false, false, false),
        (Some("7"), Some(None), true, true, true),
        (Some("9"), Some(Some("9")), true, false, false),
        (Some("abc"), Some(Some("abc")), false, true, false),
        (None, Some(Some("7")), false, false, false),
    ];
    for (new, old, deleting, refused, forbidden) in table {
        let got = restore_state(*new, *old, &backups, *deleting);
        assert_eq!(
            got.is_some(),
            *refused,
            "{new:?} {old:?} {deleting}: {got:?}"
        );
        if let Some(v) = got {
            assert_eq!(v.forbidden, *forbidden, "{new:?} {old:?}");
            assert_eq!(v.code(), if *forbidden { 403 } else { 422 });
            assert!(v.message().starts_with(RESTORE_STATE_PATH));
        }
    }
    let message = restore_state(Some("9"), Some(None), &backups, false)
        .unwrap()
        .message();
    assert!(message.contains("(listed: 5, 7)"), "{message}");
}

#[test]
fn variable_keys() {
    let table = [
        ("region", Kind::Machine, None),
        ("_x", Kind::Machine, None),
        ("a-b_c9", Kind::Machine, None),
        ("9lives", Kind::Machine, Some("must match")),
        ("a.b", Kind::Machine, Some("must match")),
        ("", Kind::Machine, Some("must match")),
        ("\u{e9}t\u{e9}", Kind::Machine, Some("must match")),
        ("r\u{e9}gion", Kind::Machine, Some("must match")),
        ("zone\u{2010}a", Kind::Machine, Some("must match")),
        ("captf_anything", Kind::Cluster, Some("captf_")),
        ("bootstrap_data", Kind::Machine, Some("contract input")),
        ("bootstrap_data", Kind::Cluster, None),
        ("replicas", Kind::MachinePool, Some("contract input")),
        ("replicas", Kind::Machine, None),
        (
            "control_plane_endpoint",
            Kind::Cluster,
            Some("contract input"),
        ),
        ("count", Kind::Cluster, Some("meta-argument")),
        ("lifecycle", Kind::MachinePool, Some("meta-argument")),
    ];
    for (key, role, want) in table {
        let got = variable_key_rule(key, role);
        match want {
            None => assert_eq!(got, None, "{key}"),
            Some(fragment) => {
                assert!(got.is_some_and(|r| r.contains(fragment)), "{key}: {got:?}")
            }
        }
    }
}

#[test]
fn variables_object_rules_never_echo_values() {
    let object = |json: Value| -> Variables { serde_json::from_value(json).unwrap() };
    let ok = object(serde_json::json!({"region": "eu", "size": 3}));
    assert!(variables("spec.variables", &ok, Kind::Machine).is_empty());
    let secretish = object(serde_json::json!({"count": "hunter2"}));
    let v = variables("spec.variables", &secretish, Kind::Machine);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].path, "spec.variables.count");
    assert!(!v[0].message().contains("hunter2"));
    let many = (0..257).map(|i| (format!("v{i}"), Value::Null)).collect();
    let v = variables(
        "spec.variables",
        &object(Value::Object(many)),
        Kind::Cluster,
    );
    assert_eq!(
        v[0].message(),
        "spec.variables: must have at most 256 keys (got 257 keys)"
    );
    // A key given twice is one variable, as the manager reads it.
    let twice: Variables = serde_json::from_str(r#"{"a": 1, "a": 2}"#).unwrap();
    assert!(variables("spec.variables", &twice, Kind::Cluster).is_empty());
    // The text holds any nesting; the manager reads 128 levels.
    let deep = format!(r#"{{"a": {}{}}}"#, "[".repeat(129), "]".repeat(129));
    let deep: Variables = serde_json::from_str(&deep).unwrap();
    assert_eq!(
        variables("spec.variables", &deep, Kind::Cluster)[0].message(),
        "spec.variables: must nest its values at most 128 levels deep"
    );
}

#[test]
fn security_context_rules() {
    let hardened = SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: Some(vec![]),
        }),
        ..Default::default()
    };
    assert!(security_context_hardened("spec.jobs.securityContext", &hardened).is_empty());
    let loose = SecurityContext {
        privileged: Some(true),
        allow_privilege_escalation: Some(true),
        capabilities: Some(Capabilities {
            add: Some(vec!["NET_ADMIN".into()]),
            drop: None,
        }),
        ..Default::default()
    };
    let paths: Vec<String> = security_context_hardened("spec.jobs.securityContext", &loose)
        .into_iter()
        .map(|v| v.path)
        .collect();
    assert_eq!(
        paths,
        [
            "spec.jobs.securityContext.privileged",
            "spec.jobs.securityContext.allowPrivilegeEscalation",
            "spec.jobs.securityContext.capabilities.add",
        ]
    );
}

/// One context of each kind that sets every field the stricter rules
/// read, to an allowed value.
fn hardened_pair() -> (SecurityContext, PodSecurityContext) {
    let seccomp = SeccompProfile {
        type_: "Localhost".into(),
        localhost_profile: Some("profiles/job.json".into()),
    };
    let app_armor = AppArmorProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    };
    let se_linux = SELinuxOptions {
        type_: Some("container_t".into()),
        level: Some("s0:c123,c456".into()),
        ..Default::default()
    };
    let windows = WindowsSecurityContextOptions {
        host_process: Some(false),
        ..Default::default()
    };
    let container = SecurityContext {
        read_only_root_filesystem: Some(true),
        proc_mount: Some("Default".into()),
        seccomp_profile: Some(seccomp.clone()),
        app_armor_profile: Some(app_armor.clone()),
        se_linux_options: Some(se_linux.clone()),
        run_as_user: Some(1000),
        run_as_group: Some(0),
        run_as_non_root: Some(true),
        windows_options: Some(windows.clone()),
        ..Default::default()
    };
    let pod = PodSecurityContext {
        seccomp_profile: Some(seccomp),
        app_armor_profile: Some(app_armor),
        se_linux_options: Some(se_linux),
        run_as_user: Some(1000),
        run_as_non_root: Some(true),
        windows_options: Some(windows),
        fs_group: Some(65532),
        ..Default::default()
    };
    (container, pod)
}

#[test]
fn stricter_rules_pass_hardened_contexts() {
    let (container, pod) = hardened_pair();
    assert_eq!(security_context_strict("c", &container), []);
    assert_eq!(pod_security_context_strict("p", &pod), []);
    assert_eq!(security_context_hardened("c", &container), []);
    // Unset is allowed throughout: the built-in defaults leave the user
    // to the image.
    assert_eq!(security_context_strict("c", &Default::default()), []);
    assert_eq!(pod_security_context_strict("p", &Default::default()), []);
    let empty_se_linux = PodSecurityContext {
        se_linux_options: Some(SELinuxOptions {
            type_: Some(String::new()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(pod_security_context_strict("p", &empty_se_linux), []);
    for allowed in ["container_init_t", "container_kvm_t", "container_engine_t"] {
        let mut context = container.clone();
        context.se_linux_options.as_mut().unwrap().type_ = Some(allowed.into());
        assert_eq!(security_context_strict("c", &context), [], "{allowed}");
    }
}

#[test]
fn stricter_rules_refuse_each_loose_setting_in_both_contexts() {
    const SE: &str = "must be unset or one of container_t, container_init_t, container_kvm_t, container_engine_t: other types, such as spc_t, may run unconfined";
    const UNCONFINED: &str = "must not be Unconfined: use RuntimeDefault or Localhost";
    const ROOT: &str = "a Job does not run as root";
    // (change to the hardened pair, field, message after the field path;
    // whether a pod context has the field)
    type Change = fn(&mut SecurityContext, &mut PodSecurityContext);
    let table: &[(Change, &str, String, bool)] = &[
        (
            |c, _| c.read_only_root_filesystem = Some(false),
            "readOnlyRootFilesystem",
            "must not be false: a Job writes only to its volumes (got false)".into(),
            false,
        ),
        (
            |c, _| c.proc_mount = Some("Unmasked".into()),
            "procMount",
            r#"must not be Unmasked: /proc stays masked (got "Unmasked")"#.into(),
            false,
        ),
        (
            |c, p| {
                c.seccomp_profile.as_mut().unwrap().type_ = "Unconfined".into();
                p.seccomp_profile.as_mut().unwrap().type_ = "Unconfined".into();
            },
            "seccompProfile.type",
            format!(r#"{UNCONFINED} (got "Unconfined")"#),
            true,
        ),
        (
            |c, p| {
                c.app_armor_profile.as_mut().unwrap().type_ = "Unconfined".into();
                p.app_armor_profile.as_mut().unwrap().type_ = "Unconfined".into();
            },
            "appArmorProfile.type",
            format!(r#"{UNCONFINED} (got "Unconfined")"#),
            true,
        ),
        (
            |c, p| {
                c.se_linux_options.as_mut().unwrap().type_ = Some("spc_t".into());
                p.se_linux_options.as_mut().unwrap().type_ = Some("spc_t".into());
            },
            "seLinuxOptions.type",
            format!(r#"{SE} (got "spc_t")"#),
            true,
        ),
        (
            |c, p| {
                c.se_linux_options.as_mut().unwrap().type_ = Some("unconfined_t".into());
                p.se_linux_options.as_mut().unwrap().type_ = Some("unconfined_t".into());
            },
            "seLinuxOptions.type",
            format!(r#"{SE} (got "unconfined_t")"#),
            true,
        ),
        (
            |c, p| {
                c.run_as_user = Some(0);
                p.run_as_user = Some(0);
            },
            "runAsUser",
            format!("must not be 0: {ROOT} (got 0)"),
            true,
        ),
        (
            |c, p| {
                c.run_as_non_root = Some(false);
                p.run_as_non_root = Some(false);
            },
            "runAsNonRoot",
            format!("must not be false: {ROOT} (got false)"),
            true,
        ),
        (
            |c, p| {
                c.windows_options.as_mut().unwrap().host_process = Some(true);
                p.windows_options.as_mut().unwrap().host_process = Some(true);
            },
            "windowsOptions.hostProcess",
            "must not be true: a Job never runs as a host process (got true)".into(),
            true,
        ),
    ];
    for (change, field, message, pod_has_it) in table {
        let (mut container, mut pod) = hardened_pair();
        change(&mut container, &mut pod);
        let got: Vec<String> = security_context_strict("spec.jobs.securityContext", &container)
            .iter()
            .map(Violation::message)
            .collect();
        assert_eq!(
            got,
            [format!("spec.jobs.securityContext.{field}: {message}")],
            "{field}"
        );
        let got: Vec<String> = pod_security_context_strict("spec.jobs.podSecurityContext", &pod)
            .iter()
            .map(Violation::message)
            .collect();
        let want: Vec<String> = pod_has_it
            .then(|| format!("spec.jobs.podSecurityContext.{field}: {message}"))
            .into_iter()
            .collect();
        assert_eq!(got, want, "pod {field}");
    }
    // Every loose setting at once: each is named, in field order, and
    // each is a 422.
    let loose = SecurityContext {
        read_only_root_filesystem: Some(false),
        proc_mount: Some("Unmasked".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        }),
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        ..Default::default()
    };
    let got = security_context_strict("s", &loose);
    let paths: Vec<&str> = got.iter().map(|v| v.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "s.readOnlyRootFilesystem",
            "s.procMount",
            "s.seccompProfile.type",
            "s.runAsUser",
            "s.runAsNonRoot"
        ]
    );
    assert!(got.iter().all(|v| v.code() == 422));
}

/// The contexts the manager builds itself pass the rules a user's must:
/// the built-in defaults, and every container and pod context of the
/// golden Jobs (the init container's fixed one included).
#[test]
fn the_managers_own_contexts_pass() {
    use crate::jobs::policy::{default_pod_security_context, default_security_context};
    use k8s_openapi::api::batch::v1::Job;

    assert_eq!(
        security_context_hardened("c", &default_security_context()),
        []
    );
    assert_eq!(
        security_context_strict("c", &default_security_context()),
        []
    );
    assert_eq!(
        pod_security_context_strict("p", &default_pod_security_context()),
        []
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/jobs");
    let mut containers = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let job = documents
            .into_iter()
            .find(|d| d["kind"] == "Job")
            .expect("a Job document");
        let job: Job = serde_json::from_value(job).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let context = pod.security_context.expect("a pod context");
        assert_eq!(
            pod_security_context_strict("p", &context),
            [],
            "{}",
            path.display()
        );
        for container in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let context = container.security_context.as_ref().expect("a context");
            let name = format!("{} {}", path.display(), container.name);
            assert_eq!(security_context_hardened("c", context), [], "{name}");
            assert_eq!(security_context_strict("c", context), [], "{name}");
            containers += 1;
        }
    }
    assert!(containers >= 16, "only {containers} containers read");
}

#[test]
fn env_warnings_name_each_dropped_entry() {
    let env: Vec<EnvVar> = ["TF_LOG", "REGION", "KUBE_CONFIG", "TFX", "KUBECONFIG"]
        .iter()
        .map(|n| EnvVar {
            name: n.to_string(),
            ..Default::default()
        })
        .collect();
    let warnings = dropped_env_warnings("spec.jobs.env", &env);
    assert_eq!(warnings.len(), 2);
    assert!(warnings[0].starts_with("spec.jobs.env[0].name: \"TF_LOG\""));
    assert!(warnings[1].starts_with("spec.jobs.env[2].name: \"KUBE_CONFIG\""));
}

#[test]
fn set_once_and_immutable() {
    assert!(set_once("spec.providerID", None, Some("aws:///i-1")).is_none());
    assert!(set_once("spec.providerID", Some(""), Some("aws:///i-1")).is_none());
    assert!(set_once("spec.providerID", Some("aws:///i-1"), Some("aws:///i-1")).is_none());
    assert!(set_once("spec.providerID", Some("aws:///i-1"), Some("aws:///i-2")).is_some());
    assert!(set_once("spec.providerID", Some("aws:///i-1"), None).is_some());
    assert!(immutable("spec.source", &"a", &"a", "is immutable").is_none());
    assert_eq!(
        immutable("spec.source", &"a", &"b", "is immutable")
            .unwrap()
            .message(),
        "spec.source: is immutable"
    );
}

#[test]
fn exactly_one_source_and_allowed_namespaces() {
    assert!(variables_source_exactly_one("spec.variablesFrom[0]", true, false).is_none());
    assert!(variables_source_exactly_one("spec.variablesFrom[0]", false, true).is_none());
    assert!(variables_source_exactly_one("spec.variablesFrom[0]", true, true).is_some());
    assert!(variables_source_exactly_one("spec.variablesFrom[0]", false, false).is_some());
    assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", false, false).is_some());
    assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", true, false).is_none());
    assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", false, true).is_none());
}

#[test]
fn long_values_are_cut() {
    let long = "x".repeat(100);
    assert!(echo(&long).ends_with("\"..."));
    assert_eq!(echo("7"), "\"7\"");
}
