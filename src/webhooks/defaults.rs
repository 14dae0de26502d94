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
//! The defaults are computed on the typed object: each default whose field
//! is unset is set there and added to the patch, so that the patch adds
//! exactly the missing fields and nothing else, and applying the webhook to
//! its own output gives an empty patch.
//!
//! It is applied on UPDATE too, so an object stored without a default
//! (created while the webhooks were not registered, or by a version without
//! it) gets it on its next write. Validation reads both objects with
//! [`Defaults::apply_defaults`] applied, as the API server reads a CRD's
//! schema defaults, so that an unset field and its default are one value for
//! the immutability rules.

use crate::api::{
    ApplyPolicy, DriftAction, DriftPolicy, ImagePullPolicy, MachinePoolDriftPolicy,
    TerraformCluster, TerraformClusterIdentity, TerraformClusterTemplate, TerraformMachine,
    TerraformMachinePool, TerraformMachinePoolTemplate, TerraformMachineTemplate, VariablesFormat,
    WorkspaceSpec,
};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde::Serialize;

/// The defaults of a kind; none for the kinds that are not defaulted.
pub trait Defaults {
    /// Sets every default that `self` leaves unset and returns the JSON
    /// patch that does the same to the object as it was sent.
    fn apply_defaults(&mut self) -> Vec<PatchOperation> {
        Vec::new()
    }
}

impl Defaults for TerraformCluster {
    fn apply_defaults(&mut self) -> Vec<PatchOperation> {
        let mut ops = Vec::new();
        let spec = &mut self.spec;
        pull_policy(&mut spec.workspace, &mut ops);
        set(
            &mut spec.apply_policy,
            ApplyPolicy::Automatic,
            &["spec", "applyPolicy"],
            &mut ops,
        );
        match &mut spec.drift {
            Some(drift) => set(&mut drift.action, REPORT, DRIFT_ACTION, &mut ops),
            None => set(
                &mut spec.drift,
                DriftPolicy {
                    action: Some(REPORT),
                    ..Default::default()
                },
                DRIFT,
                &mut ops,
            ),
        }
        variables_from(&mut spec.workspace, &mut ops);
        ops
    }
}

impl Defaults for TerraformMachine {
    fn apply_defaults(&mut self) -> Vec<PatchOperation> {
        let mut ops = Vec::new();
        pull_policy(&mut self.spec.workspace, &mut ops);
        variables_from(&mut self.spec.workspace, &mut ops);
        ops
    }
}

impl Defaults for TerraformMachinePool {
    fn apply_defaults(&mut self) -> Vec<PatchOperation> {
        let mut ops = Vec::new();
        let spec = &mut self.spec;
        pull_policy(&mut spec.workspace, &mut ops);
        match &mut spec.drift {
            Some(drift) => set(&mut drift.action, REPORT, DRIFT_ACTION, &mut ops),
            None => {
                let drift = MachinePoolDriftPolicy {
                    action: Some(REPORT),
                    ..Default::default()
                };
                set(&mut spec.drift, drift, DRIFT, &mut ops);
            }
        }
        variables_from(&mut spec.workspace, &mut ops);
        ops
    }
}

impl Defaults for TerraformClusterTemplate {}
impl Defaults for TerraformMachineTemplate {}
impl Defaults for TerraformMachinePoolTemplate {}
impl Defaults for TerraformClusterIdentity {}

const REPORT: DriftAction = DriftAction::Report;
const DRIFT: &[&str] = &["spec", "drift"];
const DRIFT_ACTION: &[&str] = &["spec", "drift", "action"];

fn pull_policy(workspace: &mut WorkspaceSpec, ops: &mut Vec<PatchOperation>) {
    set(
        &mut workspace.source.image_pull_policy,
        ImagePullPolicy::IfNotPresent,
        &["spec", "source", "imagePullPolicy"],
        ops,
    );
}

fn variables_from(workspace: &mut WorkspaceSpec, ops: &mut Vec<PatchOperation>) {
    for (i, source) in workspace.variables_from.iter_mut().flatten().enumerate() {
        let index = i.to_string();
        set(
            &mut source.optional,
            false,
            &["spec", "variablesFrom", &index, "optional"],
            ops,
        );
        set(
            &mut source.format,
            VariablesFormat::String,
            &["spec", "variablesFrom", &index, "format"],
            ops,
        );
    }
}

/// Sets an unset `field` to `value`, and adds it to the patch as the typed
/// value serializes, so the two cannot differ.
fn set<T: Serialize>(
    field: &mut Option<T>,
    value: T,
    tokens: &[&str],
    ops: &mut Vec<PatchOperation>,
) {
    if field.is_some() {
        return;
    }
    // Plain enums, bools and structs of them: serializing cannot fail.
    if let Ok(json) = serde_json::to_value(&value) {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(tokens.iter().copied()),
            value: json,
        }));
        *field = Some(value);
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use serde::de::{DeserializeOwned, DeserializeSeed};
    use serde_json::{Value, json};

    use super::*;
    use crate::server::webhook::{Field, Sent};
    use crate::webhooks::objects::{Decoder, defaults_patch};

    /// The test objects carry only what the defaults read; the typed decode
    /// needs metadata too.
    fn with_metadata(object: &Value) -> Value {
        let mut object = object.clone();
        if let Some(fields) = object.as_object_mut() {
            fields.insert("metadata".into(), json!({"name": "x"}));
        }
        object
    }

    /// The patch, the same whether the object was decoded with the body or
    /// from its text.
    fn defaults(kind: &str, object: &Value) -> Vec<PatchOperation> {
        let raw = serde_json::value::to_raw_value(&with_metadata(object)).unwrap();
        let ops = defaults_patch(kind, &Sent::Text(&raw)).unwrap();
        let decoder = Decoder::of(kind, Field::Object, raw.get().len());
        let mut deserializer = serde_json::Deserializer::from_str(raw.get());
        if let Some(Ok(decoded)) = decoder.map(|d| d.deserialize(&mut deserializer)) {
            assert_eq!(defaults_patch(kind, &Sent::Decoded(decoded)).unwrap(), ops);
        }
        ops
    }

    /// `object` with the webhook's patch applied. The typed object with its
    /// defaults applied must be the patched object, typed.
    fn defaulted(kind: &str, object: &Value) -> Value {
        let mut out = with_metadata(object);
        json_patch::patch(&mut out, &defaults(kind, object)).unwrap();
        let before = with_metadata(object);
        match kind {
            "TerraformCluster" => same_typed::<TerraformCluster>(&before, &out),
            "TerraformMachine" => same_typed::<TerraformMachine>(&before, &out),
            "TerraformMachinePool" => same_typed::<TerraformMachinePool>(&before, &out),
            _ => {}
        }
        if let Some(fields) = out.as_object_mut() {
            fields.remove("metadata");
        }
        out
    }

    fn same_typed<T: DeserializeOwned + Defaults + PartialEq + Debug>(
        before: &Value,
        after: &Value,
    ) {
        let mut typed: T = serde_json::from_value(before.clone()).unwrap();
        typed.apply_defaults();
        assert_eq!(typed, serde_json::from_value::<T>(after.clone()).unwrap());
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
