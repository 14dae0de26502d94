use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<EnvVar> {
    pairs
        .iter()
        .map(|(name, value)| EnvVar {
            name: (*name).to_owned(),
            value: Some((*value).to_owned()),
            ..Default::default()
        })
        .collect()
}

fn secrets(names: &[&str]) -> Vec<LocalObjectReference> {
    names
        .iter()
        .map(|n| LocalObjectReference {
            name: (*n).to_owned(),
        })
        .collect()
}

fn env_pairs(vars: &[EnvVar]) -> Vec<(String, String)> {
    vars.iter()
        .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn built_in_defaults_when_nothing_is_set() {
    let want = JobSettings {
        successful_jobs_history_limit: 3,
        failed_jobs_history_limit: 3,
        active_deadline_seconds: 3600,
        lock_timeout_seconds: 300,
        service_account_name: "captf-runner".into(),
        image_pull_secrets: vec![],
        resources: default_resources(),
        env: vec![],
        security_context: default_security_context(),
        pod_security_context: default_pod_security_context(),
    };
    assert_eq!(resolve(None, None), want);
    assert_eq!(
        resolve(Some(&JobPolicy::default()), Some(&JobPolicy::default())),
        want
    );

    let r = default_resources();
    assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "250m");
    assert_eq!(r.requests.as_ref().unwrap()["memory"].0, "512Mi");
    assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "2Gi");
    assert!(
        !r.limits.as_ref().unwrap().contains_key("cpu"),
        "no CPU limit"
    );
    let p = default_pod_security_context();
    assert_eq!(p.fs_group, Some(65532));
    assert_eq!(p.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let s = default_security_context();
    assert_eq!(s.run_as_non_root, None);
    assert_eq!(s.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
}

#[test]
fn scalar_fields_object_then_defaults_then_built_in() {
    let own = JobPolicy {
        successful_jobs_history_limit: Some(0),
        lock_timeout_seconds: Some(60),
        service_account_name: Some("mine".into()),
        ..Default::default()
    };
    let defaults = JobPolicy {
        successful_jobs_history_limit: Some(9),
        failed_jobs_history_limit: Some(7),
        active_deadline_seconds: Some(1800),
        lock_timeout_seconds: Some(120),
        service_account_name: Some("theirs".into()),
        ..Default::default()
    };
    // (own, defaults) -> (successful, failed, deadline, lock, account)
    type Row<'a> = (
        Option<&'a JobPolicy>,
        Option<&'a JobPolicy>,
        (i32, i32, i64, i64, &'a str),
    );
    let table: &[Row] = &[
        (Some(&own), Some(&defaults), (0, 7, 1800, 60, "mine")),
        (Some(&own), None, (0, 3, 3600, 60, "mine")),
        (None, Some(&defaults), (9, 7, 1800, 120, "theirs")),
        (Some(&defaults), Some(&own), (9, 7, 1800, 120, "theirs")),
        (None, None, (3, 3, 3600, 300, "captf-runner")),
    ];
    for (o, d, want) in table {
        let s = resolve(*o, *d);
        let got = (
            s.successful_jobs_history_limit,
            s.failed_jobs_history_limit,
            s.active_deadline_seconds,
            s.lock_timeout_seconds,
            s.service_account_name.as_str(),
        );
        assert_eq!(got, *want, "{o:?} over {d:?}");
    }
}

#[test]
fn zero_deadline_means_unset_but_zero_lock_timeout_is_a_value() {
    let zero = JobPolicy {
        active_deadline_seconds: Some(0),
        lock_timeout_seconds: Some(0),
        ..Default::default()
    };
    let defaults = JobPolicy {
        active_deadline_seconds: Some(900),
        lock_timeout_seconds: Some(100),
        ..Default::default()
    };
    let s = resolve(Some(&zero), Some(&defaults));
    assert_eq!(
        (s.active_deadline_seconds, s.lock_timeout_seconds),
        (900, 0)
    );
    let s = resolve(Some(&zero), None);
    assert_eq!(
        (s.active_deadline_seconds, s.lock_timeout_seconds),
        (3600, 0)
    );
    let s = resolve(None, Some(&zero));
    assert_eq!(s.active_deadline_seconds, 3600);
}

#[test]
fn env_merges_by_name_and_drops_reserved_names() {
    let own = JobPolicy {
        env: Some(env(&[
            ("REGION", "own"),
            ("TF_LOG", "trace"),
            ("ZONE", "a"),
        ])),
        ..Default::default()
    };
    let defaults = JobPolicy {
        env: Some(env(&[
            ("PROXY", "p"),
            ("REGION", "default"),
            ("KUBE_CONFIG", "x"),
            ("TF_LOG", "debug"),
            ("TFX", "kept"),
            ("KUBECONFIG", "kept too"),
        ])),
        ..Default::default()
    };
    // (own, defaults) -> (environment, names dropped)
    type Row<'a> = (
        Option<&'a JobPolicy>,
        Option<&'a JobPolicy>,
        &'a [(&'a str, &'a str)],
        &'a [&'a str],
    );
    let table: &[Row] = &[
        (
            Some(&own),
            Some(&defaults),
            &[
                ("REGION", "own"),
                ("ZONE", "a"),
                ("PROXY", "p"),
                ("TFX", "kept"),
                ("KUBECONFIG", "kept too"),
            ],
            &["TF_LOG", "KUBE_CONFIG"],
        ),
        (
            Some(&own),
            None,
            &[("REGION", "own"), ("ZONE", "a")],
            &["TF_LOG"],
        ),
        (
            None,
            Some(&defaults),
            &[
                ("PROXY", "p"),
                ("REGION", "default"),
                ("TFX", "kept"),
                ("KUBECONFIG", "kept too"),
            ],
            &["KUBE_CONFIG", "TF_LOG"],
        ),
        (None, None, &[], &[]),
    ];
    for (o, d, want, dropped) in table {
        let got = env_pairs(&resolve(*o, *d).env);
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(dropped_env_names(*o, *d), *dropped);
    }
}

