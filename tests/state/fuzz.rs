//! Seeded fuzz: bounded and reproducible (CAPTF_FUZZ_SEED replays another).

use super::*;

pub(super) fn seed() -> u64 {
    std::env::var("CAPTF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_CA97_F00D)
}

#[test]
fn fuzz_random_bytes_are_refused_without_panic() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    for case in 0..1500 {
        let len = rng.below(3000);
        let mut bytes = rng.bytes(len);
        // Some with a real gzip header, so that random deflate data is
        // inflated, and some valid gzip of random bytes.
        match case % 3 {
            0 => {}
            1 => bytes
                .splice(0..0, [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255])
                .for_each(drop),
            _ => bytes = gzip(&bytes),
        }
        let outcome = state::read_chunks(&[&bytes]);
        assert!(
            matches!(outcome, Err(Unreadable::Corrupt(_))),
            "seed {seed} case {case}: {outcome:?}"
        );
    }
}

#[test]
fn fuzz_damaged_gzip_never_misreads() {
    let seed = seed();
    let mut rng = Rng::new(seed ^ 1);
    let (json, _) = synthetic_state(&mut rng, 9, 30, 200);
    let good = gzip(json.as_bytes());
    let whole = state::read_chunks(&[&good]).unwrap();
    for case in 0..600 {
        let mut bytes = good.clone();
        for _ in 0..=rng.below(3) {
            let at = rng.below(bytes.len());
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = rng.next() as u8,
                2 => bytes.truncate(at),
                _ => bytes.insert(at, rng.next() as u8),
            }
            if bytes.is_empty() {
                break;
            }
        }
        // A change the checksum cannot see (in the header) may still read;
        // then it must read exactly the same state.
        if let Ok(read) = state::read_chunks(&[&bytes]) {
            assert_eq!(read.serial, whole.serial, "seed {seed} case {case}");
            assert_eq!(read.outputs, whole.outputs, "seed {seed} case {case}");
            assert_eq!(
                read.managed_resources, whole.managed_resources,
                "seed {seed} case {case}"
            );
            assert_eq!(
                read.decompressed_bytes, whole.decompressed_bytes,
                "seed {seed} case {case}"
            );
        }
    }
}

/// A random JSON value as text, in forms serde_json would not write itself
/// (exponents, trailing zeros, escapes, odd whitespace).
fn random_json(rng: &mut Rng, depth: usize, out: &mut String) {
    let ws = |rng: &mut Rng, out: &mut String| {
        if rng.chance(30) {
            out.push_str(rng.word(&[" ", "\n  ", "\t", "\r\n", "    "]));
        }
    };
    ws(rng, out);
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => out.push_str(rng.word(&["true", "false", "null"])),
        1 => out.push_str(rng.word(&[
            "0",
            "-0",
            "7",
            "-12",
            "1.50",
            "2.5e3",
            "1E-7",
            "123456789012345678901234567890",
            "-0.0e+0",
        ])),
        2..=4 => {
            out.push('"');
            for _ in 0..rng.below(12) {
                out.push_str(rng.word(&[
                    "a",
                    "Z",
                    " ",
                    "é",
                    "€",
                    "😀",
                    "\\n",
                    "\\\"",
                    "\\\\",
                    "\\/",
                    "\\u00e9",
                    "\\ud83d\\ude00",
                    "\\t",
                    "}",
                    "]",
                    ",",
                    ":",
                    "{",
                ]));
            }
            out.push('"');
        }
        5 => {
            out.push('[');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                random_json(rng, depth - 1, out);
            }
            ws(rng, out);
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                out.push_str(&format!("\"k{i}\":"));
                random_json(rng, depth - 1, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// A random version 4 state (sometimes an envelope or another version), as
/// text with the fields in random order.
pub(super) fn random_state(rng: &mut Rng) -> String {
    let mut fields: Vec<String> = Vec::new();
    let value = |rng: &mut Rng| {
        let mut text = String::new();
        random_json(rng, 3, &mut text);
        text
    };
    fields.push(format!(
        "\"version\": {}",
        rng.pick(&["4", "4", "4", "4", "3", "5", "\"4\"", "null"])
    ));
    fields.push(format!("\"serial\": {}", rng.below(1000)));
    fields.push(r#""lineage": "0f5d4a8e-3b7c-4d2e-9a1f-6c8b2e4d7f90""#.into());
    fields.push(r#""terraform_version": "1.12.6""#.into());
    let outputs: Vec<String> = (0..rng.below(4))
        .map(|i| {
            let sensitive = rng.pick(&["", r#", "sensitive": true"#, r#", "sensitive": false"#]);
            format!(
                r#""o{i}": {{"value": {}, "type": {}{sensitive}}}"#,
                value(rng),
                value(rng)
            )
        })
        .collect();
    fields.push(format!("\"outputs\": {{{}}}", outputs.join(", ")));
    let resources: Vec<String> = (0..rng.below(5))
        .map(|_| {
            let instances: Vec<String> = (0..rng.below(4))
                .map(|i| {
                    let deposed = rng.pick(&[
                        "",
                        r#""deposed": "00000001", "#,
                        r#""deposed": "", "#,
                        r#""deposed": null, "#,
                    ]);
                    format!(
                        r#"{{{deposed}"index_key": {i}, "schema_version": 0, "attributes": {}}}"#,
                        value(rng)
                    )
                })
                .collect();
            format!(
                r#"{{"mode": "{}", "type": "t", "name": "n", "instances": [{}]}}"#,
                rng.pick(&["managed", "managed", "data"]),
                instances.join(", ")
            )
        })
        .collect();
    fields.push(format!("\"resources\": [{}]", resources.join(",\n")));
    if rng.chance(10) {
        fields.push(format!(
            "\"encryption_version\": {}",
            rng.pick(&["\"v0\"", "\"\"", "1"])
        ));
    }
    if rng.chance(30) {
        fields.push(format!("\"check_results\": {}", value(rng)));
    }
    for i in (1..fields.len()).rev() {
        fields.swap(i, rng.below(i + 1));
    }
    format!("{{\n  {}\n}}", fields.join(",\n  "))
}

/// Damages JSON text a little, in ways that often keep it valid JSON.
pub(super) fn mutate(rng: &mut Rng, text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..rng.below(3) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.below(bytes.len());
        let alphabet = b"{}[]\",:0123456789-+.eE tfnul\\ \n\"a";
        match rng.below(5) {
            0 => bytes[at] = *rng.pick(alphabet),
            1 => {
                bytes.remove(at);
            }
            2 => bytes.insert(at, *rng.pick(alphabet)),
            3 => bytes[at] = rng.next() as u8,
            _ => {
                let end = (at + rng.below(16)).min(bytes.len());
                let span = bytes[at..end].to_vec();
                bytes.splice(at..at, span);
            }
        }
    }
    bytes
}
