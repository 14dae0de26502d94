//! Redaction (book: inside-the-job.md "Redaction"): every known secret is
//! replaced by `(sensitive)` in failure summaries and in the runner's logs,
//! the runtime's output passed through included. Best effort: it knows the
//! credentials mirror's files (whole, line by line, and the values inside
//! the formats of [`formats`]), the variables named by `--secret-env`, and
//! the values of sensitive variables; and it matches each of them also in
//! the escaped and encoded forms of [`encodings`], within a budget
//! ([`FORMS_MAX_BYTES`], [`FORMS_MAX_PATTERNS`]).

pub mod encodings;
pub mod formats;
mod variables;

use std::collections::HashSet;

use aho_corasick::{AhoCorasick, MatchKind};

pub use variables::sensitive_variable_secrets;

/// What a secret becomes.
pub const REDACTED: &str = "(sensitive)";

/// Values shorter than this, once trimmed of whitespace, are not redacted:
/// replacing every `1` or `yes` (or every run of spaces) would make the
/// logs unreadable and hide nothing.
pub const MIN_SECRET_LEN: usize = 4;

/// The most bytes the escaped and encoded forms of the secrets may add to
/// the automaton. The forms of a secret are added whole or not at all, in
/// the order the secrets were given, so a huge credentials file (a Secret
/// holds up to 1 MiB) cannot make the automaton tens of times its size:
/// past the budget, a secret is matched only as it is stored (whole file,
/// line, value), and the runner says how many were.
pub const FORMS_MAX_BYTES: usize = 1 << 20;

/// The most patterns the forms may add, for the same reason.
pub const FORMS_MAX_PATTERNS: usize = 16 * 1024;

/// Replaces known secrets.
#[derive(Clone, Debug)]
pub struct Redactor {
    // None when there is nothing to redact.
    matcher: Option<AhoCorasick>,
    capped: Option<Capped>,
}

