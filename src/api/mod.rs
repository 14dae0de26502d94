//! The API of CAPTF: the seven kinds of `infrastructure.cluster.x-k8s.io/v1alpha1`
//! (ref §1) and the CustomResourceDefinitions generated from them.
//!
//! The CRDs under `config/crd/` are the output of [`crd_files`]; a unit test
//! fails when they drift from the types here.

mod capi;
mod cluster;
mod flat;
mod identity;
mod machine;
mod machine_pool;
mod shared;
mod status;
mod templates;
mod variables;

pub use capi::*;
pub use cluster::*;
pub use identity::*;
pub use machine::*;
pub use machine_pool::*;
pub use shared::*;
pub use status::*;
pub use templates::*;
pub use variables::Variables;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::keys::MOVE_HIERARCHY_LABEL;

/// The API group of every kind.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// The API version of every kind.
pub const VERSION: &str = "v1alpha1";

/// Labels every CRD carries: the Cluster API contract it implements (mapped to
/// the version that implements it) and the clusterctl provider it belongs to.
const CRD_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta2", VERSION),
    ("cluster.x-k8s.io/provider", "infrastructure-terraform"),
];

/// The printer columns of the three workload kinds (what `kubectl get`
/// shows): the Ready condition, provisioned, the running operation, age. The
/// identity shows Ready and age. Set here rather than in each kind's derive so
/// that the columns are written once.
fn printer_columns(kind: &str) -> Option<Vec<CustomResourceColumnDefinition>> {
    let column = |name: &str, type_: &str, json_path: &str, description: &str| {
        CustomResourceColumnDefinition {
            name: name.into(),
            type_: type_.into(),
            json_path: json_path.into(),
            description: Some(description.into()),
            ..Default::default()
        }
    };
    let ready = column(
        "Ready",
        "string",
        r#".status.conditions[?(@.type=="Ready")].status"#,
        "Status of the Ready condition",
    );
    let age = column(
        "Age",
        "date",
        ".metadata.creationTimestamp",
        "Time since creation",
    );
    match kind {
        "TerraformCluster" | "TerraformMachine" | "TerraformMachinePool" => Some(vec![
            ready,
            column(
                "Provisioned",
                "boolean",
                ".status.initialization.provisioned",
                "Whether the infrastructure is provisioned",
            ),
            column(
                "Operation",
                "string",
                ".status.activeJob.operation",
                "The operation of the running Job",
            ),
            age,
        ]),
        "TerraformClusterIdentity" => Some(vec![ready, age]),
        _ => None,
    }
}

/// The seven CRDs, labeled and with their printer columns, in a fixed order:
/// the workload kinds, the templates, then the identity. Use these rather than
/// a kind's own `crd()`, which lacks the labels and columns.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut identity = TerraformClusterIdentity::crd();
    identity
        .metadata
        .labels
        .get_or_insert_default()
        .insert(MOVE_HIERARCHY_LABEL.into(), String::new());
    let mut crds = vec![
        TerraformCluster::crd(),
        TerraformMachine::crd(),
        TerraformMachinePool::crd(),
        TerraformClusterTemplate::crd(),
        TerraformMachineTemplate::crd(),
        TerraformMachinePoolTemplate::crd(),
        identity,
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_default();
        for (key, value) in CRD_LABELS {
            labels.insert(key.into(), value.into());
        }
        let columns = printer_columns(&crd.spec.names.kind);
        for version in &mut crd.spec.versions {
            version.additional_printer_columns = columns.clone();
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                *schema = without_nulls(schema);
            }
        }
    }
    crds
}

