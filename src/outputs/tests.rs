use super::*;

const SECRET: &str = "s3cr3t-value";
const DECLARED: &str = crate::role::DECLARED_OUTPUTS;

fn outputs(pairs: &[(&str, Value)]) -> BTreeMap<String, Output> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Output::sensitive_json(&v.to_string())))
        .collect()
}

fn facts(kind: Kind, o: &BTreeMap<String, Output>) -> Facts<'_> {
    Facts {
        kind,
        outputs: Some(o),
        applied: true,
        apply_started: true,
        provisioned: false,
        endpoint: None,
        endpoint_input_null: true,
        provider_id: None,
        failure_domain_input: None,
    }
}

fn running() -> (&'static str, Value) {
    ("health", json!({"state": "running", "healthy": true}))
}

fn reason(m: &Mapped) -> (Status, &'static str) {
    let c = m.outputs_valid.as_ref().unwrap();
    (c.status, c.reason)
}

fn health(m: &Mapped) -> (Status, &'static str) {
    (m.healthy.status, m.healthy.reason)
}

#[test]
fn a_cluster_writes_the_endpoint_once_and_lists_its_failure_domains() {
    let o = outputs(&[
        (
            "control_plane_endpoint",
            json!({"host": "api.example", "port": 6443}),
        ),
        (
            "failure_domains",
            json!([{"name": "b", "control_plane": false}, {"name": "a", "attributes": {"zone": "z"}}]),
        ),
        ("exports", json!({"network": SECRET})),
        running(),
    ]);
    let m = map(&facts(Kind::Cluster, &o));
    assert_eq!(reason(&m), (Status::True, "OutputsValid"));
    assert_eq!(health(&m), (Status::True, "Healthy"));
    assert!(m.provisioned && m.endpoint_from_module);
    assert_eq!(
        m.spec["controlPlaneEndpoint"],
        json!({"host": "api.example", "port": 6443})
    );
    let status = m.status.unwrap();
    assert_eq!(
        status["failureDomains"],
        json!([
            {"name": "b", "controlPlane": false},
            {"name": "a", "controlPlane": true, "attributes": {"zone": "z"}}
        ])
    );
    // Not again once set, nor when the apply rendered an endpoint.
    let set = ApiEndpoint {
        host: Some("api.example".into()),
        port: Some(6443),
    };
    let again = map(&Facts {
        endpoint: Some(&set),
        ..facts(Kind::Cluster, &o)
    });
    assert!(again.spec.is_empty() && !again.endpoint_from_module);
    let rendered = map(&Facts {
        endpoint_input_null: false,
        ..facts(Kind::Cluster, &o)
    });
    assert!(rendered.spec.is_empty());
}

#[test]
fn null_outputs_are_pending_or_cleared_and_bad_ones_invalid() {
    // The cluster's nullable outputs: absent (tofu keeps no null output).
    let o = outputs(&[running()]);
    let m = map(&facts(Kind::Cluster, &o));
    assert_eq!(reason(&m), (Status::True, "OutputsValid"));
    assert!(m.status.unwrap().is_empty() && m.spec.is_empty());
    let cases = [
        json!({"host": "h"}),
        json!({"host": "", "port": 1}),
        json!({"host": "h", "port": 70000}),
    ];
    for endpoint in cases {
        let o = outputs(&[("control_plane_endpoint", endpoint), running()]);
        let m = map(&facts(Kind::Cluster, &o));
        assert_eq!(reason(&m), (Status::False, "OutputsInvalid"));
        assert!(!m.provisioned);
    }
    for (name, value) in [
        ("failure_domains", json!([{"name": "a"}, {"name": "a"}])),
        ("failure_domains", json!([{"name": ""}])),
        ("exports", json!({"ratio": 0.5})),
        ("health", json!({"state": "sleeping", "healthy": true})),
    ] {
        let o = outputs(&[(name, value)]);
        let m = map(&facts(Kind::Cluster, &o));
        assert_eq!(reason(&m), (Status::False, "OutputsInvalid"), "{name}");
    }
    // A pool's list and replicas are required.
    let o = outputs(&[running(), ("replicas", json!(2))]);
    let m = map(&facts(Kind::MachinePool, &o));
    assert_eq!(reason(&m), (Status::Unknown, "OutputsPending"));
}

