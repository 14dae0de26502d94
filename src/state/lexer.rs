//! The lexer: the decompressed state as blocks ([`Source`]), and the
//! byte-level reads the parser is built from. Whitespace and string contents
//! are found sixteen bytes at a time; strings, escapes, numbers and literals
//! are checked by the JSON grammar, refilling the block where it ends.

use super::Corruption;
use super::capture::Capture;

/// Where the parser's blocks come from.
pub(super) trait Blocks {
    /// Puts the next block of the stream at the start of `block` and
    /// returns its length, 0 at the end. A block is checked: within the cap,
    /// and UTF-8 (a character cut by a block's end is checked with the next
    /// block).
    fn next(&mut self, block: &mut Vec<u8>) -> Result<usize, Corruption>;
}

/// Decompressed bytes, one block at a time, for the parser, which scans
/// `buf[pos..end]` and calls [`Source::refill`] when it reaches `end`.
///
/// While capturing (an output's value or type), the bytes the parser passes
/// go to a [`Capture`], block by block.
pub(super) struct Source<B> {
    blocks: B,
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    pub(super) end: usize,
    /// The offset of `buf[0]` in the decompressed stream.
    base: u64,
    capture: Option<Capture>,
    capture_from: usize,
}

impl<B: Blocks> Source<B> {
    pub(super) fn new(blocks: B) -> Self {
        Source {
            blocks,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            base: 0,
            capture: None,
            capture_from: 0,
        }
    }

    /// The offset of `pos` in the decompressed stream, for error messages.
    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// How many decompressed bytes have been passed to the parser.
    pub(super) fn total(&self) -> u64 {
        self.base + self.end as u64
    }

    /// Takes the next block once the parser has passed the current one
    /// (`pos == end`). False at the end of the stream.
    pub(super) fn refill(&mut self) -> Result<bool, Corruption> {
        if let Some(capture) = &mut self.capture {
            capture.take(&self.buf[self.capture_from..self.end])?;
            self.capture_from = 0;
        }
        self.base += self.end as u64;
        self.pos = 0;
        self.end = 0;
        self.end = self.blocks.next(&mut self.buf)?;
        Ok(self.end > 0)
    }

    /// Starts capturing the bytes the parser passes, from `pos`, compacted
    /// and at most `max` of them; past that, the pass stops with `over`.
    pub(super) fn start_capture(&mut self, max: usize, over: Corruption) {
        self.capture = Some(Capture::new(max, over));
        self.capture_from = self.pos;
    }

    /// Stops capturing and returns the compact text.
    pub(super) fn finish_capture(&mut self) -> Result<Vec<u8>, Corruption> {
        let Some(mut capture) = self.capture.take() else {
            return Ok(Vec::new());
        };
        capture.take(&self.buf[self.capture_from..self.pos])?;
        Ok(capture.into_bytes())
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

pub(super) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The index of the first byte of `bytes[from..]` that ends a plain run of
/// string content. Thirty-two bytes a step: most strings and indentation
/// runs of a state end within one step, which keeps the branch predictable.
#[inline(always)]
pub(super) fn find_special(bytes: &[u8], mut from: usize) -> Option<usize> {
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
pub(super) fn find_non_ws(bytes: &[u8], mut from: usize) -> Option<usize> {
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

/// Lexing over the block buffer. Each function leaves `pos` just after what it
/// consumed and refills when it reaches the end of the block.
impl<B: Blocks> Source<B> {
    pub(super) fn json_error(&self, detail: &'static str) -> Corruption {
        Corruption::Json {
            offset: self.offset(),
            detail,
        }
    }

    /// Skips whitespace and returns the next byte without consuming it, or
    /// None at the end of the stream.
    pub(super) fn ws(&mut self) -> Result<Option<u8>, Corruption> {
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
    pub(super) fn ws_some(&mut self) -> Result<u8, Corruption> {
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
    pub(super) fn skip_string(&mut self) -> Result<(), Corruption> {
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
    pub(super) fn read_string(
        &mut self,
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<bool, Corruption> {
        self.decode_string(out, max, false)
    }

    /// [`Source::read_string`] for a string that is refused past `max`: false
    /// as soon as it passes, without reading the rest of it.
    pub(super) fn read_string_within(
        &mut self,
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<bool, Corruption> {
        self.decode_string(out, max, true)
    }

    fn decode_string(
        &mut self,
        out: &mut Vec<u8>,
        max: usize,
        stop: bool,
    ) -> Result<bool, Corruption> {
        let mut fits = true;
        let mut keep = |out: &mut Vec<u8>, bytes: &[u8]| {
            if fits && out.len() + bytes.len() <= max {
                out.extend_from_slice(bytes);
            } else {
                fits = false;
            }
            fits || !stop
        };
        loop {
            let end = self.end;
            let start = self.pos;
            match find_special(&self.buf[..end], start) {
                Some(i) => {
                    if !keep(out, &self.buf[start..i]) {
                        return Ok(false);
                    }
                    match self.buf[i] {
                        b'"' => {
                            self.pos = i + 1;
                            return Ok(fits);
                        }
                        b'\\' => {
                            self.pos = i + 1;
                            let ch = self.escape()?;
                            if !keep(out, ch.encode_utf8(&mut [0; 4]).as_bytes()) {
                                return Ok(false);
                            }
                        }
                        _ => {
                            self.pos = i;
                            return Err(self.json_error("control character in a string"));
                        }
                    }
                }
                None => {
                    if !keep(out, &self.buf[start..end]) {
                        return Ok(false);
                    }
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
    pub(super) fn number(&mut self) -> Result<Option<u64>, Corruption> {
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
    pub(super) fn literal(&mut self, word: &[u8]) -> Result<(), Corruption> {
        for &expected in word {
            if self.next_byte()? != expected {
                return Err(self.json_error("invalid literal"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
