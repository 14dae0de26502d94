//! The parser: one streaming pass over the decompressed state that checks the
//! whole document as JSON (RFC 8259: syntax, UTF-8, escapes) and keeps only
//! what CAPTF reads: version, serial, lineage, terraform_version, the root
//! outputs, and whether each resource is managed and has a current object.
//! Everything else, above all the resource instances' attributes, is skipped
//! by a scanner that passes whitespace and string contents sixteen bytes at
//! a time and checks every token where it lies.
//!
//! Two kinds of failure: a fatal one (gzip, cap, JSON syntax, UTF-8) stops the
//! pass; a value of the wrong shape (a serial that is a string, a duplicated
//! key) is skipped and remembered, so that the decision of what the document
//! is (an encrypted envelope, another version) can still be made on all of it.

mod outputs;
mod resources;
mod skip;

use std::collections::BTreeMap;

use super::lexer::{Blocks, Source};
use super::{Corruption, Output};

/// Go's encoding/json, which reads the state in Terraform and OpenTofu, stops
/// at this nesting depth; the skipper does too.
const MAX_DEPTH: usize = 10_000;

/// Keys longer than this are not among the ones CAPTF reads.
const KEY_MAX: usize = 24;

/// What the pass found; [`super::envelope::decide`] makes it a state or not.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub version: Option<u64>,
    /// Only when the document has it as a string.
    pub encryption_version: Option<String>,
    pub serial: u64,
    pub lineage: String,
    pub terraform_version: String,
    pub outputs: BTreeMap<String, Output>,
    pub managed_resources: u64,
    /// The first value of the wrong shape.
    pub shape: Option<Corruption>,
}

/// Parses a whole document from `source`, to the end of the stream. Returns
/// what it found and the decompressed size.
pub(super) fn document<B: Blocks>(source: Source<B>) -> Result<(Parsed, u64), Corruption> {
    let mut parser = Parser {
        src: source,
        stack: Vec::new(),
        parsed: Parsed::default(),
        name: Vec::new(),
        scratch: Vec::with_capacity(KEY_MAX),
    };
    parser.top()?;
    let total = parser.src.total();
    Ok((parser.parsed, total))
}

/// A typed read of a scalar: the value, JSON null, or a value of another type
/// (already skipped).
enum Typed<T> {
    Value(T),
    Null,
    Mismatch,
}

/// A decoded object key or short string, kept only when it is short enough
/// to be one CAPTF knows.
struct Key {
    bytes: [u8; KEY_MAX],
    len: usize,
    fits: bool,
}

impl Key {
    fn is(&self, name: &[u8]) -> bool {
        self.fits && &self.bytes[..self.len] == name
    }

    fn is_empty(&self) -> bool {
        self.fits && self.len == 0
    }
}

struct Parser<B> {
    src: Source<B>,
    /// The open containers of the value being skipped.
    stack: Vec<u8>,
    parsed: Parsed,
    /// Scratch for output names.
    name: Vec<u8>,
    /// Scratch for keys and short strings.
    scratch: Vec<u8>,
}

impl<B: Blocks> Parser<B> {
    fn shape(&mut self, offset: u64, detail: impl Into<String>) {
        if self.parsed.shape.is_none() {
            self.parsed.shape = Some(Corruption::Shape {
                offset,
                detail: detail.into(),
            });
        }
    }

    /// Reads the next key of an object whose `{` is consumed, and its colon.
    /// None at the closing `}`.
    fn next_key(&mut self, first: &mut bool) -> Result<Option<Key>, Corruption> {
        if !self.before_key(first)? {
            return Ok(None);
        }
        let key = self.short_string()?;
        self.colon()?;
        Ok(Some(key))
    }

    /// [`Parser::next_key`] for keys kept whole (output names), into
    /// `self.name`.
    fn next_name(&mut self, first: &mut bool) -> Result<bool, Corruption> {
        if !self.before_key(first)? {
            return Ok(false);
        }
        self.name.clear();
        self.src.read_string(&mut self.name, usize::MAX)?;
        self.colon()?;
        Ok(true)
    }

