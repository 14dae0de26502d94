//! The parser's tests: syntax, shapes and splits of whole documents.

use std::io::Read;

use super::super::read::Inflater;
use super::*;

pub(super) fn parse(json: &str) -> Result<Parsed, Corruption> {
    document(Source::new(Inflater::new(json.as_bytes(), u64::MAX - 1))).map(|(parsed, _)| parsed)
}

pub(super) fn json_error(json: &str) -> &'static str {
    match parse(json) {
        Err(Corruption::Json { detail, .. }) => detail,
        other => panic!("{json}: expected a JSON error, got {other:?}"),
    }
}

pub(super) fn shape(json: &str) -> String {
    match parse(json) {
        Ok(Parsed {
            shape: Some(Corruption::Shape { detail, .. }),
            ..
        }) => detail,
        Err(Corruption::Shape { detail, .. }) => detail,
        other => panic!("{json}: expected a shape error, got {other:?}"),
    }
}

#[test]
fn reads_the_fields_in_any_order() {
    let parsed = parse(
        r#"{"resources": [], "outputs": {"b": {"type": "number", "value": 1.50}},
            "lineage": "l-1", "serial": 18446744073709551615, "version": 4,
            "terraform_version": "1.12.6", "check_results": null}"#,
    )
    .unwrap();
    assert_eq!(parsed.version, Some(4));
    assert_eq!(parsed.serial, u64::MAX);
    assert_eq!(parsed.lineage, "l-1");
    assert_eq!(parsed.terraform_version, "1.12.6");
    assert_eq!(parsed.outputs["b"].value.expose().as_str(), "1.50");
    assert_eq!(parsed.outputs["b"].type_.as_str(), "\"number\"");
    assert!(parsed.shape.is_none());
}

