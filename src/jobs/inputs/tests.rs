use std::collections::BTreeMap;

use super::*;

fn vars(value: Value) -> BTreeMap<String, Value> {
    serde_json::from_value(value).unwrap()
}

fn machine<'a>(variables: Option<&'a BTreeMap<String, Value>>) -> InputsRequest<'a> {
    InputsRequest {
        kind: Kind::Machine,
        namespace: "ns",
        name: "worker-0",
        cluster_name: Some("prod"),
        image: "registry.example/mod:1.0",
        template: Some("workers"),
        variables,
        sensitive: &[],
        role: &[],
    }
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn keys(value: &Value) -> Vec<&str> {
    value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

#[test]
fn root_declares_passes_and_reexports() {
    let v = vars(json!({ "region": "eu", "sizes": [1, 2] }));
    let rendered = render(&machine(Some(&v))).unwrap();
    let root = parse(&rendered.main_tf_json);
    assert_eq!(
        keys(&root),
        ["module", "output", "terraform", "variable"],
        "nothing but these four blocks"
    );
    assert_eq!(
        root["terraform"],
        json!({ "backend": { "kubernetes": {} } })
    );
    assert_eq!(
        root["variable"],
        json!({
            "captf_cluster": { "type": "object({name=string,namespace=string})" },
            "captf_contract": { "type": "string" },
            "captf_object": { "type": "object({kind=string,name=string,namespace=string})" },
            "captf_tags": { "type": "map(string)" },
            "region": {},
            "sizes": {},
        })
    );
    assert_eq!(
        root["module"],
        json!({ "role": {
            "source": "../../module",
            "captf_cluster": "${var.captf_cluster}",
            "captf_contract": "${var.captf_contract}",
            "captf_object": "${var.captf_object}",
            "captf_tags": "${var.captf_tags}",
            "region": "${var.region}",
            "sizes": "${var.sizes}",
        }})
    );
    assert_eq!(
        root["output"],
        json!({
            "addresses": { "value": "${try(module.role.addresses, null)}", "sensitive": true },
            "captf_declared_outputs": { "value": "${[for n in [\"provider_id\",\"addresses\",\"failure_domain\",\"interruptible\",\"health\"] : n if can(module.role[n])]}" },
            "failure_domain": { "value": "${try(module.role.failure_domain, null)}", "sensitive": true },
            "health": { "value": "${try(module.role.health, null)}", "sensitive": true },
            "interruptible": { "value": "${try(module.role.interruptible, null)}", "sensitive": true },
            "provider_id": { "value": "${try(module.role.provider_id, null)}", "sensitive": true },
        })
    );
    assert_eq!(
        parse(&rendered.tfvars_json),
        json!({
            "captf_cluster": { "name": "prod", "namespace": "ns" },
            "captf_contract": "v1alpha1",
            "captf_object": { "kind": "TerraformMachine", "name": "worker-0", "namespace": "ns" },
            "captf_tags": {
                "captf.io/cluster": "prod",
                "captf.io/kind": "TerraformMachine",
                "captf.io/managed-by": "captf",
                "captf.io/name": "worker-0",
                "captf.io/namespace": "ns",
                "captf.io/template": "workers",
            },
            "region": "eu",
            "sizes": [1, 2],
        })
    );
}

#[test]
fn outputs_follow_the_role() {
    for (kind, outputs) in [
        (
            Kind::Cluster,
            vec![
                "captf_declared_outputs",
                "control_plane_endpoint",
                "exports",
                "failure_domains",
                "health",
            ],
        ),
        (
            Kind::MachinePool,
            vec![
                "captf_declared_outputs",
                "health",
                "instances",
                "provider_id",
                "provider_id_list",
                "replicas",
            ],
        ),
    ] {
        let req = InputsRequest {
            kind,
            ..machine(None)
        };
        let root = parse(&render(&req).unwrap().main_tf_json);
        assert_eq!(keys(&root["output"]), outputs, "{kind:?}");
    }
}

#[test]
fn without_a_cluster_there_is_no_captf_cluster_and_an_empty_tag() {
    let req = InputsRequest {
        cluster_name: None,
        template: None,
        ..machine(None)
    };
    let rendered = render(&req).unwrap();
    let root = parse(&rendered.main_tf_json);
    let values = parse(&rendered.tfvars_json);
    assert_eq!(
        keys(&root["variable"]),
        ["captf_contract", "captf_object", "captf_tags"]
    );
    assert_eq!(
        keys(&values),
        ["captf_contract", "captf_object", "captf_tags"]
    );
    assert_eq!(values["captf_tags"]["captf.io/cluster"], "");
    assert_eq!(values["captf_tags"]["captf.io/template"], "");
    assert_eq!(values["captf_tags"].as_object().unwrap().len(), 6);
}

#[test]
fn files_are_compact_json_with_sorted_keys() {
    let v = vars(json!({ "zeta": { "b": 1, "a": [ { "y": 1, "x": 2 } ] }, "alpha": null }));
    let rendered = render(&machine(Some(&v))).unwrap();
    for bytes in [&rendered.main_tf_json, &rendered.tfvars_json] {
        // serde_json without preserve_order sorts keys; the bytes must be
        // what that canonical form prints.
        let reprinted = serde_json::to_vec(&parse(bytes)).unwrap();
        assert_eq!(*bytes, reprinted);
    }
    let tfvars = String::from_utf8(rendered.tfvars_json).unwrap();
    assert!(
        tfvars.contains(r#""zeta":{"a":[{"x":2,"y":1}],"b":1}"#),
        "{tfvars}"
    );
    assert_eq!(
        render(&machine(Some(&v))).unwrap().inputs_hash,
        rendered.inputs_hash
    );
}

#[test]
fn hash_is_sha256_of_the_canonical_document() {
    let v = vars(json!({ "n": -3, "s": "x" }));
    let req = InputsRequest {
        kind: Kind::Cluster,
        namespace: "ns",
        name: "c",
        cluster_name: None,
        image: "img:1",
        template: None,
        variables: Some(&v),
        sensitive: &[],
        role: &[],
    };
    let canonical = concat!(
        r#"{"contract":"v1alpha1","image":"img:1","inputs":{"#,
        r#""captf_contract":"v1alpha1","#,
        r#""captf_object":{"kind":"TerraformCluster","name":"c","namespace":"ns"},"#,
        r#""captf_tags":{"captf.io/cluster":"","captf.io/kind":"TerraformCluster","#,
        r#""captf.io/managed-by":"captf","captf.io/name":"c","captf.io/namespace":"ns","#,
        r#""captf.io/template":""}},"#,
        r#""role":"cluster","scheme":"h2","variables":{"n":-3,"s":"x"}}"#
    );
    let hex: String = Sha256::digest(canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(render(&req).unwrap().inputs_hash, format!("h2:{hex}"));
}

#[test]
fn an_unhashed_input_is_rendered_and_not_hashed() {
    let count = |n: i32| [Input::new("replicas", "number", n.into()).unhashed()];
    let (two, five) = (count(2), count(5));
    let a = render(&InputsRequest {
        kind: Kind::MachinePool,
        role: &two,
        ..machine(None)
    })
    .unwrap();
    let b = render(&InputsRequest {
        kind: Kind::MachinePool,
        role: &five,
        ..machine(None)
    })
    .unwrap();
    assert_eq!(a.inputs_hash, b.inputs_hash);
    assert_eq!(parse(&b.tfvars_json)["replicas"], json!(5));
    let hashed = [Input::new("replicas", "number", 5.into())];
    let c = render(&InputsRequest {
        kind: Kind::MachinePool,
        role: &hashed,
        ..machine(None)
    })
    .unwrap();
    assert_ne!(a.inputs_hash, c.inputs_hash);
}

#[test]
fn hash_covers_every_input() {
    let base = vars(json!({ "region": "eu", "count_of": 3 }));
    let other_value = vars(json!({ "region": "us", "count_of": 3 }));
    let other_number = vars(json!({ "region": "eu", "count_of": 4 }));
    let added = vars(json!({ "region": "eu", "count_of": 3, "extra": null }));
    let as_string = vars(json!({ "region": "eu", "count_of": "3" }));
    let req = machine(Some(&base));
    let cases: Vec<(&str, InputsRequest)> = vec![
        ("base", req),
        (
            "kind",
            InputsRequest {
                kind: Kind::MachinePool,
                ..req
            },
        ),
        (
            "namespace",
            InputsRequest {
                namespace: "ns2",
                ..req
            },
        ),
        (
            "name",
            InputsRequest {
                name: "worker-1",
                ..req
            },
        ),
        (
            "cluster",
            InputsRequest {
                cluster_name: Some("dev"),
                ..req
            },
        ),
        (
            "no cluster",
            InputsRequest {
                cluster_name: None,
                ..req
            },
        ),
        (
            "image",
            InputsRequest {
                image: "registry.example/mod:1.1",
                ..req
            },
        ),
        (
            "template",
            InputsRequest {
                template: Some("other"),
                ..req
            },
        ),
        (
            "no template",
            InputsRequest {
                template: None,
                ..req
            },
        ),
        (
            "variable value",
            InputsRequest {
                variables: Some(&other_value),
                sensitive: &[],
                role: &[],
                ..req
            },
        ),
        (
            "variable number",
            InputsRequest {
                variables: Some(&other_number),
                sensitive: &[],
                role: &[],
                ..req
            },
        ),
        (
            "variable added",
            InputsRequest {
                variables: Some(&added),
                sensitive: &[],
                role: &[],
                ..req
            },
        ),
        (
            "variable type",
            InputsRequest {
                variables: Some(&as_string),
                sensitive: &[],
                role: &[],
                ..req
            },
        ),
        (
            "no variables",
            InputsRequest {
                variables: None,
                sensitive: &[],
                role: &[],
                ..req
            },
        ),
    ];
    let mut seen = BTreeMap::new();
    for (what, req) in &cases {
        let hash = render(req).unwrap().inputs_hash;
        assert!(hash.starts_with("h2:") && hash.len() == 67, "{hash}");
        if let Some(before) = seen.insert(hash, *what) {
            panic!("{what} hashes like {before}");
        }
    }
    // The same request, built again, hashes the same.
    assert_eq!(
        render(&machine(Some(&vars(
            json!({ "count_of": 3, "region": "eu" })
        ))))
        .unwrap()
        .inputs_hash,
        render(&req).unwrap().inputs_hash
    );
}

#[test]
fn floats_are_unhashable_integers_are_not() {
    for (value, path) in [
        (json!({ "f": 1.5 }), "variables.f"),
        (json!({ "f": 1.0 }), "variables.f"),
        (json!({ "a": [1, { "b": 2e3 }] }), "variables.a[1].b"),
    ] {
        let v = vars(value);
        let err = render(&machine(Some(&v))).unwrap_err();
        assert_eq!(err, InputsError::Unhashable { path: path.into() });
        assert_eq!(err.reason(), "VariablesInvalid");
        assert_eq!(err.category(), Category::Invalid);
    }
    let v = vars(json!({ "big": u64::MAX, "neg": i64::MIN, "zero": 0 }));
    assert!(render(&machine(Some(&v))).is_ok());
}

#[test]
fn reserved_variable_names_are_refused() {
    for key in [
        "captf_tags",
        "captf_anything",
        "bootstrap_data",
        "count",
        "1x",
    ] {
        let v = vars(json!({ key: "x" }));
        match render(&machine(Some(&v))) {
            Err(InputsError::InvalidVariable { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{key}: {other:?}"),
        }
    }
    // A machine input is not reserved for a cluster.
    let v = vars(json!({ "bootstrap_data": "x" }));
    let req = InputsRequest {
        kind: Kind::Cluster,
        ..machine(Some(&v))
    };
    assert!(render(&req).is_ok());
}

#[test]
fn size_cap_counts_both_files() {
    let fixed = {
        let v = vars(json!({ "blob": "" }));
        let r = render(&machine(Some(&v))).unwrap();
        r.main_tf_json.len() + r.tfvars_json.len()
    };
    let fits = "x".repeat(MAX_INPUTS_BYTES - fixed);
    let v = vars(json!({ "blob": fits }));
    let r = render(&machine(Some(&v))).unwrap();
    assert_eq!(r.main_tf_json.len() + r.tfvars_json.len(), MAX_INPUTS_BYTES);

    let over = vars(json!({ "blob": format!("{fits}x") }));
    let err = render(&machine(Some(&over))).unwrap_err();
    assert_eq!(
        err,
        InputsError::TooLarge {
            bytes: MAX_INPUTS_BYTES + 1
        }
    );
    assert_eq!(err.reason(), "InputsTooLarge");
}

#[test]
fn backend_only_root_is_json() {
    assert_eq!(
        parse(BACKEND_ONLY_MAIN_TF_JSON),
        json!({ "terraform": { "backend": { "kubernetes": {} } } })
    );
    assert_eq!(parse(EMPTY_TFVARS_JSON), json!({}));
}
