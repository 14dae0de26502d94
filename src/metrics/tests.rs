use super::*;

/// (name on the wire, type) of every family of ref §5.
const FAMILIES: [(&str, &str); 33] = [
    ("captf_jobs", "counter"),
    ("captf_job_duration_seconds", "histogram"),
    ("captf_job_step_duration_seconds", "histogram"),
    ("captf_job_queue_seconds", "histogram"),
    ("captf_job_errors", "counter"),
    ("captf_jobs_active", "gauge"),
    ("captf_job_attempts", "histogram"),
    ("captf_resources_changed", "counter"),
    ("captf_drift_resources", "counter"),
    ("captf_reconcile_op_decisions", "counter"),
    ("captf_state_read_errors", "counter"),
    ("captf_outputs_invalid", "counter"),
    ("captf_drift_detected", "gauge"),
    ("captf_ready", "gauge"),
    ("captf_infrastructure_healthy", "gauge"),
    ("captf_state_resources", "gauge"),
    ("captf_state_bytes", "gauge"),
    ("captf_inputs_bytes", "gauge"),
    ("captf_last_success_timestamp_seconds", "gauge"),
    ("captf_unhealthy_samples", "gauge"),
    ("captf_lock_force_unlocks", "counter"),
    ("captf_identity_denied", "counter"),
    ("captf_inputs_hash_changes", "counter"),
    ("captf_remediation_requests", "counter"),
    ("captf_destructive_plan_approvals_consumed", "counter"),
    ("captf_lease_waits", "counter"),
    ("captf_state_backups", "counter"),
    ("captf_state_restores", "counter"),
    ("captf_plan_approvals", "counter"),
    ("captf_build_info", "gauge"),
    ("rest_client_requests", "counter"),
    ("controller_runtime_reconcile", "counter"),
    ("controller_runtime_reconcile_errors", "counter"),
];

/// The shipped alerts (config/prometheus/rules.yaml) use only families
/// registered here: a renamed metric would otherwise silence its alert.
#[test]
fn every_alert_uses_a_registered_family() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/prometheus/rules.yaml");
    let rules: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rules = rules["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 11, "the eleven alerts of ref §5");
    let m = Metrics::new();
    touch_every_family(&m);
    let text = m.encode().unwrap();
    let mut used = 0;
    for rule in rules {
        let expr = rule["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !(word.starts_with("captf_") || word.starts_with("controller_runtime_")) {
                continue;
            }
            used += 1;
            // Queries name samples; the exposition's TYPE line names the family.
            let family = word
                .strip_suffix("_bucket")
                .or_else(|| word.strip_suffix("_total"))
                .unwrap_or(word);
            assert!(
                text.lines().any(
                    |l| l.strip_prefix("# TYPE ").and_then(|l| l.split(' ').next()) == Some(family)
                ),
                "alert {} uses {word}, which is not registered",
                rule["alert"]
            );
        }
    }
    assert!(used >= 10, "only {used} metric references found");
}

