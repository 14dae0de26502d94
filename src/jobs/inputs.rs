//! The rendered root module of a Job and its inputs hash (ref §9.2, §9.3).
//! Pure.
//!
//! The root (`main.tf.json`) holds a partial kubernetes backend, one
//! variable per input, a `module "role"` that passes every input to the
//! image's module, and a sensitive re-export of each of the role's outputs;
//! the values go to `terraform.tfvars.json`. Both are JSON with sorted keys,
//! so equal inputs render to equal bytes.
//!
//! The role's inputs come from the Cluster API objects (`capi::inputs`);
//! the user's variables follow them, declared without a type.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::api::Variables;
use crate::error::{Categorized, Category};
use crate::names::Kind;
use crate::role::DECLARED_OUTPUTS;
use crate::webhooks::rules::variable_key_rule;

/// The module contract version the root implements.
pub const CONTRACT_VERSION: &str = "v1alpha1";
/// The scheme id of the inputs hash; a change of what is hashed bumps it.
pub const HASH_SCHEME: &str = "h2";
/// The cap on both files together (ref §9.2).
pub const MAX_INPUTS_BYTES: usize = 1_000_000;
/// The data key of the root module in the per-run Secret.
pub const MAIN_TF_JSON: &str = "main.tf.json";
/// The data key of the values in the per-run Secret.
pub const TFVARS_JSON: &str = "terraform.tfvars.json";
/// The root of a restore: the backend alone, since `state push` and
/// `state list` need neither the module nor its inputs.
pub const BACKEND_ONLY_MAIN_TF_JSON: &[u8] = br#"{"terraform":{"backend":{"kubernetes":{}}}}"#;
/// The values of a backend-only root.
pub const EMPTY_TFVARS_JSON: &[u8] = b"{}";
/// Where the root (in `<workdir>/root`) finds the image's module.
const MODULE_SOURCE: &str = "../../module";

/// What the inputs of one object are rendered from.
#[derive(Clone, Copy, Debug)]
pub struct InputsRequest<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The Cluster API cluster the object belongs to.
    pub cluster_name: Option<&'a str>,
    /// `spec.source.image` as written.
    pub image: &'a str,
    /// The `cluster.x-k8s.io/cloned-from-name` annotation.
    pub template: Option<&'a str>,
    /// `spec.variables` merged over the `spec.variablesFrom` sources.
    pub variables: Option<&'a Variables>,
    /// The variables whose value came from a Secret: declared sensitive.
    pub sensitive: &'a [String],
    /// The role's inputs from the Cluster API objects (`capi::inputs`).
    pub role: &'a [Input],
}

/// The two files of the per-run Secret and the inputs hash they carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedInputs {
    pub main_tf_json: Vec<u8>,
    pub tfvars_json: Vec<u8>,
    /// `h2:<sha256 hex>`.
    pub inputs_hash: String,
}

/// Why no Job can be rendered. Messages name keys, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputsError {
    #[error("the rendered inputs are {bytes} bytes, more than the cap of {MAX_INPUTS_BYTES}")]
    TooLarge { bytes: usize },
    #[error("{path} is not an integer: only integer numbers can be hashed")]
    Unhashable { path: String },
    #[error("variable {key:?} {rule}")]
    InvalidVariable { key: String, rule: &'static str },
    #[error(transparent)]
    Variables(#[from] super::variables::VariablesError),
}

impl InputsError {
    /// The condition reason (ref §3). A float can only come from a user
    /// variable here, so it is the variables that are invalid.
    pub const fn reason(&self) -> &'static str {
        match self {
            InputsError::TooLarge { .. } => "InputsTooLarge",
            InputsError::Unhashable { .. } | InputsError::InvalidVariable { .. } => {
                "VariablesInvalid"
            }
            InputsError::Variables(e) => e.reason(),
        }
    }
}

