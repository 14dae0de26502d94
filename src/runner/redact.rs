//! Redaction (book: inside-the-job.md "Redaction"): every known secret is
//! replaced by `(sensitive)` in failure summaries and in the runner's logs,
//! the runtime's output passed through included. Best effort: it knows the
//! credentials mirror's files and the values of sensitive variables.

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

/// What a secret becomes.
pub const REDACTED: &str = "(sensitive)";

/// Values shorter than this are not redacted: replacing every `1` or `yes`
/// would make the logs unreadable and hide nothing.
pub const MIN_SECRET_LEN: usize = 4;

/// Replaces known secrets.
#[derive(Clone, Debug)]
pub struct Redactor {
    // None when there is nothing to redact.
    matcher: Option<AhoCorasick>,
}

/// A redactor cannot be built (the automaton would be too large).
#[derive(Debug, thiserror::Error)]
#[error("building the redactor: {0}")]
pub struct RedactorError(#[from] aho_corasick::BuildError);

impl crate::error::Categorized for RedactorError {
    fn category(&self) -> crate::error::Category {
        crate::error::Category::Internal
    }
}

impl Redactor {
    /// A redactor for `secrets`; those shorter than [`MIN_SECRET_LEN`] are
    /// ignored.
    pub fn new(secrets: impl IntoIterator<Item = Vec<u8>>) -> Result<Redactor, RedactorError> {
        let mut secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        secrets.sort();
        secrets.dedup();
        if secrets.is_empty() {
            return Ok(Redactor { matcher: None });
        }
        // Leftmost-longest, so that a secret containing another is replaced
        // whole rather than leaving its remainder behind.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&secrets)?;
        Ok(Redactor {
            matcher: Some(matcher),
        })
    }

    /// A redactor that knows no secret.
    pub fn none() -> Redactor {
        Redactor { matcher: None }
    }

    pub fn bytes(&self, text: &[u8]) -> Vec<u8> {
        match &self.matcher {
            Some(m) => {
                let mut out = Vec::with_capacity(text.len());
                m.replace_all_with_bytes(text, &mut out, |_, _, dst| {
                    dst.extend_from_slice(REDACTED.as_bytes());
                    true
                });
                out
            }
            None => text.to_vec(),
        }
    }

    pub fn text(&self, text: &str) -> String {
        // A secret is arbitrary bytes; lossy conversion back is safe because
        // only whole matches are replaced by ASCII.
        String::from_utf8_lossy(&self.bytes(text.as_bytes())).into_owned()
    }
}

/// The secrets in one credentials file: its whole content, the content
/// without its final newline, and each line when it has several.
pub fn credential_secrets(content: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![content.to_vec()];
    let trimmed = trim_newline(content);
    out.push(trimmed.to_vec());
    if trimmed.contains(&b'\n') {
        out.extend(
            trimmed
                .split(|&b| b == b'\n')
                .map(|line| trim_cr(line).to_vec()),
        );
    }
    out
}

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
        Value::String(s) => out.extend(credential_secrets(s.as_bytes())),
        Value::Array(items) => items.iter().for_each(|v| value_secrets(v, out)),
        Value::Object(map) => map.values().for_each(|v| value_secrets(v, out)),
        Value::Number(n) => out.push(n.to_string().into_bytes()),
        Value::Bool(_) | Value::Null => {}
    }
}

fn trim_newline(content: &[u8]) -> &[u8] {
    let content = content.strip_suffix(b"\n").unwrap_or(content);
    trim_cr(content)
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn redactor(secrets: &[&str]) -> Redactor {
        Redactor::new(secrets.iter().map(|s| s.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn replaces_known_secrets() {
        for (secrets, input, want) in [
            (
                &["hunter22"][..],
                "password is hunter22.",
                "password is (sensitive).",
            ),
            (&["hunter22"], "hunter22hunter22", "(sensitive)(sensitive)"),
            (
                &["abc"],
                "abc is too short to redact",
                "abc is too short to redact",
            ),
            (&["abcd"], "abcd is not", "(sensitive) is not"),
            (
                &["secret", "secret-longer"],
                "a secret-longer b",
                "a (sensitive) b",
            ),
            (
                &["secret", "secret-longer"],
                "a secret b",
                "a (sensitive) b",
            ),
            (&[], "nothing known", "nothing known"),
            (&["ünïcødé"], "x ünïcødé y", "x (sensitive) y"),
        ] {
            assert_eq!(redactor(secrets).text(input), want, "{secrets:?} {input:?}");
        }
    }

    #[test]
    fn redacts_bytes_that_are_not_utf8() {
        let r = Redactor::new([b"\xff\xfesecret".to_vec()]).unwrap();
        assert_eq!(r.bytes(b"<\xff\xfesecret>"), b"<(sensitive)>");
        assert_eq!(Redactor::none().bytes(b"\xff\xfesecret"), b"\xff\xfesecret");
    }

    #[test]
    fn credential_files() {
        let one = credential_secrets(b"s3cr3t-value\n");
        assert!(one.contains(&b"s3cr3t-value\n".to_vec()));
        assert!(one.contains(&b"s3cr3t-value".to_vec()));

        let pem = b"-----BEGIN KEY-----\r\nAAAABBBB\r\nCCCCDDDD\r\n-----END KEY-----\r\n";
        let secrets = credential_secrets(pem);
        let r = Redactor::new(secrets).unwrap();
        // A line of the key alone, as a log line might show it.
        assert_eq!(r.text("key line: CCCCDDDD"), "key line: (sensitive)");
        assert_eq!(r.text("AAAABBBB"), "(sensitive)");
        assert_eq!(
            r.bytes(pem),
            b"(sensitive)".to_vec(),
            "the whole file is one match"
        );
    }

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