/// Secrets whose forms did not fit in the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capped {
    /// How many are matched only as they are stored.
    pub without_forms: usize,
    /// Of how many secrets.
    pub secrets: usize,
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
    /// A redactor for `secrets` and their forms, the first secrets' forms
    /// first; secrets shorter than [`MIN_SECRET_LEN`] once trimmed are
    /// ignored.
    pub fn new(secrets: impl IntoIterator<Item = Vec<u8>>) -> Result<Redactor, RedactorError> {
        Redactor::with_budget(secrets, FORMS_MAX_BYTES, FORMS_MAX_PATTERNS)
    }

    fn with_budget(
        secrets: impl IntoIterator<Item = Vec<u8>>,
        max_bytes: usize,
        max_patterns: usize,
    ) -> Result<Redactor, RedactorError> {
        let mut seen = HashSet::new();
        let secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| is_secret(s) && seen.insert(s.clone()))
            .collect();
        if secrets.is_empty() {
            return Ok(Redactor::none());
        }
        let mut patterns = secrets.clone();
        let (mut bytes, mut without_forms) = (0usize, 0usize);
        for secret in &secrets {
            // Every form is at least about as long as the secret.
            if bytes + secret.len() > max_bytes {
                without_forms += 1;
                continue;
            }
            let mut new: Vec<Vec<u8>> = encodings::forms(secret)
                .into_iter()
                .filter(|f| is_secret(f) && !seen.contains(f))
                .collect();
            new.sort();
            new.dedup();
            let size: usize = new.iter().map(Vec::len).sum();
            if bytes + size > max_bytes || patterns.len() - secrets.len() + new.len() > max_patterns
            {
                without_forms += 1;
                continue;
            }
            bytes += size;
            for form in new {
                seen.insert(form.clone());
                patterns.push(form);
            }
        }
        // Leftmost-longest, so that a secret containing another (a padded
        // encoding, an unpadded one) is replaced whole rather than leaving
        // its remainder behind.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)?;
        Ok(Redactor {
            matcher: Some(matcher),
            capped: (without_forms > 0).then_some(Capped {
                without_forms,
                secrets: secrets.len(),
            }),
        })
    }

    /// A redactor that knows no secret.
    pub fn none() -> Redactor {
        Redactor {
            matcher: None,
            capped: None,
        }
    }

    /// Whether the budget left some secrets without their forms.
    pub fn capped(&self) -> Option<Capped> {
        self.capped
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

/// Long enough once trimmed: whitespace alone is never a secret.
fn is_secret(s: &[u8]) -> bool {
    s.trim_ascii().len() >= MIN_SECRET_LEN
}

/// The secrets of one credentials file or secret variable, the values
/// inside its format first (their forms matter most), then
/// [`value_lines`] of the whole.
pub fn file_secrets(content: &[u8]) -> Vec<Vec<u8>> {
    let mut out = formats::extract(content);
    out.extend(value_lines(content));
    out
}

/// A value whole, without its final newline, and each of its lines
/// trimmed when it has several, but PEM armor lines (`-----BEGIN ...`),
/// which are no secret.
pub fn value_lines(content: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![content.to_vec()];
    let trimmed = trim_newline(content);
    out.push(trimmed.to_vec());
    if trimmed.contains(&b'\n') {
        out.extend(
            trimmed
                .split(|&b| b == b'\n')
                .map(<[u8]>::trim_ascii)
                .filter(|line| !is_armor(line))
                .map(<[u8]>::to_vec),
        );
    }
    out
}

fn is_armor(line: &[u8]) -> bool {
    (line.starts_with(b"-----BEGIN ") || line.starts_with(b"-----END ")) && line.ends_with(b"-----")
}

fn trim_newline(content: &[u8]) -> &[u8] {
    let content = content.strip_suffix(b"\n").unwrap_or(content);
    content.strip_suffix(b"\r").unwrap_or(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

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
    fn whitespace_is_never_a_secret() {
        for blank in ["        ", "\t\t\t\t", " \r\n \r\n", "  ab  "] {
            let r = redactor(&[blank]);
            assert_eq!(
                r.text("a    b\t\t\t\tc\n"),
                "a    b\t\t\t\tc\n",
                "{blank:?}"
            );
            assert!(r.capped().is_none());
        }
        // A file with blank and indented lines: the lines count trimmed.
        let r =
            Redactor::new(file_secrets(b"first-line\n        \n\n    indented-line\n")).unwrap();
        assert_eq!(r.text("x        y indented-line"), "x        y (sensitive)");
    }

    #[test]
    fn redacts_bytes_that_are_not_utf8() {
        let r = Redactor::new([b"\xff\xfesecret".to_vec()]).unwrap();
        assert_eq!(r.bytes(b"<\xff\xfesecret>"), b"<(sensitive)>");
        assert_eq!(r.bytes(br"<\xff\xfesecret>"), b"<(sensitive)>");
        assert_eq!(Redactor::none().bytes(b"\xff\xfesecret"), b"\xff\xfesecret");
    }

    #[test]
    fn credential_files() {
        let one = file_secrets(b"s3cr3t-value\n");
        assert!(one.contains(&b"s3cr3t-value\n".to_vec()));
        assert!(one.contains(&b"s3cr3t-value".to_vec()));

        let pem = b"-----BEGIN KEY-----\r\nAAAABBBB\r\nCCCCDDDD\r\n-----END KEY-----\r\n";
        let secrets = file_secrets(pem);
        let r = Redactor::new(secrets).unwrap();
        // A line of the key alone, as a log line might show it.
        assert_eq!(r.text("key line: CCCCDDDD"), "key line: (sensitive)");
        assert_eq!(r.text("AAAABBBB"), "(sensitive)");
        assert_eq!(
            r.bytes(pem),
            b"(sensitive)".to_vec(),
            "the whole file is one match"
        );
        assert_eq!(r.text("-----BEGIN KEY-----"), "-----BEGIN KEY-----");
    }

    /// Each format's bare value, found in a log line alone.
    #[test]
    fn values_inside_formats() {
        let pem =
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n-----END PRIVATE KEY-----\n";
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: kube-token-value\n    client-key-data: {}\n",
            STANDARD.encode(pem)
        );
        let key_json = serde_json::json!({"type": "service_account", "private_key": pem, "client_secret": "json-client-secret"});
        for (file, value) in [
            (
                "[default]\naws_secret_access_key = ini-secret-value\n".to_string(),
                "ini-secret-value",
            ),
            (
                "API_KEY=dotenv-secret-value\n".into(),
                "dotenv-secret-value",
            ),
            (kubeconfig.clone(), "kube-token-value"),
            (kubeconfig, pem.trim_end()),
            (key_json.to_string(), "json-client-secret"),
            (key_json.to_string(), pem),
        ] {
            let r = Redactor::new(file_secrets(file.as_bytes())).unwrap();
            assert_eq!(r.text(&format!("<{value}>")), "<(sensitive)>", "{file}");
            let json = encodings::json_minimal(value);
            assert_eq!(r.text(&format!("\"{json}\"")), "\"(sensitive)\"", "{file}");
        }
    }

    /// Each encoding of a secret, found in a log line.
    #[test]
    fn escaped_and_encoded_forms() {
        let secret = "pa\"ss\\w<o>rd é\n/+?&=%${x}";
        let r = redactor(&[secret]);
        let b = secret.as_bytes();
        for (what, form) in [
            ("raw", secret.to_string()),
            ("json", encodings::json_minimal(secret)),
            ("json go", encodings::json_go(secret)),
            ("json ascii", encodings::json_ascii(secret)),
            ("go %q", encodings::go_quote(b, false)),
            ("go ascii", encodings::go_quote(b, true)),
            ("hcl", encodings::hcl_quote(secret)),
            ("base64", STANDARD.encode(b)),
            ("base64 url raw", URL_SAFE_NO_PAD.encode(b)),
            ("query", encodings::percent(b, true)),
            ("rfc3986", encodings::percent(b, false)),
        ] {
            let line = format!("msg: \"{form}\" end");
            assert_eq!(r.text(&line), "msg: \"(sensitive)\" end", "{what}: {line}");
        }
        // Inside a longer encoding: at most a few characters at each end
        // remain.
        let basic = STANDARD.encode(format!("admin:{secret}"));
        let shown = r.text(&basic);
        assert!(shown.contains(REDACTED), "{shown}");
        assert!(shown.len() <= REDACTED.len() + 12, "{shown}");
    }

    #[test]
    fn the_budget_keeps_the_first_secrets_forms() {
        let secrets: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("{i:04}-secret-number").into_bytes())
            .collect();
        let all = Redactor::with_budget(secrets.clone(), 1 << 20, 1 << 14).unwrap();
        assert_eq!(all.capped(), None);
        let capped = Redactor::with_budget(secrets.clone(), 2000, 1 << 14).unwrap();
        let Some(Capped {
            without_forms,
            secrets: total,
        }) = capped.capped()
        else {
            panic!("not capped")
        };
        assert_eq!(total, 50);
        assert!((20..50).contains(&without_forms), "{without_forms}");
        let first = STANDARD.encode("0000-secret-number");
        let last = STANDARD.encode("0049-secret-number");
        assert_eq!(capped.text(&first), REDACTED);
        assert_eq!(
            capped.text(&last),
            last,
            "past the budget: stored form only"
        );
        assert_eq!(capped.text("0049-secret-number"), REDACTED);
        let few = Redactor::with_budget(secrets, 1 << 20, 30).unwrap();
        assert!(few.capped().is_some());
    }

    /// A credentials Secret at its size limit: the automaton is built in
    /// reasonable time, with the forms capped.
    #[test]
    fn a_huge_credentials_file() {
        let mut file = String::new();
        let mut i = 0u64;
        while file.len() < 1 << 20 {
            file.push_str(&format!("key_{i} = {:016x}{:016x}\n", i * 7919, i * 104729));
            i += 1;
        }
        let started = std::time::Instant::now();
        let r = Redactor::new(file_secrets(file.as_bytes())).unwrap();
        let took = started.elapsed();
        let capped = r.capped().expect("capped");
        assert!(capped.without_forms > 0 && capped.without_forms < capped.secrets);
        let line = |i: u64| format!("key_{i} = {:016x}{:016x}", i * 7919, i * 104729);
        assert_eq!(r.text(&line(7)), REDACTED);
        let value = |i: u64| line(i).split_once(" = ").unwrap().1.to_string();
        assert_eq!(
            r.text(&STANDARD.encode(value(7))),
            REDACTED,
            "the first values' forms"
        );
        assert!(took.as_secs() < 30, "{took:?}");
    }
}