/// Drops `nullable: true`, and the `null` that marks an optional enum, from a
/// schema. The derived schema makes every `Option` nullable, so the API server
/// would store an explicit `null`; without it the server prunes nulls, and an
/// object never holds `null` in place of an absent field (as with the CRDs
/// that controller-gen writes for the Go implementation).
fn without_nulls(schema: &JSONSchemaProps) -> JSONSchemaProps {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                // A property named "nullable" or "enum" would hold a schema
                // object, so only the keywords are touched.
                if map
                    .get("nullable")
                    .is_some_and(serde_json::Value::is_boolean)
                {
                    map.remove("nullable");
                }
                if let Some(serde_json::Value::Array(values)) = map.get_mut("enum") {
                    values.retain(|v| !v.is_null());
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(schema).expect("a schema serializes to JSON");
    strip(&mut value);
    serde_json::from_value(value).expect("removing keywords keeps a valid schema")
}

/// The CRDs as one multi-document YAML stream, in the order of [`crds`].
pub fn crds_yaml() -> String {
    serde_saphyr::to_string_multiple(&crds()).expect("a CRD serializes to YAML")
}

/// The files of `config/crd/`, as (path relative to `config/crd/`, content):
/// one `bases/<group>_<plural>.yaml` per kind, and the kustomization that
/// lists them.
pub fn crd_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = crds()
        .iter()
        .map(|crd| {
            let name = format!("bases/{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            let yaml = serde_saphyr::to_string(crd).expect("a CRD serializes to YAML");
            (name, yaml)
        })
        .collect();
    let mut kustomization = String::from(
        "# Generated from src/api by `CAPTF_UPDATE_CRDS=1 cargo test --lib api`; do not edit.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         resources:\n",
    );
    for (name, _) in &files {
        kustomization.push_str(&format!("- {name}\n"));
    }
    files.push(("kustomization.yaml".into(), kustomization));
    files
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use serde_json::{Value, json};

    use super::*;

    const UPDATE_VARIABLE: &str = "CAPTF_UPDATE_CRDS";

    fn crd_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/crd")
    }

    /// Compares every committed file with the generated one; with
    /// `CAPTF_UPDATE_CRDS=1` it rewrites the files that differ instead.
    #[test]
    fn committed_crds_match_the_code() {
        let dir = crd_dir();
        let update = std::env::var(UPDATE_VARIABLE).is_ok_and(|v| v == "1");
        let files = crd_files();
        let mut drifted = Vec::new();
        for (name, generated) in &files {
            let path = dir.join(name);
            if std::fs::read_to_string(&path).ok().as_ref() == Some(generated) {
                continue;
            }
            if update {
                std::fs::create_dir_all(path.parent().expect("a file has a parent")).unwrap();
                std::fs::write(&path, generated).unwrap();
            } else {
                drifted.push(name.clone());
            }
        }
        // The Helm chart ships the same CRDs, flat under charts/captf/crds/.
        let chart = dir.join("../../charts/captf/crds");
        for (name, generated) in files.iter().filter(|(name, _)| name.starts_with("bases/")) {
            let flat = name.trim_start_matches("bases/");
            let path = chart.join(flat);
            if std::fs::read_to_string(&path).ok().as_ref() == Some(generated) {
                continue;
            }
            if update {
                std::fs::create_dir_all(&chart).unwrap();
                std::fs::write(&path, generated).unwrap();
            } else {
                drifted.push(format!("charts/captf/crds/{flat}"));
            }
        }
        // A committed CRD of a kind that no longer exists is drift too.
        for entry in std::fs::read_dir(dir.join("bases")).into_iter().flatten() {
            let name = format!("bases/{}", entry.unwrap().file_name().to_string_lossy());
            if !files.iter().any(|(generated, _)| *generated == name) {
                if update {
                    std::fs::remove_file(dir.join(&name)).unwrap();
                } else {
                    drifted.push(name);
                }
            }
        }
        assert!(
            drifted.is_empty(),
            "config/crd/ or charts/captf/crds/ differs from the types in src/api: {drifted:?}.\n\
             Regenerate with `{UPDATE_VARIABLE}=1 cargo test --lib api` and commit the result."
        );
    }

    fn schema_of(crd: &CustomResourceDefinition) -> Value {
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref();
        serde_json::to_value(schema.unwrap()).unwrap()
    }

    /// Visits every schema node with its JSON path, e.g. `.spec.jobs.env[]`.
    fn walk(path: &str, schema: &Value, visit: &mut dyn FnMut(&str, &Value)) {
        visit(path, schema);
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                walk(&format!("{path}.{name}"), property, visit);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, visit);
        }
        if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
            walk(&format!("{path}{{}}"), values, visit);
        }
    }

    /// The schema node at a dotted path of property names.
    fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
        path.split('.').fold(schema, |node, name| match name {
            "[]" => &node["items"],
            _ => &node["properties"][name],
        })
    }

    #[test]
    fn every_field_has_a_description() {
        let mut missing = Vec::new();
        for crd in crds() {
            let kind = &crd.spec.names.kind;
            walk(kind, &schema_of(&crd), &mut |path, node| {
                let is_field = !path.ends_with("[]") && !path.ends_with('}');
                let described = node["description"]
                    .as_str()
                    .is_some_and(|d| !d.trim().is_empty());
                if is_field && !described {
                    missing.push(path.to_string());
                }
            });
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:#?}"
        );
    }

    /// Ref §1.1: the CRD schemas declare no defaults, so that a default is
    /// resolved at run time and never stored.
    #[test]
    fn schemas_declare_no_defaults_and_no_nulls() {
        for crd in crds() {
            walk(&crd.spec.names.kind, &schema_of(&crd), &mut |path, node| {
                assert!(node.get("default").is_none(), "{path} declares a default");
                assert!(node.get("nullable").is_none(), "{path} is nullable");
                let values = node.get("enum").and_then(Value::as_array);
                assert!(
                    !values.into_iter().flatten().any(Value::is_null),
                    "{path} allows null"
                );
            });
        }
    }

    #[test]
    fn crds_carry_the_cluster_api_labels_and_names() {
        let crds = crds();
        let plurals: Vec<_> = crds.iter().map(|c| c.spec.names.plural.as_str()).collect();
        assert_eq!(
            plurals,
            [
                "terraformclusters",
                "terraformmachines",
                "terraformmachinepools",
                "terraformclustertemplates",
                "terraformmachinetemplates",
                "terraformmachinepooltemplates",
                "terraformclusteridentities",
            ]
        );
        for crd in &crds {
            let kind = &crd.spec.names.kind;
            let labels = crd.metadata.labels.as_ref().unwrap();
            assert_eq!(labels["cluster.x-k8s.io/v1beta2"], "v1alpha1", "{kind}");
            assert_eq!(
                labels["cluster.x-k8s.io/provider"], "infrastructure-terraform",
                "{kind}"
            );
            let is_identity = kind == "TerraformClusterIdentity";
            assert_eq!(
                labels.get(MOVE_HIERARCHY_LABEL).map(String::as_str),
                is_identity.then_some("")
            );
            assert_eq!(
                crd.spec.scope,
                if is_identity { "Cluster" } else { "Namespaced" }
            );
            assert_eq!(
                crd.spec.names.categories,
                Some(vec!["cluster-api".to_string()])
            );
            let version = &crd.spec.versions[0];
            let has_status = version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some());
            assert_eq!(has_status, kind != "TerraformMachinePoolTemplate", "{kind}");
        }
    }

    #[test]
    fn workload_kinds_print_ready_provisioned_operation_and_age() {
        for crd in &crds()[..3] {
            let columns = crd.spec.versions[0]
                .additional_printer_columns
                .as_ref()
                .unwrap();
            let columns: Vec<_> = columns
                .iter()
                .map(|c| (c.name.as_str(), c.json_path.as_str()))
                .collect();
            assert_eq!(
                columns,
                [
                    ("Ready", r#".status.conditions[?(@.type=="Ready")].status"#),
                    ("Provisioned", ".status.initialization.provisioned"),
                    ("Operation", ".status.activeJob.operation"),
                    ("Age", ".metadata.creationTimestamp"),
                ],
                "{}",
                crd.spec.names.kind
            );
        }
    }

    /// Spot checks that the schemars attributes survive kube's structural
    /// rewriting: a limit of each sort, on each level of nesting.
    #[test]
    fn schema_carries_the_limits_of_the_reference() {
        let crds = crds();
        let machine = schema_of(&crds[1]);
        let pool = schema_of(&crds[2]);
        let identity = schema_of(&crds[6]);
        let template = schema_of(&crds[4]);

        let spec = at(&machine, "spec");
        assert_eq!(spec["minProperties"], 1);
        assert_eq!(spec["required"], json!(["source"]));
        assert_eq!(at(spec, "source.image")["maxLength"], 512);
        assert_eq!(at(spec, "source.image")["minLength"], 1);
        assert_eq!(
            at(spec, "source.imagePullPolicy")["enum"],
            json!(["IfNotPresent", "Always", "Never"])
        );
        assert_eq!(at(spec, "providerID")["maxLength"], 512);
        assert_eq!(at(spec, "jobs.lockTimeoutSeconds")["maximum"], 3600.0);
        assert_eq!(at(spec, "jobs.activeDeadlineSeconds")["minimum"], 1.0);
        assert_eq!(at(spec, "jobs.env")["maxItems"], 64);
        assert_eq!(
            at(spec, "remediation.healthCheckIntervalSeconds")["minimum"],
            60.0
        );

        let variables = at(spec, "variables");
        assert_eq!(variables["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(variables["maxProperties"], 256);
        assert_eq!(variables["minProperties"], 1);

        let source = at(spec, "variablesFrom.[]");
        assert_eq!(at(spec, "variablesFrom")["maxItems"], 16);
        assert_eq!(
            source["x-kubernetes-validations"][0]["rule"],
            "has(self.configMapRef) != has(self.secretRef)"
        );
        assert_eq!(
            at(source, "secretRef.name")["pattern"],
            DNS_SUBDOMAIN_PATTERN
        );
        assert_eq!(at(source, "format")["enum"], json!(["String", "JSON"]));
        // The field's own description, not its type's.
        let description = at(source, "format")["description"].as_str().unwrap();
        assert!(
            description.starts_with("How each value is read"),
            "{description}"
        );

        assert_eq!(at(&pool, "spec.drift.intervalSeconds")["minimum"], 1.0);
        assert_eq!(
            at(&pool, "spec.membershipRefreshIntervalSeconds")["minimum"],
            15.0
        );
        assert_eq!(at(&pool, "spec.providerIDList")["maxItems"], 10000);
        assert_eq!(at(&pool, "spec.providerIDList.[]")["maxLength"], 512);
        assert_eq!(
            at(&pool, "status.instances.[]")["required"],
            json!(["providerID"])
        );
        assert_eq!(
            at(&pool, "status.instances.[].state")["enum"],
            json!([
                "pending",
                "running",
                "degraded",
                "stopped",
                "terminated",
                "unknown"
            ])
        );

        let conditions = at(&machine, "status.conditions");
        assert_eq!(conditions["maxItems"], 32);
        assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
        assert_eq!(
            at(&machine, "status.lastRun.error.kind")["enum"],
            json!([
                "image-layout",
                "step",
                "interrupted",
                "blocked",
                "plan-changed"
            ])
        );
        assert_eq!(at(&machine, "status.stateBackups")["minItems"], 1);

        assert_eq!(
            at(&identity, "spec.allowedNamespaces.list.[]")["pattern"],
            DNS_LABEL_PATTERN
        );
        assert_eq!(at(&identity, "spec.secretRef.namespace")["maxLength"], 63);

        let resource = at(&template, "spec.template");
        assert_eq!(resource["minProperties"], 1);
        assert_eq!(resource["required"], json!(["spec"]));
        assert_eq!(at(resource, "spec.source.image")["maxLength"], 512);
    }

    /// An object read from the API and written back keeps exactly its fields:
    /// nothing is added (a machine without spec.jobs stays without it) and
    /// nothing is lost, flattened workspace fields included.
    #[test]
    fn objects_round_trip_without_inventing_fields() {
        let minimal = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "TerraformMachine",
            "metadata": { "name": "m" },
            "spec": { "source": { "image": "registry.example/machine:1.0" } },
        });
        let machine: TerraformMachine = serde_json::from_value(minimal.clone()).unwrap();
        assert_eq!(machine.spec.workspace.jobs, None);
        assert_eq!(serde_json::to_value(&machine).unwrap(), minimal);

        let full = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "TerraformMachinePool",
            "metadata": { "name": "p", "namespace": "ns" },
            "spec": {
                "providerIDList": ["aws:///a", "aws:///b"],
                "source": { "image": "registry.example/pool:1.0", "imagePullPolicy": "Always" },
                "identityRef": { "name": "creds" },
                "jobs": { "lockTimeoutSeconds": 0, "env": [{ "name": "A", "value": "b" }] },
                "variables": { "size": 3, "tags": { "team": "x" } },
                "variablesFrom": [{ "secretRef": { "name": "vars" }, "format": "JSON" }],
                "drift": { "intervalSeconds": 60, "action": "Remediate" },
            },
            "status": {
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                    "lastTransitionTime": "2025-01-02T03:04:05Z",
                }],
                "initialization": { "provisioned": true },
                "activeJob": { "name": "captf-mp-p-drift-a1-abcdef", "operation": "drift", "attempt": 1 },
                "stateBackups": [{ "serial": 7, "takenAt": "2025-01-02T03:04:05Z", "bytes": 1024 }],
                "ready": true,
                "replicas": 0,
                "instances": [{ "providerID": "aws:///a", "state": "running" }],
            },
        });
        let pool: TerraformMachinePool = serde_json::from_value(full.clone()).unwrap();
        assert_eq!(
            pool.spec
                .workspace
                .jobs
                .as_ref()
                .unwrap()
                .lock_timeout_seconds,
            Some(0)
        );
        assert_eq!(
            pool.status
                .as_ref()
                .unwrap()
                .workspace
                .state_backups
                .as_ref()
                .unwrap()[0]
                .serial,
            7
        );
        assert_eq!(serde_json::to_value(&pool).unwrap(), full);
    }

    #[test]
    fn crds_yaml_holds_the_seven_crds_in_order() {
        let documents: Vec<CustomResourceDefinition> =
            serde_saphyr::from_str_multiple(&crds_yaml()).unwrap();
        assert_eq!(documents, crds());
    }

    // Keeps the helper honest: a schema without a description is reported.
    #[test]
    fn walk_reports_nested_fields() {
        let schema: JSONSchemaProps = serde_json::from_value(json!({
            "type": "object",
            "properties": { "a": { "type": "array", "items": {
                "type": "object", "properties": { "b": { "type": "string" } } } } },
        }))
        .unwrap();
        let mut paths = Vec::new();
        walk(
            "",
            &serde_json::to_value(schema).unwrap(),
            &mut |path, _| paths.push(path.to_string()),
        );
        assert_eq!(paths, ["", ".a", ".a[]", ".a[].b"]);
    }
}
