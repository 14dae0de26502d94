//! A JSON object's key as serde reads it, borrowed from the text unless it
//! holds an escape. serde's own `Cow<str>` always copies, which costs an
//! allocation per key where only a look at the key is needed.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A key, borrowed from the text where it can be.
pub struct JsonKey<'de>(pub Cow<'de, str>);

impl<'de> Deserialize<'de> for JsonKey<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = JsonKey<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<JsonKey<'de>, E> {
        Ok(JsonKey(Cow::Borrowed(key)))
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<JsonKey<'de>, E> {
        Ok(JsonKey(Cow::Owned(key.to_owned())))
    }

    fn visit_string<E: de::Error>(self, key: String) -> Result<JsonKey<'de>, E> {
        Ok(JsonKey(Cow::Owned(key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_borrowed_unless_escaped() {
        let key: JsonKey<'_> = serde_json::from_str(r#""plain""#).unwrap();
        assert!(matches!(key.0, Cow::Borrowed("plain")));
        let key: JsonKey<'_> = serde_json::from_str(r#""esc\u0061ped""#).unwrap();
        assert!(matches!(key.0, Cow::Owned(ref k) if k == "escaped"));
    }
}
