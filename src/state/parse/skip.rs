//! The skipper: one value of any kind passed and checked fully, without
//! recursion. Nearly all of a state's bytes (the instances' attributes) go
//! through it.

use super::{MAX_DEPTH, Parser};
use crate::state::Corruption;
use crate::state::lexer::{Blocks, find_non_ws, find_special};

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

impl<B: Blocks> Parser<B> {
    /// Skips one value of any kind, checking it fully, without recursion.
    ///
    /// This is where nearly all of a state's bytes go (the instances'
    /// attributes), so it is one loop over the block with the position in a
    /// local: whitespace and string contents are passed sixteen bytes at a
    /// time, numbers and literals are checked in place, and only what the
    /// block cuts or what is rare (escapes) goes through the byte-by-byte
    /// functions.
    pub(super) fn skip_value(&mut self) -> Result<(), Corruption> {
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

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
}
