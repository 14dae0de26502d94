use super::*;

fn n(attempt: u32) -> NonZeroU32 {
    NonZeroU32::new(attempt).unwrap()
}

fn h(hex: &str) -> Hash6 {
    Hash6::new(hex).unwrap()
}

#[test]
fn suffix_is_sha256_prefix_and_kind_code() {
    // sha256("ns/TerraformCluster/demo"), computed independently.
    let expected = format!("{}-c", &sha256_hex(b"ns/TerraformCluster/demo")[..16]);
    assert_eq!(suffix("ns", Kind::Cluster, "demo"), expected);
    assert_eq!(
        &sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "the hash is SHA-256 in lowercase hex"
    );
    for (kind, code) in [
        (Kind::Cluster, "-c"),
        (Kind::Machine, "-m"),
        (Kind::MachinePool, "-mp"),
    ] {
        let s = suffix("ns", kind, "x");
        assert!(s.ends_with(code), "{s}");
        assert_eq!(s.len(), 17 + kind.short().len());
        assert!(s[..16].bytes().all(is_lower_hex));
    }
}

#[test]
fn suffix_never_ends_in_dash_digits() {
    for ns in ["a", "default", "1", "ns-2"] {
        for name in ["0", "x-1", "machine-12", "9-9-9"] {
            for kind in [Kind::Cluster, Kind::Machine, Kind::MachinePool] {
                let s = suffix(ns, kind, name);
                let last = s.rsplit('-').next().unwrap();
                assert!(!last.bytes().all(|b| b.is_ascii_digit()), "{s}");
                assert_eq!(state_chunk_index(&s, &state_secret(&s)), Some(0));
            }
        }
    }
}

#[test]
fn suffix_depends_on_namespace_kind_and_name_only() {
    // The UID is not an input at all, so a moved object (same
    // namespace/kind/name, new UID) gets the same suffix.
    assert_eq!(
        suffix("ns", Kind::Machine, "m1"),
        suffix("ns", Kind::Machine, "m1")
    );
    let all = [
        suffix("ns", Kind::Machine, "m1"),
        suffix("ns2", Kind::Machine, "m1"),
        suffix("ns", Kind::Cluster, "m1"),
        suffix("ns", Kind::MachinePool, "m1"),
        suffix("ns", Kind::Machine, "m2"),
        // The separator keeps "a/b" + "c" apart from "a" + "b/c".
        suffix("a", Kind::Machine, "b"),
        suffix("a/TerraformMachine/b", Kind::Machine, ""),
    ];
    let distinct: std::collections::BTreeSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "{all:?}");
    // Same hash part only when the hashed text is the same.
    assert_ne!(all[0][..16], all[2][..16]);
}

#[test]
fn state_names() {
    let s = "0123456789abcdef-m";
    assert_eq!(state_secret(s), "tfstate-default-0123456789abcdef-m");
    assert_eq!(state_chunk(s, 0), "tfstate-default-0123456789abcdef-m");
    assert_eq!(
        state_chunk(s, 2),
        "tfstate-default-0123456789abcdef-m-part-2"
    );
    assert_eq!(
        state_lock_lease(s),
        "lock-tfstate-default-0123456789abcdef-m"
    );
    assert_eq!(run_lease(s), "captf-run-0123456789abcdef-m");
    assert_eq!(run_lease("0123456789abcdef-mp").len(), 29);
    assert_eq!(
        backup_secret(s, 7),
        "captf-state-backup-0123456789abcdef-m-7"
    );
    assert_eq!(
        backup_chunk(s, 7, 0),
        "captf-state-backup-0123456789abcdef-m-7"
    );
    assert_eq!(
        backup_chunk(s, 7, 3),
        "captf-state-backup-0123456789abcdef-m-7-part-3"
    );
}

#[test]
fn chunk_indexes() {
    let s = "0123456789abcdef-c";
    let base = "tfstate-default-0123456789abcdef-c";
    for (name, index) in [
        (base.to_string(), Some(0)),
        (format!("{base}-part-1"), Some(1)),
        (format!("{base}-part-31"), Some(31)),
        (format!("{base}-part-01"), Some(1)),
        (format!("{base}-part-0"), Some(0)),
        (
            format!("{base}-part-99999999999999999999999"),
            Some(u64::MAX),
        ),
        (format!("{base}-part-"), None),
        (format!("{base}-part-1a"), None),
        (format!("{base}-part-+1"), None),
        (format!("{base}-part--1"), None),
        (format!("{base}-1"), None),
        (format!("{base}x"), None),
        (format!("{base}-part-1-part-2"), None),
        ("tfstate-default-0123456789abcdef".to_string(), None),
        ("tfstate-other-0123456789abcdef-c".to_string(), None),
        (format!("x{base}"), None),
    ] {
        assert_eq!(state_chunk_index(s, &name), index, "{name}");
    }
    for i in [0, 1, 2, 31] {
        assert_eq!(state_chunk_index(s, &state_chunk(s, i)), Some(u64::from(i)));
        assert_eq!(
            backup_chunk_index(s, 12, &backup_chunk(s, 12, i)),
            Some(u64::from(i))
        );
    }
    // A backup of serial 1 is not a chunk of the backup of serial 12,
    // nor the other way round.
    assert_eq!(backup_chunk_index(s, 1, &backup_chunk(s, 12, 0)), None);
    assert_eq!(backup_chunk_index(s, 12, &backup_chunk(s, 1, 2)), None);
}

