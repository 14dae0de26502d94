use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;

use super::*;
use crate::state::{Corruption, Inconsistency, State, StateReadable, Unreadable};

const S: &str = "0123456789abcdef-m";

fn state(serial: u64) -> State {
    State {
        serial,
        lineage: "7c0e6e4e-1f0b-4b35-9d3a-5a5f5d1b2c3d".into(),
        terraform_version: "1.12.6".into(),
        outputs: BTreeMap::new(),
        managed_resources: 4,
        compressed_bytes: 0,
        decompressed_bytes: 0,
    }
}

fn source(index: u32, payload: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(names::state_chunk(S, index)),
            annotations: (index == 0)
                .then(|| BTreeMap::from([(INPUTS_HASH.to_owned(), "abc123".to_owned())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            TFSTATE_KEY.to_owned(),
            ByteString(payload.to_vec()),
        )])),
        ..Default::default()
    }
}

fn owner() -> Owner<'static> {
    Owner {
        reference: OwnerReference {
            api_version: "infrastructure.cluster.x-k8s.io/v1beta1".into(),
            kind: "TerraformMachine".into(),
            name: "worker-0".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
        kind: Kind::Machine,
        name: "worker-0",
        cluster_name: Some("prod"),
    }
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn plan(serial: u64, chunks: &[Secret]) -> Result<BackupSet, PlanError> {
    plan_backup(
        S,
        &state(serial),
        chunks,
        &owner(),
        Some("job-1"),
        at(1_700_000_000),
    )
}

fn tfstate(secret: &Secret) -> &[u8] {
    &secret.data.as_ref().unwrap()[TFSTATE_KEY].0
}

fn annot<'a>(secret: &'a Secret, key: &str) -> &'a str {
    annotation(secret, key).unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn plans_chunk_for_chunk_from_the_names_whatever_the_list_order() {
    // Bytes that are not valid UTF-8 must survive as they are.
    let payloads: [&[u8]; 3] = [b"\x1f\x8b\x00first", b"\xff\xfesecond", b"third\x00"];
    let listed = vec![
        source(2, payloads[2]),
        source(0, payloads[0]),
        source(1, payloads[1]),
    ];
    let set = plan(12, &listed).unwrap();
    assert_eq!(set.serial, 12);
    assert_eq!(set.suffix, S);
    let concatenated: Vec<u8> = payloads.concat();
    assert_eq!(set.digest, sha256_hex(&[&concatenated]));
    assert_eq!(set.set_id, format!("12-{}", &set.digest[..12]));
    assert_eq!(set.secrets.len(), 3);
    for (index, secret) in set.secrets.iter().enumerate() {
        let index = index as u32;
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some(names::backup_chunk(S, 12, index).as_str())
        );
        assert_eq!(tfstate(secret), payloads[index as usize], "chunk {index}");
        assert_eq!(annot(secret, BACKUP_CHUNK), index.to_string());
        assert_eq!(annot(secret, BACKUP_CHUNKS), "3");
        assert_eq!(annot(secret, BACKUP_SERIAL), "12");
        assert_eq!(annot(secret, BACKUP_LINEAGE), state(12).lineage);
        assert_eq!(annot(secret, BACKUP_TAKEN_AT), "2023-11-14T22:13:20Z");
        assert_eq!(annot(secret, BACKUP_SOURCE_JOB), "job-1");
        assert_eq!(annot(secret, BACKUP_DIGEST), set.digest);
        assert_eq!(annot(secret, BACKUP_RESOURCES), "4");
        assert_eq!(annot(secret, BACKUP_SET), set.set_id);
        assert_eq!(
            annotation(secret, INPUTS_HASH),
            (index == 0).then_some("abc123")
        );
        let labels = secret.metadata.labels.as_ref().unwrap();
        for (key, value) in [
            ("captf.io/managed", "true"),
            (BACKUP_LABEL, "true"),
            (BACKUP_SUFFIX_LABEL, S),
            ("clusterctl.cluster.x-k8s.io/move", ""),
            (
                "captf.infrastructure.cluster.x-k8s.io/owner-kind",
                "TerraformMachine",
            ),
            (
                "captf.infrastructure.cluster.x-k8s.io/owner-name",
                "worker-0",
            ),
            ("cluster.x-k8s.io/cluster-name", "prod"),
        ] {
            assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
        }
        let refs = secret.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, "uid-1");
        assert_eq!(refs[0].controller, Some(false));
        assert_eq!(refs[0].block_owner_deletion, Some(false));
    }
}

