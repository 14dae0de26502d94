//! The state reader: the chunk set (`state::chunks::assemble`), the bounded
//! gunzip and the streaming parser, through `state::classify`, as the
//! reconciler calls it on the listed Secrets.
//!
//! Input: the first byte is a set of flags, the rest the payload.
//! - bit 0 clear: the payload is the decompressed document; the harness
//!   gzips it (bit 7: stored blocks instead of deflated ones; bit 3: as two
//!   gzip members, as Go's reader accepts), so the fuzzer works on the JSON.
//!   Bit 0 set: the payload is the compressed stream itself.
//! - bits 1-2: the stream is cut into 1 to 4 chunks, named as Terraform names
//!   them (`tfstate-default-<suffix>`, then `-part-N`);
//! - bit 4: the list comes in reverse order; bit 5: the last part's index is
//!   spelled with a leading zero; bit 6: the last chunk has no tfstate key.
//!
//! Properties, beyond "no panic, no OOM, no hang":
//! - a state read keeps its caps (lineage, terraform_version, the outputs'
//!   budget, the decompressed size) and its byte counts are the input's;
//! - every output value and type is compact JSON text that serde_json reads;
//! - what the reader accepts, serde_json accepts too (beyond its nesting
//!   limit of 128 and f64's range), and the fields agree with it.

#![no_main]

use std::io::Write;

use captf::state::{
    self, ChunkSecret, MAX_DECOMPRESSED, MAX_LINEAGE, MAX_OUTPUTS, MAX_TERRAFORM_VERSION,
    OUTPUT_COST, StateReadable,
};
use flate2::Compression;
use flate2::write::GzEncoder;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const SUFFIX: &str = "0123456789abcdef-c";

fn gzip(bytes: &[u8], level: Compression) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), level);
    encoder.write_all(bytes).expect("writing to a Vec");
    encoder.finish().expect("writing to a Vec")
}

/// Whether JSON text has whitespace outside its strings.
fn has_outer_whitespace(json: &str) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            return true;
        }
    }
    false
}

/// serde_json's refusals that are its own limits, not the document's.
fn serde_limit(e: &serde_json::Error) -> bool {
    let text = e.to_string();
    text.contains("recursion limit") || text.contains("number out of range")
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, payload)) = data.split_first() else {
        return;
    };
    let json_mode = flags & 1 == 0;
    let compressed = if json_mode {
        let level = if flags & 0x80 != 0 {
            Compression::none()
        } else {
            Compression::fast()
        };
        if flags & 0x08 != 0 {
            let half = payload.len() / 2;
            let mut two = gzip(&payload[..half], level);
            two.extend(gzip(&payload[half..], level));
            two
        } else {
            gzip(payload, level)
        }
    } else {
        payload.to_vec()
    };

    let count = 1 + usize::from((flags >> 1) & 3);
    let size = compressed.len().div_ceil(count).max(1);
    let mut pieces: Vec<&[u8]> = compressed.chunks(size).collect();
    pieces.resize(count, &[][..]);
    let mut names: Vec<String> = (0..count as u32).map(|i| state_chunk(SUFFIX, i)).collect();
    if flags & 0x20 != 0 && count > 1 {
        *names.last_mut().unwrap() = format!("{}-part-0{}", state_chunk(SUFFIX, 0), count - 1);
    }
    let mut secrets: Vec<ChunkSecret<'_>> = names
        .iter()
        .zip(&pieces)
        .map(|(name, piece)| ChunkSecret {
            name,
            payload: Some(piece),
        })
        .collect();
    let no_key = flags & 0x40 != 0;
    if no_key {
        secrets.last_mut().unwrap().payload = None;
    }
    if flags & 0x10 != 0 {
        secrets.reverse();
    }

    let readable = state::classify(SUFFIX, &secrets);
    // The message never fails and never quotes the state.
    let _ = (
        readable.message(),
        readable.reason(),
        readable.metric_reason(),
    );
    let StateReadable::Read(read) = readable else {
        return;
    };
    assert!(!no_key, "a chunk without its tfstate key was read");
    assert!(read.lineage.len() <= MAX_LINEAGE);
    assert!(read.terraform_version.len() <= MAX_TERRAFORM_VERSION);
    assert!(read.decompressed_bytes <= MAX_DECOMPRESSED);
    assert_eq!(read.compressed_bytes, compressed.len() as u64);
    if json_mode {
        assert_eq!(read.decompressed_bytes, payload.len() as u64);
    }
    let mut charged = 0;
    for (name, output) in &read.outputs {
        let (value, type_) = (output.value.expose().as_str(), output.type_.as_str());
        charged += OUTPUT_COST + name.len() + value.len() + type_.len();
        for text in [value, type_] {
            assert!(!has_outer_whitespace(text), "not compact: {text:?}");
            if let Err(e) = serde_json::from_str::<Value>(text) {
                assert!(serde_limit(&e), "an output that is not JSON: {e}: {text:?}");
            }
        }
    }
    assert!(charged <= MAX_OUTPUTS, "outputs charged {charged}");

    // The document as serde_json reads it must say the same.
    if !json_mode {
        return;
    }
    let doc: Value = match serde_json::from_slice(payload) {
        Ok(doc) => doc,
        Err(e) if serde_limit(&e) => return,
        Err(e) => panic!("the reader accepted what serde_json refuses: {e}"),
    };
    assert_eq!(doc["version"].as_u64(), Some(4), "version");
    match &doc["serial"] {
        Value::Null => assert_eq!(read.serial, 0),
        serial => assert_eq!(serial.as_u64(), Some(read.serial), "serial"),
    }
    assert_eq!(
        doc["lineage"].as_str().unwrap_or(""),
        read.lineage,
        "lineage"
    );
    assert_eq!(
        doc["terraform_version"].as_str().unwrap_or(""),
        read.terraform_version,
        "terraform_version"
    );
    let outputs = doc["outputs"].as_object();
    assert_eq!(
        outputs.map_or(0, |o| o.len()),
        read.outputs.len(),
        "the number of outputs"
    );
    for (name, output) in &read.outputs {
        let want = &outputs.expect("outputs")[name];
        assert_eq!(
            want["sensitive"].as_bool().unwrap_or(false),
            output.sensitive(),
            "{name}: sensitive"
        );
        if let Ok(value) = output.value.expose().to_value() {
            assert_eq!(want["value"], value, "{name}: value");
        }
    }
});

fn state_chunk(suffix: &str, index: u32) -> String {
    captf::names::state_chunk(suffix, index)
}
