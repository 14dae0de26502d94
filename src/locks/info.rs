//! The lock info the Kubernetes backend writes into the annotation
//! `app.terraform.io/lock-info` of the state lock Lease: Go's
//! `statemgr.LockInfo`, marshalled with its capitalized field names.

use std::fmt;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

/// How much of the free-form `Info` field may reach a log line: anyone who
/// can write the Lease chooses its text and its length.
const INFO_LOG_MAX: usize = 200;

/// The parsed lock info. Go writes empty strings for unset fields; they read
/// as None here, so "missing" has one spelling.
#[derive(Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub id: Option<String>,
    pub operation: Option<String>,
    /// Free-form text chosen by whoever took the lock; never log it whole
    /// (the Debug form clips it).
    pub info: Option<String>,
    /// `user@hostname`.
    pub who: Option<String>,
    pub version: Option<String>,
    pub created: Option<Created>,
    pub path: Option<String>,
}

/// When the lock was taken: the text the backend wrote (Go's RFC 3339 with
/// nanoseconds), and the instant it stands for when it parses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub raw: String,
    pub at: Option<Timestamp>,
}

/// The wire form. Unknown fields are ignored (a newer backend may add some);
/// a field of the wrong type is an error rather than a default, because a
/// lock info that does not read as the backend wrote it names no holder we
/// can trust.
#[derive(Deserialize)]
struct Wire {
    #[serde(rename = "ID")]
    id: Option<String>,
    #[serde(rename = "Operation")]
    operation: Option<String>,
    #[serde(rename = "Info")]
    info: Option<String>,
    #[serde(rename = "Who")]
    who: Option<String>,
    #[serde(rename = "Version")]
    version: Option<String>,
    #[serde(rename = "Created")]
    created: Option<String>,
    #[serde(rename = "Path")]
    path: Option<String>,
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

impl LockInfo {
    /// Parses the annotation's JSON document.
    pub fn parse(json: &str) -> Result<LockInfo, serde_json::Error> {
        let wire: Wire = serde_json::from_str(json)?;
        Ok(LockInfo {
            id: non_empty(wire.id),
            operation: non_empty(wire.operation),
            info: non_empty(wire.info),
            who: non_empty(wire.who),
            version: non_empty(wire.version),
            created: non_empty(wire.created).map(|raw| Created {
                at: raw.parse().ok(),
                raw,
            }),
            path: non_empty(wire.path),
        })
    }
}

/// The first `max` characters of `s`, marked when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

impl fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockInfo")
            .field("id", &self.id)
            .field("operation", &self.operation)
            .field("info", &self.info.as_deref().map(|i| clip(i, INFO_LOG_MAX)))
            .field("who", &self.who)
            .field("version", &self.version)
            .field("created", &self.created)
            .field("path", &self.path)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock info as OpenTofu's kubernetes backend writes it.
    const REAL: &str = r#"{"ID":"8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f","Operation":"OperationTypeApply","Info":"","Who":"runner@captf-m-foo-apply-a1-abc123-x7k2p","Version":"1.12.6","Created":"2026-12-02T10:00:00.123456789Z","Path":""}"#;

    #[test]
    fn parses_what_the_backend_writes() {
        let info = LockInfo::parse(REAL).unwrap();
        assert_eq!(
            info.id.as_deref(),
            Some("8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f")
        );
        assert_eq!(info.operation.as_deref(), Some("OperationTypeApply"));
        assert_eq!(info.info, None, "an empty string is missing");
        assert_eq!(
            info.who.as_deref(),
            Some("runner@captf-m-foo-apply-a1-abc123-x7k2p")
        );
        assert_eq!(info.version.as_deref(), Some("1.12.6"));
        assert_eq!(info.path, None);
        let created = info.created.unwrap();
        assert_eq!(created.raw, "2026-12-02T10:00:00.123456789Z");
        assert_eq!(
            created.at.unwrap(),
            Timestamp::new(1_796_205_600, 123_456_789).unwrap()
        );
    }

    #[test]
    fn tolerates_extra_and_missing_fields() {
        let info =
            LockInfo::parse(r#"{"Who":"alice@laptop","Extra":{"nested":[1,2]},"Later":7,"id":5}"#)
                .unwrap();
        assert_eq!(info.who.as_deref(), Some("alice@laptop"));
        // Go's field names are capitalized; another spelling is another field.
        assert_eq!(info.id, None);
        assert_eq!(info.created, None);
        let info = LockInfo::parse(r#"{"ID":null,"Created":null}"#).unwrap();
        assert_eq!((info.id, info.created), (None, None));
        assert_eq!(LockInfo::parse("{}").unwrap().who, None);
    }

    #[test]
    fn keeps_a_created_that_does_not_parse() {
        for raw in ["yesterday", "2026-12-02T10:00:00", "2026-13-02T10:00:00Z"] {
            let json = serde_json::json!({ "Created": raw }).to_string();
            let created = LockInfo::parse(&json).unwrap().created.unwrap();
            assert_eq!(created.raw, raw);
            assert_eq!(created.at, None, "{raw}");
        }
        let json = r#"{"Created":"2026-12-02T11:00:00+01:00"}"#;
        let created = LockInfo::parse(json).unwrap().created.unwrap();
        assert_eq!(created.at, Some("2026-12-02T10:00:00Z".parse().unwrap()));
    }

    #[test]
    fn refuses_wrong_types_and_non_objects() {
        for bad in [
            r#"{"ID":5}"#,
            r#"{"Who":["alice@laptop"]}"#,
            r#"{"Who":true}"#,
            r#"{"Operation":{}}"#,
            r#"{"Created":1796205600}"#,
            r#"{"Who":"a@b","Who":"c@d"}"#,
            "[]",
            "\"alice@laptop\"",
            "null",
            "",
            "not json",
            "{\"Who\":\"alice@laptop\"",
            "{\"Who\":\"alice@laptop\"} trailing",
        ] {
            assert!(LockInfo::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_clips_info() {
        let long = "x".repeat(1000);
        let json = serde_json::json!({ "Info": long, "Who": "a@b" }).to_string();
        let info = LockInfo::parse(&json).unwrap();
        assert_eq!(info.info.as_deref(), Some(long.as_str()));
        let shown = format!("{info:?}");
        assert!(shown.contains(&format!("{}…", "x".repeat(200))), "{shown}");
        assert!(!shown.contains(&"x".repeat(201)), "{shown}");
        assert!(shown.contains("a@b"));
    }

    #[test]
    fn clip_counts_characters() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc…");
        assert_eq!(clip("ééééé", 2), "éé…");
        assert_eq!(clip("", 0), "");
        assert_eq!(clip("a", 0), "…");
    }
}
