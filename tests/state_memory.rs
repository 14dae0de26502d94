//! The heap the state reader holds, whatever the state carries: a state of a
//! few KiB compressed can inflate to a 60 MiB output value, name, lineage or
//! version string, and the reader must refuse it (or, for what it does not
//! keep, pass it) without ever holding it.
//!
//! A binary of its own, because the counting allocator is process-wide: it
//! also counts the inflating thread a large state is read with. The cases
//! run one at a time.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Mutex;

use captf::state::{Corruption, MAX_OUTPUTS, State, Unreadable};
use captf_testkit::heap::{Counting, peak_during};
use flate2::Compression;
use flate2::write::GzEncoder;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measurement at a time: the counters are the process's.
static SERIAL: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;

/// Runs `f` and returns its result and the peak of heap bytes held meanwhile
/// above what was live before.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    peak_during(f)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// `head`, `mebibytes` MiB of `x`, then `tail`, gzipped as two members
/// (which Go's reader and this one read as one stream): about a thousandth
/// of its size, and never held inflated.
fn padded(head: &str, mebibytes: u64, tail: &str) -> Vec<u8> {
    let mut compressed = captf_testkit::gzip_bomb(head.as_bytes(), b'x', mebibytes);
    compressed.extend_from_slice(&gzip(tail.as_bytes()));
    compressed
}

/// Reads `compressed` as one chunk and returns the outcome and the peak heap.
fn read(compressed: &[u8]) -> (Result<State, Unreadable>, usize) {
    peak_heap(|| captf::state::read_chunks(&[compressed]))
}

/// Held for a whole test, so that no other test allocates or frees meanwhile.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the reader may hold besides what it keeps: its blocks, the gzip
/// decoder and small scratch.
const OVERHEAD: usize = 2 * MIB;

fn refused_at_the_outputs_cap(outcome: &Result<State, Unreadable>) -> bool {
    matches!(
        outcome,
        Err(Unreadable::Corrupt(Corruption::OutputsTooLarge { .. }))
    )
}

fn too_long(outcome: &Result<State, Unreadable>, want: &str) -> bool {
    matches!(outcome, Err(Unreadable::Corrupt(Corruption::TooLong { field, .. })) if *field == want)
}

/// The case of the issue: one output of 60 MiB, 60 KiB compressed. It was
/// held whole twice (as read, then compacted): 124 MiB of heap.
#[test]
fn a_sixty_mib_output_value_is_refused_holding_at_most_the_cap() {
    let _alone = alone();
    let compressed = padded(
        r#"{"version": 4, "serial": 1, "lineage": "l", "outputs": {"big": {"type": "string", "value": ""#,
        60,
        r#""}}, "resources": []}"#,
    );
    assert!(compressed.len() < 128 * 1024, "{}", compressed.len());
    let (outcome, peak) = read(&compressed);
    eprintln!("60 MiB output value: peak heap {peak} bytes");
    assert!(refused_at_the_outputs_cap(&outcome), "{outcome:?}");
    assert!(
        peak < MAX_OUTPUTS + OVERHEAD,
        "the reader held {peak} bytes"
    );
}

#[test]
fn sixty_mib_strings_are_refused_or_passed_without_being_held() {
    let _alone = alone();
    type Check = fn(&Result<State, Unreadable>) -> bool;
    let cases: [(&str, &str, &str, Check, usize); 6] = [
        (
            "lineage",
            r#"{"version": 4, "serial": 1, "lineage": ""#,
            r#"", "outputs": {}, "resources": []}"#,
            |o| too_long(o, "lineage"),
            OVERHEAD,
        ),
        (
            "terraform_version",
            r#"{"version": 4, "terraform_version": ""#,
            r#""}"#,
            |o| too_long(o, "terraform_version"),
            OVERHEAD,
        ),
        (
            "encryption_version",
            r#"{"encrypted_data": "", "encryption_version": ""#,
            r#""}"#,
            |o| matches!(o, Err(Unreadable::Encrypted)),
            OVERHEAD,
        ),
        (
            "output name",
            r#"{"version": 4, "outputs": {""#,
            r#"": {"value": 1, "type": "number"}}}"#,
            refused_at_the_outputs_cap,
            MAX_OUTPUTS + OVERHEAD,
        ),
        (
            "output type",
            r#"{"version": 4, "outputs": {"o": {"value": 1, "type": ""#,
            r#""}}}"#,
            refused_at_the_outputs_cap,
            MAX_OUTPUTS + OVERHEAD,
        ),
        (
            // Not kept: passed, as any attribute is.
            "resource attribute",
            r#"{"version": 4, "resources": [{"mode": "managed", "instances": [{"attributes": {"a": ""#,
            r#""}}]}]}"#,
            |o| matches!(o, Ok(state) if state.managed_resources == 1),
            OVERHEAD,
        ),
    ];
    for (what, head, tail, check, bound) in cases {
        let (outcome, peak) = read(&padded(head, 60, tail));
        eprintln!("60 MiB {what}: peak heap {peak} bytes");
        assert!(check(&outcome), "{what}: {outcome:?}");
        assert!(peak < bound, "{what}: the reader held {peak} bytes");
    }
}

/// Many outputs cost more than their text: a million tiny ones held 118 MiB.
#[test]
fn a_million_tiny_outputs_are_refused_holding_at_most_the_cap() {
    let _alone = alone();
    let mut text = String::from(r#"{"version": 4, "outputs": {"#);
    for i in 0..1_000_000 {
        let _ = write!(text, r#""o{i}":{{"value":0,"type":0}},"#);
    }
    text.push_str(r#""o":{"value":0,"type":0}}}"#);
    // Stored, not compressed: cheap to make, and large enough (compressed)
    // that the reader inflates on its second thread, which is counted too.
    let mut encoder = GzEncoder::new(Vec::new(), Compression::none());
    encoder.write_all(text.as_bytes()).unwrap();
    let compressed = encoder.finish().unwrap();
    drop(text);
    let (outcome, peak) = read(&compressed);
    eprintln!("a million tiny outputs: peak heap {peak} bytes");
    assert!(refused_at_the_outputs_cap(&outcome), "{outcome:?}");
    // The map's nodes and allocations are within the cap's per-output charge.
    assert!(
        peak < MAX_OUTPUTS + OVERHEAD,
        "the reader held {peak} bytes"
    );
}

/// Outputs just under the cap read whole, holding about what they are.
#[test]
fn outputs_under_the_cap_read_whole() {
    let _alone = alone();
    let value = "y".repeat(MAX_OUTPUTS - 64 * 1024);
    let json = format!(
        r#"{{"version": 4, "serial": 2, "outputs": {{"exports": {{"value": {{"blob": "{value}"}}, "type": "dynamic", "sensitive": true}}}}}}"#
    );
    let compressed = gzip(json.as_bytes());
    drop(json);
    let (outcome, peak) = read(&compressed);
    eprintln!("outputs under the cap: peak heap {peak} bytes");
    let state = outcome.unwrap();
    let exports = state.outputs["exports"].value.expose().to_value().unwrap();
    assert_eq!(exports["blob"].as_str(), Some(value.as_str()));
    assert!(
        peak < MAX_OUTPUTS + OVERHEAD,
        "the reader held {peak} bytes"
    );
}
