//! The capture of an output's value or type: the bytes the parser passes,
//! compacted as they come (whitespace outside strings dropped) into the one
//! buffer that becomes the kept [`super::Json`], and never more than a budget
//! of them. A value is copied once, and a value past the budget is given up
//! at the block where it passes it, not after it was held whole.

use super::Corruption;
use super::lexer::is_ws;

/// The compact text of one JSON value, within `max` bytes.
pub(super) struct Capture {
    out: Vec<u8>,
    max: usize,
    /// What the pass stops with past `max`.
    over: Corruption,
    in_string: bool,
    escaped: bool,
}

impl Capture {
    pub(super) fn new(max: usize, over: Corruption) -> Self {
        Capture {
            out: Vec::new(),
            max,
            over,
            in_string: false,
            escaped: false,
        }
    }

    /// Appends the compact form of `bytes`, the next piece of the value's
    /// text, which the parser checks as JSON. Fails, keeping nothing more,
    /// when the compact text passes `max`.
    pub(super) fn take(&mut self, bytes: &[u8]) -> Result<(), Corruption> {
        self.reserve(bytes.len());
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else if is_ws(b) {
                continue;
            } else {
                self.in_string = b == b'"';
            }
            if self.out.len() == self.max {
                return Err(self.over.clone());
            }
            self.out.push(b);
        }
        Ok(())
    }

    /// Room for `more` bytes, grown as a Vec grows but never past `max`, so
    /// the buffer's capacity stays within the budget too.
    fn reserve(&mut self, more: usize) {
        let len = self.out.len();
        let need = len.saturating_add(more).min(self.max);
        if need > self.out.capacity() {
            let grown = need.max(self.out.capacity() * 2).min(self.max);
            self.out.reserve_exact(grown - len);
        }
    }

    pub(super) fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact(pieces: &[&str], max: usize) -> Option<String> {
        let mut capture = Capture::new(max, Corruption::TooLarge);
        for piece in pieces {
            capture.take(piece.as_bytes()).ok()?;
        }
        Some(String::from_utf8(capture.into_bytes()).unwrap())
    }

    #[test]
    fn whitespace_goes_outside_strings_only_whatever_the_pieces() {
        let text = "{ \"a b\" : [ 1 ,\n\t\"x\\\" \\\\\" ] , \"c\\\\\" : \" \" }";
        let want = r#"{"a b":[1,"x\" \\"],"c\\":" "}"#;
        for cut in 0..text.len() {
            let (head, tail) = text.split_at(cut);
            assert_eq!(
                compact(&[head, tail], usize::MAX).as_deref(),
                Some(want),
                "{cut}"
            );
        }
    }

    #[test]
    fn the_budget_is_exact_and_bounds_the_buffer() {
        let value = format!("[{}]", "1, ".repeat(999) + "1");
        let compact_len = 2 + 999 * 2 + 1;
        assert!(compact(&[&value], compact_len).is_some());
        assert!(compact(&[&value], compact_len - 1).is_none());
        let mut capture = Capture::new(1000, Corruption::TooLarge);
        for round in 0..10 {
            let taken = capture.take(&[b'7'; 300]);
            assert_eq!(taken.is_ok(), round < 3, "{round}");
        }
        let kept = capture.into_bytes();
        assert_eq!(kept.len(), 1000);
        assert!(kept.capacity() <= 1000, "{}", kept.capacity());
    }
}