#[test]
fn cluster_write_lease_hashes_namespace_and_cluster() {
    let lease = cluster_write_lease("ns", "prod");
    assert_eq!(
        lease,
        format!("captf-cluster-{}", &sha256_hex(b"ns/prod")[..16])
    );
    assert_ne!(lease, cluster_write_lease("ns", "prod2"));
    assert_ne!(lease, cluster_write_lease("ns2", "prod"));
}

#[test]
fn job_names() {
    let hash = h("0a1b2c");
    assert_eq!(
        job(Kind::Machine, "worker-0", Op::Apply, n(1), &hash),
        "captf-m-worker-0-apply-a1-0a1b2c"
    );
    assert_eq!(
        job(Kind::MachinePool, "p", Op::Destroy, n(12), &hash),
        "captf-mp-p-destroy-a12-0a1b2c"
    );
    assert_eq!(
        job(Kind::Cluster, "c", Op::Restore, n(3), &hash),
        "captf-c-c-restore-a3-0a1b2c"
    );
    for op in Op::ALL {
        let name = job(Kind::Cluster, "c", op, n(1), &hash);
        assert!(name.contains(&format!("-{}-a1-", op.as_str())), "{name}");
    }

    // Exactly 57 stays; 58 hashes the name.
    let fits = "x".repeat(JOB_NAME_MAX - "captf-m--apply-a1-0a1b2c".len());
    let at_cap = job(Kind::Machine, &fits, Op::Apply, n(1), &hash);
    assert_eq!(at_cap.len(), JOB_NAME_MAX);
    assert!(at_cap.contains(&fits));
    let over = format!("{fits}x");
    let hashed = job(Kind::Machine, &over, Op::Apply, n(1), &hash);
    assert_eq!(hashed, format!("captf-m-{}-apply-a1-0a1b2c", hash16(&over)));

    // The cap depends on op and attempt: the same name may fit for one
    // and not for another.
    let name = "y".repeat(JOB_NAME_MAX - "captf-m--plan-a1-0a1b2c".len());
    assert!(job(Kind::Machine, &name, Op::Plan, n(1), &hash).contains(&name));
    assert!(!job(Kind::Machine, &name, Op::Destroy, n(1), &hash).contains(&name));
    assert!(!job(Kind::Machine, &name, Op::Plan, n(10), &hash).contains(&name));

    // The longest hashed name still fits.
    let longest = job(
        Kind::MachinePool,
        &"z".repeat(253),
        Op::Destroy,
        n(u32::MAX),
        &hash,
    );
    assert!(
        longest.len() <= JOB_NAME_MAX,
        "{longest} is {}",
        longest.len()
    );
    assert_eq!(longest.len(), 52);
}

#[test]
fn hash6_accepts_six_lowercase_hex_only() {
    for ok in ["000000", "abcdef", "0a9f3c"] {
        assert_eq!(Hash6::new(ok).unwrap().as_str(), ok);
    }
    for bad in [
        "", "abcde", "abcdef0", "ABCDEF", "abcdeg", "-12345", "ａbcde",
    ] {
        assert!(Hash6::new(bad).is_none(), "{bad}");
    }
    assert_eq!(Hash6::of(b"abc").as_str(), "ba7816");
}