#[test]
fn image_pull_secrets_are_a_union_object_first() {
    let policy = |names: &[&str]| JobPolicy {
        image_pull_secrets: Some(secrets(names)),
        ..Default::default()
    };
    let table: &[(Option<JobPolicy>, Option<JobPolicy>, &[&str])] = &[
        (
            Some(policy(&["a", "b"])),
            Some(policy(&["b", "c"])),
            &["a", "b", "c"],
        ),
        (
            Some(policy(&["c"])),
            Some(policy(&["a", "c", "b"])),
            &["c", "a", "b"],
        ),
        (Some(policy(&["a", "a"])), None, &["a"]),
        (None, Some(policy(&["z"])), &["z"]),
        (Some(JobPolicy::default()), Some(policy(&["z"])), &["z"]),
        (None, None, &[]),
    ];
    for (o, d, want) in table {
        let got = resolve(o.as_ref(), d.as_ref()).image_pull_secrets;
        assert_eq!(got, secrets(want), "{o:?} over {d:?}");
    }
}

#[test]
fn resources_are_replaced_whole() {
    let resources = ResourceRequirements {
        limits: Some(BTreeMap::from([("cpu".to_owned(), Quantity("1".into()))])),
        ..Default::default()
    };
    let own = JobPolicy {
        resources: Some(resources.clone()),
        ..Default::default()
    };
    let defaults = JobPolicy {
        resources: Some(ResourceRequirements::default()),
        ..Default::default()
    };
    // Not merged field by field with the defaults: the object's value as
    // it is, without memory requests.
    assert_eq!(resolve(Some(&own), Some(&defaults)).resources, resources);
    assert_eq!(
        resolve(None, Some(&defaults)).resources,
        ResourceRequirements::default()
    );
}

fn seccomp(type_: &str, profile: Option<&str>) -> SeccompProfile {
    SeccompProfile {
        type_: type_.into(),
        localhost_profile: profile.map(Into::into),
    }
}

