//! The AdmissionReview bodies the webhook bench sends: a CREATE and an
//! UPDATE of each workload kind as the API server sends them, and the
//! memory cases (the largest realistic UPDATE, a hostile body, objects at
//! the values cap).

use axum::body::Bytes;
use captf::server::webhook::BODY_LIMIT;
use captf::webhooks::decode::MAX_VALUES;
use serde_json::{Value, json};

const GROUP_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";

/// `count` module variables, each value `value(i)`.
fn variables(count: usize, value: impl Fn(usize) -> Value) -> Value {
    let variables: serde_json::Map<String, Value> = (0..count)
        .map(|i| (format!("variable_{i:03}"), value(i)))
        .collect();
    Value::Object(variables)
}

fn short_values(count: usize, generation: u64) -> Value {
    variables(count, |i| {
        json!(format!("value-{i}-of-a-realistic-length-gen-{generation}"))
    })
}

/// An object of `kind` as the API server sends it: with managed fields, the
/// last-applied annotation, owner and labels, and `spec`.
fn object(kind: &str, name: &str, generation: u64, owner: (&str, &str), spec: Value) -> Value {
    json!({
        "apiVersion": GROUP_VERSION,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "clusters",
            "uid": "7a5c7a54-2b1f-4f52-a4b4-4a0f0c7e9f11",
            "resourceVersion": format!("{}", 41_000 + generation),
            "generation": generation,
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "prod-eu-1", "team": "platform"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": spec.to_string()},
            "ownerReferences": [{"apiVersion": owner.0, "kind": owner.1, "name": name, "uid": "0f7d2f7e-8f5a-4a51-9a63-3c5f0b1d2e3a", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": GROUP_VERSION, "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:source": {"f:image": {}}, "f:variables": {}}}}]
        },
        "spec": spec
    })
}

/// `object` with the status the manager writes once it has applied it: on
/// an UPDATE the API server sends the stored status in both objects.
fn applied(mut object: Value) -> Value {
    let condition = |kind: &str, reason: &str| json!({"type": kind, "status": "True", "reason": reason, "message": "", "lastTransitionTime": "2025-06-01T10:04:12Z", "observedGeneration": 1});
    object["status"] = json!({
        "conditions": [
            condition("Ready", "Ready"),
            condition("DependenciesReady", "DependenciesReady"),
            condition("Provisioned", "Applied"),
            condition("StateHealthy", "StateRead"),
            condition("Paused", "NotPaused"),
        ],
        "initialization": {"provisioned": true},
        "observedGeneration": 1,
        "lastRun": {
            "job": "captf-apply-tc-prod-eu-1-7d9f2",
            "operation": "apply",
            "steps": [
                {"name": "init", "exitCode": 0, "durationMilliseconds": 4210},
                {"name": "plan", "exitCode": 0, "durationMilliseconds": 9876},
                {"name": "apply", "exitCode": 0, "durationMilliseconds": 61234}
            ]
        },
        "lastRefresh": "2025-06-01T10:04:12Z",
        "observedStateSerial": 7,
        "stateSecretSuffix": "tc-prod-eu-1",
        "source": {"image": "registry.example/infra/module:v1.4.2", "imageDigest": "sha256:3f1c5e0b8a7d6c4e2f9a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e", "runtimeVersion": "OpenTofu v1.12.6"},
        "stateBackups": [
            {"serial": 7, "takenAt": "2025-06-01T10:04:12Z", "bytes": 48211},
            {"serial": 6, "takenAt": "2025-05-30T08:12:40Z", "bytes": 47982},
            {"serial": 5, "takenAt": "2025-05-28T16:51:03Z", "bytes": 47730}
        ]
    });
    object
}

/// The AdmissionReview around `object` (and `old` on UPDATE).
fn review(kind: &str, resource: &str, object: &Value, old: Option<&Value>) -> Bytes {
    let (operation, options) = match old {
        None => ("CREATE", "CreateOptions"),
        Some(_) => ("UPDATE", "UpdateOptions"),
    };
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": kind},
            "requestResource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": "clusters",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:capi-system:capi-controller-manager", "uid": "3c1f", "groups": ["system:serviceaccounts", "system:serviceaccounts:capi-system", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options, "fieldManager": "kubectl"}
        }
    });
    Bytes::from(review.to_string())
}

