//! The seeded fuzz against serde_json: what a reading of a document must
//! give, decided from serde_json alone, and chunk sets against a model.

use super::fuzz::{mutate, random_state, seed};
use super::*;

/// What a reading of `json` must give, decided with serde_json alone.
#[derive(Debug, PartialEq)]
enum Expected {
    Read {
        serial: u64,
        lineage: String,
        terraform_version: String,
        managed: u64,
        outputs: BTreeMap<String, (Value, Value, bool)>,
    },
    Encrypted,
    Corrupt,
}

/// An object's members in order, duplicates kept.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// An array's raw elements.
struct Elements(Vec<Box<RawValue>>);

impl<'de> Deserialize<'de> for Elements {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Elements;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elements, A::Error> {
                let mut elements = Vec::new();
                while let Some(element) = seq.next_element()? {
                    elements.push(element);
                }
                Ok(Elements(elements))
            }
        }
        deserializer.deserialize_seq(V)
    }
}

/// The members of an object (the last of a repeated name), or None when it
/// is no object; Err when one of the `read` names repeats (all names when
/// `read` is None): a repeated name the reader does not read is harmless.
fn members(
    raw: &RawValue,
    read: Option<&[&str]>,
) -> Option<Result<BTreeMap<String, Box<RawValue>>, ()>> {
    let Members(list) = serde_json::from_str(raw.get()).ok()?;
    let mut map = BTreeMap::new();
    let mut repeated = false;
    for (name, value) in list {
        let checked = read.is_none_or(|names| names.contains(&name.as_str()));
        repeated |= map.insert(name, value).is_some() && checked;
    }
    Some(if repeated { Err(()) } else { Ok(map) })
}

fn oracle_of(json: &[u8]) -> Expected {
    use Expected::Corrupt;
    // The whole text must be JSON to serde_json (syntax, UTF-8, escapes).
    if serde_json::from_slice::<Value>(json).is_err() {
        return Corrupt;
    }
    let Ok(top) = serde_json::from_slice::<Box<RawValue>>(json) else {
        return Corrupt;
    };
    let Some(top_members) = serde_json::from_str::<Members>(top.get()).ok() else {
        return Corrupt;
    };
    let known = [
        "version",
        "serial",
        "lineage",
        "terraform_version",
        "outputs",
        "resources",
        "encryption_version",
    ];
    let mut duplicate = false;
    let mut last: BTreeMap<&str, &RawValue> = BTreeMap::new();
    for (key, value) in &top_members.0 {
        if let Some(name) = known.iter().find(|k| **k == key) {
            duplicate |= last.insert(name, value).is_some();
        }
    }
    let value_of = |raw: &RawValue| serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null);
    if let Some(Value::String(v)) = last.get("encryption_version").map(|raw| value_of(raw))
        && !v.is_empty()
    {
        return Expected::Encrypted;
    }
    // Go reads an integer field from the literal: digits only.
    let as_u64 = |raw: &RawValue| -> Option<Option<u64>> {
        let text = raw.get();
        if text == "null" {
            Some(None)
        } else if text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse().ok().map(Some)
        } else {
            None
        }
    };
    match last.get("version").map(|raw| as_u64(raw)) {
        Some(Some(Some(4))) => {}
        _ => return Corrupt,
    }
    if duplicate {
        return Corrupt;
    }
    let serial = match last.get("serial").map(|raw| as_u64(raw)) {
        None | Some(Some(None)) => 0,
        Some(Some(Some(n))) => n,
        Some(None) => return Corrupt,
    };
    let string = |name: &str| -> Option<String> {
        match last.get(name).map(|raw| value_of(raw)) {
            None | Some(Value::Null) => Some(String::new()),
            Some(Value::String(s)) => Some(s),
            Some(_) => None,
        }
    };
    let (Some(lineage), Some(terraform_version)) = (string("lineage"), string("terraform_version"))
    else {
        return Corrupt;
    };
    let mut outputs = BTreeMap::new();
    if let Some(raw) = last.get("outputs").filter(|raw| raw.get() != "null") {
        let Some(Ok(map)) = members(raw, None) else {
            return Corrupt;
        };
        for (name, output) in map {
            let Some(Ok(fields)) = members(&output, Some(&["value", "type", "sensitive"])) else {
                return Corrupt;
            };
            let (Some(value), Some(type_)) = (fields.get("value"), fields.get("type")) else {
                return Corrupt;
            };
            let sensitive = match fields.get("sensitive").map(|raw| value_of(raw)) {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(_) => return Corrupt,
            };
            outputs.insert(name, (value_of(value), value_of(type_), sensitive));
        }
    }
    let mut managed = 0;
    if let Some(raw) = last.get("resources").filter(|raw| raw.get() != "null") {
        let Ok(Elements(resources)) = serde_json::from_str(raw.get()) else {
            return Corrupt;
        };
        for resource in resources {
            let Some(Ok(fields)) = members(&resource, Some(&["mode", "instances"])) else {
                return Corrupt;
            };
            let mode = fields.get("mode").map(|raw| value_of(raw));
            let is_managed = match mode {
                Some(Value::String(m)) if m == "managed" => true,
                Some(Value::String(m)) if m == "data" => false,
                _ => return Corrupt,
            };
            let mut current = false;
            if let Some(raw) = fields.get("instances").filter(|raw| raw.get() != "null") {
                let Ok(Elements(instances)) = serde_json::from_str(raw.get()) else {
                    return Corrupt;
                };
                for instance in instances {
                    let Some(Ok(fields)) = members(&instance, Some(&["deposed"])) else {
                        return Corrupt;
                    };
                    match fields.get("deposed").map(|raw| value_of(raw)) {
                        None | Some(Value::Null) => current = true,
                        Some(Value::String(key)) => current |= key.is_empty(),
                        Some(_) => return Corrupt,
                    }
                }
            }
            managed += u64::from(is_managed && current);
        }
    }
    Expected::Read {
        serial,
        lineage,
        terraform_version,
        managed,
        outputs,
    }
}