impl Categorized for InputsError {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

/// Renders the root, the values and the inputs hash of `req`.
pub fn render(req: &InputsRequest) -> Result<RenderedInputs, InputsError> {
    let role = req.kind;
    let empty = Variables::default();
    let variables = &req.variables.unwrap_or(&empty).0;
    // The admission webhook refuses these keys already; checked again so a
    // user variable can never replace a contract input in the values.
    for key in variables.keys() {
        if let Some(rule) = variable_key_rule(key, role) {
            return Err(InputsError::InvalidVariable {
                key: key.clone(),
                rule,
            });
        }
    }

    let inputs = contract_inputs(req);
    let mut declared = Map::new();
    let mut arguments = Map::new();
    let mut values = Map::new();
    arguments.insert("source".into(), MODULE_SOURCE.into());
    for input in &inputs {
        let name = input.name;
        let mut declaration = json!({ "type": input.type_ });
        if input.nullable {
            declaration["default"] = Value::Null;
        }
        if input.sensitive {
            declaration["sensitive"] = true.into();
        }
        declared.insert(name.into(), declaration);
        arguments.insert(name.into(), format!("${{var.{name}}}").into());
        values.insert(name.into(), input.value.clone());
    }
    // Without a type: the module's own declaration constrains it.
    for (name, value) in variables {
        let declaration = if req.sensitive.contains(name) {
            json!({ "sensitive": true })
        } else {
            json!({})
        };
        declared.insert(name.clone(), declaration);
        arguments.insert(name.clone(), format!("${{var.{name}}}").into());
        values.insert(name.clone(), value.clone());
    }
    // An output the module does not declare is null here rather than a
    // validate error, and the declared list tells the two apart.
    let mut outputs: Map<String, Value> = role
        .outputs()
        .iter()
        .map(|name| {
            let value = format!("${{try(module.role.{name}, null)}}");
            let output = json!({ "value": value, "sensitive": true });
            ((*name).to_owned(), output)
        })
        .collect();
    let names = serde_json::to_string(role.outputs()).unwrap_or_default();
    outputs.insert(
        DECLARED_OUTPUTS.into(),
        json!({ "value": format!("${{[for n in {names} : n if can(module.role[n])]}}") }),
    );
    let root = json!({
        "terraform": { "backend": { "kubernetes": {} } },
        "variable": declared,
        "module": { "role": arguments },
        "output": outputs,
    });

    let main_tf_json = sorted_json(&root);
    let tfvars_json = sorted_json(&Value::Object(values));
    let bytes = main_tf_json.len() + tfvars_json.len();
    if bytes > MAX_INPUTS_BYTES {
        return Err(InputsError::TooLarge { bytes });
    }

    let mut hashed = json!({
        "scheme": HASH_SCHEME,
        "contract": CONTRACT_VERSION,
        "role": role.role(),
        "image": req.image,
        "inputs": inputs
            .into_iter()
            .filter(|i| !i.unhashed)
            .map(|i| (i.name.to_owned(), i.value))
            .collect::<Map<_, _>>(),
    });
    if !variables.is_empty() {
        hashed["variables"] = Value::Object(variables.clone().into_iter().collect());
    }
    integers_only(&hashed, "")?;
    let digest = Sha256::digest(sorted_json(&hashed));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(RenderedInputs {
        main_tf_json,
        tfvars_json,
        inputs_hash: format!("{HASH_SCHEME}:{hex}"),
    })
}

/// One contract input: its name, its type constraint and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub name: &'static str,
    pub type_: &'static str,
    pub value: Value,
    /// Declared with `default = null`.
    pub nullable: bool,
    /// Declared sensitive (the bootstrap data).
    pub sensitive: bool,
    /// Left out of the inputs hash (a pool's replicas under autoscaling).
    pub unhashed: bool,
}

impl Input {
    pub fn new(name: &'static str, type_: &'static str, value: Value) -> Input {
        Input {
            name,
            type_,
            value,
            nullable: false,
            sensitive: false,
            unhashed: false,
        }
    }

    /// This input, left out of the inputs hash.
    pub fn unhashed(self) -> Input {
        Input {
            unhashed: true,
            ..self
        }
    }

    pub fn nullable(name: &'static str, type_: &'static str, value: Value) -> Input {
        Input {
            nullable: true,
            ..Input::new(name, type_, value)
        }
    }

    pub fn sensitive(name: &'static str, type_: &'static str, value: Value) -> Input {
        Input {
            sensitive: true,
            ..Input::new(name, type_, value)
        }
    }
}

/// The contract inputs of `req`.
fn contract_inputs(req: &InputsRequest) -> Vec<Input> {
    let mut inputs = vec![
        Input::new("captf_contract", "string", CONTRACT_VERSION.into()),
        Input::new(
            "captf_object",
            "object({kind=string,name=string,namespace=string})",
            json!({ "kind": req.kind.kind(), "name": req.name, "namespace": req.namespace }),
        ),
        Input::new(
            "captf_tags",
            "map(string)",
            json!({
                "captf.io/cluster": req.cluster_name.unwrap_or_default(),
                "captf.io/namespace": req.namespace,
                "captf.io/kind": req.kind.kind(),
                "captf.io/name": req.name,
                "captf.io/managed-by": "captf",
                "captf.io/template": req.template.unwrap_or_default(),
            }),
        ),
    ];
    if let Some(cluster) = req.cluster_name {
        inputs.push(Input::new(
            "captf_cluster",
            "object({name=string,namespace=string})",
            json!({ "name": cluster, "namespace": req.namespace }),
        ));
    }
    inputs.extend(req.role.iter().cloned());
    inputs
}

/// `value` as compact JSON with every object's keys sorted, whatever order
/// the map keeps them in.
fn sorted_json(value: &Value) -> Vec<u8> {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(key.as_str()).to_string());
                    out.push(':');
                    write(item, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out.into_bytes()
}

/// Refuses a float anywhere in `value`, naming where it is (`path`), never
/// what it is.
pub fn integers_only(value: &Value, path: &str) -> Result<(), InputsError> {
    match value {
        Value::Number(n) if !(n.is_i64() || n.is_u64()) => Err(InputsError::Unhashable {
            path: path.to_owned(),
        }),
        Value::Object(map) => map.iter().try_for_each(|(key, item)| {
            let path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            integers_only(item, &path)
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| integers_only(item, &format!("{path}[{i}]"))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn vars(value: Value) -> Variables {
        serde_json::from_value(value).unwrap()
    }

    fn machine<'a>(variables: Option<&'a Variables>) -> InputsRequest<'a> {
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
}