#[test]
fn a_machine_gets_its_provider_id_once_and_sorted_addresses() {
    let o = outputs(&[
        ("provider_id", json!("test://m")),
        (
            "addresses",
            json!([
                {"type": "Hostname", "address": "m"},
                {"type": "ExternalIP", "address": "203.0.113.1"},
                {"type": "InternalIP", "address": "10.0.0.2"},
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "InternalDNS", "address": "m.internal"},
            ]),
        ),
        ("failure_domain", json!("fd-a")),
        ("interruptible", Value::Null),
        running(),
    ]);
    let m = map(&Facts {
        failure_domain_input: Some("fd-a"),
        ..facts(Kind::Machine, &o)
    });
    assert_eq!(reason(&m), (Status::True, "OutputsValid"));
    assert!(m.provisioned);
    assert_eq!(m.spec["providerID"], json!("test://m"));
    let status = m.status.unwrap();
    let order: Vec<&str> = status["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        ["10.0.0.1", "10.0.0.2", "m.internal", "203.0.113.1", "m"]
    );
    assert_eq!(status["failureDomain"], json!("fd-a"));
    assert_eq!(status["interruptible"], json!(false));

    // Another provider ID later: kept, and said.
    let changed = map(&Facts {
        provider_id: Some("test://first"),
        provisioned: true,
        failure_domain_input: Some("fd-a"),
        ..facts(Kind::Machine, &o)
    });
    assert_eq!(reason(&changed), (Status::False, "ProviderIDChanged"));
    assert!(changed.spec.is_empty());
    // A failure domain other than the input.
    let elsewhere = map(&Facts {
        failure_domain_input: Some("fd-b"),
        ..facts(Kind::Machine, &o)
    });
    assert_eq!(reason(&elsewhere), (Status::False, "FailureDomainMismatch"));
    assert!(!elsewhere.provisioned);
}

#[test]
fn a_null_provider_id_waits_before_provisioning_and_means_terminated_after() {
    let o = outputs(&[("provider_id", json!("")), running()]);
    let before = map(&facts(Kind::Machine, &o));
    assert_eq!(reason(&before), (Status::Unknown, "OutputsPending"));
    assert_eq!(health(&before), (Status::False, "Provisioning"));
    assert!(!before.provisioned);
    let after = map(&Facts {
        provisioned: true,
        provider_id: Some("test://m"),
        ..facts(Kind::Machine, &o)
    });
    assert!(after.provisioned && after.spec.is_empty());
    assert_eq!(health(&after), (Status::False, "InstanceTerminated"));
}

#[test]
fn health_maps_to_infrastructure_healthy() {
    let cases = [
        (
            json!({"state": "running", "healthy": true}),
            (Status::True, "Healthy"),
        ),
        (
            json!({"state": "running", "healthy": false}),
            (Status::False, "InstanceUnhealthy"),
        ),
        (
            json!({"state": "degraded", "healthy": false}),
            (Status::False, "InstanceDegraded"),
        ),
        (
            json!({"state": "stopped", "healthy": false}),
            (Status::False, "InstanceStopped"),
        ),
        (
            json!({"state": "terminated", "healthy": false}),
            (Status::False, "InstanceTerminated"),
        ),
        (
            json!({"state": "unknown", "healthy": false}),
            (Status::Unknown, "HealthUnknown"),
        ),
        (
            json!({"state": "pending", "healthy": false}),
            (Status::False, "InstancePending"),
        ),
    ];
    for (h, want) in cases {
        let o = outputs(&[("health", h.clone())]);
        let m = map(&Facts {
            provisioned: true,
            ..facts(Kind::Cluster, &o)
        });
        assert_eq!(health(&m), want, "{h}");
    }
    // Pending keeps a fresh cluster from being provisioned.
    let o = outputs(&[("health", json!({"state": "pending", "healthy": false}))]);
    let m = map(&facts(Kind::Cluster, &o));
    assert!(!m.provisioned);
    assert_eq!(health(&m), (Status::False, "Provisioning"));
    // No health at all: unknown, and no gate.
    let o = outputs(&[]);
    let m = map(&facts(Kind::Cluster, &o));
    assert!(m.provisioned);
    assert_eq!(health(&m), (Status::Unknown, "HealthUnknown"));
    // No state yet.
    let m = map(&Facts {
        outputs: None,
        apply_started: false,
        ..facts(Kind::Cluster, &o)
    });
    assert_eq!(
        (m.outputs_valid.clone(), health(&m)),
        (None, (Status::Unknown, "WaitingForProvisioning"))
    );
}

#[test]
fn a_pool_lists_sorted_unique_ids_replicas_and_capped_instances() {
    let ids: Vec<String> = (0..1002).map(|i| format!("test://p-{i:04}")).collect();
    let instances: Vec<Value> = ids
        .iter()
        .map(|id| json!({"provider_id": id, "state": "running"}))
        .collect();
    let mut list = ids.clone();
    list.reverse();
    list.push(ids[0].clone());
    let o = outputs(&[
        ("provider_id_list", json!(list)),
        ("replicas", json!(1002)),
        ("instances", json!(instances)),
        running(),
    ]);
    let m = map(&facts(Kind::MachinePool, &o));
    assert_eq!(reason(&m), (Status::True, "InstancesTruncated"));
    assert!(m.provisioned);
    assert_eq!(m.spec["providerIDList"], json!(ids));
    assert_eq!(m.spec["providerID"], Value::Null);
    let status = m.status.unwrap();
    assert_eq!(status["replicas"], json!(1002));
    assert_eq!(status["ready"], json!(true));
    assert_eq!(
        status["instances"].as_array().unwrap().len(),
        decode::MAX_INSTANCES
    );
    // Zero members: replicas 0 written, and no instances.
    let o = outputs(&[
        ("provider_id_list", json!([])),
        ("replicas", json!(0)),
        running(),
    ]);
    let m = map(&facts(Kind::MachinePool, &o));
    let status = m.status.unwrap();
    assert_eq!(status["replicas"], json!(0));
    assert!(!status.contains_key("instances"));
}