/// One series in every family: the library shows a family only once it has one.
fn touch_every_family(m: &Metrics) {
    let (kind, op) = (Kind::Cluster, Op::Apply);
    let job = JobLabels {
        kind,
        op,
        result: JobResult::Succeeded,
    };
    let kind_op = KindOpLabels { kind, op };
    let object = ObjectLabels::new(kind, "ns", "name");
    m.jobs.get_or_create(&job).inc();
    m.job_duration.get_or_create(&job).observe(1.0);
    m.job_step_duration
        .get_or_create(&JobStepLabels {
            kind,
            op,
            step: Step::Init,
        })
        .observe(1.0);
    m.job_queue.get_or_create(&kind_op).observe(1.0);
    m.job_errors
        .get_or_create(&JobErrorLabels {
            kind,
            op,
            error_kind: JobErrorKind::Step,
            step: Step::Apply,
        })
        .inc();
    m.jobs_active.get_or_create(&kind_op).set(1);
    m.job_attempts.get_or_create(&kind_op).observe(1.0);
    m.resources_changed
        .get_or_create(&ResourceChangeLabels {
            kind,
            op,
            action: ResourceAction::Add,
        })
        .inc();
    m.drift_resources
        .get_or_create(&DriftLabels {
            kind,
            action: ResourceAction::Change,
        })
        .inc();
    m.reconcile_op_decisions
        .get_or_create(&DecisionLabels {
            kind,
            op: Op::Apply,
            reason: "no_state",
        })
        .inc();
    m.state_read_errors
        .get_or_create(&StateReadErrorLabels {
            kind,
            reason: StateReadError::Corrupt,
        })
        .inc();
    m.outputs_invalid
        .get_or_create(&KindReasonLabels {
            kind,
            reason: "Schema",
        })
        .inc();
    for family in [
        &m.drift_detected,
        &m.ready,
        &m.infrastructure_healthy,
        &m.state_resources,
        &m.state_bytes,
        &m.inputs_bytes,
    ] {
        family.get_or_create(&object).set(1);
    }
    m.last_success_timestamp
        .get_or_create(&ObjectOpLabels {
            kind,
            namespace: "ns".into(),
            name: "name".into(),
            op: Op::Drift,
        })
        .set(1);
    m.unhealthy_samples
        .get_or_create(&MachineLabels {
            namespace: "ns".into(),
            name: "name".into(),
        })
        .set(1);
    for family in [
        &m.lock_force_unlocks,
        &m.inputs_hash_changes,
        &m.destructive_plan_approvals_consumed,
    ] {
        family.get_or_create(&KindLabels { kind }).inc();
    }
    m.identity_denied
        .get_or_create(&IdentityDeniedLabels {
            reason: IdentityDenied::NotFound,
        })
        .inc();
    m.remediation_requests
        .get_or_create(&RemediationLabels {
            action: RemediationAction::Requested,
        })
        .inc();
    m.lease_waits
        .get_or_create(&LeaseWaitLabels {
            kind,
            reason: LeaseWait::RunLease,
        })
        .inc();
    m.state_backups
        .get_or_create(&BackupLabels {
            kind,
            result: BackupResult::Taken,
        })
        .inc();
    m.state_restores
        .get_or_create(&RestoreLabels {
            kind,
            result: RestoreResult::NotFound,
        })
        .inc();
    m.plan_approvals
        .get_or_create(&ApprovalLabels {
            kind,
            result: ApprovalResult::Approved,
        })
        .inc();
    m.api_request(&http::Method::GET, Some(200));
    m.reconciled(Kind::Cluster, true);
}

