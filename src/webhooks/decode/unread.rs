//! The parts of an object that no rule reads, skipped while it is decoded:
//! the `status` of `object` (the rules read only the stored object's, in
//! `oldObject`) and every field of that stored status but those the rules
//! read ([`READ_STATUS`]); every field of `metadata` but those the rules read
//! ([`READ_METADATA`]),
//! among them `managedFields`; and every annotation and label but the few
//! the rules read ([`READ_ANNOTATIONS`], [`READ_LABELS`]), among the
//! annotations `kubectl.kubernetes.io/last-applied-configuration`, a copy
//! of the object as escaped JSON text. Together they are often most of an
//! object's metadata, and dense short entries cost many times their text
//! as maps. Skipped, they are still parsed (the text must be JSON) but
//! nothing is built of them.
//!
//! [`Skipping`] wraps a deserializer at the object's root, then at
//! `metadata` and at its `annotations` and `labels`, and at the stored
//! object's `status`; every other value goes
//! to the wrapped deserializer untouched, so the rest of the object costs
//! nothing more.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;

use super::Field;
use crate::json_key::JsonKey;
use crate::keys::{CLUSTER_NAME_LABEL, DELETE_FOR_MOVE, RESTORE_STATE};

/// The fields of `metadata` a rule reads; a rule that reads another adds it
/// here. `annotations` and `labels` are filtered further.
const READ_METADATA: &[&str] = &[
    "name",
    "namespace",
    "annotations",
    "labels",
    "ownerReferences",
    "deletionTimestamp",
];

/// The fields of the stored object's `status` a rule reads (the backups'
/// serials for `captf.io/restore-state`, an identity's mirrored namespaces
/// on its deletion); a rule that reads another adds it here. The
/// conditions, the last run and the rest are most of a status.
const READ_STATUS: &[&str] = &["stateBackups", "namespaces"];

/// The annotations a rule reads; a rule that reads another adds it here.
const READ_ANNOTATIONS: &[&str] = &[RESTORE_STATE, DELETE_FOR_MOVE];

/// The labels a rule reads; a rule that reads another adds it here.
const READ_LABELS: &[&str] = &[CLUSTER_NAME_LABEL];

/// Where in the object a [`Skipping`] deserializer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// The root of an object, `field` of the request.
    Root(Field),
    Metadata,
    /// The `status` of `oldObject`.
    Status,
    Annotations,
    Labels,
}

/// What becomes of the value under a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Child {
    /// Decoded as it is.
    Keep,
    /// Decoded through [`Skipping`] at this level.
    Enter(Level),
    /// Parsed and dropped: its key is not seen by the object either.
    Skip,
}

impl Level {
    fn child(self, key: &str) -> Child {
        match (self, key) {
            (Level::Root(_), "metadata") => Child::Enter(Level::Metadata),
            (Level::Root(Field::Object), "status") => Child::Skip,
            (Level::Root(Field::OldObject), "status") => Child::Enter(Level::Status),
            (Level::Status, key) if !READ_STATUS.contains(&key) => Child::Skip,
            (Level::Metadata, "annotations") => Child::Enter(Level::Annotations),
            (Level::Metadata, "labels") => Child::Enter(Level::Labels),
            (Level::Metadata, key) if !READ_METADATA.contains(&key) => Child::Skip,
            (Level::Annotations, key) if !READ_ANNOTATIONS.contains(&key) => Child::Skip,
            (Level::Labels, key) if !READ_LABELS.contains(&key) => Child::Skip,
            _ => Child::Keep,
        }
    }
}

/// `inner`, read as the `field` object without its unread parts.
pub fn skipping<'de, D: Deserializer<'de>>(field: Field, inner: D) -> Skipping<D> {
    Skipping {
        inner,
        level: Level::Root(field),
    }
}

pub struct Skipping<D> {
    inner: D,
    level: Level,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(Wrap::new(visitor, self.level))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_option(Wrap::new(visitor, self.level))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(Wrap::new(visitor, self.level))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_struct(name, fields, Wrap::new(visitor, self.level))
    }

    // Objects, their metadata, the stored status, and the annotations and
    // labels are maps: any other request reads the value as it is.
    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple tuple_struct
        enum identifier ignored_any
    }
}

/// The visitor of a value at `level`: its map's entries are filtered.
struct Wrap<V> {
    inner: V,
    level: Level,
}

impl<V> Wrap<V> {
    fn new(inner: V, level: Level) -> Self {
        Self { inner, level }
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(Entries {
            inner: map,
            level: self.level,
            next: Child::Keep,
        })
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Skipping {
            inner: d,
            level: self.level,
        })
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.inner.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.inner.visit_i64(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.inner.visit_u64(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.inner.visit_f64(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.inner.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.inner.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.inner.visit_string(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
}

/// The entries of a map at `level`, the skipped ones left out.
struct Entries<A> {
    inner: A,
    level: Level,
    /// What the value of the key just returned becomes.
    next: Child,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Entries<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(JsonKey(key)) = self.inner.next_key::<JsonKey<'de>>()? else {
                return Ok(None);
            };
            let child = self.level.child(&key);
            if child == Child::Skip {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.next = child;
            return match key {
                Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
                Cow::Owned(key) => seed.deserialize(StringDeserializer::new(key)),
            }
            .map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        match self.next {
            Child::Enter(level) => self.inner.next_value_seed(Nested { seed, level }),
            Child::Keep | Child::Skip => self.inner.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// The seed of a value that is entered at `level`.
struct Nested<S> {
    seed: S,
    level: Level,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Nested<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Skipping {
            inner: d,
            level: self.level,
        })
    }
}
