//! The outputs of the state this pass read, mapped onto the object (ref
//! §9.4, [`crate::outputs`]): OutputsValid, InfrastructureHealthy, the
//! provisioned latch, the kind's status fields, and the spec fields written
//! once. Pure.

use serde_json::{Map, Value, json};

use super::common::provisioned;
use super::observe::Rest;
use super::plan::{Plan, Write};
use crate::controllers::decide::StateFact;
use crate::controllers::workload::Workload;
use crate::jobs::durable::Recorded;
use crate::keys::ENDPOINT_SOURCE;
use crate::names::Kind;
use crate::outputs::{self, Facts};
use crate::state::StateReadable;

/// The status fields the outputs own, per kind.
const fn owned(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Cluster => &["failureDomains"],
        Kind::Machine => &["addresses", "failureDomain", "interruptible"],
        Kind::MachinePool => &["ready", "replicas", "instances"],
    }
}

pub fn outputs<K: Workload>(
    obj: &K,
    rest: &Rest,
    fact: &StateFact,
    durable: Option<&Recorded>,
    ever_applied: bool,
    deleting: bool,
    plan: &mut Plan,
) {
    let applied_inputs =
        durable.and_then(|d| serde_json::from_slice::<Value>(&d.inputs.tfvars_json).ok());
    let input = |name: &str| applied_inputs.as_ref().and_then(|v| v.get(name));
    let read = match &rest.snapshot.readable {
        StateReadable::Read(st) => Some(&st.outputs),
        _ => None,
    };
    let mapped = outputs::map(&Facts {
        kind: K::KIND,
        outputs: read,
        applied: matches!(
            fact,
            StateFact::Read {
                inputs_hash: Some(_)
            }
        ),
        apply_started: ever_applied || durable.is_some(),
        provisioned: provisioned(obj),
        endpoint: obj.own_endpoint(),
        endpoint_input_null: input("control_plane_endpoint").is_none_or(Value::is_null),
        provider_id: obj.provider_id(),
        failure_domain_input: input("failure_domain").and_then(Value::as_str),
    });
    if let Some(cond) = mapped.outputs_valid {
        plan.draft.set(cond);
    }
    plan.draft.set(mapped.healthy);
    if mapped.provisioned {
        plan.draft
            .status
            .initialization
            .get_or_insert_default()
            .provisioned = Some(true);
    }
    if let Some(fields) = mapped.status {
        for key in owned(K::KIND) {
            plan.kind_status.remove(*key);
        }
        plan.kind_status.extend(fields);
    }
    if deleting {
        return;
    }
    // Only what differs from the spec is written.
    let spec = obj.spec_value();
    let due: Map<String, Value> = mapped
        .spec
        .into_iter()
        .filter(|(k, v)| spec.get(k).unwrap_or(&Value::Null) != v)
        .collect();
    let mut patch = Map::new();
    if !due.is_empty() {
        patch.insert("spec".into(), Value::Object(due));
    }
    // In the same write as the endpoint: an endpoint seen without its
    // source would be taken for the user's.
    if mapped.endpoint_from_module {
        let source = crate::capi::inputs::EndpointSource::Module.as_str();
        patch.insert(
            "metadata".into(),
            json!({"annotations": {ENDPOINT_SOURCE: source}}),
        );
    }
    if !patch.is_empty() {
        plan.writes.push(Write::Patch(Value::Object(patch)));
    }
}