fn expected_of(outcome: Result<State, Unreadable>) -> Expected {
    match outcome {
        Ok(state) => Expected::Read {
            serial: state.serial,
            lineage: state.lineage,
            terraform_version: state.terraform_version,
            managed: state.managed_resources,
            outputs: state
                .outputs
                .into_iter()
                .map(|(name, output)| {
                    let value = output.value.expose().to_value().unwrap();
                    (
                        name,
                        (value, output.type_.to_value().unwrap(), output.sensitive()),
                    )
                })
                .collect(),
        },
        Err(Unreadable::Encrypted) => Expected::Encrypted,
        Err(Unreadable::Corrupt(_)) => Expected::Corrupt,
        Err(Unreadable::Inconsistent(why)) => panic!("no chunk set here: {why}"),
    }
}

#[test]
fn fuzz_documents_agree_with_serde_json() {
    let seed = seed();
    let mut rng = Rng::new(seed ^ 2);
    let mut reads = 0;
    for case in 0..1500 {
        let text = random_state(&mut rng);
        let json = if case % 4 == 0 {
            text.into_bytes()
        } else {
            mutate(&mut rng, &text)
        };
        let compressed = gzip(&json);
        // Cut the gzip at random places: the chunk boundaries must not matter.
        let mut cuts: Vec<usize> = (0..rng.below(4))
            .map(|_| rng.below(compressed.len() + 1))
            .collect();
        cuts.sort();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in cuts {
            pieces.push(&compressed[from..cut]);
            from = cut;
        }
        pieces.push(&compressed[from..]);
        let got = expected_of(state::read_chunks(&pieces));
        let want = oracle_of(&json);
        assert_eq!(
            got,
            want,
            "seed {seed} case {case}: {}",
            String::from_utf8_lossy(&json)
        );
        reads += usize::from(matches!(got, Expected::Read { .. }));
    }
    // The fuzz is only worth something if both outcomes are common.
    assert!((300..1400).contains(&reads), "{reads} of 1500 read");
}

#[test]
fn fuzz_documents_across_block_boundaries() {
    let seed = seed();
    let mut rng = Rng::new(seed ^ 3);
    for case in 0..60 {
        let text = random_state(&mut rng);
        let json = if case % 2 == 0 {
            text.into_bytes()
        } else {
            mutate(&mut rng, &text)
        };
        // Leading whitespace moves the document across the reader's first
        // 128 KiB block boundary.
        let padded = [vec![b' '; 128 * 1024 - rng.below(json.len() + 1)], json].concat();
        let got = expected_of(state::read_chunks(&[&gzip(&padded)]));
        assert_eq!(got, oracle_of(&padded), "seed {seed} case {case}");
    }
}

#[test]
fn fuzz_chunk_sets_agree_with_a_model() {
    let seed = seed();
    let mut rng = Rng::new(seed ^ 4);
    let suffix = "0123456789abcdef-m";
    let base = names::state_secret(suffix);
    for case in 0..3000 {
        let n = rng.below(36);
        let mut owned: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        for i in 0..n {
            let name = match rng.below(20) {
                0 => format!("{base}-part-0{}", rng.below(3)),
                1 => format!("{base}-part-x"),
                2 => format!("tfstate-default-other-m-part-{i}"),
                3 => format!("{base}-part-{}", rng.below(40)),
                _ => names::state_chunk(suffix, i as u32),
            };
            let payload = (!rng.chance(3)).then(|| vec![i as u8]);
            owned.push((name, payload));
        }
        for i in (1..owned.len()).rev() {
            owned.swap(i, rng.below(i + 1));
        }
        let secrets: Vec<ChunkSecret<'_>> = owned
            .iter()
            .map(|(name, payload)| ChunkSecret {
                name,
                payload: payload.as_deref(),
            })
            .collect();
        let got = state::chunks::assemble(suffix, &secrets);

        // The model: parse each name on its own terms, then compare sets.
        let want: Result<Option<Vec<u8>>, &str> = (|| {
            if owned.is_empty() {
                return Ok(None);
            }
            if owned.len() > 32 {
                return Err("corrupt");
            }
            let mut by_index = BTreeMap::new();
            for (name, payload) in &owned {
                let index = if *name == base {
                    0
                } else {
                    match name
                        .strip_prefix(&format!("{base}-part-"))
                        .map(str::parse::<u64>)
                    {
                        Some(Ok(index)) => index,
                        _ => return Err("inconsistent"),
                    }
                };
                if by_index.insert(index, payload).is_some() {
                    return Err("inconsistent");
                }
            }
            if by_index.keys().copied().ne(0..owned.len() as u64) {
                return Err("inconsistent");
            }
            by_index
                .values()
                .map(|payload| payload.as_ref().map(|p| p[0]).ok_or("inconsistent"))
                .collect::<Result<Vec<u8>, _>>()
                .map(Some)
        })();
        let got = match got {
            Ok(payloads) => Ok(payloads.map(|list| list.iter().map(|p| p[0]).collect::<Vec<u8>>())),
            Err(Unreadable::Corrupt(_)) => Err("corrupt"),
            Err(Unreadable::Inconsistent(_)) => Err("inconsistent"),
            Err(Unreadable::Encrypted) => Err("encrypted"),
        };
        let names: Vec<&str> = owned.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(got, want, "seed {seed} case {case}: {names:?}");
    }
}