#[test]
fn secrets_and_rbac() {
    assert_eq!(
        run_secret("captf-m-w-apply-a1-0a1b2c"),
        "captf-run-captf-m-w-apply-a1-0a1b2c"
    );
    assert_eq!(
        inputs_secret(Kind::MachinePool, "pool"),
        "captf-inputs-mp-pool"
    );
    assert_eq!(inputs_secret(Kind::Cluster, "c1"), "captf-inputs-c-c1");
    assert_eq!(credentials_mirror("aws"), "captf-creds-aws");
    assert_eq!(plan_key(Kind::Cluster, "c1"), "captf-plankey-c-c1");
    assert_eq!(RUNNER_RBAC, "captf-runner");
    assert_eq!(
        run_credentials("captf-m-w-destroy-a1-0a1b2c"),
        "captf-run-captf-m-w-destroy-a1-0a1b2c-creds"
    );
    assert_eq!(
        away_runner("team-a"),
        format!("captf-runner-{}", &sha256_hex(b"team-a")[..16])
    );
    assert_ne!(away_runner("team-a"), away_runner("team-b"));

    // Names that would pass 253 characters are shortened to prefix+hash.
    let long = "n".repeat(253);
    assert_eq!(
        inputs_secret(Kind::Machine, &long),
        format!("captf-inputs-m-{}", hash16(&long))
    );
    assert_eq!(
        credentials_mirror(&long),
        format!("captf-creds-{}", hash16(&long))
    );
    assert_eq!(
        plan_key(Kind::Machine, &long),
        format!("captf-plankey-m-{}", hash16(&long))
    );
    let fits = "n".repeat(253 - "captf-inputs-m-".len());
    assert_eq!(inputs_secret(Kind::Machine, &fits).len(), 253);
    assert!(inputs_secret(Kind::Machine, &fits).ends_with(&fits));
}

#[test]
fn label_values() {
    assert_eq!(label_value("short"), "short");
    let at_cap = "a".repeat(63);
    assert_eq!(label_value(&at_cap), at_cap);
    let over = "a".repeat(64);
    assert_eq!(label_value(&over), sha256_hex(over.as_bytes())[..16]);
    assert_eq!(label_value(&over).len(), 16);
    // Every hashed value is recognised as one; a short name rarely.
    assert!(may_be_label_hash(&label_value(&over)));
    assert!(!may_be_label_hash(&label_value("short")));
    assert!(!may_be_label_hash("0123456789abcdeF"));
}

#[test]
fn own_runner_pods() {
    let hash = h("0a1b2c");
    let own_job = job(Kind::Machine, "foo", Op::Apply, n(1), &hash);
    let long = "l".repeat(60);
    let long_job = job(Kind::Machine, &long, Op::Drift, n(2), &hash);
    assert!(long_job.contains(&hash16(&long)));
    let short_hashed = format!("captf-m-{}-apply-a1-0a1b2c-abcde", hash16("foo"));

    let table: &[(Kind, &str, &str, bool)] = &[
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p",
            true,
        ),
        (Kind::Machine, "foo", &format!("{own_job}-00000"), true),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-plan-a1-ffffff-abcde",
            true,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-destroy-a10-123456-zzzzz",
            true,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-refresh-a3-123456-a1b2c",
            true,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-drift-a3-123456-a1b2c",
            true,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-restore-a3-123456-a1b2c",
            true,
        ),
        (Kind::Machine, &long, &format!("{long_job}-q1w2e"), true),
        (
            Kind::Machine,
            "foo-bar",
            "captf-m-foo-bar-apply-a1-0a1b2c-x7k2p",
            true,
        ),
        // A pod of object "foo-apply" is not one of "foo"'s, and the
        // other way round.
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo-apply",
            "captf-m-foo-apply-apply-a1-0a1b2c-x7k2p",
            true,
        ),
        (
            Kind::Machine,
            "foo-apply",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        // Object "foo-bar" against "foo", and "foo" against "fo".
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-bar-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "fo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        // Another kind with a name that makes the same text.
        (
            Kind::Machine,
            "p-x",
            "captf-mp-x-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::MachinePool,
            "x",
            "captf-mp-x-apply-a1-0a1b2c-x7k2p",
            true,
        ),
        (
            Kind::Cluster,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        // The hashed name only where the name would not fit.
        (Kind::Machine, "foo", &short_hashed, false),
        (
            Kind::Machine,
            &long,
            &format!("captf-m-{long}-drift-a2-0a1b2c-q1w2e"),
            false,
        ),
        // Shapes the pattern refuses.
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a0-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a01-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a99999999999-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0A1B2C-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2cd-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2pq",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-X7K2P",
            false,
        ),
        (Kind::Machine, "foo", "captf-m-foo-apply-a1-0a1b2c", false),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p-",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "xcaptf-m-foo-apply-a1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-apply-a1-0a1b2c-x7k2p.local",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-sync-a1-0a1b2c-x7k2p",
            false,
        ),
        (
            Kind::Machine,
            "foo",
            "captf-m-foo-Apply-a1-0a1b2c-x7k2p",
            false,
        ),
        (Kind::Machine, "foo", "", false),
        (Kind::Machine, "foo", "-----", false),
        (Kind::Machine, "foo", "workstation", false),
    ];
    for (kind, name, hostname, want) in table {
        assert_eq!(
            is_own_runner_pod(*kind, name, hostname),
            *want,
            "{kind:?} {name} {hostname}"
        );
    }
}
