//! The bare secret values inside the credential formats a credentials file
//! (or a secret environment variable) commonly holds, which whole-file and
//! per-line matching never see alone:
//!
//! - JSON (a GCP service account key, any JSON credentials): the string and
//!   number values of credential-named keys ([`credential_key`]).
//! - YAML (a kubeconfig, clouds.yaml): the same; a `*-data` value
//!   (`client-key-data`) also base64-decoded (the PEM).
//! - Otherwise INI, AWS credentials, dotenv (`key = value`, `key=value`,
//!   `export KEY=value`): every value, but of the keys known to hold public
//!   settings ([`public_ini_key`]) and booleans. These files are small and
//!   made of credentials under names of every kind, and each of their lines
//!   was already a secret; JSON and YAML files carry much public structure
//!   (URLs, project names, CA certificates) that must stay readable.
//!
//! Each value found counts whole and line by line (a PEM key's lines).

use base64::Engine as _;
use serde_json::Value;

use super::MIN_SECRET_LEN;

/// The secret values in `content`, by its format; empty for a format not
/// known.
pub fn extract(content: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if let Ok(value) = serde_json::from_slice::<Value>(content) {
        if value.is_object() || value.is_array() {
            walk(&value, None, &mut out);
        }
        return out;
    }
    let Ok(text) = std::str::from_utf8(content) else {
        return out;
    };
    if let Ok(value) = serde_saphyr::from_str::<Value>(text)
        && (value.is_object() || value.is_array())
    {
        walk(&value, None, &mut out);
        return out;
    }
    ini(text, &mut out);
    out
}

/// Whether a JSON or YAML key names a credential: it has a credential word
/// in it and no word of a location or a public certificate.
pub fn credential_key(key: &str) -> bool {
    const WORDS: &[&str] = &[
        "secret",
        "passw",
        "pwd",
        "passphrase",
        "token",
        "key",
        "credential",
        "auth",
        "session",
        "private",
        "cert",
        "signature",
        "cookie",
        "sas",
        "bearer",
        "connectionstring",
        "connection_string",
    ];
    const PUBLIC: &[&str] = &[
        "url",
        "uri",
        "endpoint",
        "file",
        "path",
        "certificate-authority",
        "certificate_authority",
        "authority",
        "ca-data",
        "ca_data",
    ];
    let key = key.to_ascii_lowercase();
    WORDS.iter().any(|w| key.contains(w)) && !PUBLIC.iter().any(|w| key.contains(w))
}

/// Whether an INI key holds a public setting (AWS, Azure and GCP config
/// names) rather than a credential.
pub fn public_ini_key(key: &str) -> bool {
    const PUBLIC: &[&str] = &[
        "region",
        "output",
        "profile",
        "url",
        "uri",
        "endpoint",
        "role_arn",
        "role_name",
        "session_name",
        "account_id",
        "duration",
        "retry",
        "attempts",
        "ca_bundle",
        "mfa_serial",
        "format",
        "_file",
        "_path",
        "tenant",
        "subscription",
        "project",
        "zone",
        "version",
    ];
    let key = key.to_ascii_lowercase();
    PUBLIC.iter().any(|w| key.contains(w))
}

