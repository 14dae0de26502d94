//! `spec.variables`: module variables as a free-form JSON object, kept as the
//! JSON text it was read from. Nothing reads the values but the Job's
//! inputs, so neither the webhook nor the watch caches build them into a
//! tree of `serde_json::Value`s: a value dense in small JSON values costs
//! many times its text as a tree (see `webhooks::decode`), and as text it
//! costs its length.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::json_key::JsonKey;

/// Module variables: each key a variable name, each value its JSON value.
/// Always the text of a JSON object (decoding refuses any other value).
#[derive(Clone, Debug, Serialize)]
#[serde(transparent)]
pub struct Variables(Box<RawValue>);

impl Variables {
    /// The variables as a map of values: for the Job's inputs. Fails only
    /// past serde_json's nesting limit (128), which the text itself does
    /// not bound.
    pub fn values(&self) -> Result<BTreeMap<String, Value>, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The variables' names, each once, sorted; their values are walked
    /// (their nesting bounded as [`Variables::values`] bounds it) but not
    /// built.
    pub fn names(&self) -> Result<Vec<Cow<'_, str>>, serde_json::Error> {
        let mut names = serde_json::from_str::<Names>(self.0.get())?.0;
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }
}

/// Equal as JSON values: the same text, or text that reads as the same
/// values (other spacing or key order). The API server sends both objects
/// of an UPDATE as it encodes them, so the text is the same whenever the
/// values are, and no tree is built then.
impl PartialEq for Variables {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
            || matches!((self.values(), other.values()), (Ok(a), Ok(b)) if a == b)
    }
}

impl<'de> Deserialize<'de> for Variables {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        // The text starts at the value (serde_json skips the space before
        // it), so an object's starts with its brace.
        if !raw.get().starts_with('{') {
            return Err(de::Error::invalid_type(
                unexpected(raw.get()),
                &"a JSON object",
            ));
        }
        Ok(Variables(raw))
    }
}

/// What other JSON value `text` is, for the error.
fn unexpected(text: &str) -> de::Unexpected<'static> {
    match text.as_bytes().first() {
        Some(b'[') => de::Unexpected::Seq,
        Some(b'"') => de::Unexpected::Other("string"),
        Some(b'n') => de::Unexpected::Unit,
        Some(b't' | b'f') => de::Unexpected::Other("boolean"),
        _ => de::Unexpected::Other("number"),
    }
}

impl JsonSchema for Variables {
    fn schema_name() -> Cow<'static, str> {
        "Variables".into()
    }

    // Any JSON value may sit under a key, so the schema keeps unknown fields
    // instead of declaring properties; only the key count is bounded here.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Module variables as a JSON object, 1 to 256 keys.",
            "type": "object",
            "minProperties": 1,
            "maxProperties": 256,
            "x-kubernetes-preserve-unknown-fields": true,
        })
    }
}

/// An object's keys, borrowed from the text where they hold no escape.
struct Names<'de>(Vec<Cow<'de, str>>);

impl<'de> Deserialize<'de> for Names<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(NamesVisitor)
    }
}

struct NamesVisitor;

impl<'de> Visitor<'de> for NamesVisitor {
    type Value = Names<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Names<'de>, A::Error> {
        let mut names = Vec::new();
        while let Some(JsonKey(name)) = map.next_key::<JsonKey<'de>>()? {
            map.next_value_seed(Walk)?;
            names.push(name);
        }
        Ok(Names(names))
    }
}

/// A value walked and dropped. Unlike `IgnoredAny`, it recurses through
/// the deserializer, so serde_json's nesting limit holds.
#[derive(Clone, Copy)]
struct Walk;

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<de::IgnoredAny>()?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(text: &str) -> Result<Variables, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn only_an_object_is_variables() {
        for (text, ok) in [
            (r#"{"a": 1}"#, true),
            (r#"  {"a": [1, {"b": null}]}"#, true),
            ("{}", true),
            ("[1]", false),
            (r#""text""#, false),
            ("1", false),
            ("null", false),
        ] {
            assert_eq!(read(text).is_ok(), ok, "{text}");
        }
        // From a Value too (tests and the API's typed clients build so).
        let v: Variables = serde_json::from_value(json!({"a": [1]})).unwrap();
        assert_eq!(v.values().unwrap()["a"], json!([1]));
        assert!(serde_json::from_value::<Variables>(json!([1])).is_err());
    }

    #[test]
    fn written_back_as_read() {
        let text = r#"{"b":1.0,"a":{"x":"y"}}"#;
        assert_eq!(serde_json::to_string(&read(text).unwrap()).unwrap(), text);
    }

    #[test]
    fn equal_as_values() {
        let a = read(r#"{"a":1,"b":[true,"x"]}"#).unwrap();
        for (text, equal) in [
            (r#"{"a":1,"b":[true,"x"]}"#, true),
            (r#"{ "b": [true, "x"], "a": 1 }"#, true),
            (r#"{"a":2,"b":[true,"x"]}"#, false),
            (r#"{"a":1.0,"b":[true,"x"]}"#, false),
            (r#"{"a":1}"#, false),
        ] {
            assert_eq!(a == read(text).unwrap(), equal, "{text}");
        }
    }

    #[test]
    fn names_once_sorted_and_nesting_bounded() {
        let v = read(r#"{"b": {"deep": [1]}, "a\u0041": 1, "b": 2}"#).unwrap();
        assert_eq!(v.names().unwrap(), ["aA", "b"]);
        // The text holds any nesting; reading it holds serde_json's limit.
        let deep = format!(r#"{{"a": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        let v = read(&deep).unwrap();
        assert!(v.names().is_err());
        assert!(v.values().is_err());
        let shallow = format!(r#"{{"a": {}{}}}"#, "[".repeat(100), "]".repeat(100));
        let v = read(&shallow).unwrap();
        assert_eq!(v.names().unwrap(), ["a"]);
        assert!(v.values().is_ok());
    }
}
