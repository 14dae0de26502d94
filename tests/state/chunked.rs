//! Terraform's chunked shape and its broken variants, written by hand.

use super::*;

#[tokio::test]
async fn terraform_chunked_state_is_read_whole() {
    let (_, _, secrets, suffix) = setup("state-chunks").await;
    let mut rng = Rng::new(7);
    let (json, managed) = synthetic_state(&mut rng, 31, 250, 12_000);
    let compressed = gzip(json.as_bytes());
    let chunks = put_chunked(&secrets, &suffix, &compressed).await;
    assert_eq!(
        chunks,
        3,
        "the premise: {} bytes make base, -part-1 and -part-2",
        compressed.len()
    );
    // An unlabelled Secret named like a chunk is not listed, so not read.
    let lookalike = Secret {
        metadata: ObjectMeta {
            name: Some(names::state_chunk(&suffix, 3)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "tfstate".into(),
            ByteString(b"junk".to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &lookalike)
        .await
        .unwrap();

    let read = read_ok(read(&secrets, &suffix).await);
    assert_eq!(read.serial, 31);
    assert_eq!(read.lineage, "7c0e6e4e-1f0b-4b35-9d3a-5a5f5d1b2c3d");
    assert_eq!(read.managed_resources, managed);
    assert_eq!(read.compressed_bytes, compressed.len() as u64);
    assert_eq!(read.decompressed_bytes, json.len() as u64);
    assert!(state::near_secret_limit(read.compressed_bytes));
    assert!(read.near_secret_limit_note().is_some());
    assert_eq!(
        read.outputs["endpoint"].value.expose().as_str(),
        r#""10.0.0.1""#
    );
}

/// Writes a variant of a three-chunk set into a fresh namespace and reads it.
async fn chunk_variant(
    prefix: &str,
    write: impl AsyncFnOnce(&Api<Secret>, &str, &[&[u8]]),
) -> StateReadable {
    let (_, _, secrets, suffix) = setup(prefix).await;
    let mut rng = Rng::new(11);
    let (json, _) = synthetic_state(&mut rng, 5, 250, 12_000);
    let compressed = gzip(json.as_bytes());
    let pieces: Vec<&[u8]> = compressed.chunks(MIB).collect();
    assert_eq!(pieces.len(), 3);
    write(&secrets, &suffix, &pieces).await;
    read(&secrets, &suffix).await
}

#[tokio::test]
async fn chunk_set_variants_are_inconsistent_or_corrupt() {
    let missing = chunk_variant("state-missing", async |secrets, suffix, pieces| {
        put(
            secrets,
            &names::state_chunk(suffix, 0),
            suffix,
            Some(pieces[0]),
        )
        .await;
        put(
            secrets,
            &names::state_chunk(suffix, 2),
            suffix,
            Some(pieces[2]),
        )
        .await;
    })
    .await;
    assert!(
        matches!(
            &missing,
            StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::Missing {
                index: 1,
                ..
            }))
        ),
        "{missing:?}"
    );
    assert_eq!(missing.reason().as_str(), "StateInconsistent");
    assert_eq!(missing.metric_reason(), Some("inconsistent"));

    let duplicate = chunk_variant("state-dup", async |secrets, suffix, pieces| {
        for (i, piece) in pieces.iter().enumerate() {
            put(
                secrets,
                &names::state_chunk(suffix, i as u32),
                suffix,
                Some(piece),
            )
            .await;
        }
        put(
            secrets,
            &format!("{}-part-01", names::state_secret(suffix)),
            suffix,
            Some(pieces[1]),
        )
        .await;
    })
    .await;
    assert!(
        matches!(
            &duplicate,
            StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::Duplicate {
                index: 1,
                ..
            }))
        ),
        "{duplicate:?}"
    );

    let stray = chunk_variant("state-stray", async |secrets, suffix, pieces| {
        for (i, piece) in pieces.iter().enumerate() {
            put(
                secrets,
                &names::state_chunk(suffix, i as u32),
                suffix,
                Some(piece),
            )
            .await;
        }
        put(secrets, "tfstate-default-leftover", suffix, Some(b"x")).await;
    })
    .await;
    assert_eq!(
        stray,
        StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::Stray {
            name: "tfstate-default-leftover".into()
        }))
    );
    assert!(stray.message().contains("tfstate-default-leftover"));

    let no_key = chunk_variant("state-nokey", async |secrets, suffix, pieces| {
        put(secrets, &names::state_chunk(suffix, 0), suffix, None).await;
        put(
            secrets,
            &names::state_chunk(suffix, 1),
            suffix,
            Some(pieces[1]),
        )
        .await;
        put(
            secrets,
            &names::state_chunk(suffix, 2),
            suffix,
            Some(pieces[2]),
        )
        .await;
    })
    .await;
    assert!(
        matches!(
            &no_key,
            StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::NoTfstateKey {
                index: 0,
                ..
            }))
        ),
        "{no_key:?}"
    );

    // 33 small chunks: over the cap, whatever they hold.
    let (_, _, secrets, suffix) = setup("state-33").await;
    for i in 0..33 {
        put(
            &secrets,
            &names::state_chunk(&suffix, i),
            &suffix,
            Some(b"x"),
        )
        .await;
    }
    let over = read(&secrets, &suffix).await;
    assert_eq!(
        over,
        StateReadable::Unreadable(Unreadable::Corrupt(Corruption::TooManyChunks { count: 33 }))
    );
    assert_eq!(over.reason().as_str(), "StateCorrupt");
    assert_eq!(over.metric_reason(), Some("corrupt"));
}