fn cluster_spec(variables: Value) -> Value {
    json!({
        "source": {"image": "registry.example/infra/network-module:v1.4.2", "imagePullPolicy": "IfNotPresent"},
        "variables": variables,
        "identityRef": {"name": "platform-credentials"},
        "jobs": {"activeDeadlineSeconds": 3600, "lockTimeoutSeconds": 300, "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}]},
        "drift": {"intervalSeconds": 1800, "action": "Report"},
        "applyPolicy": "Automatic"
    })
}

fn cluster(generation: u64, variables: Value) -> Value {
    let owner = ("cluster.x-k8s.io/v1beta2", "Cluster");
    object(
        "TerraformCluster",
        "prod-eu-1",
        generation,
        owner,
        cluster_spec(variables),
    )
}

fn machine(provider_id: Option<&str>) -> Value {
    let mut spec = json!({
        "source": {"image": "registry.example/infra/vm-module:v2.0.1", "imagePullPolicy": "IfNotPresent"},
        "variables": short_values(16, 1),
        "variablesFrom": [{"configMapRef": {"name": "vm-sizes"}, "optional": false, "format": "JSON"}],
        "jobs": {"lockTimeoutSeconds": 120}
    });
    if let Some(id) = provider_id {
        spec["providerID"] = json!(id);
    }
    let owner = ("cluster.x-k8s.io/v1beta2", "Machine");
    object("TerraformMachine", "prod-eu-1-md-0-x7k2p", 1, owner, spec)
}

fn machine_pool(generation: u64, provider_ids: &[&str]) -> Value {
    let mut spec = json!({
        "source": {"image": "registry.example/infra/pool-module:v1.1.0", "imagePullPolicy": "IfNotPresent"},
        "variables": short_values(20, generation),
        "drift": {"intervalSeconds": 600, "action": "Report"}
    });
    if !provider_ids.is_empty() {
        spec["providerIDList"] = json!(provider_ids);
    }
    let owner = ("cluster.x-k8s.io/v1beta2", "MachinePool");
    object(
        "TerraformMachinePool",
        "prod-eu-1-pool-0",
        generation,
        owner,
        spec,
    )
}

/// A CREATE and an UPDATE of each workload kind, each of them allowed.
pub fn cases() -> Vec<(&'static str, Bytes)> {
    let (clusters, machines, pools) = (
        "terraformclusters",
        "terraformmachines",
        "terraformmachinepools",
    );
    let cluster_v1 = cluster(1, short_values(24, 1));
    let cluster_v2 = cluster(2, short_values(24, 2));
    let machine_old = machine(None);
    let machine_new = machine(Some("aws:///eu-west-1a/i-0abc"));
    let pool_v1 = machine_pool(1, &[]);
    let pool_v2 = machine_pool(2, &["aws:///eu-west-1a/i-1", "aws:///eu-west-1b/i-2"]);
    // An UPDATE's objects carry the stored status; a CREATE's has none.
    let (cluster_applied, pool_applied) = (applied(cluster_v1.clone()), applied(pool_v1.clone()));
    let (machine_applied, machine_new) = (applied(machine_old.clone()), applied(machine_new));
    let (cluster_v2, pool_v2) = (applied(cluster_v2), applied(pool_v2));
    vec![
        (
            "TerraformCluster CREATE",
            review("TerraformCluster", clusters, &cluster_v1, None),
        ),
        (
            "TerraformCluster UPDATE",
            review(
                "TerraformCluster",
                clusters,
                &cluster_v2,
                Some(&cluster_applied),
            ),
        ),
        (
            "TerraformMachine CREATE",
            review("TerraformMachine", machines, &machine_old, None),
        ),
        (
            "TerraformMachine UPDATE",
            review(
                "TerraformMachine",
                machines,
                &machine_new,
                Some(&machine_applied),
            ),
        ),
        (
            "TerraformMachinePool CREATE",
            review("TerraformMachinePool", pools, &pool_v1, None),
        ),
        (
            "TerraformMachinePool UPDATE",
            review("TerraformMachinePool", pools, &pool_v2, Some(&pool_applied)),
        ),
    ]
}

/// A realistic largest UPDATE: as many variables of long values (PEM-like
/// text of 6.5 KB) as fit the body limit in an object and its old version,
/// with the last-applied annotation (a second copy of the spec) in each.
pub fn large_update() -> Bytes {
    let pem = |i: usize, generation: u64| {
        let line: String = format!(
            "{i:04}{generation:02}{}",
            "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo".repeat(2)
        )
        .chars()
        .take(64)
        .collect();
        format!(
            "-----BEGIN CERTIFICATE-----\n{}-----END CERTIFICATE-----\n",
            format!("{line}\n").repeat(100)
        )
    };
    let build = |count: usize| {
        let old = cluster(7, variables(count, |i| json!(pem(i, 7))));
        let new = cluster(8, variables(count, |i| json!(pem(i, 8))));
        review("TerraformCluster", "terraformclusters", &new, Some(&old))
    };
    (1..=256)
        .rev()
        .map(build)
        .find(|body| body.len() <= BODY_LIMIT)
        .expect("one variable fits")
}

/// 3 MB of JSON that is 1.5M values: an array of zeros in spec.variables.
pub fn hostile_create() -> Bytes {
    let zeros = format!("[{}]", vec!["0"; 1_500_000].join(","));
    let spec = cluster_spec(json!({"list": "LIST"}));
    let object = object(
        "TerraformCluster",
        "prod-eu-1",
        1,
        ("cluster.x-k8s.io/v1beta2", "Cluster"),
        spec,
    );
    let body = review("TerraformCluster", "terraformclusters", &object, None);
    // Spliced in as text: a Value of it would be the very tree at stake.
    let body = String::from_utf8_lossy(&body).replacen("\"LIST\"", &zeros, 1);
    Bytes::from(body)
}

/// An UPDATE whose objects each hold just under [`MAX_VALUES`] in
/// `spec.variables.list`, as `values` (JSON text) repeated: the shapes that
/// cost most to decode per value counted.
pub fn at_the_cap(value: &str, counted: usize) -> Bytes {
    // The rest of each object counts fewer than 500.
    let list = format!("[{}]", vec![value; (MAX_VALUES - 500) / counted].join(","));
    let old = cluster(1, json!({"list": "LIST"}));
    let new = cluster(2, json!({"list": "LIST"}));
    let body = review("TerraformCluster", "terraformclusters", &new, Some(&old));
    // Spliced in as text into spec.variables (the annotation's copy of the
    // spec is escaped, so it does not match).
    Bytes::from(String::from_utf8_lossy(&body).replace("\"LIST\"", &list))
}

/// An UPDATE whose objects each hold just under [`MAX_VALUES`] in short
/// annotations (`"a12345":""`): the densest metadata, one value an entry.
pub fn dense_annotations() -> Bytes {
    let entries: Vec<String> = (0..MAX_VALUES - 500)
        .map(|i| format!(r#""a{i}":"""#))
        .collect();
    let annotations = entries.join(",");
    let old = cluster(1, json!({"region": "eu"}));
    let new = cluster(2, json!({"region": "eu"}));
    let body = review("TerraformCluster", "terraformclusters", &new, Some(&old));
    // Spliced in as text into each object's annotations (the
    // last-applied copy is escaped, so it does not match).
    let spliced = String::from_utf8_lossy(&body).replace(
        r#""annotations":{"#,
        &format!(r#""annotations":{{{annotations},"#),
    );
    Bytes::from(spliced)
}
