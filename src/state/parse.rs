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

use std::collections::BTreeMap;

use super::read::{Blocks, Source};
use super::{Corruption, Json, Output, OutputValue, Sensitive};

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

/// Bit i is set when byte i of the chunk ends a plain run of string
/// content: a quote, a backslash or a control character.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn specials16(chunk: &[u8; 16]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of every x86_64 target, and the load reads
    // exactly the 16 bytes `chunk` borrows (unaligned loads are allowed).
    unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast());
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Unsigned v <= 0x1f exactly when min(v, 0x1f) == v.
        let control = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control)) as u32
    }
}

/// Bit i is set when byte i of the chunk is not JSON whitespace.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn non_ws16(chunk: &[u8; 16]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: as in `specials16`.
    unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast());
        let ws = _mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\n' as i8)),
            ),
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\r' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\t' as i8)),
            ),
        );
        !(_mm_movemask_epi8(ws) as u32) & 0xffff
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn specials16(chunk: &[u8; 16]) -> u32 {
    chunk
        .iter()
        .enumerate()
        .fold(0, |mask, (i, &b)| mask | (u32::from(is_special(b)) << i))
}

#[cfg(not(target_arch = "x86_64"))]
fn non_ws16(chunk: &[u8; 16]) -> u32 {
    chunk
        .iter()
        .enumerate()
        .fold(0, |mask, (i, &b)| mask | (u32::from(!is_ws(b)) << i))
}

fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The index of the first byte of `bytes[from..]` that ends a plain run of
/// string content. Thirty-two bytes a step: most strings and indentation
/// runs of a state end within one step, which keeps the branch predictable.
#[inline(always)]
fn find_special(bytes: &[u8], mut from: usize) -> Option<usize> {
    while let Some(chunk) = bytes[from..].first_chunk::<16>() {
        let mask = specials16(chunk);
        if mask != 0 {
            return Some(from + mask.trailing_zeros() as usize);
        }
        from += 16;
    }
    bytes[from..]
        .iter()
        .position(|&b| is_special(b))
        .map(|k| from + k)
}

/// The index of the first byte of `bytes[from..]` that is not whitespace.
#[inline(always)]
fn find_non_ws(bytes: &[u8], mut from: usize) -> Option<usize> {
    while let Some(chunk) = bytes[from..].first_chunk::<16>() {
        let mask = non_ws16(chunk);
        if mask != 0 {
            return Some(from + mask.trailing_zeros() as usize);
        }
        from += 16;
    }
    bytes[from..]
        .iter()
        .position(|&b| !is_ws(b))
        .map(|k| from + k)
}

/// Whether `run` is exactly one JSON number.
fn is_number(run: &[u8]) -> bool {
    let digits = |bytes: &[u8]| bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut rest = run.strip_prefix(b"-").unwrap_or(run);
    match rest.first() {
        Some(b'0') => rest = &rest[1..],
        Some(b'1'..=b'9') => rest = &rest[digits(rest)..],
        _ => return false,
    }
    if let Some(fraction) = rest.strip_prefix(b".") {
        let n = digits(fraction);
        if n == 0 {
            return false;
        }
        rest = &fraction[n..];
    }
    if let Some(exponent) = rest.strip_prefix(b"e").or_else(|| rest.strip_prefix(b"E")) {
        let exponent = exponent
            .strip_prefix(b"+")
            .or_else(|| exponent.strip_prefix(b"-"))
            .unwrap_or(exponent);
        let n = digits(exponent);
        if n == 0 {
            return false;
        }
        rest = &exponent[n..];
    }
    rest.is_empty()
}

/// Drops the whitespace outside strings from valid JSON text.
fn compact(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !is_ws(b) {
            out.push(b);
            in_string = b == b'"';
        }
    }
    out
}

/// Lexing over the block buffer. Each function leaves `pos` just after what it
/// consumed and refills when it reaches the end of the block.
impl<B: Blocks> Source<B> {
    fn json_error(&self, detail: &'static str) -> Corruption {
        Corruption::Json {
            offset: self.offset(),
            detail,
        }
    }

    /// Skips whitespace and returns the next byte without consuming it, or
    /// None at the end of the stream.
    fn ws(&mut self) -> Result<Option<u8>, Corruption> {
        loop {
            let end = self.end;
            if let Some(i) = find_non_ws(&self.buf[..end], self.pos) {
                self.pos = i;
                return Ok(Some(self.buf[i]));
            }
            self.pos = end;
            if !self.refill()? {
                return Ok(None);
            }
        }
    }