#[test]
fn keys_are_compared_decoded() {
    let parsed = parse(r#"{"\u0076ersion": 4, "ser\u0069al": 7, "outputs": {"n\u00e4me": {"value": 1, "type": "number"}}}"#)
        .unwrap();
    assert_eq!(parsed.version, Some(4));
    assert_eq!(parsed.serial, 7);
    assert!(parsed.outputs.contains_key("näme"));
}

#[test]
fn json_syntax_errors() {
    for (json, detail) in [
        ("", "unexpected end of the document"),
        ("this is not JSON", "invalid literal"),
        ("<html>", "expected a value"),
        ("{", "unexpected end of the document"),
        (r#"{"version": 4,}"#, "expected a key"),
        (r#"{"version": 4 "serial": 1}"#, "expected ',' or '}'"),
        (r#"{"version" 4}"#, "expected ':'"),
        (r#"{"a": [1,]}"#, "expected a value"),
        (r#"{"a": [1 2]}"#, "expected ',' or ']'"),
        (r#"{"a": {"b": 1]}"#, "expected ',' or '}'"),
        (r#"{"a": [}"#, "expected a value"),
        (r#"{"a": 01}"#, "invalid number"),
        (r#"{"a": 1-2}"#, "invalid number"),
        (r#"{"a": 1e5.0}"#, "invalid number"),
        (r#"{"a": -01.5}"#, "invalid number"),
        (r#"{"a": -}"#, "invalid number"),
        (r#"{"a": 1.}"#, "invalid number"),
        (r#"{"a": 1e}"#, "invalid number"),
        (r#"{"a": .5}"#, "expected a value"),
        (r#"{"a": tru}"#, "invalid literal"),
        (r#"{"a": nul}"#, "invalid literal"),
        (r#"{"a": "x"#, "unexpected end of the document in a string"),
        ("{\"a\": \"x\ty\"}", "control character in a string"),
        (r#"{"a": "\x"}"#, "invalid escape in a string"),
        (r#"{"a": "\u12g4"}"#, "invalid \\u escape"),
        (r#"{"a": "\ud800"}"#, "unpaired surrogate in a \\u escape"),
        (r#"{"a": "\udc00"}"#, "unpaired surrogate in a \\u escape"),
        (
            r#"{"a": "\ud800\u0041"}"#,
            "unpaired surrogate in a \\u escape",
        ),
        (
            r#"{"version": 4} {}"#,
            "trailing characters after the document",
        ),
        (
            r#"{"version": 4} x"#,
            "trailing characters after the document",
        ),
        (r#"{"outputs": {"o": {"value": [1,}}}"#, "expected a value"),
        (
            r#"{"outputs": {"o": {"value": "x", "type": "string",}}}"#,
            "expected a key",
        ),
        (
            r#"{"resources": [{"mode": "managed", "instances": [{"attributes": {"a": 1,}}]}]}"#,
            "expected a key",
        ),
    ] {
        assert_eq!(json_error(json), detail, "{json}");
    }
    let deep = format!(
        "{{\"a\": {}{}}}",
        "[".repeat(MAX_DEPTH + 1),
        "]".repeat(MAX_DEPTH + 1)
    );
    assert_eq!(json_error(&deep), "nested deeper than 10000 levels");
    let ok = format!(
        "{{\"version\": 4, \"a\": {}{}}}",
        "[".repeat(MAX_DEPTH),
        "]".repeat(MAX_DEPTH)
    );
    assert!(parse(&ok).is_ok());
}

#[test]
fn valid_json_of_the_wrong_shape() {
    for (json, detail) in [
        ("[]", "the document is not a JSON object"),
        ("4", "the document is not a JSON object"),
        (r#"{"version": "4"}"#, "version is not a whole number"),
        (r#"{"version": 4.0}"#, "version is not a whole number"),
        (r#"{"version": -4}"#, "version is not a whole number"),
        (
            r#"{"version": 4, "serial": 1e3}"#,
            "serial is not an unsigned 64-bit integer",
        ),
        (
            r#"{"version": 4, "serial": 18446744073709551616}"#,
            "serial is not an unsigned 64-bit integer",
        ),
        (
            r#"{"version": 4, "serial": -1}"#,
            "serial is not an unsigned 64-bit integer",
        ),
        (r#"{"version": 4, "lineage": 5}"#, "lineage is not a string"),
        (
            r#"{"version": 4, "terraform_version": []}"#,
            "terraform_version is not a string",
        ),
        (r#"{"version": 4, "version": 4}"#, "duplicate key version"),
        (
            r#"{"version": 4, "serial": 1, "serial": 2}"#,
            "duplicate key serial",
        ),
        (
            r#"{"version": 4, "outputs": []}"#,
            "outputs is not an object",
        ),
        (
            r#"{"version": 4, "outputs": {"o": 1}}"#,
            "an output is not an object",
        ),
        (
            r#"{"version": 4, "outputs": {"o": {"value": 1}}}"#,
            "an output has no value or no type",
        ),
        (
            r#"{"version": 4, "outputs": {"o": {"type": "number"}}}"#,
            "an output has no value or no type",
        ),
        (
            r#"{"version": 4, "outputs": {"o": {"value": 1, "type": "number", "sensitive": "yes"}}}"#,
            "an output's sensitive is not a boolean",
        ),
        (
            r#"{"version": 4, "outputs": {"o": {"value": 1, "type": "number"}, "o": {"value": 2, "type": "number"}}}"#,
            "duplicate output name",
        ),
        (
            r#"{"version": 4, "resources": {}}"#,
            "resources is not an array",
        ),
        (
            r#"{"version": 4, "resources": [1]}"#,
            "a resource is not an object",
        ),
        (
            r#"{"version": 4, "resources": [{"instances": []}]}"#,
            "a resource has no mode",
        ),
        (
            r#"{"version": 4, "resources": [{"mode": "other"}]}"#,
            "a resource's mode is neither managed nor data",
        ),
        (
            r#"{"version": 4, "resources": [{"mode": "managed", "instances": {}}]}"#,
            "a resource's instances is not an array",
        ),
        (
            r#"{"version": 4, "resources": [{"mode": "managed", "instances": ["x"]}]}"#,
            "an instance is not an object",
        ),
        (
            r#"{"version": 4, "resources": [{"mode": "managed", "instances": [{"deposed": 1}]}]}"#,
            "an instance's deposed key is not a string",
        ),
    ] {
        assert_eq!(shape(json), detail, "{json}");
    }
}

#[test]
fn nulls_read_as_go_reads_them() {
    let parsed = parse(
        r#"{"version": 4, "serial": null, "lineage": null, "outputs": null, "resources": null}"#,
    )
    .unwrap();
    assert_eq!(
        (
            parsed.serial,
            parsed.lineage.as_str(),
            parsed.outputs.len(),
            parsed.managed_resources
        ),
        (0, "", 0, 0)
    );
    assert!(parsed.shape.is_none());
    assert_eq!(parse(r#"{"version": null}"#).unwrap().version, None);
}

#[test]
fn an_envelope_is_a_non_empty_encryption_version_string() {
    let long = "v".repeat(100_000);
    for (value, envelope) in [
        (r#""v0""#, true),
        (r#""""#, false),
        ("1", false),
        ("null", false),
        // Not kept, so not capped: any length is an envelope.
        (&format!("\"{long}\""), true),
    ] {
        let json = format!(
            r#"{{"meta": {{"key_provider.pbkdf2.k": "eyJ9"}}, "encrypted_data": "AAEC", "encryption_version": {value}}}"#
        );
        assert_eq!(parse(&json).unwrap().envelope, envelope, "{value:.10}");
    }
}

#[test]
fn lineage_and_version_are_capped() {
    use crate::state::{MAX_LINEAGE, MAX_TERRAFORM_VERSION};
    for (field, cap) in [
        ("lineage", MAX_LINEAGE),
        ("terraform_version", MAX_TERRAFORM_VERSION),
    ] {
        // Decoded bytes count: each "\u00e9" is 2 of them.
        let at_cap = format!("{}{}", r"\u00e9".repeat(cap / 2), "x".repeat(cap % 2));
        let json = format!(r#"{{"version": 4, "{field}": "{at_cap}"}}"#);
        let parsed = parse(&json).unwrap();
        let kept = match field {
            "lineage" => parsed.lineage,
            _ => parsed.terraform_version,
        };
        assert_eq!(kept.len(), cap, "{field}");
        assert!(kept.starts_with('é'), "{field}");
        for over in [
            format!("x{at_cap}"),
            "x".repeat(10 * cap),
            // Far past the cap, across several blocks.
            "x".repeat(1 << 20),
        ] {
            let json = format!(r#"{{"version": 4, "{field}": "{over}"}}"#);
            let offset = json.find(&format!(r#": "{}"#, &over[..1])).unwrap() as u64 + 2;
            assert_eq!(
                parse(&json).map(|_| ()),
                Err(Corruption::TooLong { field, cap, offset }),
                "{field}"
            );
        }
    }
}

#[test]
fn tokens_cut_by_block_boundaries() {
    use super::super::read::BLOCK;
    // Every token kind placed across the first block boundary, at every
    // offset near it.
    let tail = r#""value": "a\u00e9\ud834\udd1e\n\"b", "type": "string"}, "n": {"value": -12.5e+3, "type": "number"}, "t": {"value": [true, false, null], "type": ["tuple", ["bool", "bool", "bool"]]}}, "serial": 12345, "resources": [{"mode": "managed", "instances": [{"attributes": {"k": "€€€€€€€€€€", "z": 0}}]}]}"#;
    for pad in 0..96 {
        let head = format!(
            "{{\"version\": 4, \"outputs\": {{\"s\": {{{}",
            " ".repeat(BLOCK - 64 + pad)
        );
        let json = format!("{head}{tail}");
        let parsed = parse(&json).unwrap_or_else(|e| panic!("pad {pad}: {e}"));
        assert_eq!(parsed.serial, 12345, "pad {pad}");
        assert_eq!(parsed.managed_resources, 1, "pad {pad}");
        assert_eq!(
            parsed.outputs["s"].value.expose().as_str(),
            r#""a\u00e9\ud834\udd1e\n\"b""#,
            "pad {pad}"
        );
        assert_eq!(
            parsed.outputs["n"].value.expose().as_str(),
            "-12.5e+3",
            "pad {pad}"
        );
        assert_eq!(
            parsed.outputs["t"].value.expose().as_str(),
            "[true,false,null]",
            "pad {pad}"
        );
    }
}

/// Hands out at most `step` bytes per read, so that every token of a
/// document falls across block boundaries somewhere.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(out.len()).min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn every_split_of_the_input_reads_the_same() {
    let documents = [
        r#"{"version": 4, "serial": 12, "lineage": "l\u00e9\ud834\udd1e", "terraform_version": "1.12.6",
            "outputs": {"a": {"value": {"k": [1, -2.5e+3, true, false, null, "x\"y"]}, "type": "dynamic", "sensitive": true},
                        "b\n": {"value": "€€", "type": "string"}},
            "resources": [{"mode": "managed", "instances": [{"deposed": "", "attributes": {"a": [[], {}, [{"b": "}]"}]]}},
                                                             {"deposed": "0001", "attributes": null}]},
                          {"mode": "data", "instances": [{}]}],
            "check_results": [{"x": 123456789012345678901234567890}]}"#,
        r#"{"version": 4, "a": [1, 2,]}"#,
        r#"{"version": 4, "a": "\ud800\u0041"}"#,
        r#"{"version": 4, "a": 01}"#,
        r#"{"version": 4, "a": tru}"#,
        r#"{"version": 4, "serial": "1"}"#,
        r#"{"version": 4} x"#,
        r#"{"encryption_version": "v0", "encrypted_data": "AAEC", "meta": {}}"#,
        "{\"version\": 4, \"a\": \"é\"}",
    ];
    for document in documents {
        let whole = parse(document).map(|p| format!("{p:?}"));
        for step in 1..=19 {
            let split = document_of(Trickle {
                data: document.as_bytes(),
                step,
            });
            assert_eq!(split, whole, "step {step}: {document}");
        }
    }

    fn document_of(source: Trickle<'_>) -> Result<String, Corruption> {
        document(Source::new(Inflater::new(source, u64::MAX - 1))).map(|(p, _)| format!("{p:?}"))
    }
}
