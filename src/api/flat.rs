//! Decoding the specs and statuses that flatten the shared workspace fields,
//! without serde's `flatten`: that buffers every value of the object (the
//! variables included) as serde's private `Content` before decoding it a
//! second time, which made decoding a spec about a third slower. Here each
//! key goes straight to its field.
//!
//! [`fields!`] writes the impls. It names each field with its JSON key and
//! destructures the struct without `..`, so a field added to a struct and
//! not to its `fields!` fails to compile; a unit test holds each list of
//! keys to the properties of the type's schema (what the CRD says).

use std::fmt;
use std::marker::PhantomData;

use serde::Deserializer;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

use crate::json_key::JsonKey;

/// A struct decoded one JSON key at a time.
pub(crate) trait Fields: Default {
    /// The keys of its own fields (not the flattened struct's).
    #[cfg(test)]
    const KEYS: &'static [&'static str];
    /// The keys that must be present.
    const REQUIRED: &'static [&'static str];

    /// Decodes the value of `key` into its field, or the flattened
    /// struct's; false (the value left unread) when no field has that key.
    fn take<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;
}

/// A JSON object as a `T`: unknown keys are skipped, as serde's derive does,
/// and a missing required key is an error.
pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: Fields>(
    deserializer: D,
    name: &'static str,
) -> Result<T, D::Error> {
    deserializer.deserialize_map(Object::<T>(name, PhantomData))
}

struct Object<T>(&'static str, PhantomData<T>);

impl<'de, T: Fields> Visitor<'de> for Object<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "struct {}", self.0)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        let mut seen = 0usize;
        while let Some(JsonKey(key)) = map.next_key()? {
            if !value.take(&key, &mut map)? {
                map.next_value::<IgnoredAny>()?;
            } else if let Some(i) = T::REQUIRED.iter().position(|r| *r == key) {
                seen |= 1 << i;
            }
        }
        match T::REQUIRED
            .iter()
            .enumerate()
            .find(|(i, _)| seen & (1 << i) == 0)
        {
            Some((_, missing)) => Err(de::Error::missing_field(missing)),
            None => Ok(value),
        }
    }
}

/// `Fields` and `Deserialize` for a struct: `fields!(Type, ["required"],
/// { "jsonKey" => field, ... })`, and `, flatten inner` when the field
/// `inner` (itself `Fields`) takes every other key. `REQUIRED` names the
/// flattened struct's required keys too; `KEYS` only the struct's own.
macro_rules! fields {
    ($ty:ident, [$($required:literal),*], { $($key:literal => $field:ident),* $(,)? }
        $(, flatten $inner:ident)?) => {
        impl $crate::api::flat::Fields for $ty {
            #[cfg(test)]
            const KEYS: &'static [&'static str] = &[$($key),*];
            const REQUIRED: &'static [&'static str] = &[$($required),*];

            fn take<'de, A: ::serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                // Without `..`: a field missing here does not compile.
                let Self { $($field,)* $($inner,)? } = self;
                match key {
                    $($key => *$field = map.next_value()?,)*
                    _ => return fields!(@other key, map $(, $inner)?),
                }
                Ok(true)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::api::flat::deserialize(d, stringify!($ty))
            }
        }
    };
    (@other $key:ident, $map:ident) => { Ok(false) };
    (@other $key:ident, $map:ident, $inner:ident) => {
        $crate::api::flat::Fields::take($inner, $key, $map)
    };
}

