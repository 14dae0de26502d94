//! `spec.variablesFrom` (ref §1.2 VariablesSource): the variables an object
//! takes from ConfigMaps and Secrets of its namespace, merged with its
//! inline `spec.variables`. Pure; the reconcile fetches the sources.
//!
//! - A source must carry the label `captf.io/variables=true`; one that is
//!   missing or unlabeled blocks the object (VariablesSourceNotFound)
//!   unless it is `optional`, when it contributes nothing.
//! - Values must be UTF-8 (a ConfigMap's `binaryData` is read like its
//!   `data`); `format: JSON` parses each value, `String` passes it as is.
//! - A key from a source obeys the webhook's rules for inline keys.
//! - Sources merge in list order (a later one wins on a key), then the
//!   inline variables win over all of them.
//! - A variable whose winning value came from a Secret is sensitive.
//!
//! Errors name the source and the key, never a value.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{Variables, VariablesFormat, VariablesSource};
use crate::error::{Categorized, Category};
use crate::keys::VARIABLES_LABEL;
use crate::names::Kind;
use crate::webhooks::rules::variable_key_rule;

/// A ConfigMap or a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    ConfigMap,
    Secret,
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
        })
    }
}

/// Which object one `variablesFrom` entry names; None for an entry with
/// neither reference (the CRD and the webhook refuse it).
pub fn reference(source: &VariablesSource) -> Option<(SourceKind, &str)> {
    match (&source.config_map_ref, &source.secret_ref) {
        (Some(c), None) => Some((SourceKind::ConfigMap, c.name.as_str())),
        (None, Some(s)) => Some((SourceKind::Secret, s.name.as_str())),
        _ => None,
    }
}

/// One entry of `variablesFrom` with what the reconcile found.
#[derive(Clone, Debug, PartialEq)]
pub struct Fetched<'a> {
    pub source: &'a VariablesSource,
    /// The object's data (a ConfigMap's `data` and `binaryData`), or None
    /// when it is missing or does not carry [`VARIABLES_LABEL`]`=true`.
    pub data: Option<BTreeMap<String, Vec<u8>>>,
}

/// The variables of an object and which of them are sensitive.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merged {
    pub variables: BTreeMap<String, Value>,
    /// Sorted.
    pub sensitive: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VariablesError {
    #[error("{kind} {name} of spec.variablesFrom is missing or not labeled {VARIABLES_LABEL}=true")]
    SourceNotFound { kind: SourceKind, name: String },
    #[error("spec.variablesFrom[{index}]: exactly one of configMapRef and secretRef must be set")]
    NoReference { index: usize },
    #[error("key {key:?} of {kind} {name} is not UTF-8")]
    NotUtf8 {
        kind: SourceKind,
        name: String,
        key: String,
    },
    #[error("key {key:?} of {kind} {name} is not valid JSON (format: JSON)")]
    NotJson {
        kind: SourceKind,
        name: String,
        key: String,
    },
    /// Past serde_json's nesting limit: the text of `spec.variables` holds
    /// any nesting, and the webhook refuses it past the limit.
    #[error("spec.variables is not a JSON object nested at most 128 levels deep")]
    InlineTooDeep,
    #[error("key {key:?} of {kind} {name}: {rule}")]
    InvalidKey {
        kind: SourceKind,
        name: String,
        key: String,
        rule: &'static str,
    },
}

impl VariablesError {
    /// The condition reason (ref §3, DependenciesReady).
    pub const fn reason(&self) -> &'static str {
        match self {
            VariablesError::SourceNotFound { .. } => "VariablesSourceNotFound",
            _ => "VariablesInvalid",
        }
    }
}

