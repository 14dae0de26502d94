//! The reader: the chunks' payloads, concatenated without copying, inflated
//! block by block under the decompressed-size cap, checked as UTF-8, and fed
//! to the streaming parser. Memory stays at a few blocks plus the decoder's
//! window, whatever the state's size.
//!
//! A large state is inflated (and checked as UTF-8) on a second thread while
//! the parser scans the blocks already inflated; the blocks change hands, they
//! are not copied.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};

use flate2::bufread::MultiGzDecoder;

use super::lexer::{Blocks, Source};
use super::{Corruption, MAX_DECOMPRESSED, State, Unreadable, envelope, parse};

/// The size of a decompressed block.
pub(super) const BLOCK: usize = 128 * 1024;

/// States this large (compressed) are inflated on a second thread; below,
/// the thread would cost more than it saves.
const PIPELINE_FROM: u64 = 256 * 1024;

/// Inflated blocks waiting for the parser.
const PIPELINE_DEPTH: usize = 4;

/// Inflates and parses the concatenated `chunks` (already in chunk order).
/// The gzip stream must end exactly where the JSON document does, with a
/// matching checksum: a state is read whole or not at all.
pub fn read_chunks(chunks: &[&[u8]]) -> Result<State, Unreadable> {
    let compressed_bytes = chunks.iter().map(|chunk| chunk.len() as u64).sum();
    // Go's gzip reader, which Terraform and OpenTofu use, reads every member
    // of a multi-member stream; so does this one.
    let decoder = MultiGzDecoder::new(Concat::new(chunks));
    let mut inflater = Inflater::new(decoder, MAX_DECOMPRESSED);
    let (parsed, decompressed_bytes) = if compressed_bytes < PIPELINE_FROM {
        parse::document(Source::new(inflater))
    } else {
        std::thread::scope(|scope| {
            let (full_tx, full_rx) = mpsc::sync_channel(PIPELINE_DEPTH);
            let (empty_tx, empty_rx) = mpsc::channel();
            inflater.fill = true;
            scope.spawn(move || feed(inflater, &full_tx, &empty_rx));
            parse::document(Source::new(Piped {
                full: full_rx,
                empty: empty_tx,
            }))
        })
    }
    .map_err(Unreadable::Corrupt)?;
    let fields = envelope::decide(parsed)?;
    Ok(State {
        serial: fields.serial,
        lineage: fields.lineage,
        terraform_version: fields.terraform_version,
        outputs: fields.outputs,
        managed_resources: fields.managed_resources,
        compressed_bytes,
        decompressed_bytes,
    })
}

/// Inflates on the calling thread.
pub(super) struct Inflater<R> {
    decoder: R,
    total: u64,
    limit: u64,
    utf8: Utf8,
    /// Fill each block whole rather than take what one read gives.
    fill: bool,
}

impl<R: Read> Inflater<R> {
    pub(super) fn new(decoder: R, limit: u64) -> Self {
        Inflater {
            decoder,
            total: 0,
            limit,
            utf8: Utf8::default(),
            fill: false,
        }
    }
}

impl<R: Read> Blocks for Inflater<R> {
    fn next(&mut self, block: &mut Vec<u8>) -> Result<usize, Corruption> {
        // Never ask for more than one byte past the cap: that byte is the
        // proof that the cap is passed.
        let room = (self.limit + 1 - self.total).min(BLOCK as u64) as usize;
        // Grown once; a block that comes back is read into as it is.
        if block.len() < BLOCK {
            block.resize(BLOCK, 0);
        }
        let mut filled = 0;
        while filled < room {
            match self.decoder.read(&mut block[filled..]) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    if !self.fill {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(Corruption::Gzip(error.to_string())),
            }
        }
        let offset = self.total;
        self.total += filled as u64;
        if self.total > self.limit {
            return Err(Corruption::TooLarge);
        }
        if filled == 0 {
            self.utf8.finish(offset)?;
        } else {
            self.utf8.check(&block[..filled], offset)?;
        }
        Ok(filled)
    }
}