#[test]
fn security_context_is_merged_field_by_field_over_the_hardened_defaults() {
    let policy = |context: SecurityContext| JobPolicy {
        security_context: Some(Box::new(context)),
        ..Default::default()
    };
    let hardened = default_security_context();
    let user = |uid: i64| SecurityContext {
        run_as_user: Some(uid),
        ..Default::default()
    };
    let drop_net_raw = Capabilities {
        drop: Some(vec!["NET_RAW".into()]),
        ..Default::default()
    };
    let localhost = seccomp("Localhost", Some("profiles/runner.json"));
    // (own, defaults) -> the container's context
    let table: Vec<(Option<JobPolicy>, Option<JobPolicy>, SecurityContext)> = vec![
        (None, None, hardened.clone()),
        (
            Some(policy(SecurityContext::default())),
            None,
            hardened.clone(),
        ),
        // A field the user sets wins for that field only.
        (
            Some(policy(user(1000))),
            None,
            SecurityContext {
                run_as_user: Some(1000),
                ..hardened.clone()
            },
        ),
        (
            Some(policy(SecurityContext {
                read_only_root_filesystem: Some(false),
                run_as_non_root: Some(true),
                ..Default::default()
            })),
            None,
            SecurityContext {
                read_only_root_filesystem: Some(false),
                run_as_non_root: Some(true),
                ..hardened.clone()
            },
        ),
        // capabilities and seccompProfile are fields: a user value
        // replaces the default's whole (ref §1.2).
        (
            Some(policy(SecurityContext {
                capabilities: Some(drop_net_raw.clone()),
                seccomp_profile: Some(localhost.clone()),
                ..Default::default()
            })),
            None,
            SecurityContext {
                capabilities: Some(drop_net_raw),
                seccomp_profile: Some(localhost),
                ..hardened.clone()
            },
        ),
        // The cluster's defaults, when the object sets no context.
        (
            None,
            Some(policy(SecurityContext {
                run_as_group: Some(2000),
                ..Default::default()
            })),
            SecurityContext {
                run_as_group: Some(2000),
                ..hardened.clone()
            },
        ),
        // The object's context replaces the cluster's whole, then is
        // merged over the built-in defaults.
        (
            Some(policy(user(1000))),
            Some(policy(SecurityContext {
                run_as_group: Some(2000),
                read_only_root_filesystem: Some(false),
                ..Default::default()
            })),
            SecurityContext {
                run_as_user: Some(1000),
                ..hardened.clone()
            },
        ),
    ];
    for (o, d, want) in table {
        let got = resolve(o.as_ref(), d.as_ref()).security_context;
        assert_eq!(got, want, "{o:?} over {d:?}");
    }
}

#[test]
fn pod_security_context_is_merged_field_by_field_over_the_defaults() {
    let policy = |context: PodSecurityContext| JobPolicy {
        pod_security_context: Some(Box::new(context)),
        ..Default::default()
    };
    let defaults = default_pod_security_context();
    let localhost = seccomp("Localhost", Some("profiles/pod.json"));
    // (own, defaults) -> the pod's context
    let table: Vec<(Option<JobPolicy>, Option<JobPolicy>, PodSecurityContext)> = vec![
        (None, None, defaults.clone()),
        (
            Some(policy(PodSecurityContext::default())),
            None,
            defaults.clone(),
        ),
        // A non-root user without fsGroup still reads the 0440 Secret
        // volumes through the default group.
        (
            Some(policy(PodSecurityContext {
                run_as_user: Some(1000),
                run_as_group: Some(1000),
                run_as_non_root: Some(true),
                ..Default::default()
            })),
            None,
            PodSecurityContext {
                run_as_user: Some(1000),
                run_as_group: Some(1000),
                run_as_non_root: Some(true),
                ..defaults.clone()
            },
        ),
        (
            Some(policy(PodSecurityContext {
                fs_group: Some(2000),
                seccomp_profile: Some(localhost.clone()),
                ..Default::default()
            })),
            None,
            PodSecurityContext {
                fs_group: Some(2000),
                seccomp_profile: Some(localhost),
                ..Default::default()
            },
        ),
        (
            None,
            Some(policy(PodSecurityContext {
                supplemental_groups: Some(vec![5]),
                ..Default::default()
            })),
            PodSecurityContext {
                supplemental_groups: Some(vec![5]),
                ..defaults.clone()
            },
        ),
        // The object's context replaces the cluster's whole: the
        // cluster's fsGroup is not kept, the built-in one is.
        (
            Some(policy(PodSecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            })),
            Some(policy(PodSecurityContext {
                fs_group: Some(3000),
                ..Default::default()
            })),
            PodSecurityContext {
                run_as_user: Some(1000),
                ..defaults.clone()
            },
        ),
    ];
    for (o, d, want) in table {
        let got = resolve(o.as_ref(), d.as_ref()).pod_security_context;
        assert_eq!(got, want, "{o:?} over {d:?}");
    }
}