fn walk(value: &Value, key: Option<&str>, out: &mut Vec<Vec<u8>>) {
    match value {
        Value::Object(map) => {
            // `{name: AWS_SECRET_ACCESS_KEY, value: ...}`, as in a
            // kubeconfig's exec env.
            if let (Some(Value::String(name)), Some(Value::String(v))) =
                (map.get("name"), map.get("value"))
                && credential_key(name)
            {
                value_secrets(name, v, out);
            }
            for (k, v) in map {
                walk(v, Some(k), out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk(v, key, out)),
        Value::String(s) => {
            if let Some(key) = key.filter(|k| credential_key(k)) {
                value_secrets(key, s, out);
            }
        }
        Value::Number(n) => {
            if key.is_some_and(credential_key) {
                out.push(n.to_string().into_bytes());
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

/// One value: whole and by lines; a kubeconfig `*-data` value decoded too.
fn value_secrets(key: &str, value: &str, out: &mut Vec<Vec<u8>>) {
    out.extend(super::value_lines(value.as_bytes()));
    let key = key.to_ascii_lowercase();
    if (key.ends_with("-data") || key.ends_with("_data"))
        && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(value.trim())
    {
        out.extend(super::value_lines(&decoded));
    }
}

fn ini(text: &str, out: &mut Vec<Vec<u8>>) {
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';', '[']) {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let key = key.strip_prefix("export ").unwrap_or(key).trim();
        let is_key = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !is_key || public_ini_key(key) {
            continue;
        }
        let value = unquote(value.trim());
        let boolean = ["true", "false", "yes", "no", "on", "off"]
            .iter()
            .any(|b| value.eq_ignore_ascii_case(b));
        if value.len() >= MIN_SECRET_LEN && !boolean {
            out.push(value.as_bytes().to_vec());
        }
    }
}

fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(content: &str) -> Vec<String> {
        extract(content.as_bytes())
            .into_iter()
            .map(|s| String::from_utf8(s).unwrap())
            .collect()
    }

    fn assert_found(content: &str, want: &[&str], not: &[&str]) {
        let got = found(content);
        for w in want {
            assert!(got.iter().any(|g| g == w), "{w:?} not in {got:?}");
        }
        for n in not {
            assert!(!got.iter().any(|g| g.contains(n)), "{n:?} in {got:?}");
        }
    }

    #[test]
    fn ini_and_aws_credentials() {
        assert_found(
            "[default]\n\
             aws_access_key_id = AKIAEXAMPLEKEY01\n\
             aws_secret_access_key=wJalrXUtnFEMI/K7MDENG+bPxRfiCY\n\
             aws_session_token = \"FwoGZXIvYXdzEJr//////////\"\n\
             region = eu-west-1\n\
             output = json\n\
             ; comment = not-a-value\n\
             # also = not-a-value\n\
             [profile other]\n\
             role_arn = arn:aws:iam::123456789012:role/admin\n\
             source_profile = default\n\
             custom_thing = my-api-key-value\n\
             s3 =\n    signature_version = s3v4\n\
             use_fips = true\n",
            &[
                "AKIAEXAMPLEKEY01",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCY",
                "FwoGZXIvYXdzEJr//////////",
                "my-api-key-value",
            ],
            &[
                "eu-west-1",
                "json",
                "not-a-value",
                "arn:aws",
                "default",
                "true",
                "s3v4",
            ],
        );
    }

    #[test]
    fn dotenv() {
        assert_found(
            "export DB_PASSWORD='pa ss=word'\nAPI_TOKEN=tok-abcdef\nREGION=us-east-1\n",
            &["pa ss=word", "tok-abcdef"],
            &["us-east-1"],
        );
    }

    #[test]
    fn kubeconfig() {
        let pem = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIKey+Line/One\nMoreKeyLineTwo==\n-----END EC PRIVATE KEY-----\n";
        let key_data = base64::engine::general_purpose::STANDARD.encode(pem);
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://api.example:6443\n    certificate-authority-data: Q0FDRVJU\n\
             users:\n- name: u\n  user:\n    token: kube-token-abc.def\n    client-key-data: {key_data}\n    client-certificate-data: Y2VydC1kYXRh\n\
             - name: basic\n  user:\n    username: admin\n    password: basic-pass-123\n\
             - name: exec\n  user:\n    exec:\n      command: aws\n      env:\n      - name: AWS_SECRET_ACCESS_KEY\n        value: exec-env-secret\n      - name: AWS_REGION\n        value: eu-west-3\n\
             contexts:\n- name: u\n  context:\n    cluster: c\n    user: u\ncurrent-context: u\n"
        );
        assert_found(
            &kubeconfig,
            &[
                "kube-token-abc.def",
                key_data.as_str(),
                pem,
                "MHcCAQEEIKey+Line/One",
                "MoreKeyLineTwo==",
                "Y2VydC1kYXRh",
                "cert-data",
                "basic-pass-123",
                "exec-env-secret",
            ],
            &[
                "Q0FDRVJU",
                "CACERT",
                "https://api.example",
                "admin",
                "eu-west-3",
            ],
        );
        assert!(
            !found(&kubeconfig)
                .iter()
                .any(|s| s.starts_with("-----") && !s.contains('\n')),
            "a PEM armor line is no secret"
        );
    }

    #[test]
    fn json_key_file() {
        let key = serde_json::json!({
            "type": "service_account",
            "project_id": "my-project",
            "private_key_id": "0123456789abcdef0123",
            "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nAQEFAASCBKcwggSjAgEAAoIB\n-----END PRIVATE KEY-----\n",
            "client_email": "sa@my-project.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "token_uri": "https://oauth2.googleapis.com/token",
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "installed": {"client_secret": "GOCSPX-secret", "refresh_token": "1//refresh"}
        });
        assert_found(
            &key.to_string(),
            &[
                "0123456789abcdef0123",
                "MIIEvQIBADANBgkqhkiG9w0B",
                "AQEFAASCBKcwggSjAgEAAoIB",
                "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nAQEFAASCBKcwggSjAgEAAoIB\n-----END PRIVATE KEY-----",
                "GOCSPX-secret",
                "1//refresh",
            ],
            &["service_account", "my-project", "googleapis", "1234567890"],
        );
    }

    #[test]
    fn unknown_formats_have_nothing_inside() {
        for content in [
            &b"just-a-token-value\n"[..],
            b"-----BEGIN KEY-----\nAAAABBBB==\n-----END KEY-----\n",
            b"\xff\xfe binary",
            b"\"a json string\"",
            b"",
        ] {
            assert!(extract(content).is_empty(), "{content:?}");
        }
    }

    /// A YAML alias bomb is refused by the parser's budget, not expanded.
    #[test]
    fn a_yaml_alias_bomb_is_not_expanded() {
        let mut yaml = String::from("a: &a [\"lol-token\", \"lol-token\"]\n");
        for i in 1..30 {
            yaml.push_str(&format!(
                "l{i}: &l{i} [*{prev}, *{prev}, *{prev}]\n",
                prev = if i == 1 {
                    "a".to_string()
                } else {
                    format!("l{}", i - 1)
                }
            ));
        }
        yaml.push_str("token: *l29\n");
        let started = std::time::Instant::now();
        let found = extract(yaml.as_bytes());
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
        assert!(found.len() < 1000, "{}", found.len());
    }

    #[test]
    fn key_names() {
        for (key, want) in [
            ("password", true),
            ("client-key-data", true),
            ("client-certificate-data", true),
            ("certificate-authority-data", false),
            ("token", true),
            ("tokenFile", false),
            ("token_uri", false),
            ("private_key_id", true),
            ("client_id", false),
            ("username", false),
            ("AccessKey", true),
        ] {
            assert_eq!(credential_key(key), want, "{key}");
        }
    }
}