/// Runs an inflater on its own thread, handing its blocks to [`Piped`] and
/// reusing the ones handed back. Stops at the end, at the first error, or
/// when the parser hangs up.
fn feed<R: Read>(mut inflater: Inflater<R>, full: &SyncSender<Filled>, empty: &Receiver<Vec<u8>>) {
    loop {
        let mut block = empty.try_recv().unwrap_or_default();
        let outcome = inflater.next(&mut block);
        let last = matches!(outcome, Ok(0) | Err(_));
        if full.send(outcome.map(|len| (block, len))).is_err() || last {
            return;
        }
    }
}

/// A block and the length of its content, or why there is none.
type Filled = Result<(Vec<u8>, usize), Corruption>;

/// The parser's end of [`feed`].
struct Piped {
    full: Receiver<Filled>,
    empty: Sender<Vec<u8>>,
}

impl Blocks for Piped {
    fn next(&mut self, block: &mut Vec<u8>) -> Result<usize, Corruption> {
        let (next, len) = match self.full.recv() {
            Ok(filled) => filled?,
            // The inflater ends only after sending the end or an error, so
            // this is a bug of its; never read it as a clean end.
            Err(_) => return Err(Corruption::Gzip("the inflating thread stopped".into())),
        };
        let spent = std::mem::replace(block, next);
        // The inflater may be gone already; then the block is dropped.
        let _ = self.empty.send(spent);
        Ok(len)
    }
}

/// UTF-8 checking across blocks: a character cut by a block's end is kept
/// (at most 3 bytes) and checked with the start of the next block.
#[derive(Default)]
struct Utf8 {
    cut: [u8; 4],
    len: usize,
}

impl Utf8 {
    fn check(&mut self, block: &[u8], offset: u64) -> Result<(), Corruption> {
        let invalid = |at: u64| Corruption::Json {
            offset: at,
            detail: "invalid UTF-8",
        };
        let mut start = 0;
        if self.len > 0 {
            // The kept bytes start a valid sequence, so their first byte
            // tells how long it is.
            let width = match self.cut[0] {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let take = (width - self.len).min(block.len());
            let mut joined = [0u8; 4];
            joined[..self.len].copy_from_slice(&self.cut[..self.len]);
            joined[self.len..self.len + take].copy_from_slice(&block[..take]);
            let cut_at = offset - self.len as u64;
            match std::str::from_utf8(&joined[..self.len + take]) {
                Ok(_) => {}
                Err(error) if error.error_len().is_none() && self.len + take < width => {
                    // Still cut: a block shorter than the rest of it.
                    self.cut = joined;
                    self.len += take;
                    return Ok(());
                }
                Err(_) => return Err(invalid(cut_at)),
            }
            self.len = 0;
            start = take;
        }
        match std::str::from_utf8(&block[start..]) {
            Ok(_) => Ok(()),
            Err(error) if error.error_len().is_none() => {
                let valid = start + error.valid_up_to();
                self.len = block.len() - valid;
                self.cut[..self.len].copy_from_slice(&block[valid..]);
                Ok(())
            }
            Err(error) => Err(invalid(offset + (start + error.valid_up_to()) as u64)),
        }
    }

    /// At the end of the stream, a character still cut is invalid.
    fn finish(&self, offset: u64) -> Result<(), Corruption> {
        if self.len == 0 {
            Ok(())
        } else {
            Err(Corruption::Json {
                offset: offset - self.len as u64,
                detail: "invalid UTF-8",
            })
        }
    }
}

/// The chunks as one stream, without concatenating them in memory.
struct Concat<'a> {
    chunks: &'a [&'a [u8]],
    index: usize,
    pos: usize,
}

impl<'a> Concat<'a> {
    fn new(chunks: &'a [&'a [u8]]) -> Self {
        Concat {
            chunks,
            index: 0,
            pos: 0,
        }
    }
}