pub(crate) use fields;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use schemars::JsonSchema;
    use serde_json::{Value, json};

    use super::*;
    use crate::api::{
        TerraformClusterSpec, TerraformClusterStatus, TerraformMachinePoolSpec,
        TerraformMachinePoolStatus, TerraformMachineSpec, TerraformMachineStatus, WorkspaceSpec,
        WorkspaceStatus,
    };

    /// The properties and required keys of `T`'s schema, as the CRD has them.
    fn schema_keys<T: JsonSchema>() -> (BTreeSet<String>, BTreeSet<String>) {
        let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap();
        let names = |field: &str| -> BTreeSet<String> {
            match &schema[field] {
                Value::Object(map) => map.keys().cloned().collect(),
                Value::Array(items) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect(),
                _ => BTreeSet::new(),
            }
        };
        (names("properties"), names("required"))
    }

    fn keys<T: Fields>(inner: &[&[&str]]) -> (BTreeSet<String>, BTreeSet<String>) {
        let own = T::KEYS.iter().chain(inner.iter().flat_map(|k| k.iter()));
        (
            own.map(|k| k.to_string()).collect(),
            T::REQUIRED.iter().map(|k| k.to_string()).collect(),
        )
    }

    #[test]
    fn every_key_of_the_schema_is_taken_and_no_other() {
        let spec = WorkspaceSpec::KEYS;
        let status = WorkspaceStatus::KEYS;
        let cases = [
            (
                "WorkspaceSpec",
                keys::<WorkspaceSpec>(&[]),
                schema_keys::<WorkspaceSpec>(),
            ),
            (
                "WorkspaceStatus",
                keys::<WorkspaceStatus>(&[]),
                schema_keys::<WorkspaceStatus>(),
            ),
            (
                "TerraformClusterSpec",
                keys::<TerraformClusterSpec>(&[spec]),
                schema_keys::<TerraformClusterSpec>(),
            ),
            (
                "TerraformClusterStatus",
                keys::<TerraformClusterStatus>(&[status]),
                schema_keys::<TerraformClusterStatus>(),
            ),
            (
                "TerraformMachineSpec",
                keys::<TerraformMachineSpec>(&[spec]),
                schema_keys::<TerraformMachineSpec>(),
            ),
            (
                "TerraformMachineStatus",
                keys::<TerraformMachineStatus>(&[status]),
                schema_keys::<TerraformMachineStatus>(),
            ),
            (
                "TerraformMachinePoolSpec",
                keys::<TerraformMachinePoolSpec>(&[spec]),
                schema_keys::<TerraformMachinePoolSpec>(),
            ),
            (
                "TerraformMachinePoolStatus",
                keys::<TerraformMachinePoolStatus>(&[status]),
                schema_keys::<TerraformMachinePoolStatus>(),
            ),
        ];
        for (name, taken, schema) in cases {
            assert!(!schema.0.is_empty(), "{name}: the schema has properties");
            assert_eq!(taken, schema, "{name}: (keys, required) against the schema");
        }
    }

    #[test]
    fn keys_go_to_their_fields_and_unknown_ones_are_skipped() {
        // An escaped key is the same key; an unknown one, however deep, is
        // read past.
        let spec: TerraformMachineSpec = serde_json::from_value(json!({
            "providerID": "aws:///i-1",
            "source": {"image": "registry.example/m:v1"},
            "unknown": {"deep": [1, {"x": null}]},
            "variables": {"a": 1},
        }))
        .unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("aws:///i-1"));
        assert_eq!(spec.workspace.source.image, "registry.example/m:v1");
        assert_eq!(
            spec.workspace.variables.unwrap().values().unwrap()["a"],
            json!(1)
        );
        let escaped = r#"{"provider\u0049D":"p","source":{"image":"i"},"variable\u0073":{"b":2}}"#;
        let spec: TerraformMachineSpec = serde_json::from_str(escaped).unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("p"));
        assert_eq!(
            spec.workspace.variables.unwrap().values().unwrap()["b"],
            json!(2)
        );
    }

    #[test]
    fn a_missing_required_key_or_a_wrong_type_is_an_error() {
        let e =
            serde_json::from_str::<TerraformClusterSpec>(r#"{"variables":{"a":1}}"#).unwrap_err();
        assert_eq!(e.to_string(), "missing field `source` at line 1 column 21");
        let e =
            serde_json::from_str::<TerraformClusterSpec>(r#"{"source":{"image":"i"},"drift":7}"#)
                .unwrap_err();
        assert!(
            e.to_string().starts_with("invalid type: integer `7`"),
            "{e}"
        );
        let e = serde_json::from_str::<TerraformClusterStatus>("[]").unwrap_err();
        assert!(
            e.to_string().contains("struct TerraformClusterStatus"),
            "{e}"
        );
        // Null is the field unset, as with serde's derive.
        let spec: TerraformClusterSpec =
            serde_json::from_str(r#"{"source":{"image":"i"},"drift":null}"#).unwrap();
        assert_eq!(spec.drift, None);
    }
}