impl Categorized for VariablesError {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

/// Merges the fetched sources, in order, and then `inline` over them.
pub fn merge(
    fetched: &[Fetched],
    inline: Option<&Variables>,
    role: Kind,
) -> Result<Merged, VariablesError> {
    // Each key's value and whether it came from a Secret.
    let mut merged: BTreeMap<String, (Value, bool)> = BTreeMap::new();
    for (index, entry) in fetched.iter().enumerate() {
        let (kind, name) = reference(entry.source).ok_or(VariablesError::NoReference { index })?;
        let Some(data) = &entry.data else {
            if entry.source.optional == Some(true) {
                continue;
            }
            return Err(VariablesError::SourceNotFound {
                kind,
                name: name.to_string(),
            });
        };
        for (key, bytes) in data {
            let named = |key: &str| (kind, name.to_string(), key.to_string());
            if let Some(rule) = variable_key_rule(key, role) {
                let (kind, name, key) = named(key);
                return Err(VariablesError::InvalidKey {
                    kind,
                    name,
                    key,
                    rule,
                });
            }
            let Ok(text) = std::str::from_utf8(bytes) else {
                let (kind, name, key) = named(key);
                return Err(VariablesError::NotUtf8 { kind, name, key });
            };
            let value = match entry.source.format.unwrap_or_default() {
                VariablesFormat::String => Value::String(text.to_string()),
                VariablesFormat::Json => serde_json::from_str(text).map_err(|_| {
                    let (kind, name, key) = named(key);
                    VariablesError::NotJson { kind, name, key }
                })?,
            };
            merged.insert(key.clone(), (value, kind == SourceKind::Secret));
        }
    }
    let inline = inline.map(Variables::values).transpose();
    for (key, value) in inline
        .map_err(|_| VariablesError::InlineTooDeep)?
        .into_iter()
        .flatten()
    {
        merged.insert(key, (value, false));
    }
    let sensitive = merged
        .iter()
        .filter(|(_, (_, secret))| *secret)
        .map(|(key, _)| key.clone())
        .collect();
    Ok(Merged {
        variables: merged.into_iter().map(|(k, (v, _))| (k, v)).collect(),
        sensitive,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::VariablesSourceReference;

    fn source(kind: SourceKind, name: &str, optional: bool, json: bool) -> VariablesSource {
        let reference = Some(VariablesSourceReference { name: name.into() });
        VariablesSource {
            config_map_ref: reference.clone().filter(|_| kind == SourceKind::ConfigMap),
            secret_ref: reference.filter(|_| kind == SourceKind::Secret),
            optional: Some(optional),
            format: Some(if json {
                VariablesFormat::Json
            } else {
                VariablesFormat::String
            }),
        }
    }

    fn data(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Vec<u8>>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    fn vars(v: serde_json::Value) -> Variables {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn sources_merge_in_order_and_inline_wins() {
        let cm = source(SourceKind::ConfigMap, "plain", false, false);
        let secret = source(SourceKind::Secret, "secret", false, false);
        let json_cm = source(SourceKind::ConfigMap, "typed", false, true);
        let fetched = [
            Fetched {
                source: &cm,
                data: data(&[("region", "eu"), ("size", "small"), ("token", "x")]),
            },
            Fetched {
                source: &secret,
                data: data(&[("token", "s3cr3t"), ("size", "large"), ("pass", "p")]),
            },
            Fetched {
                source: &json_cm,
                data: data(&[
                    ("nodes", "3"),
                    ("tags", r#"{"a":"b"}"#),
                    ("region", "\"us\""),
                ]),
            },
        ];
        let inline = vars(json!({"pass": "inline", "extra": true}));
        let got = merge(&fetched, Some(&inline), Kind::Machine).unwrap();
        assert_eq!(
            got.variables,
            serde_json::from_value::<BTreeMap<String, Value>>(json!({
                "region": "us",
                "size": "large",
                "token": "s3cr3t",
                "pass": "inline",
                "nodes": 3,
                "tags": {"a": "b"},
                "extra": true,
            }))
            .unwrap()
        );
        // pass came from the Secret, but the inline value won.
        assert_eq!(got.sensitive, ["size", "token"]);
    }

    #[test]
    fn missing_sources_block_unless_optional() {
        let required = source(SourceKind::Secret, "gone", false, false);
        let optional = source(SourceKind::ConfigMap, "maybe", true, false);
        let got = merge(
            &[Fetched {
                source: &optional,
                data: None,
            }],
            None,
            Kind::Cluster,
        )
        .unwrap();
        assert_eq!(got, Merged::default());
        let err = merge(
            &[Fetched {
                source: &required,
                data: None,
            }],
            None,
            Kind::Cluster,
        )
        .unwrap_err();
        assert_eq!(err.reason(), "VariablesSourceNotFound");
        assert_eq!(
            err.to_string(),
            "Secret gone of spec.variablesFrom is missing or not labeled captf.io/variables=true"
        );
    }

    #[test]
    fn bad_values_and_keys_are_named_without_the_value() {
        let json_secret = source(SourceKind::Secret, "s", false, true);
        let plain = source(SourceKind::ConfigMap, "c", false, false);
        // (source, key, value) -> message
        let table: &[(&VariablesSource, &str, &[u8], &str)] = &[
            (
                &json_secret,
                "k",
                b"{not json hunter2",
                "key \"k\" of Secret s is not valid JSON (format: JSON)",
            ),
            (
                &plain,
                "k",
                b"\xff\xfehunter2",
                "key \"k\" of ConfigMap c is not UTF-8",
            ),
            (
                &plain,
                "9lives",
                b"hunter2",
                "key \"9lives\" of ConfigMap c: ",
            ),
            (
                &plain,
                "captf_x",
                b"hunter2",
                "key \"captf_x\" of ConfigMap c: ",
            ),
            (
                &plain,
                "count",
                b"hunter2",
                "key \"count\" of ConfigMap c: ",
            ),
        ];
        for (source, key, value, message) in table {
            let fetched = [Fetched {
                source,
                data: Some([(key.to_string(), value.to_vec())].into()),
            }];
            let err = merge(&fetched, None, Kind::Machine).unwrap_err();
            assert_eq!(err.reason(), "VariablesInvalid", "{key}");
            let text = err.to_string();
            assert!(text.starts_with(message), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn inline_variables_past_the_nesting_limit_block_the_object() {
        // Admitted without the webhook: the text holds it, reading it fails.
        let deep = format!(r#"{{"hunter2": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        let inline: Variables = serde_json::from_str(&deep).unwrap();
        let err = merge(&[], Some(&inline), Kind::Machine).unwrap_err();
        assert_eq!(err.reason(), "VariablesInvalid");
        assert_eq!(
            err.to_string(),
            "spec.variables is not a JSON object nested at most 128 levels deep"
        );
    }
}
