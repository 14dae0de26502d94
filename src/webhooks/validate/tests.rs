use serde::de::DeserializeSeed;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::*;
use crate::server::webhook::Sent;
use crate::webhooks::objects::Decoder;

const IMAGE: &str = "ghcr.io/captf-io/modules/noop:v0.1.0";

fn raw(value: &Value) -> Box<RawValue> {
    RawValue::from_string(value.to_string()).unwrap()
}

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": "o", "namespace": "default"},
        "spec": spec,
    })
}

/// The object as the server hands it over: decoded with the body when its
/// kind has a decoder and it decodes, its text otherwise.
fn sent<'a>(kind: &str, field: Field, raw: &'a RawValue, decoded: bool) -> Object<'a> {
    let decoder = Decoder::of(kind, field, raw.get().len()).filter(|_| decoded);
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    match decoder.map(|d| d.deserialize(&mut deserializer)) {
        Some(Ok(object)) => Sent::Decoded(object),
        _ => Sent::Text(raw),
    }
}

/// The messages of the verdict on `object` (an UPDATE from `old` when
/// given). The verdict is the same whether the objects were decoded with
/// the body or from their text.
fn messages(kind: &str, object: &Value, old: Option<&Value>) -> Vec<String> {
    let (new, old) = (raw(object), old.map(raw));
    let judge = |decoded: bool| {
        let new = sent(kind, Field::Object, &new, decoded);
        let old = old
            .as_deref()
            .map(|old| sent(kind, Field::OldObject, old, decoded));
        let review = Review {
            verb: if old.is_some() {
                Verb::Update
            } else {
                Verb::Create
            },
            kind,
            object: Some(&new),
            old_object: old.as_ref(),
            dry_run: false,
        };
        validate(&review).0
    };
    let verdict = judge(false);
    assert_eq!(judge(true), verdict, "decoded with the body");
    verdict.violations.iter().map(Violation::message).collect()
}

/// Every place a jobs policy sits, with the kind that holds it and the
/// spec that puts `jobs` there.
fn policies(jobs: &Value) -> Vec<(&'static str, &'static str, Value)> {
    let workload = json!({"source": {"image": IMAGE}, "jobs": jobs});
    let cluster = json!({"source": {"image": IMAGE}, "identityRef": {"name": "id"}, "defaults": {"jobs": jobs}});
    let cluster_own =
        json!({"source": {"image": IMAGE}, "identityRef": {"name": "id"}, "jobs": jobs});
    let template = |spec: &Value| json!({"template": {"spec": spec}});
    let cluster_template = json!({"source": {"image": IMAGE}, "defaults": {"jobs": jobs}});
    vec![
        ("TerraformMachine", "spec.jobs", workload.clone()),
        ("TerraformMachinePool", "spec.jobs", workload.clone()),
        ("TerraformCluster", "spec.jobs", cluster_own),
        ("TerraformCluster", "spec.defaults.jobs", cluster),
        (
            "TerraformMachineTemplate",
            "spec.template.spec.jobs",
            template(&workload),
        ),
        (
            "TerraformMachinePoolTemplate",
            "spec.template.spec.jobs",
            template(&workload),
        ),
        (
            "TerraformClusterTemplate",
            "spec.template.spec.jobs",
            template(&json!({"source": {"image": IMAGE}, "jobs": jobs})),
        ),
        (
            "TerraformClusterTemplate",
            "spec.template.spec.defaults.jobs",
            template(&cluster_template),
        ),
    ]
}

#[test]
fn both_contexts_are_judged_in_every_jobs_policy() {
    let jobs = json!({
        "securityContext": {"runAsNonRoot": false},
        "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
    });
    for (kind, path, spec) in policies(&jobs) {
        let got = messages(kind, &object(kind, spec), None);
        assert_eq!(
            got,
            [
                format!(
                    "{path}.securityContext.runAsNonRoot: must not be false: a Job does not run as root (got false)"
                ),
                format!(
                    "{path}.podSecurityContext.seLinuxOptions.type: must be unset or one of container_t, container_init_t, container_kvm_t, container_engine_t: other types, such as spc_t, may run unconfined (got \"spc_t\")"
                ),
            ],
            "{kind} {path}"
        );
    }
    let hardened = json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "readOnlyRootFilesystem": true},
        "podSecurityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    });
    for (kind, path, spec) in policies(&hardened) {
        assert_eq!(
            messages(kind, &object(kind, spec), None),
            Vec::<String>::new(),
            "{kind} {path}"
        );
    }
}

#[test]
fn a_stored_loose_value_is_not_judged_again_on_update() {
    let loose = json!({
        "securityContext": {"readOnlyRootFilesystem": false},
        "podSecurityContext": {"runAsUser": 0},
    });
    for (kind, path, spec) in policies(&loose) {
        let old = object(kind, spec.clone());
        // The manager's finalizer patch, a label: the stored values stay.
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["captf.io/finalizer"]);
        assert_eq!(
            messages(kind, &new, Some(&old)),
            Vec::<String>::new(),
            "{kind} {path}"
        );
        // Created again (clusterctl move, say), they are refused.
        assert_eq!(messages(kind, &new, None).len(), 2, "{kind} {path}");
    }
    // A new or changed loose value is refused on UPDATE; the stored one
    // still is not.
    let old = object(
        "TerraformMachine",
        json!({"source": {"image": IMAGE}, "jobs": loose}),
    );
    let mut new = old.clone();
    new["spec"]["jobs"]["podSecurityContext"]["runAsNonRoot"] = json!(false);
    new["spec"]["jobs"]["securityContext"]["procMount"] = json!("Unmasked");
    assert_eq!(
        messages("TerraformMachine", &new, Some(&old)),
        [
            "spec.jobs.securityContext.procMount: must not be Unmasked: /proc stays masked (got \"Unmasked\")",
            "spec.jobs.podSecurityContext.runAsNonRoot: must not be false: a Job does not run as root (got false)",
        ]
    );
    // The same value under another policy is new there.
    let moved = object(
        "TerraformCluster",
        json!({"source": {"image": IMAGE}, "identityRef": {"name": "id"}, "jobs": loose}),
    );
    let old = object(
        "TerraformCluster",
        json!({"source": {"image": IMAGE}, "identityRef": {"name": "id"}, "defaults": {"jobs": loose}}),
    );
    assert_eq!(messages("TerraformCluster", &moved, Some(&old)).len(), 2);
    // The rules of ref §1.4 themselves are judged on every UPDATE.
    let privileged = object(
        "TerraformMachine",
        json!({"source": {"image": IMAGE}, "jobs": {"securityContext": {"privileged": true}}}),
    );
    assert_eq!(
        messages("TerraformMachine", &privileged, Some(&privileged)),
        ["spec.jobs.securityContext.privileged: must not be true (got true)"]
    );
}