#[test]
fn no_message_carries_an_output_value() {
    let bad = [
        ("provider_id", json!(SECRET.repeat(100))),
        ("failure_domain", json!(SECRET.repeat(30))),
        ("addresses", json!([{"type": SECRET, "address": "a"}])),
        ("exports", json!({SECRET: 0.5})),
        ("health", json!({"state": SECRET, "healthy": true})),
    ];
    for kind in [Kind::Cluster, Kind::Machine, Kind::MachinePool] {
        for (name, value) in &bad {
            let o = outputs(&[(name, value.clone())]);
            let m = map(&facts(kind, &o));
            for c in [m.outputs_valid.as_ref().unwrap(), &m.healthy] {
                assert!(
                    !c.message.contains(SECRET),
                    "{kind:?} {name}: {}",
                    c.message
                );
            }
        }
    }
}

#[test]
fn nothing_is_mapped_from_a_state_no_apply_adopted() {
    let o = outputs(&[("provider_id", json!("test://m")), running()]);
    let m = map(&Facts {
        applied: false,
        ..facts(Kind::Machine, &o)
    });
    assert_eq!(m.outputs_valid, None);
    assert!(!m.provisioned && m.spec.is_empty() && m.status.is_none());
}

#[test]
fn an_undeclared_required_output_is_missing_a_null_one_pending() {
    let declared = |names: &[&str]| (DECLARED, json!(names));
    // (kind, outputs, want)
    let cases = [
        // Every required output declared, the optional ones left out.
        (
            Kind::Cluster,
            vec![declared(&[
                "control_plane_endpoint",
                "failure_domains",
                "exports",
            ])],
            (Status::True, "OutputsValid"),
        ),
        (
            Kind::Cluster,
            vec![declared(&["control_plane_endpoint", "health"]), running()],
            (Status::False, "OutputsMissing"),
        ),
        // Declared and null: pending, not missing.
        (
            Kind::Machine,
            vec![declared(&["provider_id", "interruptible"]), running()],
            (Status::Unknown, "OutputsPending"),
        ),
        // Missing wins over an invalid value.
        (
            Kind::Machine,
            vec![
                declared(&["provider_id", "addresses"]),
                ("provider_id", json!("test://m")),
                ("addresses", json!("not a list")),
            ],
            (Status::False, "OutputsMissing"),
        ),
        (
            Kind::MachinePool,
            vec![declared(&["replicas"]), ("replicas", json!(0))],
            (Status::False, "OutputsMissing"),
        ),
        // A state rendered before the list: everything counts as declared.
        (
            Kind::MachinePool,
            vec![("replicas", json!(0)), ("provider_id_list", json!([]))],
            (Status::True, "OutputsValid"),
        ),
        (
            Kind::MachinePool,
            vec![(DECLARED, json!("provider_id_list"))],
            (Status::False, "OutputsInvalid"),
        ),
    ];
    for (kind, pairs, want) in cases {
        let o = outputs(&pairs);
        let m = map(&facts(kind, &o));
        assert_eq!(reason(&m), want, "{kind:?} {pairs:?}");
        if want.1 == "OutputsMissing" {
            assert!(!m.provisioned || kind == Kind::MachinePool, "{kind:?}");
        }
    }
    let o = outputs(&[declared(&["health"]), running()]);
    let m = map(&facts(Kind::Machine, &o));
    assert_eq!(
        m.outputs_valid.unwrap().message,
        "the module declares no output provider_id, interruptible"
    );
    assert!(!m.provisioned);
}

#[test]
fn an_apply_start_makes_a_waiting_object_provisioning() {
    for (current, after) in [
        (None, Some("Provisioning")),
        (
            Some((Status::Unknown, "WaitingForProvisioning")),
            Some("Provisioning"),
        ),
        (Some((Status::False, "Provisioning")), None),
        (Some((Status::True, "Healthy")), None),
        (Some((Status::False, "InstanceStopped")), None),
    ] {
        let cond = apply_started(current);
        assert_eq!(cond.as_ref().map(|c| c.reason), after, "{current:?}");
        if let Some(c) = cond {
            assert_eq!(
                (c.type_, c.status),
                (conditions::INFRASTRUCTURE_HEALTHY, Status::False)
            );
        }
    }
}