    /// Moves past the `,` before a key and its opening quote; false at `}`.
    fn before_key(&mut self, first: &mut bool) -> Result<bool, Corruption> {
        let mut byte = self.src.ws_some()?;
        if byte == b'}' {
            self.src.pos += 1;
            return Ok(false);
        }
        if !*first {
            if byte != b',' {
                return Err(self.src.json_error("expected ',' or '}'"));
            }
            self.src.pos += 1;
            byte = self.src.ws_some()?;
        }
        if byte != b'"' {
            return Err(self.src.json_error("expected a key"));
        }
        self.src.pos += 1;
        *first = false;
        Ok(true)
    }

    fn colon(&mut self) -> Result<(), Corruption> {
        if self.src.ws_some()? != b':' {
            return Err(self.src.json_error("expected ':'"));
        }
        self.src.pos += 1;
        Ok(())
    }

    /// Moves to the next element of an array whose `[` is consumed; false at
    /// the closing `]`. The element itself is left to the caller.
    fn next_element(&mut self, first: &mut bool) -> Result<bool, Corruption> {
        let byte = self.src.ws_some()?;
        if byte == b']' {
            self.src.pos += 1;
            return Ok(false);
        }
        if !*first {
            if byte != b',' {
                return Err(self.src.json_error("expected ',' or ']'"));
            }
            self.src.pos += 1;
        }
        *first = false;
        Ok(true)
    }

    /// Opens the object or array (`open` is `{` or `[`) that should come
    /// next. A null is consumed and gives false; a value of another type is
    /// skipped, noted as `what`, and gives false.
    fn enter(&mut self, open: u8, what: &'static str) -> Result<bool, Corruption> {
        let offset = self.src.offset();
        match self.src.ws_some()? {
            byte if byte == open => {
                self.src.pos += 1;
                Ok(true)
            }
            b'n' => {
                self.src.literal(b"null")?;
                Ok(false)
            }
            _ => {
                self.skip_value()?;
                self.shape(offset, what);
                Ok(false)
            }
        }
    }

    fn u64_value(&mut self) -> Result<Typed<u64>, Corruption> {
        match self.src.ws_some()? {
            b'-' | b'0'..=b'9' => Ok(match self.src.number()? {
                Some(value) => Typed::Value(value),
                None => Typed::Mismatch,
            }),
            b'n' => {
                self.src.literal(b"null")?;
                Ok(Typed::Null)
            }
            _ => {
                self.skip_value()?;
                Ok(Typed::Mismatch)
            }
        }
    }

    fn bool_value(&mut self) -> Result<Typed<bool>, Corruption> {
        match self.src.ws_some()? {
            b't' => {
                self.src.literal(b"true")?;
                Ok(Typed::Value(true))
            }
            b'f' => {
                self.src.literal(b"false")?;
                Ok(Typed::Value(false))
            }
            b'n' => {
                self.src.literal(b"null")?;
                Ok(Typed::Null)
            }
            _ => {
                self.skip_value()?;
                Ok(Typed::Mismatch)
            }
        }
    }

    fn string_value(&mut self) -> Result<Typed<String>, Corruption> {
        match self.src.ws_some()? {
            b'"' => {
                self.src.pos += 1;
                let mut bytes = Vec::new();
                self.src.read_string(&mut bytes, usize::MAX)?;
                Ok(Typed::Value(self.utf8(bytes)?))
            }
            b'n' => {
                self.src.literal(b"null")?;
                Ok(Typed::Null)
            }
            _ => {
                self.skip_value()?;
                Ok(Typed::Mismatch)
            }
        }
    }

    /// Decodes a string (its opening quote consumed) into a [`Key`].
    fn short_string(&mut self) -> Result<Key, Corruption> {
        self.scratch.clear();
        let fits = self.src.read_string(&mut self.scratch, KEY_MAX)?;
        let mut key = Key {
            bytes: [0; KEY_MAX],
            len: self.scratch.len(),
            fits,
        };
        key.bytes[..key.len].copy_from_slice(&self.scratch);
        Ok(key)
    }

    /// A string value kept only when short (a mode, a deposed key).
    fn short_string_value(&mut self) -> Result<Typed<Key>, Corruption> {
        match self.src.ws_some()? {
            b'"' => {
                self.src.pos += 1;
                Ok(Typed::Value(self.short_string()?))
            }
            b'n' => {
                self.src.literal(b"null")?;
                Ok(Typed::Null)
            }
            _ => {
                self.skip_value()?;
                Ok(Typed::Mismatch)
            }
        }
    }

