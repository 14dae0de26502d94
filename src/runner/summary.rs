//! The failure summary of a run (ref §6.3 "Failure summary source"): the
//! runner's curated description, never raw output, at most 512 bytes, with
//! every known secret redacted.

use serde::Deserialize;

use super::redact::Redactor;

/// The most a summary holds, in bytes.
pub const SUMMARY_MAX: usize = 512;

/// What the summary of a failed step is made from.
#[derive(Clone, Copy, Debug)]
pub struct FailedStep<'a> {
    pub name: &'a str,
    pub exit_code: i32,
    /// `validate -json`'s output, for the validate step.
    pub validate_json: Option<&'a [u8]>,
    /// The tail of the step's standard error.
    pub stderr: &'a [u8],
}

/// validate's diagnostics first, then the `Error:` lines of standard error,
/// then a pointer to the logs.
pub fn summarize(step: &FailedStep<'_>, redactor: &Redactor) -> String {
    let found = step
        .validate_json
        .and_then(validate_errors)
        .or_else(|| error_lines(step.stderr))
        .unwrap_or_else(|| {
            format!(
                "step {} exited {}; see the Job's logs",
                step.name, step.exit_code
            )
        });
    bounded(&redactor.text(&found), SUMMARY_MAX)
}

/// The runner's own summary (a preflight failure, a signal), redacted and
/// bounded like any other.
pub fn own(summary: &str, redactor: &Redactor) -> String {
    bounded(&redactor.text(summary), SUMMARY_MAX)
}

#[derive(Deserialize)]
struct Validation {
    #[serde(default)]
    diagnostics: Vec<Diagnostic>,
}

#[derive(Deserialize)]
struct Diagnostic {
    severity: String,
    summary: String,
    #[serde(default)]
    detail: String,
}

fn validate_errors(json: &[u8]) -> Option<String> {
    let validation: Validation = serde_json::from_slice(json).ok()?;
    let errors: Vec<String> = validation
        .diagnostics
        .into_iter()
        .filter(|d| d.severity == "error")
        .map(|d| {
            let detail = d.detail.split_whitespace().collect::<Vec<_>>().join(" ");
            if detail.is_empty() {
                d.summary
            } else {
                format!("{}: {detail}", d.summary)
            }
        })
        .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

fn error_lines(stderr: &[u8]) -> Option<String> {
    let plain = strip_ansi_escapes::strip(stderr);
    let text = String::from_utf8_lossy(&plain);
    let lines: Vec<&str> = text
        .lines()
        // Colored output frames diagnostics in box-drawing characters.
        .map(|line| line.trim_start_matches(['│', '╷', '╵', ' ']).trim_end())
        .filter(|line| line.starts_with("Error:"))
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// `text` cut to at most `max` bytes on a character boundary, marked when
/// cut.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    const MARK: &str = "…";
    if max < MARK.len() {
        return String::new();
    }
    let mut end = max - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed<'a>(validate_json: Option<&'a [u8]>, stderr: &'a [u8]) -> FailedStep<'a> {
        FailedStep {
            name: "apply",
            exit_code: 1,
            validate_json,
            stderr,
        }
    }

    const VALIDATE: &[u8] = br#"{"format_version":"1.0","valid":false,"error_count":2,"warning_count":1,
        "diagnostics":[
          {"severity":"warning","summary":"Deprecated","detail":"old"},
          {"severity":"error","summary":"Unsupported argument","detail":"An argument named \"colour\" is not expected here.\n\nDid you mean \"color\"?"},
          {"severity":"error","summary":"Missing required argument"}
        ]}"#;

    #[test]
    fn sources_in_order() {
        let none = Redactor::new([]).unwrap();
        for (step, want) in [
            (
                failed(Some(VALIDATE), b"Error: ignored when validate said why\n"),
                "Unsupported argument: An argument named \"colour\" is not expected here. Did you \
                 mean \"color\"?; Missing required argument",
            ),
            (
                failed(Some(br#"{"valid":true,"diagnostics":[]}"#), b"Error: Failed to load\n"),
                "Error: Failed to load",
            ),
            (failed(Some(b"not json"), b"Error: Failed to load\n"), "Error: Failed to load"),
            (
                failed(
                    None,
                    b"\nError: Error acquiring the state lock\n\nError message: held\n\nError: second\n",
                ),
                "Error: Error acquiring the state lock; Error: second",
            ),
            (
                failed(None, b"\x1b[31m\xe2\x95\xb7\x1b[0m\n\x1b[31m\xe2\x94\x82\x1b[0m \x1b[1m\x1b[31mError: \x1b[0m\x1b[0m\x1b[1mColored\x1b[0m\n"),
                "Error: Colored",
            ),
            (failed(None, b"panic: something\n"), "step apply exited 1; see the Job's logs"),
            (failed(None, b""), "step apply exited 1; see the Job's logs"),
        ] {
            assert_eq!(summarize(&step, &none), want);
        }
    }

    #[test]
    fn secrets_are_redacted_before_the_cut() {
        let secret = "s3cr3t-value";
        let r = Redactor::new([secret.as_bytes().to_vec()]).unwrap();
        let stderr = format!("Error: leaked {secret}\n");
        assert_eq!(
            summarize(&failed(None, stderr.as_bytes()), &r),
            "Error: leaked (sensitive)"
        );

        // A secret straddling the 512-byte cut must not leave its head behind.
        let head = "x".repeat(SUMMARY_MAX - 10);
        let long = format!("Error: {head}{secret}{}\n", "y".repeat(100));
        let got = summarize(&failed(None, long.as_bytes()), &r);
        assert!(got.len() <= SUMMARY_MAX);
        assert!(!got.contains("s3cr"), "{got}");

        let diag = format!(
            r#"{{"diagnostics":[{{"severity":"error","summary":"Bad","detail":"{secret}"}}]}}"#
        );
        let step = FailedStep {
            validate_json: Some(diag.as_bytes()),
            ..failed(None, b"")
        };
        assert_eq!(summarize(&step, &r), "Bad: (sensitive)");
        assert_eq!(own(&format!("no {secret}"), &r), "no (sensitive)");
    }

    #[test]
    fn bounded_cuts_on_character_boundaries() {
        for (text, max, want) in [
            ("short", 512, "short".to_string()),
            ("abcdef", 6, "abcdef".into()),
            ("abcdefg", 6, "abc…".into()),
            ("ééééé", 7, "éé…".into()),
            ("ééééé", 8, "éé…".into()),
            ("abcdef", 2, String::new()),
        ] {
            let got = bounded(text, max);
            assert_eq!(got, want, "{text} {max}");
            assert!(got.len() <= max);
        }
        let long = "é".repeat(1000);
        assert!(
            summarize(
                &failed(None, format!("Error: {long}").as_bytes()),
                &Redactor::new([]).unwrap()
            )
            .len()
                <= SUMMARY_MAX
        );
    }
}
