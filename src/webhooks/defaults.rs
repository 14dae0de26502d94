//! Defaulting (CONTRACT.md "Webhooks"): only fields that nothing inherits.
//!
//! `spec.source.imagePullPolicy` (IfNotPresent), TerraformCluster
//! `spec.applyPolicy` (Automatic), `spec.drift.action` (Report) on the kinds
//! that have it (TerraformCluster, TerraformMachinePool), and
//! `spec.variablesFrom[].optional`/`format` (false/String). Jobs policies,
//! drift intervals and identities stay unset so that a machine or pool keeps
//! inheriting them from its cluster's `spec.defaults`.
//!
//! Templates are not defaulted: the objects created from them are, and a
//! template's spec is immutable, so defaulting it would only make the
//! ClusterClass controller's dry-run comparison see a difference.
//!
//! The patch is computed over the raw JSON so that it adds exactly the
//! missing fields and nothing else; applying the webhook to its own output
//! gives an empty patch.
//!
//! It is applied on UPDATE too, so an object stored without a default
//! (created while the webhooks were not registered, or by a version without
//! it) gets it on its next write. Validation reads both objects through
//! [`defaulted`], as the API server reads a CRD's schema defaults, so that an
//! unset field and its default are one value for the immutability rules.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde_json::{Value, json};

/// The patch that defaults `object` of `kind`.
pub fn defaults(kind: &str, object: &Value) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return ops;
    };
    if !matches!(
        kind,
        "TerraformCluster" | "TerraformMachine" | "TerraformMachinePool"
    ) {
        return ops;
    }
    if let Some(source) = spec.get("source").and_then(Value::as_object)
        && !source.contains_key("imagePullPolicy")
    {
        ops.push(add(
            &["spec", "source", "imagePullPolicy"],
            json!("IfNotPresent"),
        ));
    }
    if kind == "TerraformCluster" && !spec.contains_key("applyPolicy") {
        ops.push(add(&["spec", "applyPolicy"], json!("Automatic")));
    }
    if matches!(kind, "TerraformCluster" | "TerraformMachinePool") {
        match spec.get("drift") {
            None => ops.push(add(&["spec", "drift"], json!({ "action": "Report" }))),
            Some(Value::Object(drift)) if !drift.contains_key("action") => {
                ops.push(add(&["spec", "drift", "action"], json!("Report")));
            }
            Some(_) => {}
        }
    }
    if let Some(sources) = spec.get("variablesFrom").and_then(Value::as_array) {
        for (i, source) in sources.iter().enumerate() {
            let Some(source) = source.as_object() else {
                continue;
            };
            let index = i.to_string();
            if !source.contains_key("optional") {
                ops.push(add(
                    &["spec", "variablesFrom", &index, "optional"],
                    json!(false),
                ));
            }
            if !source.contains_key("format") {
                ops.push(add(
                    &["spec", "variablesFrom", &index, "format"],
                    json!("String"),
                ));
            }
        }
    }
    ops
}

/// `object` with the patch of [`defaults`] applied.
pub fn defaulted(kind: &str, object: &Value) -> Result<Value, json_patch::PatchError> {
    let mut out = object.clone();
    json_patch::patch(&mut out, &defaults(kind, object))?;
    Ok(out)
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(tokens.iter().copied()),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaulted(kind: &str, object: &Value) -> Value {
        super::defaulted(kind, object).unwrap()
    }

    #[test]
    fn machine_gets_only_the_pull_policy_and_source_defaults() {
        let machine = json!({
            "spec": {
                "source": {"image": "ghcr.io/x/noop:v1"},
                "variablesFrom": [
                    {"configMapRef": {"name": "a"}},
                    {"secretRef": {"name": "b"}, "optional": true, "format": "JSON"}
                ]
            }
        });
        let out = defaulted("TerraformMachine", &machine);
        assert_eq!(
            out,
            json!({
                "spec": {
                    "source": {"image": "ghcr.io/x/noop:v1", "imagePullPolicy": "IfNotPresent"},
                    "variablesFrom": [
                        {"configMapRef": {"name": "a"}, "optional": false, "format": "String"},
                        {"secretRef": {"name": "b"}, "optional": true, "format": "JSON"}
                    ]
                }
            })
        );
        // Nothing inherited appears: no jobs, no drift, no identity.
        assert!(out["spec"].get("jobs").is_none());
        assert!(out["spec"].get("drift").is_none());
        assert!(defaults("TerraformMachine", &out).is_empty(), "idempotent");
    }

    #[test]
    fn cluster_and_pool() {
        let cluster = json!({"spec": {"source": {"image": "x:1", "imagePullPolicy": "Always"}}});
        let out = defaulted("TerraformCluster", &cluster);
        assert_eq!(
            out,
            json!({"spec": {
                "source": {"image": "x:1", "imagePullPolicy": "Always"},
                "applyPolicy": "Automatic",
                "drift": {"action": "Report"}
            }})
        );
        assert!(defaults("TerraformCluster", &out).is_empty());

        let pool = json!({"spec": {"source": {"image": "x:1"}, "drift": {"intervalSeconds": 60}}});
        let out = defaulted("TerraformMachinePool", &pool);
        assert_eq!(
            out["spec"]["drift"],
            json!({"intervalSeconds": 60, "action": "Report"})
        );
        assert!(out["spec"].get("applyPolicy").is_none());
        assert!(defaults("TerraformMachinePool", &out).is_empty());

        let set = json!({"spec": {"source": {"image": "x:1", "imagePullPolicy": "Never"},
            "applyPolicy": "Manual", "drift": {"action": "Remediate"}}});
        assert!(
            defaults("TerraformCluster", &set).is_empty(),
            "set values are kept"
        );
    }

    #[test]
    fn templates_and_other_kinds_are_left_alone() {
        let template = json!({"spec": {"template": {"spec": {"source": {"image": "x:1"}}}}});
        assert!(defaults("TerraformMachineTemplate", &template).is_empty());
        assert!(defaults("TerraformClusterIdentity", &json!({"spec": {}})).is_empty());
        assert!(defaults("TerraformMachine", &json!({})).is_empty());
    }
}
