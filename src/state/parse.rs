//! The parser: one streaming pass over the decompressed state that checks the
//! whole document as JSON (RFC 8259: syntax, UTF-8, escapes) and keeps only
//! what CAPTF reads: version, serial, lineage, terraform_version, the root
//! outputs, and whether each resource is managed and has a current object.
//! What it keeps is capped as it is read (the outputs, the lineage, the
//! version), so that a state's size bounds only what is scanned, not what
//! is held.
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
use super::{Corruption, MAX_LINEAGE, MAX_OUTPUTS, MAX_TERRAFORM_VERSION, Output};

/// Go's encoding/json, which reads the state in Terraform and OpenTofu, stops
/// at this nesting depth; the skipper does too.
const MAX_DEPTH: usize = 10_000;

/// Keys longer than this are not among the ones CAPTF reads.
const KEY_MAX: usize = 24;

/// What the pass found; [`super::envelope::decide`] makes it a state or not.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub version: Option<u64>,
    /// `encryption_version` is a non-empty string, which is all OpenTofu
    /// looks at to take a document for its encryption envelope.
    pub envelope: bool,
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
        outputs_left: MAX_OUTPUTS,
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
    /// What the outputs may still take of [`MAX_OUTPUTS`].
    outputs_left: usize,
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

    /// A string value kept whole: past `cap` bytes the pass stops, since
    /// the field is read only to be written into objects that hold little.
    fn string_value(
        &mut self,
        field: &'static str,
        cap: usize,
    ) -> Result<Typed<String>, Corruption> {
        let next = self.src.ws_some()?;
        let offset = self.src.offset();
        match next {
            b'"' => {
                self.src.pos += 1;
                let mut bytes = Vec::new();
                if !self.src.read_string_within(&mut bytes, cap)? {
                    return Err(Corruption::TooLong { field, cap, offset });
                }
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

    /// A string value kept only when short (a mode, a deposed key, an
    /// encryption_version, of which only emptiness matters).
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
                match self.string_value("lineage", MAX_LINEAGE)? {
                    Typed::Value(lineage) => self.parsed.lineage = lineage,
                    Typed::Null => self.parsed.lineage.clear(),
                    Typed::Mismatch => self.shape(offset, "lineage is not a string"),
                }
            } else if key.is(b"terraform_version") {
                self.once(&mut seen, 8, offset, "terraform_version");
                match self.string_value("terraform_version", MAX_TERRAFORM_VERSION)? {
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
                // Anything but a string is not OpenTofu's envelope; of a
                // string, only whether it is empty matters.
                self.parsed.envelope = match self.short_string_value()? {
                    Typed::Value(version) => !version.is_empty(),
                    Typed::Null | Typed::Mismatch => false,
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
mod tests;