    /// [`Source::ws`], where the document cannot end.
    fn ws_some(&mut self) -> Result<u8, Corruption> {
        match self.ws()? {
            Some(byte) => Ok(byte),
            None => Err(self.json_error("unexpected end of the document")),
        }
    }

    /// The next byte, consumed.
    fn next_byte(&mut self) -> Result<u8, Corruption> {
        if self.pos == self.end && !self.refill()? {
            return Err(self.json_error("unexpected end of the document"));
        }
        let byte = self.buf[self.pos];
        self.pos += 1;
        Ok(byte)
    }

    /// The next byte, not consumed; None at the end of the stream.
    fn peek(&mut self) -> Result<Option<u8>, Corruption> {
        if self.pos == self.end && !self.refill()? {
            return Ok(None);
        }
        Ok(Some(self.buf[self.pos]))
    }

    /// Skips a string's content and closing quote (the opening quote is
    /// consumed).
    fn skip_string(&mut self) -> Result<(), Corruption> {
        loop {
            let end = self.end;
            match find_special(&self.buf[..end], self.pos) {
                Some(i) => match self.buf[i] {
                    b'"' => {
                        self.pos = i + 1;
                        return Ok(());
                    }
                    b'\\' => {
                        self.pos = i + 1;
                        self.escape()?;
                    }
                    _ => {
                        self.pos = i;
                        return Err(self.json_error("control character in a string"));
                    }
                },
                None => {
                    self.pos = end;
                    if !self.refill()? {
                        return Err(self.json_error("unexpected end of the document in a string"));
                    }
                }
            }
        }
    }

    /// Decodes a string's content (the opening quote is consumed) into `out`,
    /// keeping at most `max` bytes. Returns whether all of it fit.
    fn read_string(&mut self, out: &mut Vec<u8>, max: usize) -> Result<bool, Corruption> {
        let mut fits = true;
        let mut keep = |out: &mut Vec<u8>, bytes: &[u8]| {
            if fits && out.len() + bytes.len() <= max {
                out.extend_from_slice(bytes);
            } else {
                fits = false;
            }
        };
        loop {
            let end = self.end;
            let start = self.pos;
            match find_special(&self.buf[..end], start) {
                Some(i) => {
                    keep(out, &self.buf[start..i]);
                    match self.buf[i] {
                        b'"' => {
                            self.pos = i + 1;
                            return Ok(fits);
                        }
                        b'\\' => {
                            self.pos = i + 1;
                            let ch = self.escape()?;
                            keep(out, ch.encode_utf8(&mut [0; 4]).as_bytes());
                        }
                        _ => {
                            self.pos = i;
                            return Err(self.json_error("control character in a string"));
                        }
                    }
                }
                None => {
                    keep(out, &self.buf[start..end]);
                    self.pos = end;
                    if !self.refill()? {
                        return Err(self.json_error("unexpected end of the document in a string"));
                    }
                }
            }
        }
    }