#[test]
fn every_family_is_registered_with_its_name_and_type() {
    let m = Metrics::new();
    touch_every_family(&m);
    let text = m.encode().unwrap();
    let mut got: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    got.sort();
    let mut want = FAMILIES.to_vec();
    want.sort();
    assert_eq!(got, want);
    assert!(text.ends_with("# EOF\n"));
    // Counters get their `_total` on the samples.
    assert!(
        text.contains(
            "captf_destructive_plan_approvals_consumed_total{kind=\"TerraformCluster\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn reconciles_count_per_controller_as_controller_runtime_names_them() {
    let m = Metrics::new();
    m.reconciled(Kind::MachinePool, false);
    m.reconciled(Kind::MachinePool, true);
    m.reconciled(Kind::Machine, true);
    let text = m.encode().unwrap();
    for line in [
        r#"controller_runtime_reconcile_total{controller="terraformmachinepool",result="success"} 1"#,
        r#"controller_runtime_reconcile_total{controller="terraformmachinepool",result="error"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="terraformmachinepool"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="terraformmachine"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
    }
}

#[test]
fn build_info_is_one_with_version_commit_and_contract() {
    let text = Metrics::new().encode().unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("captf_build_info{"))
        .expect("a captf_build_info sample");
    assert!(line.ends_with("} 1"), "{line}");
    for label in ["version=\"0.", "commit=\"", "contract=\"v1alpha1\""] {
        assert!(line.contains(label), "{line}");
    }
}

#[test]
fn samples_carry_the_wire_names_of_their_labels() {
    let m = Metrics::new();
    m.jobs
        .get_or_create(&JobLabels {
            kind: Kind::Cluster,
            op: Op::Apply,
            result: JobResult::PlanChanged,
        })
        .inc();
    m.job_errors
        .get_or_create(&JobErrorLabels {
            kind: Kind::Machine,
            op: Op::Destroy,
            error_kind: JobErrorKind::ImageLayout,
            step: Step::NoStep,
        })
        .inc();
    m.job_duration
        .get_or_create(&JobLabels {
            kind: Kind::MachinePool,
            op: Op::Drift,
            result: JobResult::Succeeded,
        })
        .observe(42.0);
    let text = m.encode().unwrap();
    for sample in [
        "captf_jobs_total{kind=\"TerraformCluster\",op=\"apply\",result=\"plan_changed\"} 1",
        "captf_job_errors_total{kind=\"TerraformMachine\",op=\"destroy\",error_kind=\"image-layout\",step=\"none\"} 1",
        "captf_job_duration_seconds_bucket{le=\"60.0\",kind=\"TerraformMachinePool\",op=\"drift\",result=\"succeeded\"} 1",
        "captf_job_duration_seconds_bucket{le=\"30.0\",kind=\"TerraformMachinePool\",op=\"drift\",result=\"succeeded\"} 0",
    ] {
        assert!(text.contains(sample), "missing {sample} in\n{text}");
    }
}

#[test]
fn requests_are_counted_by_method_and_code() {
    let m = Metrics::new();
    m.api_request(&http::Method::GET, Some(200));
    m.reconciled(Kind::Cluster, true);
    m.api_request(&http::Method::GET, Some(200));
    m.reconciled(Kind::Cluster, true);
    m.api_request(&http::Method::PATCH, Some(409));
    m.api_request(&http::Method::DELETE, None);
    let text = m.encode().unwrap();
    for sample in [
        "rest_client_requests_total{method=\"GET\",code=\"200\"} 2",
        "rest_client_requests_total{method=\"PATCH\",code=\"409\"} 1",
        "rest_client_requests_total{method=\"DELETE\",code=\"<error>\"} 1",
    ] {
        assert!(text.contains(sample), "missing {sample} in\n{text}");
    }
}

#[test]
fn forgetting_an_object_removes_its_series_only() {
    let m = Metrics::new();
    for name in ["gone", "stays"] {
        let object = ObjectLabels::new(Kind::Machine, "ns", name);
        for family in [
            &m.drift_detected,
            &m.ready,
            &m.infrastructure_healthy,
            &m.state_resources,
            &m.state_bytes,
            &m.inputs_bytes,
        ] {
            family.get_or_create(&object).set(1);
        }
        for op in [Op::Drift, Op::Refresh, Op::Apply] {
            m.last_success_timestamp
                .get_or_create(&ObjectOpLabels {
                    kind: Kind::Machine,
                    namespace: "ns".into(),
                    name: name.into(),
                    op,
                })
                .set(1_700_000_000);
        }
        m.unhealthy_samples
            .get_or_create(&MachineLabels {
                namespace: "ns".into(),
                name: name.into(),
            })
            .set(2);
    }
    // Same name, other kind: not this object.
    m.ready
        .get_or_create(&ObjectLabels::new(Kind::Cluster, "ns", "gone"))
        .set(1);

    m.forget(Kind::Machine, "ns", "gone");
    let text = m.encode().unwrap();
    let samples = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("name=\"{name}\"")))
            .count()
    };
    assert_eq!(samples("stays"), 6 + 3 + 1);
    assert_eq!(samples("gone"), 1, "{text}");
    assert!(
        text.contains("captf_ready{kind=\"TerraformCluster\",namespace=\"ns\",name=\"gone\"} 1")
    );
}

#[test]
fn label_values_are_distinct() {
    fn distinct(values: Vec<&'static str>) {
        let mut sorted = values.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), values.len(), "{values:?}");
    }
    distinct(Step::ALL.iter().map(|v| v.as_str()).collect());
    distinct(JobErrorKind::ALL.iter().map(|v| v.as_str()).collect());
    distinct(JobResult::ALL.iter().map(|v| v.as_str()).collect());
}
