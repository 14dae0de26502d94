//! OCI image references, `[registry[:port]/]repository[:tag][@algorithm:digest]`,
//! checked with the grammar of the distribution project's reference package
//! (which container runtimes use), so that the webhook refuses what a kubelet
//! would fail to pull, and the controller can pin `repository@sha256:...`.

use std::fmt;

/// A parsed reference. `name` is everything before the tag and digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    pub name: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// Why a reference does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("is empty")]
    Empty,
    #[error("is longer than 255 characters before the tag and digest")]
    NameTooLong,
    #[error("has an invalid registry host {0:?}")]
    Registry(String),
    #[error(
        "has an invalid repository path component {0:?} (lowercase letters, digits and separators . _ __ - only)"
    )]
    PathComponent(String),
    #[error("has an invalid tag {0:?} (a word character, then up to 127 of [A-Za-z0-9_.-])")]
    Tag(String),
    #[error("has an invalid digest {0:?} (algorithm:hex, sha256 with 64 hex characters)")]
    Digest(String),
}

impl crate::error::Categorized for ImageRefError {
    fn category(&self) -> crate::error::Category {
        crate::error::Category::Invalid
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl ImageRef {
    pub fn parse(reference: &str) -> Result<Self, ImageRefError> {
        if reference.is_empty() {
            return Err(ImageRefError::Empty);
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                check_digest(digest)?;
                (rest, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        // A colon after the last slash starts the tag; one before it is a
        // registry port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].find(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                check_tag(tag)?;
                (&rest[..last_slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.len() > 255 {
            return Err(ImageRefError::NameTooLong);
        }
        check_name(name)?;
        Ok(Self {
            name: name.to_string(),
            tag,
            digest,
        })
    }

    /// The same repository pinned to `digest`, without a tag.
    pub fn pinned(&self, digest: &str) -> Result<Self, ImageRefError> {
        check_digest(digest)?;
        Ok(Self {
            name: self.name.clone(),
            tag: None,
            digest: Some(digest.to_string()),
        })
    }
}

fn check_name(name: &str) -> Result<(), ImageRefError> {
    let mut components: Vec<&str> = name.split('/').collect();
    // The first component is a registry when it looks like a host: it has a
    // dot or a port, or is localhost (the rule docker uses).
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            check_registry(first)?;
            components.remove(0);
        }
    }
    for component in components {
        if !is_path_component(component) {
            return Err(ImageRefError::PathComponent(component.to_string()));
        }
    }
    Ok(())
}

fn check_registry(registry: &str) -> Result<(), ImageRefError> {
    let bad = || ImageRefError::Registry(registry.to_string());
    let (host, port) = if let Some(inner) = registry.strip_prefix('[') {
        // [IPv6]:port
        let (addr, after) = inner.split_once(']').ok_or_else(bad)?;
        addr.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':').ok_or_else(bad)?),
        };
        (None, port)
    } else {
        match registry.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(registry), None),
        }
    };
    if let Some(host) = host {
        let ok = !host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !ok {
            return Err(bad());
        }
    }
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(bad());
    }
    Ok(())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        let allowed = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !allowed {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`
fn check_tag(tag: &str) -> Result<(), ImageRefError> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    let ok = tag.len() <= 128
        && chars.next().is_some_and(word)
        && chars.all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ImageRefError::Tag(tag.to_string()))
    }
}

/// `algorithm:encoded`, algorithm `[a-z0-9]+(?:[.+_-][a-z0-9]+)*`, encoded
/// at least 32 hex characters, and exactly 64 lowercase hex for sha256.
fn check_digest(digest: &str) -> Result<(), ImageRefError> {
    let bad = || ImageRefError::Digest(digest.to_string());
    let (algorithm, encoded) = digest.split_once(':').ok_or_else(bad)?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['.', '+', '_', '-']).all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let encoded_ok = match algorithm {
        "sha256" => encoded.len() == 64 && hex(encoded),
        "sha512" => encoded.len() == 128 && hex(encoded),
        _ => encoded.len() >= 32 && encoded.bytes().all(|b| b.is_ascii_hexdigit()),
    };
    if algorithm_ok && encoded_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn valid_references() {
        let table: &[(&str, &str, Option<&str>, bool)] = &[
            ("busybox", "busybox", None, false),
            (
                "library/busybox:1.36",
                "library/busybox",
                Some("1.36"),
                false,
            ),
            (
                "ghcr.io/captf-io/modules/noop:v0.1.0",
                "ghcr.io/captf-io/modules/noop",
                Some("v0.1.0"),
                false,
            ),
            ("localhost:5000/noop", "localhost:5000/noop", None, false),
            (
                "localhost/noop:latest",
                "localhost/noop",
                Some("latest"),
                false,
            ),
            (
                "registry.example.com:5000/a/b_c__d-e--f.g:tag_1.2-3",
                "registry.example.com:5000/a/b_c__d-e--f.g",
                Some("tag_1.2-3"),
                false,
            ),
            ("[::1]:5000/noop:1", "[::1]:5000/noop", Some("1"), false),
        ];
        for (input, name, tag, _) in table {
            let parsed = ImageRef::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(parsed.name, *name, "{input}");
            assert_eq!(parsed.tag.as_deref(), *tag, "{input}");
            assert_eq!(parsed.to_string(), *input);
        }
        let with_digest = format!("ghcr.io/x/noop:v1@{SHA}");
        let parsed = ImageRef::parse(&with_digest).unwrap();
        assert_eq!(parsed.digest.as_deref(), Some(SHA));
        assert_eq!(parsed.to_string(), with_digest);
    }

    #[test]
    fn invalid_references() {
        let long = format!("{}/x", "a".repeat(255));
        let table: &[(&str, &str)] = &[
            ("", "is empty"),
            ("Busybox", "path component"),
            ("ghcr.io/Org/noop", "path component"),
            ("noop:", "tag"),
            ("noop:-x", "tag"),
            ("noop::1", "tag"),
            ("a//b", "path component"),
            ("a/b/", "path component"),
            ("ghcr..io/x", "registry"),
            ("-ghcr.io/x", "registry"),
            ("ghcr.io:port/x", "registry"),
            ("noop@sha256:abc", "digest"),
            (
                "noop@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                "digest",
            ),
            ("noop@", "digest"),
            ("a b", "path component"),
            (&long, "255"),
        ];
        for (input, want) in table {
            let err = ImageRef::parse(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
    }

    #[test]
    fn pinning_keeps_the_repository_and_drops_the_tag() {
        let parsed = ImageRef::parse("ghcr.io/x/noop:v1").unwrap();
        assert_eq!(
            parsed.pinned(SHA).unwrap().to_string(),
            format!("ghcr.io/x/noop@{SHA}")
        );
        assert!(parsed.pinned("sha256:short").is_err());
    }
}