    /// Decoded bytes as a String; the document was checked as UTF-8 and
    /// escapes decode to whole characters, so this fails only on a bug.
    fn utf8(&self, bytes: Vec<u8>) -> Result<String, Corruption> {
        String::from_utf8(bytes).map_err(|_| self.src.json_error("invalid UTF-8"))
    }

    /// Notes a key seen twice at a level CAPTF reads: Go would keep the last,
    /// serde_json the first or an error; neither is a state OpenTofu wrote.
    fn once(&mut self, seen: &mut u32, bit: u32, offset: u64, name: &'static str) {
        if *seen & bit != 0 {
            self.shape(offset, format!("duplicate key {name}"));
        }
        *seen |= bit;
    }

    /// The document: one object, then nothing but whitespace to the end of
    /// the stream.
    fn top(&mut self) -> Result<(), Corruption> {
        match self.src.ws_some()? {
            b'{' => {}
            b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                // Say so only of a JSON value; anything else is not JSON.
                let offset = self.src.offset();
                self.skip_value()?;
                return Err(Corruption::Shape {
                    offset,
                    detail: "the document is not a JSON object".into(),
                });
            }
            _ => return Err(self.src.json_error("expected a value")),
        }
        self.src.pos += 1;
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"version") {
                self.once(&mut seen, 1, offset, "version");
                match self.u64_value()? {
                    Typed::Value(version) => self.parsed.version = Some(version),
                    Typed::Null => self.parsed.version = None,
                    Typed::Mismatch => self.shape(offset, "version is not a whole number"),
                }
            } else if key.is(b"serial") {
                self.once(&mut seen, 2, offset, "serial");
                match self.u64_value()? {
                    Typed::Value(serial) => self.parsed.serial = serial,
                    Typed::Null => self.parsed.serial = 0,
                    Typed::Mismatch => {
                        self.shape(offset, "serial is not an unsigned 64-bit integer")
                    }
                }
            } else if key.is(b"lineage") {
                self.once(&mut seen, 4, offset, "lineage");
                match self.string_value()? {
                    Typed::Value(lineage) => self.parsed.lineage = lineage,
                    Typed::Null => self.parsed.lineage.clear(),
                    Typed::Mismatch => self.shape(offset, "lineage is not a string"),
                }
            } else if key.is(b"terraform_version") {
                self.once(&mut seen, 8, offset, "terraform_version");
                match self.string_value()? {
                    Typed::Value(version) => self.parsed.terraform_version = version,
                    Typed::Null => self.parsed.terraform_version.clear(),
                    Typed::Mismatch => self.shape(offset, "terraform_version is not a string"),
                }
            } else if key.is(b"outputs") {
                self.once(&mut seen, 16, offset, "outputs");
                self.outputs()?;
            } else if key.is(b"resources") {
                self.once(&mut seen, 32, offset, "resources");
                self.resources()?;
            } else if key.is(b"encryption_version") {
                self.once(&mut seen, 64, offset, "encryption_version");
                // Anything but a string is not OpenTofu's envelope.
                self.parsed.encryption_version = match self.string_value()? {
                    Typed::Value(version) => Some(version),
                    Typed::Null | Typed::Mismatch => None,
                };
            } else {
                self.skip_value()?;
            }
        }
        match self.src.ws()? {
            None => Ok(()),
            Some(_) => Err(self
                .src
                .json_error("trailing characters after the document")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::super::read::Inflater;
    use super::*;

    pub(super) fn parse(json: &str) -> Result<Parsed, Corruption> {
        document(Source::new(Inflater::new(json.as_bytes(), u64::MAX - 1)))
            .map(|(parsed, _)| parsed)
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
        let parsed = parse(r#"{"version": 4, "serial": null, "lineage": null, "outputs": null, "resources": null}"#).unwrap();
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
    fn encryption_version_is_kept_only_as_a_string() {
        let envelope = parse(r#"{"meta": {"key_provider.pbkdf2.k": "eyJ9"}, "encrypted_data": "AAEC", "encryption_version": "v0"}"#).unwrap();
        assert_eq!(envelope.encryption_version.as_deref(), Some("v0"));
        assert_eq!(
            parse(r#"{"encryption_version": 1}"#)
                .unwrap()
                .encryption_version,
            None
        );
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
            document(Source::new(Inflater::new(source, u64::MAX - 1)))
                .map(|(p, _)| format!("{p:?}"))
        }
    }
}
