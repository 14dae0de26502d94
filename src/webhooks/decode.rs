//! Reading an object of an AdmissionReview: its JSON text, borrowed from the
//! request body, decoded straight into the typed API object, once, without
//! the parts no rule reads ([`unread`]).
//!
//! `spec.variables` holds free JSON, so a small body can still ask for a big
//! tree: a 3 MiB array of 1.5M zeros is 48 MB as `serde_json::Value`s, and
//! 780 KB of nested one-key objects are 41 MB. The webhook keeps the
//! variables as text (`api::Variables`), but the manager reads them as
//! values when it renders a Job's inputs, and the webhook's own maps
//! (labels, annotations) cost many times their text when dense. So an
//! object long enough to go past [`MAX_VALUES`] has its JSON values counted
//! by a pass that builds nothing, and is refused past the cap.
//!
//! Nesting depth needs no check of its own here: serde_json refuses more
//! than 128 levels (its recursion limit) both in the count and in
//! `from_str`, and capturing the raw text for the envelope walks the
//! nesting without recursing. The variables, kept as text, hold any
//! nesting: their rule walks them under the same limit.

use std::fmt;

use serde::Deserialize;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::value::RawValue;
use thiserror::Error;

use super::rules::Violation;

mod unread;

/// The most JSON values one object of a request may hold, each non-empty
/// JSON object counting as [`OBJECT_WEIGHT`] more. Reading a value as a
/// `serde_json::Value` costs up to 32 bytes (more while a growing array
/// doubles) and a non-empty object a B-tree node of 632 bytes more;
/// weighed so, the cap holds what reading one object's values allocates
/// beyond its strings to about 4 MB, whatever its text (4.5 and 4.9 MB for
/// the worst shapes, when the webhook still read the variables so). A real
/// object holds a few hundred values; 65,536 leaves room for large
/// variables.
pub const MAX_VALUES: usize = 65_536;

/// What a non-empty JSON object counts for beyond its own value: its B-tree
/// node is ten values' worth, and a margin.
pub const OBJECT_WEIGHT: usize = 16;

pub use crate::server::webhook::Field;

/// Why an object was not decoded.
#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("{}: {}", .0.name(), too_many_values_rule())]
    TooManyValues(Field),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Decoded with the body as the request's kind, read as another.
    #[error("{}: is not of the kind the rules read", .0.name())]
    OtherKind(Field),
}

fn too_many_values_rule() -> String {
    format!(
        "must hold at most {MAX_VALUES} JSON values, a non-empty object counting as {}: the webhook bounds the memory of a request",
        OBJECT_WEIGHT + 1
    )
}

impl DecodeError {
    /// The refusal: the values cap as it is, a JSON error under `object`
    /// with the rule that `rule` makes of it.
    pub fn into_violation(self, rule: impl FnOnce(serde_json::Error) -> String) -> Violation {
        match self {
            DecodeError::TooManyValues(field) => Violation::invalid(
                field.name(),
                too_many_values_rule(),
                Some(format!("more than {MAX_VALUES}")),
            ),
            DecodeError::Json(e) => Violation::invalid("object", rule(e), None),
            DecodeError::OtherKind(field) => {
                Violation::invalid(field.name(), "is not of the kind the rules read", None)
            }
        }
    }
}

/// `raw` as a `T` without its [`unread`] parts, refused unread past
/// [`MAX_VALUES`].
pub fn decode<T: DeserializeOwned>(field: Field, raw: &RawValue) -> Result<T, DecodeError> {
    if too_many_values(raw.get())? {
        return Err(DecodeError::TooManyValues(field));
    }
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    let object = decode_from(field, &mut deserializer)?;
    deserializer.end()?;
    Ok(object)
}

/// The `field` object decoded from `d` without its [`unread`] parts,
/// unchecked against the cap: for text that is [`below_the_cap`].
pub fn decode_from<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    field: Field,
    d: D,
) -> Result<T, D::Error> {
    T::deserialize(unread::skipping(field, d))
}

/// Whether JSON text of `len` bytes cannot hold more than [`MAX_VALUES`]
/// values. A non-empty object spends at least 5 bytes of its own (`{"":`
/// and `}`) on its `1 + OBJECT_WEIGHT` = 17, any other value at least 1 byte
/// on its one, so text counts at most 3.4 per byte: shorter than a quarter
/// of the cap, it cannot pass it.
pub fn below_the_cap(len: usize) -> bool {
    len < MAX_VALUES / 4
}