#[tokio::test]
async fn another_workspaces_secrets_are_not_read() {
    let (_, _, secrets, suffix) = setup("state-workspace").await;
    let state =
        gzip(br#"{"version": 4, "serial": 6, "lineage": "l", "outputs": {}, "resources": []}"#);
    put(
        &secrets,
        &names::state_secret(&suffix),
        &suffix,
        Some(&state),
    )
    .await;
    // The same suffix in workspace "other": the backend's base Secret for it,
    // and one named like this state's next chunk.
    let other =
        gzip(br#"{"version": 4, "serial": 9, "lineage": "o", "outputs": {}, "resources": []}"#);
    put_in_workspace(
        &secrets,
        &format!("tfstate-other-{suffix}"),
        &suffix,
        "other",
        Some(&other),
    )
    .await;
    put_in_workspace(
        &secrets,
        &names::state_chunk(&suffix, 1),
        &suffix,
        "other",
        Some(&other),
    )
    .await;

    let read = read_ok(read(&secrets, &suffix).await);
    assert_eq!((read.serial, read.lineage.as_str()), (6, "l"));
    assert_eq!(read.compressed_bytes, state.len() as u64);
}

/// The listing is decoded by the state layer itself, not by kube: a
/// refused list is still the API server's own Status.
#[tokio::test]
async fn a_refused_listing_is_the_api_servers_status() {
    let (_, _, secrets, _) = setup("state-refused").await;
    // A label value may not hold a space: the API server refuses the selector.
    let error = state::read(&secrets, "not a label").await.unwrap_err();
    let state::ReadError::List(kube::Error::Api(status)) = &error else {
        panic!("expected the API server's refusal, got {error:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    // The API server's own words, not kube's or ours.
    assert!(status.message.contains("expected"), "{}", status.message);
}

#[tokio::test]
async fn corrupt_payloads_are_reported_corrupt() {
    let (_, _, secrets, _) = setup("state-corrupt").await;
    let ns_secrets = &secrets;
    let good =
        gzip(br#"{"version": 4, "serial": 1, "lineage": "l", "outputs": {}, "resources": []}"#);
    let mut bad_crc = good.clone();
    let len = bad_crc.len();
    bad_crc[len - 8] ^= 0x40;
    let version3 = gzip(
        br#"{"version": 3, "terraform_version": "0.11.14", "serial": 2, "lineage": "l",
            "modules": [{"path": ["root"], "outputs": {}, "resources": {}}]}"#,
    );
    let envelope = gzip(br#"{"meta": {"key_provider.pbkdf2.k": "e30="}, "encrypted_data": "AAECAw==", "encryption_version": "v0"}"#);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() - 5].to_vec()),
        ("bad-crc", bad_crc),
        ("not-json", gzip(b"this is not JSON at all")),
        ("version-3", version3),
        ("not-gzip", b"{\"version\": 4}".to_vec()),
        ("envelope", envelope),
    ];
    for (i, (what, payload)) in cases.iter().enumerate() {
        let suffix = names::suffix("corrupt", Kind::Cluster, &format!("c{i}"));
        put(
            ns_secrets,
            &names::state_secret(&suffix),
            &suffix,
            Some(payload),
        )
        .await;
        let outcome = read(ns_secrets, &suffix).await;
        let message = outcome.message();
        match *what {
            "version-3" => assert_eq!(
                outcome,
                StateReadable::Unreadable(Unreadable::Corrupt(Corruption::UnsupportedVersion(3)))
            ),
            "not-json" => assert!(
                matches!(
                    outcome,
                    StateReadable::Unreadable(Unreadable::Corrupt(Corruption::Json { .. }))
                ),
                "{what}: {outcome:?}"
            ),
            "envelope" => assert_eq!(outcome, StateReadable::Unreadable(Unreadable::Encrypted)),
            _ => assert!(
                matches!(
                    outcome,
                    StateReadable::Unreadable(Unreadable::Corrupt(Corruption::Gzip(_)))
                ),
                "{what}: {outcome:?}"
            ),
        }
        assert!(!message.contains("this is not"), "{what}: {message}");
    }
}

#[tokio::test]
async fn a_ten_gib_bomb_stops_at_the_cap() {
    let (_, _, secrets, suffix) = setup("state-bomb").await;
    let compressed = captf_testkit::gzip_bomb(br#"{"version": 4, "filler": ""#, b'x', 10 * 1024);
    let chunks = put_chunked(&secrets, &suffix, &compressed).await;
    assert!(chunks <= 32, "{chunks} chunks");
    let outcome = read(&secrets, &suffix).await;
    assert_eq!(
        outcome,
        StateReadable::Unreadable(Unreadable::Corrupt(Corruption::TooLarge))
    );
    assert!(
        outcome.message().contains("64 MiB"),
        "{}",
        outcome.message()
    );

    // The same bytes, read on this thread: the heap the reader holds stays
    // far below the 64 MiB it inflates before it stops.
    let pieces: Vec<&[u8]> = compressed.chunks(MIB).collect();
    let (outcome, peak) = peak_heap(|| state::read_chunks(&pieces));
    assert_eq!(outcome, Err(Unreadable::Corrupt(Corruption::TooLarge)));
    assert!(peak < 2 * MIB, "the reader held {peak} bytes");
}
