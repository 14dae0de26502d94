//! The chunk set: which of the Secrets that carry the backend's labels make up
//! the state, in which order. A pure decision over names and payloads.

use std::collections::BTreeMap;

use super::{Corruption, Inconsistency, MAX_CHUNKS, Unreadable};
use crate::names;

/// One Secret of the label-selected list, as the chunk decision sees it.
#[derive(Clone, Copy, Debug)]
pub struct ChunkSecret<'a> {
    pub name: &'a str,
    /// The `tfstate` data key, if the Secret has one.
    pub payload: Option<&'a [u8]>,
}

impl<'a> ChunkSecret<'a> {
    /// The view of a listed Secret.
    pub fn of(secret: &'a k8s_openapi::api::core::v1::Secret) -> Self {
        ChunkSecret {
            name: secret.metadata.name.as_deref().unwrap_or_default(),
            payload: secret
                .data
                .as_ref()
                .and_then(|data| data.get(super::TFSTATE_KEY))
                .map(|bytes| bytes.0.as_slice()),
        }
    }
}

/// Orders the Secrets of the state of `suffix` by chunk index and returns
/// their payloads, or None when there is no state Secret at all.
///
/// A set is whole only when its names are exactly the base Secret and
/// `-part-1` .. `-part-<n-1>`, each with a `tfstate` key. The cap on the
/// number of chunks is checked first, so an oversized set is never looked
/// into; then stray names, then duplicated indexes (two spellings of one
/// index), then the first missing index, then missing `tfstate` keys.
pub fn assemble<'a>(
    suffix: &str,
    secrets: &[ChunkSecret<'a>],
) -> Result<Option<Vec<&'a [u8]>>, Unreadable> {
    if secrets.is_empty() {
        return Ok(None);
    }
    if secrets.len() > MAX_CHUNKS {
        return Err(Unreadable::Corrupt(Corruption::TooManyChunks {
            count: secrets.len(),
        }));
    }
    let mut by_index: BTreeMap<u64, &ChunkSecret<'a>> = BTreeMap::new();
    // Stray names come first whatever the order of the list, so that the
    // answer does not depend on how the API server sorted it.
    let mut indexed = Vec::with_capacity(secrets.len());
    for secret in secrets {
        match names::state_chunk_index(suffix, secret.name) {
            Some(index) => indexed.push((index, secret)),
            None => {
                return Err(Unreadable::Inconsistent(Inconsistency::Stray {
                    name: secret.name.to_owned(),
                }));
            }
        }
    }
    // Sorting by (index, name) makes the reported pair deterministic.
    indexed.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(b.1.name)));
    for (index, secret) in indexed {
        if let Some(first) = by_index.insert(index, secret) {
            return Err(Unreadable::Inconsistent(Inconsistency::Duplicate {
                index,
                first: first.name.to_owned(),
                second: secret.name.to_owned(),
            }));
        }
    }
    // n distinct indexes are 0..n exactly when none of 0..n is absent.
    for index in 0..secrets.len() as u32 {
        if !by_index.contains_key(&u64::from(index)) {
            return Err(Unreadable::Inconsistent(Inconsistency::Missing {
                index,
                name: names::state_chunk(suffix, index),
            }));
        }
    }
    let mut payloads = Vec::with_capacity(by_index.len());
    for (index, secret) in by_index {
        match secret.payload {
            Some(payload) => payloads.push(payload),
            None => {
                return Err(Unreadable::Inconsistent(Inconsistency::NoTfstateKey {
                    index,
                    name: secret.name.to_owned(),
                }));
            }
        }
    }
    Ok(Some(payloads))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "0123456789abcdef-m";

    fn base() -> String {
        names::state_secret(S)
    }

    fn part(n: u32) -> String {
        names::state_chunk(S, n)
    }

    /// Runs `assemble` over (name, payload) pairs.
    fn run(set: &[(String, Option<&'static [u8]>)]) -> Result<Option<Vec<Vec<u8>>>, Unreadable> {
        let secrets: Vec<ChunkSecret<'_>> = set
            .iter()
            .map(|(name, payload)| ChunkSecret {
                name,
                payload: *payload,
            })
            .collect();
        assemble(S, &secrets).map(|o| o.map(|v| v.into_iter().map(<[u8]>::to_vec).collect()))
    }

    fn inconsistent(result: Result<Option<Vec<Vec<u8>>>, Unreadable>) -> Inconsistency {
        match result {
            Err(Unreadable::Inconsistent(i)) => i,
            other => panic!("expected inconsistent, got {other:?}"),
        }
    }

    #[test]
    fn no_secret_is_not_found() {
        assert_eq!(run(&[]).unwrap(), None);
    }

    #[test]
    fn orders_by_index_whatever_the_list_order() {
        let set = vec![
            (part(2), Some(&b"c"[..])),
            (part(10), Some(&b"k"[..])),
            (base(), Some(&b"a"[..])),
            (part(1), Some(&b"b"[..])),
        ];
        // 10 chunks are named 0..=10 minus 3..=9: missing 3.
        assert_eq!(
            inconsistent(run(&set)),
            Inconsistency::Missing {
                index: 3,
                name: part(3)
            }
        );
        let mut whole: Vec<(String, Option<&'static [u8]>)> = vec![(base(), Some(&b"0"[..]))];
        let digits: [&'static [u8]; 11] = [
            b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9", b"10",
        ];
        for i in (1..=10).rev() {
            whole.push((part(i), Some(digits[i as usize])));
        }
        let payloads = run(&whole).unwrap().unwrap();
        let want: Vec<Vec<u8>> = digits.iter().map(|d| d.to_vec()).collect();
        assert_eq!(payloads, want, "part-10 after part-9, not after part-1");
    }

    #[test]
    fn single_base_secret() {
        assert_eq!(
            run(&[(base(), Some(&b"x"[..]))]).unwrap(),
            Some(vec![b"x".to_vec()])
        );
    }

    #[test]
    fn table_of_broken_sets() {
        let p = Some(&b"p"[..]);
        // (the labelled Secrets as (name, tfstate payload), the verdict)
        type Row = (Vec<(String, Option<&'static [u8]>)>, Unreadable);
        let table: Vec<Row> = vec![
            (
                vec![(part(1), p)],
                Unreadable::Inconsistent(Inconsistency::Missing {
                    index: 0,
                    name: base(),
                }),
            ),
            (
                vec![(base(), p), (part(2), p)],
                Unreadable::Inconsistent(Inconsistency::Missing {
                    index: 1,
                    name: part(1),
                }),
            ),
            (
                vec![
                    (base(), p),
                    (part(1), p),
                    (format!("{base}-part-01", base = base()), p),
                ],
                Unreadable::Inconsistent(Inconsistency::Duplicate {
                    index: 1,
                    first: format!("{}-part-01", base()),
                    second: part(1),
                }),
            ),
            (
                vec![(base(), p), (format!("{}-part-0", base()), p)],
                Unreadable::Inconsistent(Inconsistency::Duplicate {
                    index: 0,
                    first: base(),
                    second: format!("{}-part-0", base()),
                }),
            ),
            (
                vec![(base(), p), (format!("{}-backup", base()), p)],
                Unreadable::Inconsistent(Inconsistency::Stray {
                    name: format!("{}-backup", base()),
                }),
            ),
            (
                // A stray name wins over a missing chunk, wherever it is listed.
                vec![(part(3), p), ("tfstate-other-0123456789abcdef-m".into(), p)],
                Unreadable::Inconsistent(Inconsistency::Stray {
                    name: "tfstate-other-0123456789abcdef-m".into(),
                }),
            ),
            (
                vec![(base(), None)],
                Unreadable::Inconsistent(Inconsistency::NoTfstateKey {
                    index: 0,
                    name: base(),
                }),
            ),
            (
                vec![(base(), p), (part(1), None)],
                Unreadable::Inconsistent(Inconsistency::NoTfstateKey {
                    index: 1,
                    name: part(1),
                }),
            ),
            (
                (0..33).map(|i| (part(i), p)).collect(),
                Unreadable::Corrupt(Corruption::TooManyChunks { count: 33 }),
            ),
            (
                // Over the cap even when the set is also broken otherwise.
                (0..40).map(|i| (format!("stray-{i}"), None)).collect(),
                Unreadable::Corrupt(Corruption::TooManyChunks { count: 40 }),
            ),
            (
                vec![
                    (base(), p),
                    (format!("{}-part-99999999999999999999", base()), p),
                ],
                Unreadable::Inconsistent(Inconsistency::Missing {
                    index: 1,
                    name: part(1),
                }),
            ),
        ];
        for (set, want) in table {
            let names: Vec<&str> = set.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(run(&set).unwrap_err(), want, "{names:?}");
        }
    }

    #[test]
    fn thirty_two_chunks_is_the_cap_not_over_it() {
        let set: Vec<_> = (0..32).map(|i| (part(i), Some(&b"p"[..]))).collect();
        assert_eq!(run(&set).unwrap().unwrap().len(), 32);
    }

    #[test]
    fn messages_name_the_secret_and_no_content() {
        let message = Unreadable::Inconsistent(Inconsistency::Missing {
            index: 2,
            name: part(2),
        })
        .to_string();
        assert!(
            message.contains(&part(2)) && message.contains("chunk 2"),
            "{message}"
        );
        let message = Unreadable::Inconsistent(Inconsistency::NoTfstateKey {
            index: 0,
            name: base(),
        })
        .to_string();
        assert!(
            message.contains(&base()) && message.contains("tfstate"),
            "{message}"
        );
        let message = Unreadable::Corrupt(Corruption::TooManyChunks { count: 33 }).to_string();
        assert!(
            message.contains("33") && message.contains("32"),
            "{message}"
        );
    }
}
