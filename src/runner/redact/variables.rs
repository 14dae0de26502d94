//! The values of the root's sensitive variables.

use serde_json::Value;

/// The values of the sensitive variables: those `main.tf.json` declares
/// `"sensitive": true`, looked up in `terraform.tfvars.json`. A string
/// counts whole and per line; any other value by its string leaves and its
/// compact JSON.
pub fn sensitive_variable_secrets(main_tf_json: &Value, tfvars: &Value) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for name in sensitive_variables(main_tf_json) {
        if let Some(value) = tfvars.get(&name) {
            value_secrets(value, &mut out);
            if !value.is_string() {
                out.push(value.to_string().into_bytes());
            }
        }
    }
    out
}

/// The names of the variables declared sensitive. JSON syntax allows the
/// `variable` block as an object or as a list of objects.
fn sensitive_variables(main_tf_json: &Value) -> Vec<String> {
    let blocks: Vec<&Value> = match main_tf_json.get("variable") {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(block) => vec![block],
        None => Vec::new(),
    };
    let mut names = Vec::new();
    for block in blocks {
        let Some(variables) = block.as_object() else {
            continue;
        };
        for (name, decl) in variables {
            let decls: Vec<&Value> = match decl {
                Value::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            if decls
                .iter()
                .any(|d| d.get("sensitive") == Some(&Value::Bool(true)))
            {
                names.push(name.clone());
            }
        }
    }
    names
}

fn value_secrets(value: &Value, out: &mut Vec<Vec<u8>>) {
    match value {
        Value::String(s) => out.extend(super::value_lines(s.as_bytes())),
        Value::Array(items) => items.iter().for_each(|v| value_secrets(v, out)),
        Value::Object(map) => map.values().for_each(|v| value_secrets(v, out)),
        Value::Number(n) => out.push(n.to_string().into_bytes()),
        Value::Bool(_) | Value::Null => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::Redactor;
    use super::*;
    use serde_json::json;

    #[test]
    fn sensitive_variables_of_the_root() {
        let main = json!({
            "terraform": {"backend": {"kubernetes": {}}},
            "variable": {
                "bootstrap_data": {"sensitive": true, "type": "string"},
                "token": {"sensitive": true},
                "nested": {"sensitive": true},
                "machine_name": {"type": "string"},
                "short": {"sensitive": true},
                "flag": {"sensitive": false}
            }
        });
        let tfvars = json!({
            "bootstrap_data": "#cloud-config\nrunuser: secret-cmd\n",
            "token": "tok-123456",
            "nested": {"user": "admin-user", "port": 65432},
            "machine_name": "machine-public-name",
            "short": "abc",
            "flag": "not-secret-at-all"
        });
        let r = Redactor::new(sensitive_variable_secrets(&main, &tfvars)).unwrap();
        for (input, want) in [
            ("token tok-123456", "token (sensitive)"),
            ("runs runuser: secret-cmd", "runs (sensitive)"),
            ("#cloud-config", "(sensitive)"),
            (
                "user admin-user on 65432",
                "user (sensitive) on (sensitive)",
            ),
            ("machine-public-name", "machine-public-name"),
            ("not-secret-at-all", "not-secret-at-all"),
            ("abc", "abc"),
            (r#"{"port":65432,"user":"admin-user"}"#, "(sensitive)"),
        ] {
            assert_eq!(r.text(input), want, "{input:?}");
        }
    }

    #[test]
    fn variable_blocks_in_list_form() {
        let main = json!({"variable": [{"a": [{"sensitive": true}]}, {"b": {"sensitive": true}}]});
        let tfvars = json!({"a": "value-of-a", "b": "value-of-b"});
        let r = Redactor::new(sensitive_variable_secrets(&main, &tfvars)).unwrap();
        assert_eq!(r.text("value-of-a value-of-b"), "(sensitive) (sensitive)");
    }

    #[test]
    fn no_variables_no_secrets() {
        assert!(sensitive_variable_secrets(&json!({}), &json!({"x": "value"})).is_empty());
        assert!(
            sensitive_variable_secrets(
                &json!({"variable": {"x": {"sensitive": true}}}),
                &json!({})
            )
            .is_empty()
        );
    }
}