#[test]
fn part_10_follows_part_9() {
    let listed: Vec<Secret> = (0..11u32)
        .rev()
        .map(|i| source(i, format!("p{i}").as_bytes()))
        .collect();
    let set = plan(3, &listed).unwrap();
    for (i, secret) in set.secrets.iter().enumerate() {
        assert_eq!(tfstate(secret), format!("p{i}").as_bytes());
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some(names::backup_chunk(S, 3, i as u32).as_str())
        );
    }
}

#[test]
fn without_source_job_or_cluster_neither_is_written() {
    let mut who = owner();
    who.cluster_name = None;
    let set = plan_backup(S, &state(1), &[source(0, b"x")], &who, None, at(0)).unwrap();
    let secret = &set.secrets[0];
    assert_eq!(annotation(secret, BACKUP_SOURCE_JOB), None);
    assert!(
        !secret
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("cluster.x-k8s.io/cluster-name")
    );
}

#[test]
fn plan_refuses_what_is_not_one_whole_set() {
    assert_eq!(plan(1, &[]), Err(PlanError::NoState));
    assert_eq!(plan(0, &[source(0, b"x")]), Err(PlanError::ZeroSerial));
    assert_eq!(
        plan(1, &[source(0, b"a"), source(2, b"c")]),
        Err(PlanError::Chunks(Unreadable::Inconsistent(
            Inconsistency::Missing {
                index: 1,
                name: names::state_chunk(S, 1)
            }
        )))
    );
    let mut keyless = source(0, b"a");
    keyless.data = None;
    assert!(matches!(
        plan(1, &[keyless]),
        Err(PlanError::Chunks(Unreadable::Inconsistent(
            Inconsistency::NoTfstateKey { .. }
        )))
    ));
}

#[test]
fn should_back_up_table() {
    let read = StateReadable::Read(state(7));
    let corrupt = StateReadable::Unreadable(Unreadable::Corrupt(Corruption::TooLarge));
    let inconsistent = StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::Stray {
        name: "x".into(),
    }));
    let encrypted = StateReadable::Unreadable(Unreadable::Encrypted);
    let take = BackupDecision::Take { serial: 7 };
    let skip = |reason| BackupDecision::Skip { reason };
    let table = [
        (&read, None, 5, false, take),
        (&read, Some(6), 5, false, take),
        (&read, Some(8), 1, false, take),
        (&read, Some(7), 5, false, skip("unchanged")),
        (&read, None, 0, false, skip("disabled")),
        (&read, None, 5, true, skip("deleting")),
        (&read, Some(7), 0, true, skip("deleting")),
        (&StateReadable::NotFound, None, 5, false, skip("not-found")),
        (&corrupt, None, 5, false, skip("corrupt")),
        (&inconsistent, Some(1), 5, false, skip("inconsistent")),
        (&encrypted, None, 5, false, skip("encrypted")),
    ];
    for (readable, observed, keep, deleting, want) in table {
        assert_eq!(
            should_back_up(readable, observed, keep, deleting),
            want,
            "{readable:?} observed {observed:?} keep {keep} deleting {deleting}"
        );
    }
}

/// The Secrets of a planned set with labels, as the API would list them.
fn planned(serial: u64, payloads: &[&[u8]]) -> Vec<Secret> {
    let listed: Vec<Secret> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| source(i as u32, p))
        .collect();
    plan(serial, &listed).unwrap().secrets
}