impl Read for Concat<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Concat<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while let Some(chunk) = self.chunks.get(self.index) {
            if self.pos < chunk.len() {
                return Ok(&chunk[self.pos..]);
            }
            self.index += 1;
            self.pos = 0;
        }
        Ok(&[])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// Drains a source, returning the bytes it yielded.
    fn drain<B: Blocks>(source: &mut Source<B>) -> Result<Vec<u8>, Corruption> {
        let mut out = Vec::new();
        while source.refill()? {
            out.extend_from_slice(&source.buf[source.pos..source.end]);
            source.pos = source.end;
        }
        Ok(out)
    }

    /// A state large enough (compressed) to be inflated on a second thread.
    fn large_state(filler: &str) -> Vec<u8> {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut random = String::new();
        while random.len() < 600_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            random.push_str(&format!("{seed:016x}"));
        }
        let json = format!(
            r#"{{"version": 4, "serial": 3, "lineage": "l", "outputs": {{"o": {{"value": "{filler}", "type": "string"}}}},
                "resources": [{{"mode": "managed", "instances": [{{"attributes": {{"blob": "{random}"}}}}]}}]}}"#
        );
        gzip(json.as_bytes())
    }

    #[test]
    fn a_large_state_reads_the_same_on_two_threads() {
        let compressed = large_state("é");
        assert!(
            compressed.len() as u64 >= PIPELINE_FROM,
            "{}",
            compressed.len()
        );
        let pieces: Vec<&[u8]> = compressed.chunks(100_000).collect();
        let state = read_chunks(&pieces).unwrap();
        assert_eq!((state.serial, state.managed_resources), (3, 1));
        assert_eq!(state.outputs["o"].value.expose().as_str(), "\"é\"");
        assert_eq!(state.compressed_bytes, compressed.len() as u64);

        // Errors found on the inflating thread reach the parser's.
        let truncated = &compressed[..compressed.len() - 100];
        assert!(matches!(
            read_chunks(&[truncated]),
            Err(Unreadable::Corrupt(Corruption::Gzip(_)))
        ));
        let mut bad_crc = compressed.clone();
        let n = bad_crc.len();
        bad_crc[n - 6] ^= 1;
        assert!(matches!(
            read_chunks(&[&bad_crc]),
            Err(Unreadable::Corrupt(Corruption::Gzip(_)))
        ));
        let mut json = Vec::new();
        MultiGzDecoder::new(&large_state("\u{fffd}")[..])
            .read_to_end(&mut json)
            .unwrap();
        let at = json
            .windows(3)
            .position(|w| w == "\u{fffd}".as_bytes())
            .unwrap();
        json[at] = 0xff;
        let invalid = gzip(&json);
        assert!(invalid.len() as u64 >= PIPELINE_FROM);
        assert_eq!(
            read_chunks(&[&invalid]).map(|s| s.serial),
            Err(Unreadable::Corrupt(Corruption::Json {
                offset: at as u64,
                detail: "invalid UTF-8"
            }))
        );
    }

    /// `head`, `mebibytes` MiB of `x`, then `tail`, as gzip members: the
    /// 1 MiB member is compressed once and repeated.
    fn padded(head: &str, mebibytes: usize, tail: &str) -> Vec<u8> {
        let mib = gzip(&vec![b'x'; 1 << 20]);
        let mut out = gzip(head.as_bytes());
        for _ in 0..mebibytes {
            out.extend_from_slice(&mib);
        }
        out.extend_from_slice(&gzip(tail.as_bytes()));
        out
    }

    #[test]
    fn caps_passed_are_corrupt_states_with_a_message_that_says_which() {
        let suffix = "0123456789abcdef-m";
        let name = crate::names::state_secret(suffix);
        // (the document around the padding, what the message says, and the
        // offset it names: the output's or the string's)
        for (head, mebibytes, tail, says, at) in [
            (
                r#"{"version": 4, "outputs": {"o": {"type": "string", "value": ""#,
                60,
                r#""}}}"#,
                "outputs exceed the cap of 4194304 bytes (4 MiB",
                27,
            ),
            (
                r#"{"version": 4, "lineage": ""#,
                1,
                r#""}"#,
                "lineage is longer than the cap of 256 bytes",
                26,
            ),
            (
                r#"{"version": 4, "terraform_version": ""#,
                1,
                r#""}"#,
                "terraform_version is longer than the cap of 128 bytes",
                36,
            ),
        ] {
            let payload = padded(head, mebibytes, tail);
            let outcome = crate::state::classify(
                suffix,
                &[crate::state::ChunkSecret {
                    name: &name,
                    payload: Some(&payload),
                }],
            );
            assert_eq!(
                outcome.reason(),
                crate::state::Reason::StateCorrupt,
                "{says}"
            );
            assert_eq!(outcome.metric_reason(), Some("corrupt"), "{says}");
            let message = outcome.message();
            assert!(message.contains(says), "{message}");
            assert!(message.contains(&format!("at byte {at} ")), "{message}");
            assert!(!message.contains("xx"), "{message}");
        }
    }

    #[test]
    fn concat_reads_chunks_in_order_across_empty_ones() {
        let chunks: [&[u8]; 4] = [b"ab", b"", b"c", b"def"];
        let mut all = Vec::new();
        Concat::new(&chunks).read_to_end(&mut all).unwrap();
        assert_eq!(all, b"abcdef");
    }

    #[test]
    fn the_cap_is_exact() {
        let data = vec![b' '; 1000];
        let mut at_cap = Source::new(Inflater::new(&data[..], 1000));
        assert_eq!(drain(&mut at_cap).unwrap().len(), 1000);
        let mut over = Source::new(Inflater::new(&data[..], 999));
        assert_eq!(drain(&mut over), Err(Corruption::TooLarge));
    }

    #[test]
    fn a_character_cut_by_a_block_boundary_is_valid() {
        // "é" (2 bytes), "€" (3 bytes) and "𝄞" (4 bytes) straddling the
        // first block boundary at every position.
        for ch in ["é", "€", "𝄞"] {
            for shift in 0..4 {
                let mut data = vec![b'a'; BLOCK - shift];
                data.extend_from_slice(ch.as_bytes());
                data.extend_from_slice(b"zz");
                let mut source = Source::new(Inflater::new(&data[..], u64::MAX - 1));
                assert_eq!(drain(&mut source).unwrap(), data, "{ch} at {shift}");
            }
        }
    }

    #[test]
    fn invalid_utf8_is_refused_wherever_it_is() {
        for (data, offset) in [
            (b"ab\xffcd".to_vec(), 2),
            (b"ab\xc3".to_vec(), 2),
            (
                [vec![b'a'; BLOCK - 1], b"\xe2\x82".to_vec()].concat(),
                BLOCK as u64 - 1,
            ),
            (
                [vec![b'a'; BLOCK - 1], b"\xe2\x28\xa1".to_vec()].concat(),
                BLOCK as u64 - 1,
            ),
        ] {
            let mut source = Source::new(Inflater::new(&data[..], u64::MAX - 1));
            assert_eq!(
                drain(&mut source),
                Err(Corruption::Json {
                    offset,
                    detail: "invalid UTF-8"
                }),
                "{:?}",
                &data[data.len().saturating_sub(4)..]
            );
        }
    }

    #[test]
    fn gzip_errors_are_corrupt() {
        let good = gzip(b"{}");
        let mut bad_crc = good.clone();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 1;
        let truncated = &good[..good.len() - 4];
        let trailing_garbage = [good.clone(), b"garbage".to_vec()].concat();
        for (what, data) in [
            ("bad crc", bad_crc.as_slice()),
            ("truncated", truncated),
            ("trailing garbage", &trailing_garbage),
            ("not gzip", b"{}"),
            ("empty", b""),
        ] {
            let mut source = Source::new(Inflater::new(MultiGzDecoder::new(data), 1 << 20));
            assert!(
                matches!(drain(&mut source), Err(Corruption::Gzip(_))),
                "{what}"
            );
        }
        let two_members = [gzip(b"{\"a\":"), gzip(b"1}")].concat();
        let mut source = Source::new(Inflater::new(
            MultiGzDecoder::new(&two_members[..]),
            1 << 20,
        ));
        assert_eq!(drain(&mut source).unwrap(), b"{\"a\":1}");
    }
}