/// Whether `json` holds more than [`MAX_VALUES`] values, objects weighed;
/// text [`below_the_cap`] is not read at all.
fn too_many_values(json: &str) -> Result<bool, serde_json::Error> {
    if below_the_cap(json.len()) {
        return Ok(false);
    }
    count(json)
}

/// Counts the values of `json` up to the cap: whether it went past.
fn count(json: &str) -> Result<bool, serde_json::Error> {
    let mut tally = Tally {
        left: MAX_VALUES,
        over: false,
    };
    let mut deserializer = serde_json::Deserializer::from_str(json);
    match (Count { tally: &mut tally }).deserialize(&mut deserializer) {
        Ok(()) => Ok(false),
        Err(_) if tally.over => Ok(true),
        Err(e) => Err(e),
    }
}

/// The values still allowed, and whether one more was seen.
struct Tally {
    left: usize,
    over: bool,
}

/// Counts values down and fails the parse past the cap. It keeps nothing:
/// strings are seen borrowed (or in serde_json's one reused scratch buffer
/// when escaped), keys are skipped.
struct Count<'t> {
    tally: &'t mut Tally,
}

impl Count<'_> {
    fn take<E: de::Error>(&mut self, values: usize) -> Result<(), E> {
        match self.tally.left.checked_sub(values) {
            Some(left) => {
                self.tally.left = left;
                Ok(())
            }
            None => {
                self.tally.over = true;
                Err(E::custom("too many JSON values"))
            }
        }
    }

    fn inner(&mut self) -> Count<'_> {
        Count {
            tally: &mut *self.tally,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.take(1)
    }

    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<(), E> {
        self.take(1)
    }

    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<(), E> {
        self.take(1)
    }

    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.take(1)
    }

    fn visit_str<E: de::Error>(mut self, _: &str) -> Result<(), E> {
        self.take(1)
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.take(1)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.take(1)?;
        while seq.next_element_seed(self.inner())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.take(1)?;
        let mut empty = true;
        while map.next_key::<IgnoredAny>()?.is_some() {
            if empty {
                empty = false;
                self.take(OBJECT_WEIGHT)?;
            }
            map.next_value_seed(self.inner())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    fn raw(json: String) -> Box<RawValue> {
        RawValue::from_string(json).unwrap()
    }

    /// `[0,0,...]` holding `n` values in all: the array and `n - 1` zeros.
    fn zeros(n: usize) -> String {
        format!("[{}]", vec!["0"; n - 1].join(","))
    }

    #[test]
    fn values_are_counted_up_to_the_cap() {
        assert!(!too_many_values(&zeros(MAX_VALUES)).unwrap());
        assert!(too_many_values(&zeros(MAX_VALUES + 1)).unwrap());
        // Strings (escaped or not), literals, arrays and nesting count one;
        // a non-empty object 17, an empty one 1; keys nothing.
        let pair = r#"{"k\n":["s","t\u00e9",true,null,1.5,{}]}"#;
        let per_pair = 1 + OBJECT_WEIGHT + 1 + 6;
        let whole = |pairs: usize| format!("[{}]", vec![pair; pairs].join(","));
        let fits = (MAX_VALUES - 1) / per_pair;
        assert!(!too_many_values(&whole(fits)).unwrap());
        assert!(too_many_values(&whole(fits + 1)).unwrap());
    }

    #[test]
    fn short_text_is_not_read() {
        // Invalid JSON is not noticed, so it was not read.
        let short = "x".repeat(MAX_VALUES / 4 - 1);
        assert!(!too_many_values(&short).unwrap());
        assert!(too_many_values(&"x".repeat(MAX_VALUES / 4)).is_err());
        // The densest text, nested one-key objects, fits below the threshold.
        let chain = format!("{}0{}", r#"{"":"#.repeat(100), "}".repeat(100));
        let chains = (MAX_VALUES / 4 - 2) / (chain.len() + 1);
        let densest = format!("[{}]", vec![chain; chains].join(","));
        assert!(densest.len() < MAX_VALUES / 4);
        assert!(!count(&densest).unwrap());
        let doubled = format!("[{densest},{densest}]");
        assert!(count(&doubled).unwrap(), "it holds more than half the cap");
    }

    #[test]
    fn deep_nesting_is_refused_by_the_recursion_limit() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let padded = format!("[{deep},{}]", vec!["0"; MAX_VALUES].join(","));
        let e = too_many_values(&padded).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
        let e = decode::<serde_json::Value>(Field::Object, &raw(deep)).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
    }

    #[test]
    fn unread_status_metadata_annotations_and_labels_are_left_out() {
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "K",
            "metadata": {
                "name": "n",
                "namespace": "ns",
                "uid": "not read",
                "generation": 3,
                "creationTimestamp": "not read",
                "finalizers": ["not read"],
                "ownerReferences": [{"kind": "Machine"}],
                "deletionTimestamp": "2025-06-01T10:00:00Z",
                "labels": {
                    "managedFields": "not read",
                    crate::keys::CLUSTER_NAME_LABEL: "prod",
                },
                "annotations": {
                    crate::keys::LAST_APPLIED: "{\"spec\":{}}",
                    "captf.io/restore-state": "abc",
                    crate::keys::DELETE_FOR_MOVE: "",
                    "example.com/other": "not read",
                },
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {
                "metadata": {"managedFields": "kept below the root"},
                "annotations": {crate::keys::LAST_APPLIED: "kept outside metadata"},
            },
            "status": {
                "stateBackups": [{"serial": 3, "name": "kept"}],
                "namespaces": ["kept"],
                "conditions": [{"type": "Ready", "status": "True"}],
                "lastRun": {"operation": "apply"},
            },
        });
        let mut expected = object.clone();
        for field in [
            "managedFields",
            "uid",
            "generation",
            "creationTimestamp",
            "finalizers",
        ] {
            expected["metadata"].as_object_mut().unwrap().remove(field);
        }
        for annotation in [crate::keys::LAST_APPLIED, "example.com/other"] {
            expected["metadata"]["annotations"]
                .as_object_mut()
                .unwrap()
                .remove(annotation);
        }
        expected["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        // The stored object keeps the parts of its status the rules read.
        for field in ["conditions", "lastRun"] {
            expected["status"].as_object_mut().unwrap().remove(field);
        }
        let decoded =
            decode::<serde_json::Value>(Field::OldObject, &raw(object.to_string())).unwrap();
        assert_eq!(decoded, expected);
        expected.as_object_mut().unwrap().remove("status");
        let decoded = decode::<serde_json::Value>(Field::Object, &raw(object.to_string())).unwrap();
        assert_eq!(decoded, expected);

        // An escaped key is the same key; a typed object decodes as before.
        let escaped = r#"{"metad\u0061ta":{"name":"m","man\u0061gedFields":[{}],"annotations":null},"spec":{"source":{"image":"i:1"}}}"#;
        let decoded = decode::<serde_json::Value>(Field::Object, &raw(escaped.into())).unwrap();
        assert_eq!(
            decoded["metadata"],
            serde_json::json!({"name": "m", "annotations": null})
        );
        let machine =
            decode::<crate::api::TerraformMachine>(Field::Object, &raw(escaped.into())).unwrap();
        assert_eq!(machine.metadata.name.as_deref(), Some("m"));
        assert_eq!(machine.metadata.managed_fields, None);
        assert_eq!(machine.spec.workspace.source.image, "i:1");

        // Skipped text must still be JSON, and errors keep their position.
        let broken = r#"{"metadata":{"managedFields":[1,]}}"#;
        let mut deserializer = serde_json::Deserializer::from_str(broken);
        let e = serde_json::Value::deserialize(unread::skipping(Field::Object, &mut deserializer))
            .unwrap_err();
        assert!(e.to_string().contains("column"), "{e}");
        let wrong = r#"{"metadata":{"annotations":{"captf.io/restore-state":1}},"spec":{}}"#;
        let e =
            decode::<crate::api::TerraformMachine>(Field::Object, &raw(wrong.into())).unwrap_err();
        let plain = serde_json::from_str::<crate::api::TerraformMachine>(wrong).unwrap_err();
        assert_eq!(e.to_string(), plain.to_string());
        assert!(
            e.to_string()
                .contains("integer `1`, expected a string at line 1 column 54")
        );
    }

    #[test]
    fn decode_names_the_field_past_the_cap() {
        let object = format!(
            r#"{{"spec":{{"variables":{{"list":{}}}}}}}"#,
            zeros(MAX_VALUES)
        );
        let e = decode::<serde_json::Value>(Field::OldObject, &raw(object)).unwrap_err();
        assert!(matches!(e, DecodeError::TooManyValues(Field::OldObject)));
        let violation = e.into_violation(|e| e.to_string());
        assert_eq!(
            violation.message(),
            format!(
                "oldObject: {} (got more than 65536)",
                too_many_values_rule()
            )
        );
        let fine = decode::<serde_json::Value>(Field::Object, &raw(zeros(MAX_VALUES))).unwrap();
        assert_eq!(fine.as_array().map(Vec::len), Some(MAX_VALUES - 1));
    }
}