    /// Decodes an escape (the backslash is consumed). A `\u` escape of a
    /// UTF-16 surrogate must be a whole pair.
    fn escape(&mut self) -> Result<char, Corruption> {
        let ch = match self.next_byte()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let high = self.hex4()?;
                let code = match high {
                    0xD800..=0xDBFF => {
                        if self.next_byte()? != b'\\' || self.next_byte()? != b'u' {
                            return Err(self.json_error("unpaired surrogate in a \\u escape"));
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.json_error("unpaired surrogate in a \\u escape"));
                        }
                        0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                    }
                    0xDC00..=0xDFFF => {
                        return Err(self.json_error("unpaired surrogate in a \\u escape"));
                    }
                    _ => high,
                };
                match char::from_u32(code) {
                    Some(ch) => ch,
                    None => return Err(self.json_error("invalid \\u escape")),
                }
            }
            _ => return Err(self.json_error("invalid escape in a string")),
        };
        Ok(ch)
    }

    fn hex4(&mut self) -> Result<u32, Corruption> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = match self.next_byte()? {
                b @ b'0'..=b'9' => b - b'0',
                b @ b'a'..=b'f' => b - b'a' + 10,
                b @ b'A'..=b'F' => b - b'A' + 10,
                _ => return Err(self.json_error("invalid \\u escape")),
            };
            code = code * 16 + u32::from(digit);
        }
        Ok(code)
    }

    /// Scans a number (its first byte not yet consumed) by the JSON grammar.
    /// Returns its value when it is a non-negative integer literal that fits
    /// in u64.
    fn number(&mut self) -> Result<Option<u64>, Corruption> {
        #[derive(Clone, Copy, PartialEq)]
        enum At {
            Start,
            Minus,
            Zero,
            Int,
            Dot,
            Frac,
            Exp,
            ExpSign,
            ExpDigits,
        }
        // Errors point at the number's start, wherever the block ends.
        let start = self.offset();
        let invalid = Corruption::Json {
            offset: start,
            detail: "invalid number",
        };
        let mut at = At::Start;
        let mut value = Some(0u64);
        while let Some(byte) = self.peek()? {
            at = match (at, byte) {
                (At::Start, b'-') => {
                    value = None;
                    At::Minus
                }
                (At::Start | At::Minus, b'0') => At::Zero,
                (At::Start | At::Minus, b'1'..=b'9') | (At::Int, b'0'..=b'9') => {
                    value =
                        value.and_then(|v| v.checked_mul(10)?.checked_add(u64::from(byte - b'0')));
                    At::Int
                }
                (At::Zero | At::Int, b'.') => {
                    value = None;
                    At::Dot
                }
                (At::Dot | At::Frac, b'0'..=b'9') => At::Frac,
                (At::Zero | At::Int | At::Frac, b'e' | b'E') => {
                    value = None;
                    At::Exp
                }
                (At::Exp, b'+' | b'-') => At::ExpSign,
                (At::Exp | At::ExpSign | At::ExpDigits, b'0'..=b'9') => At::ExpDigits,
                // A number is always followed by a byte that cannot continue
                // one, so such a byte here makes the run no number at all,
                // as the block scanner sees it too.
                (_, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') => return Err(invalid),
                _ => break,
            };
            self.pos += 1;
        }
        match at {
            At::Zero | At::Int | At::Frac | At::ExpDigits => Ok(value),
            _ => Err(invalid),
        }
    }

    /// Consumes `word` (true, false or null) from its first byte on.
    fn literal(&mut self, word: &[u8]) -> Result<(), Corruption> {
        for &expected in word {
            if self.next_byte()? != expected {
                return Err(self.json_error("invalid literal"));
            }
        }
        Ok(())
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

    /// Skips one value of any kind, checking it fully, without recursion.
    ///
    /// This is where nearly all of a state's bytes go (the instances'
    /// attributes), so it is one loop over the block with the position in a
    /// local: whitespace and string contents are passed sixteen bytes at a
    /// time, numbers and literals are checked in place, and only what the
    /// block cuts or what is rare (escapes) goes through the byte-by-byte
    /// functions.
    fn skip_value(&mut self) -> Result<(), Corruption> {
        #[derive(Clone, Copy, PartialEq)]
        enum Next {
            /// A value, or `]` right after `[`.
            Value {
                array_start: bool,
            },
            /// A key, or `}` right after `{`.
            Key {
                object_start: bool,
            },
            Colon,
            /// `,` or the closing bracket of the innermost container.
            After,
        }
        let base = self.stack.len();
        let mut next = Next::Value { array_start: false };
        'block: loop {
            let end = self.src.end;
            let buf = &self.src.buf[..end];
            let mut i = self.src.pos;
            loop {
                if next == Next::After && self.stack.len() == base {
                    self.src.pos = i;
                    return Ok(());
                }
                let Some(at) = find_non_ws(buf, i) else {
                    i = end;
                    break;
                };
                i = at;
                let byte = buf[i];
                next = match next {
                    Next::Value { array_start } => match byte {
                        b'"' => match find_special(buf, i + 1) {
                            Some(close) if buf[close] == b'"' => {
                                i = close + 1;
                                Next::After
                            }
                            _ => {
                                // An escape, a control character, or the end
                                // of the block: the careful way.
                                self.src.pos = i + 1;
                                self.src.skip_string()?;
                                next = Next::After;
                                continue 'block;
                            }
                        },
                        b'{' => {
                            if self.stack.len() >= MAX_DEPTH {
                                self.src.pos = i;
                                return Err(self.src.json_error("nested deeper than 10000 levels"));
                            }
                            i += 1;
                            self.stack.push(b'{');
                            Next::Key { object_start: true }
                        }
                        b'[' => {
                            if self.stack.len() >= MAX_DEPTH {
                                self.src.pos = i;
                                return Err(self.src.json_error("nested deeper than 10000 levels"));
                            }
                            i += 1;
                            self.stack.push(b'[');
                            Next::Value { array_start: true }
                        }
                        b']' if array_start => {
                            i += 1;
                            self.stack.pop();
                            Next::After
                        }
                        b'-' | b'0'..=b'9' => {
                            let run = buf[i..].iter().position(|&b| {
                                !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                            });
                            match run {
                                Some(len) if is_number(&buf[i..i + len]) => {
                                    i += len;
                                    Next::After
                                }
                                Some(_) => {
                                    self.src.pos = i;
                                    return Err(self.src.json_error("invalid number"));
                                }
                                None => {
                                    self.src.pos = i;
                                    self.src.number()?;
                                    next = Next::After;
                                    continue 'block;
                                }
                            }
                        }
                        b't' | b'f' | b'n' => {
                            let word: &[u8] = match byte {
                                b't' => b"true",
                                b'f' => b"false",
                                _ => b"null",
                            };
                            if buf[i..].starts_with(word) {
                                i += word.len();
                                Next::After
                            } else {
                                self.src.pos = i;
                                self.src.literal(word)?;
                                next = Next::After;
                                continue 'block;
                            }
                        }
                        _ => {
                            self.src.pos = i;
                            return Err(self.src.json_error("expected a value"));
                        }
                    },
                    Next::Key { object_start } => match byte {
                        b'"' => match find_special(buf, i + 1) {
                            // Go writes the colon right after the key.
                            Some(close)
                                if buf[close] == b'"' && buf.get(close + 1) == Some(&b':') =>
                            {
                                i = close + 2;
                                Next::Value { array_start: false }
                            }
                            Some(close) if buf[close] == b'"' => {
                                i = close + 1;
                                Next::Colon
                            }
                            _ => {
                                self.src.pos = i + 1;
                                self.src.skip_string()?;
                                next = Next::Colon;
                                continue 'block;
                            }
                        },
                        b'}' if object_start => {
                            i += 1;
                            self.stack.pop();
                            Next::After
                        }
                        _ => {
                            self.src.pos = i;
                            return Err(self.src.json_error("expected a key"));
                        }
                    },
                    Next::Colon => {
                        if byte != b':' {
                            self.src.pos = i;
                            return Err(self.src.json_error("expected ':'"));
                        }
                        i += 1;
                        Next::Value { array_start: false }
                    }
                    Next::After => {
                        let open = self.stack.last().copied();
                        match (open, byte) {
                            (Some(b'{'), b',') => {
                                i += 1;
                                // The next member's key and colon, when the
                                // block holds them whole: the common case,
                                // without a turn of the loop for each.
                                let key = find_non_ws(buf, i).filter(|&at| buf[at] == b'"');
                                let close = key.and_then(|at| find_special(buf, at + 1));
                                match close {
                                    Some(close)
                                        if buf[close] == b'"'
                                            && buf.get(close + 1) == Some(&b':') =>
                                    {
                                        i = close + 2;
                                        Next::Value { array_start: false }
                                    }
                                    _ => Next::Key {
                                        object_start: false,
                                    },
                                }
                            }
                            (_, b',') => {
                                i += 1;
                                Next::Value { array_start: false }
                            }
                            (Some(b'{'), b'}') | (Some(b'['), b']') => {
                                i += 1;
                                self.stack.pop();
                                Next::After
                            }
                            (Some(b'{'), _) => {
                                self.src.pos = i;
                                return Err(self.src.json_error("expected ',' or '}'"));
                            }
                            _ => {
                                self.src.pos = i;
                                return Err(self.src.json_error("expected ',' or ']'"));
                            }
                        }
                    }
                };
            }
            self.src.pos = i;
            if !self.src.refill()? {
                return Err(self.src.json_error("unexpected end of the document"));
            }
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

    /// Any value, kept as compact JSON text.
    fn json_value(&mut self) -> Result<Json, Corruption> {
        self.src.ws_some()?;
        self.src.start_capture();
        let skipped = self.skip_value();
        let bytes = compact(&self.src.finish_capture());
        skipped?;
        Ok(Json(self.utf8(bytes)?.into_boxed_str()))
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

    fn outputs(&mut self) -> Result<(), Corruption> {
        self.parsed.outputs.clear();
        if !self.enter(b'{', "outputs is not an object")? {
            return Ok(());
        }
        let mut first = true;
        loop {
            let offset = self.src.offset();
            if !self.next_name(&mut first)? {
                return Ok(());
            }
            let bytes = std::mem::take(&mut self.name);
            let name = self.utf8(bytes)?;
            if let Some(output) = self.output()? {
                if self.parsed.outputs.contains_key(&name) {
                    self.shape(offset, "duplicate output name");
                }
                self.parsed.outputs.insert(name, output);
            }
        }
    }

    fn output(&mut self) -> Result<Option<Output>, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "an output is not an object")? {
            self.shape(offset, "an output is not an object");
            return Ok(None);
        }
        let (mut value, mut type_, mut sensitive) = (None, None, false);
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"value") {
                self.once(&mut seen, 1, offset, "value");
                value = Some(self.json_value()?);
            } else if key.is(b"type") {
                self.once(&mut seen, 2, offset, "type");
                type_ = Some(self.json_value()?);
            } else if key.is(b"sensitive") {
                self.once(&mut seen, 4, offset, "sensitive");
                match self.bool_value()? {
                    Typed::Value(flag) => sensitive = flag,
                    Typed::Null => sensitive = false,
                    Typed::Mismatch => self.shape(offset, "an output's sensitive is not a boolean"),
                }
            } else {
                self.skip_value()?;
            }
        }
        let (Some(value), Some(type_)) = (value, type_) else {
            self.shape(offset, "an output has no value or no type");
            return Ok(None);
        };
        let value = if sensitive {
            OutputValue::Sensitive(Sensitive::new(value))
        } else {
            OutputValue::Plain(value)
        };
        Ok(Some(Output { value, type_ }))
    }

    fn resources(&mut self) -> Result<(), Corruption> {
        self.parsed.managed_resources = 0;
        if !self.enter(b'[', "resources is not an array")? {
            return Ok(());
        }
        let mut first = true;
        while self.next_element(&mut first)? {
            if self.resource()? {
                self.parsed.managed_resources += 1;
            }
        }
        Ok(())
    }

    /// Whether the resource is managed and has a current object.
    fn resource(&mut self) -> Result<bool, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "a resource is not an object")? {
            self.shape(offset, "a resource is not an object");
            return Ok(false);
        }
        let mut managed = None;
        let mut current = false;
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"mode") {
                self.once(&mut seen, 1, offset, "mode");
                match self.short_string_value()? {
                    Typed::Value(mode) if mode.is(b"managed") => managed = Some(true),
                    Typed::Value(mode) if mode.is(b"data") => managed = Some(false),
                    _ => self.shape(offset, "a resource's mode is neither managed nor data"),
                }
            } else if key.is(b"instances") {
                self.once(&mut seen, 2, offset, "instances");
                current = self.instances()?;
            } else {
                self.skip_value()?;
            }
        }
        if managed.is_none() {
            self.shape(offset, "a resource has no mode");
        }
        Ok(managed == Some(true) && current)
    }

    /// Whether any instance object is current (not deposed).
    fn instances(&mut self) -> Result<bool, Corruption> {
        if !self.enter(b'[', "a resource's instances is not an array")? {
            return Ok(false);
        }
        let mut current = false;
        let mut first = true;
        while self.next_element(&mut first)? {
            current |= self.instance()?;
        }
        Ok(current)
    }

    /// Whether the instance object is current; its attributes are skipped.
    fn instance(&mut self) -> Result<bool, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "an instance is not an object")? {
            self.shape(offset, "an instance is not an object");
            return Ok(false);
        }
        let mut deposed = false;
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"deposed") {
                self.once(&mut seen, 1, offset, "deposed");
                match self.short_string_value()? {
                    Typed::Value(key) => deposed = !key.is_empty(),
                    Typed::Null => deposed = false,
                    Typed::Mismatch => {
                        self.shape(offset, "an instance's deposed key is not a string")
                    }
                }
            } else {
                self.skip_value()?;
            }
        }
        Ok(!deposed)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::super::read::Inflater;
    use super::*;

    fn parse(json: &str) -> Result<Parsed, Corruption> {
        document(Source::new(Inflater::new(json.as_bytes(), u64::MAX - 1)))
            .map(|(parsed, _)| parsed)
    }

    fn json_error(json: &str) -> &'static str {
        match parse(json) {
            Err(Corruption::Json { detail, .. }) => detail,
            other => panic!("{json}: expected a JSON error, got {other:?}"),
        }
    }

    fn shape(json: &str) -> String {
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
    fn output_values_are_compact_and_exact() {
        let parsed = parse(
            "{\"version\":4,\"outputs\":{\"o\":{\"value\" : {\n  \"a\" : [ 1 , 2.0e3 , \"x y\\n\\u00e9\" ],\n  \"b\": 123456789012345678901234567890, \"c\": null, \"d\": true\n},\n\"type\": [\"object\", {\"a\": [\"tuple\", [\"number\"]]}]}}}",
        )
        .unwrap();
        let output = &parsed.outputs["o"];
        assert_eq!(
            output.value.expose().as_str(),
            r#"{"a":[1,2.0e3,"x y\n\u00e9"],"b":123456789012345678901234567890,"c":null,"d":true}"#
        );
        assert_eq!(
            output.type_.as_str(),
            r#"["object",{"a":["tuple",["number"]]}]"#
        );
        assert_eq!(output.value.expose().to_value().unwrap()["a"][2], "x y\né");
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
    fn counts_managed_resources_with_a_current_object() {
        let parsed = parse(
            r#"{"version": 4, "resources": [
                {"mode": "managed", "type": "t", "name": "one", "instances": [{"attributes": {"x": [1, {"y": "}"}]}}]},
                {"mode": "managed", "each": "list", "instances": [{"index_key": 0}, {"index_key": 1}, {"index_key": 2}]},
                {"instances": [{"index_key": "a"}, {"index_key": "b"}], "mode": "managed", "each": "map"},
                {"mode": "data", "instances": [{}]},
                {"mode": "managed", "instances": [{"deposed": "00000001"}]},
                {"mode": "managed", "instances": [{"deposed": "00000001"}, {"deposed": ""}]},
                {"mode": "managed", "instances": [{"deposed": null}]},
                {"mode": "managed", "instances": []},
                {"mode": "managed", "module": "module.role", "instances": [{}]}
            ]}"#,
        )
        .unwrap();
        assert_eq!(parsed.managed_resources, 6);
        assert!(parsed.shape.is_none(), "{:?}", parsed.shape);
    }

    #[test]
    fn sensitive_outputs_are_wrapped() {
        let parsed = parse(
            r#"{"version":4,"outputs":{"s":{"value":"hunter2","type":"string","sensitive":true},"p":{"sensitive":false,"value":"plain","type":"string"}}}"#,
        )
        .unwrap();
        assert!(parsed.outputs["s"].sensitive());
        assert!(!parsed.outputs["p"].sensitive());
        let debug = format!("{parsed:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("plain"), "{debug}");
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

    #[test]
    fn numbers_by_the_grammar() {
        for good in [
            "0",
            "-0",
            "1",
            "123",
            "1.5",
            "0.0",
            "1e5",
            "1E+09",
            "0e0",
            "-12.5e-3",
            "18446744073709551616",
        ] {
            assert!(is_number(good.as_bytes()), "{good}");
            let json = format!(r#"{{"version": 4, "a": [{good}, {{"b": {good}}}]}}"#);
            assert!(parse(&json).is_ok(), "{json}");
        }
        for bad in [
            "", "-", "01", "-01", "1.", ".5", "1e", "1e+", "+1", "1-2", "1.5.5", "1e5e5", "--1",
            "0x1", "1ee5",
        ] {
            assert!(!is_number(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn masks_find_the_first_byte() {
        let mut chunk = *b"abcdefghijklmnop";
        assert_eq!(find_special(&chunk, 0), None);
        for (at, byte) in [(0, b'"'), (3, b'\\'), (15, 0x1f), (7, 0)] {
            chunk = *b"abcdefghijklmnop";
            chunk[at] = byte;
            assert_eq!(find_special(&chunk, 0), Some(at), "{byte:#x} at {at}");
            let long = [&b"0123456789abcdef0123"[..], &chunk].concat();
            assert_eq!(find_special(&long, 0), Some(20 + at));
            assert_eq!(find_special(&long, 20 + at + 1), None);
        }
        // Non-ASCII and DEL are content.
        assert_eq!(
            find_special("é€𝄞\u{7f}~~~~~~~~~~~~~~~~".as_bytes(), 0),
            None
        );
        let spaces = b"  \n\t\r             x   ";
        assert_eq!(find_non_ws(spaces, 0), Some(18));
        assert_eq!(find_non_ws(&spaces[..18], 0), None);
        assert_eq!(find_non_ws(b"x", 0), Some(0));
        assert_eq!(find_non_ws(&[b' '; 40], 3), None);
    }
}