#[test]
fn list_groups_orders_and_checks_completeness() {
    let mut secrets = Vec::new();
    secrets.extend(planned(3, &[b"aa", b"bbb"]));
    secrets.extend(planned(10, &[b"c"]));
    // Serial 5 lost its chunk 1 of 2.
    let mut five = planned(5, &[b"dd", b"e"]);
    five.pop();
    secrets.extend(five);
    // Serial 7: a chunk tampered with, so the digest no longer matches.
    let mut seven = planned(7, &[b"ff", b"g"]);
    seven[1].data = Some(BTreeMap::from([(
        TFSTATE_KEY.to_owned(),
        ByteString(b"G".to_vec()),
    )]));
    secrets.extend(seven);
    // Another suffix's backup and a Secret named unlike any chunk.
    let mut other = planned(11, &[b"h"]);
    other[0]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(BACKUP_SUFFIX_LABEL.into(), "ffffffffffffffff-m".into());
    secrets.extend(other);
    let mut stray = planned(12, &[b"i"]);
    stray[0].metadata.name = Some(format!("{}-x", names::backup_secret(S, 12)));
    secrets.extend(stray);
    secrets.reverse();

    let infos = list(&secrets, S);
    let got: Vec<(u64, u64, bool)> = infos
        .iter()
        .map(|b| (b.serial, b.bytes, b.complete))
        .collect();
    assert_eq!(
        got,
        vec![(10, 1, true), (7, 3, false), (5, 2, false), (3, 5, true)]
    );
    assert!(infos.iter().all(|b| b.taken_at == Some(at(1_700_000_000))));
}

#[test]
fn list_flags_duplicate_and_missing_chunk_zero() {
    let mut secrets = planned(4, &[b"a", b"b"]);
    let mut twice = secrets[1].clone();
    twice.metadata.name = Some(format!("{}-part-01", names::backup_secret(S, 4)));
    secrets.push(twice);
    let mut only_tail = planned(6, &[b"a", b"b"]);
    only_tail.remove(0);
    secrets.extend(only_tail);
    let got: Vec<(u64, bool)> = list(&secrets, S)
        .iter()
        .map(|b| (b.serial, b.complete))
        .collect();
    assert_eq!(got, vec![(6, false), (4, false)]);
}

fn info(serial: u64, complete: bool) -> BackupInfo {
    BackupInfo {
        serial,
        taken_at: Some(at(serial as i64)),
        bytes: 10 * serial,
        complete,
    }
}

#[test]
fn prune_table() {
    let gappy = [info(2, true), info(9, true), info(5, true), info(3, true)];
    let with_broken = [info(8, false), info(6, true), info(4, true), info(1, false)];
    let table: [(&[BackupInfo], u32, Vec<u64>); 10] = [
        (&gappy, 0, vec![]),
        (&gappy, 1, vec![5, 3, 2]),
        (&gappy, 2, vec![3, 2]),
        (&gappy, 5, vec![]),
        (&gappy, 4, vec![]),
        (&[], 3, vec![]),
        (&with_broken, 0, vec![]),
        (&with_broken, 1, vec![8, 4, 1]),
        (&with_broken, 2, vec![8, 1]),
        (&with_broken, 5, vec![8, 1]),
    ];
    for (existing, keep, want) in table {
        assert_eq!(prune(existing, keep), want, "keep {keep} of {existing:?}");
    }
}

#[test]
fn status_lists_complete_sets_newest_first_at_most_16() {
    let mut infos: Vec<BackupInfo> = (1..=20).map(|s| info(s, s != 19)).collect();
    infos.reverse();
    infos.swap(0, 5);
    let entries = status_entries(&infos);
    let serials: Vec<i64> = entries.iter().map(|e| e.serial).collect();
    let want: Vec<i64> = [20, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4].to_vec();
    assert_eq!(serials, want);
    assert_eq!(entries[0].bytes, 200);
    assert_eq!(entries[0].taken_at.0, at(20));

    let mut untimed = info(3, true);
    untimed.taken_at = None;
    let empty = BackupInfo {
        bytes: 0,
        ..info(2, true)
    };
    assert!(status_entries(&[untimed, empty, info(1, false)]).is_empty());
}

