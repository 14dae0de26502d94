use super::*;

fn workload(kind: Kind, name: &str, cluster: Option<&str>, account: Option<&str>) -> WorkloadFacts {
    WorkloadFacts {
        kind,
        name: name.into(),
        cluster_name: cluster.map(Into::into),
        service_account: account.map(Into::into),
    }
}

fn cluster(label: Option<&str>, default: Option<&str>) -> ClusterFacts {
    ClusterFacts {
        cluster_name: label.map(Into::into),
        default_service_account: default.map(Into::into),
    }
}

fn keep(names: &[&str]) -> Plan {
    Plan::Prune {
        keep: names.iter().map(|n| (*n).to_owned()).collect(),
    }
}

#[test]
fn plans() {
    use Kind::{Cluster, Machine, MachinePool};
    let long = "c".repeat(70);
    let long_hashed = names::label_value(&long);
    let table: Vec<(&str, NamespaceFacts, Plan)> = vec![
        ("nothing left", NamespaceFacts::default(), Plan::Empty),
        (
            "a cluster with no account of its own",
            NamespaceFacts {
                workloads: vec![workload(Cluster, "prod", Some("prod"), None)],
                clusters: vec![cluster(Some("prod"), Some("deployer"))],
            },
            keep(&["captf-runner"]),
        ),
        (
            "a cluster's own account",
            NamespaceFacts {
                workloads: vec![workload(Cluster, "prod", Some("prod"), Some("builder"))],
                clusters: vec![cluster(Some("prod"), None)],
            },
            keep(&["builder"]),
        ),
        (
            "a machine takes its cluster's default",
            NamespaceFacts {
                workloads: vec![
                    workload(Cluster, "prod", Some("prod"), Some("builder")),
                    workload(Machine, "m", Some("prod"), None),
                ],
                clusters: vec![cluster(Some("prod"), Some("deployer"))],
            },
            keep(&["builder", "deployer"]),
        ),
        (
            "a pool's own account wins over the default",
            NamespaceFacts {
                workloads: vec![workload(MachinePool, "p", Some("prod"), Some("mine"))],
                clusters: vec![cluster(Some("prod"), Some("deployer"))],
            },
            keep(&["mine"]),
        ),
        (
            "a cluster without defaults gives captf-runner",
            NamespaceFacts {
                workloads: vec![workload(Machine, "m", Some("prod"), None)],
                clusters: vec![
                    cluster(Some("prod"), None),
                    cluster(Some("other"), Some("x")),
                ],
            },
            keep(&["captf-runner"]),
        ),
        (
            "a missing cluster keeps every default and captf-runner",
            NamespaceFacts {
                workloads: vec![workload(Machine, "m", Some("gone"), None)],
                clusters: vec![
                    cluster(Some("a"), Some("deployer")),
                    cluster(Some("b"), None),
                    cluster(None, Some("unlabelled")),
                ],
            },
            keep(&["captf-runner", "deployer", "unlabelled"]),
        ),
        (
            "no cluster label is a cluster not found",
            NamespaceFacts {
                workloads: vec![workload(MachinePool, "p", None, None)],
                clusters: vec![cluster(Some("a"), Some("deployer"))],
            },
            keep(&["captf-runner", "deployer"]),
        ),
        (
            "an unresolved object with its own account needs no default",
            NamespaceFacts {
                workloads: vec![workload(Machine, "m", Some("gone"), Some("mine"))],
                clusters: vec![cluster(Some("a"), Some("deployer"))],
            },
            keep(&["mine"]),
        ),
        (
            "every cluster with the label counts",
            NamespaceFacts {
                workloads: vec![workload(Machine, "m", Some("prod"), None)],
                clusters: vec![
                    cluster(Some("prod"), Some("one")),
                    cluster(Some("prod"), Some("two")),
                ],
            },
            keep(&["one", "two"]),
        ),
        (
            "a long cluster name matches its hashed label",
            NamespaceFacts {
                workloads: vec![workload(Machine, "m", Some(&long), None)],
                clusters: vec![
                    cluster(Some(&long_hashed), Some("hashed")),
                    cluster(Some("other"), Some("unrelated")),
                ],
            },
            keep(&["hashed"]),
        ),
    ];
    for (what, facts, want) in table {
        assert_eq!(plan(&facts), want, "{what}");
    }
}

#[test]
fn unresolved_objects() {
    let facts = NamespaceFacts {
        workloads: vec![
            workload(Kind::Cluster, "c", Some("gone"), None),
            workload(Kind::Machine, "found", Some("prod"), None),
            workload(Kind::Machine, "own", Some("gone"), Some("x")),
            workload(Kind::Machine, "lost", Some("gone"), None),
            workload(Kind::MachinePool, "unlabelled", None, None),
        ],
        clusters: vec![cluster(Some("prod"), None)],
    };
    let names: Vec<_> = unresolved(&facts).map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["lost", "unlabelled"]);
}

fn sa(namespace: &str, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        api_group: None,
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn subjects_kept() {
    let user = Subject {
        kind: "User".into(),
        name: "captf-runner".into(),
        namespace: None,
        api_group: Some("rbac.authorization.k8s.io".into()),
    };
    let mut grouped = sa("ns", "captf-runner");
    grouped.api_group = Some("example.com".into());
    let subjects = vec![
        sa("ns", "builder"),
        sa("ns", "captf-runner"),
        sa("other", "captf-runner"),
        user,
        grouped,
        sa("ns", "deployer"),
    ];
    let table: &[(&[&str], Vec<Subject>)] = &[
        (&["captf-runner"], vec![sa("ns", "captf-runner")]),
        (
            &["deployer", "captf-runner", "absent"],
            vec![sa("ns", "captf-runner"), sa("ns", "deployer")],
        ),
        (&[], vec![]),
    ];
    for (names, want) in table {
        assert_eq!(
            kept_subjects(&subjects, "ns", &set(names)),
            *want,
            "{names:?}"
        );
    }
}

#[test]
fn only_the_runner_binding_is_pruned_and_only_when_it_changes() {
    let binding = rbac::role_binding("ns", &set(&["builder", "captf-runner"]));
    let updated = pruned(&binding, "ns", &set(&["captf-runner"])).unwrap();
    assert_eq!(updated.subjects, Some(vec![sa("ns", "captf-runner")]));
    assert_eq!(
        updated.metadata, binding.metadata,
        "the resourceVersion guard stays"
    );
    assert_eq!(updated.role_ref, binding.role_ref);

    assert_eq!(
        pruned(&binding, "ns", &set(&["builder", "captf-runner", "x"])),
        None
    );
    let emptied = pruned(&binding, "ns", &set(&["x"])).unwrap();
    assert_eq!(emptied.subjects, Some(vec![]));
    let mut none = binding.clone();
    none.subjects = None;
    assert_eq!(pruned(&none, "ns", &set(&[])), None);

    let mut renamed = binding.clone();
    renamed.metadata.name = Some("something-else".into());
    assert_eq!(pruned(&renamed, "ns", &set(&[])), None);
    let mut foreign = binding;
    foreign.role_ref.name = "admin".into();
    assert_eq!(pruned(&foreign, "ns", &set(&[])), None);
}

#[test]
fn categories() {
    let status = |code| {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    };
    assert_eq!(SweepError::Api(status(409)).category(), Category::Transient);
    assert_eq!(SweepError::Api(status(403)).category(), Category::Invalid);
}
