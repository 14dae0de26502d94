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

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

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
    pub variables: Option<&'a BTreeMap<String, Value>>,
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
    let empty = BTreeMap::new();
    let variables = req.variables.unwrap_or(&empty);
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
mod tests;