#[test]
fn a_restore_request_names_a_complete_set_once() {
    use super::restore::{Current, Push, Request, request};
    let mut sets = planned(4, &[b"aa", b"bb"]);
    sets.extend(planned(6, &[b"cc"]));
    // Chunk 1 of serial 6's two-chunk set is missing: incomplete.
    let mut broken = planned(6, &[b"dd", b"ee"]);
    broken.truncate(1);
    let push = |serial: u64, push_serial: u64, chunks: &[&str]| {
        Request::Push(Push {
            serial,
            push_serial,
            chunks: chunks.iter().map(|c| c.to_string()).collect(),
            resources: 4,
            inputs_hash: Some("abc123".into()),
        })
    };
    let b4 = names::backup_secret(S, 4);
    let b4p1 = names::backup_chunk(S, 4, 1);
    let b6 = names::backup_secret(S, 6);
    let none = Current::NothingToKeep;
    let read = |serial| Current::Read { serial };
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a [Secret],
        bool,
        Current,
        Option<u64>,
        Request,
    );
    let rows: [Row<'_>; 10] = [
        ("two chunks, in order", "4", &sets, false, none, None, push(4, 7, &[&b4, &b4p1])),
        ("one chunk", "6", &sets, false, none, None, push(6, 7, &[&b6])),
        ("above the observed serial", "4", &sets, false, none, Some(9), push(4, 10, &[&b4, &b4p1])),
        ("over a backed-up state", "4", &sets, false, read(6), Some(6), push(4, 7, &[&b4, &b4p1])),
        (
            "over a state not backed up",
            "4",
            &sets,
            false,
            read(8),
            Some(6),
            Request::NotBackedUp("the current state (serial 8) has no complete backup, and a restore would overwrite it; a restore goes ahead once it is backed up (--state-backups above 0)".into()),
        ),
        ("failed before", "4", &sets, true, none, None, Request::FailedBefore),
        (
            "not a serial",
            "x",
            &sets,
            false,
            none,
            None,
            Request::NotFound("captf.io/restore-state is \"x\", not a state serial".into()),
        ),
        (
            "no such set",
            "5",
            &sets,
            false,
            none,
            None,
            Request::NotFound(format!(
                "no complete backup of state serial 5 ({})",
                names::backup_secret(S, 5)
            )),
        ),
        (
            "incomplete",
            "6",
            &broken,
            false,
            none,
            None,
            Request::NotFound(format!("no complete backup of state serial 6 ({b6})")),
        ),
        (
            "over a state whose only backup is incomplete",
            "4",
            &[sets.clone(), broken.clone()].concat(),
            false,
            read(6),
            None,
            Request::NotBackedUp("the current state (serial 6) has no complete backup, and a restore would overwrite it; a restore goes ahead once it is backed up (--state-backups above 0)".into()),
        ),
    ];
    for (what, raw, existing, failed, current, observed, want) in rows {
        let listed = Listed {
            infos: list(existing, S),
            secrets: existing.to_vec(),
        };
        assert_eq!(
            request(raw, S, &listed, failed, current, observed),
            want,
            "{what}"
        );
    }
}

#[test]
fn a_set_records_the_inputs_hash_adopted_after_its_read() {
    let mut set = plan(2, &[source(0, b"a"), source(1, b"b")]).unwrap();
    record_inputs_hash(&mut set, Some("h2:new"));
    assert_eq!(annot(&set.secrets[0], INPUTS_HASH), "h2:new");
    assert!(
        set.secrets[1]
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(INPUTS_HASH)
            .is_none()
    );
    record_inputs_hash(&mut set, None);
    assert!(
        set.secrets[0]
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(INPUTS_HASH)
            .is_none()
    );
}
