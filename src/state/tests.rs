use super::*;

#[test]
fn reasons_statuses_and_metric_labels() {
    let read = StateReadable::Read(State {
        serial: 3,
        lineage: "l".into(),
        terraform_version: "1.12.6".into(),
        outputs: BTreeMap::new(),
        managed_resources: 2,
        compressed_bytes: 10,
        decompressed_bytes: 20,
    });
    let table = [
        (read, "StateRead", "True", None),
        (StateReadable::NotFound, "StateNotFound", "Unknown", None),
        (
            StateReadable::Unreadable(Unreadable::Corrupt(Corruption::TooLarge)),
            "StateCorrupt",
            "False",
            Some("corrupt"),
        ),
        (
            StateReadable::Unreadable(Unreadable::Inconsistent(Inconsistency::Stray {
                name: "x".into(),
            })),
            "StateInconsistent",
            "False",
            Some("inconsistent"),
        ),
        (
            StateReadable::Unreadable(Unreadable::Encrypted),
            "StateEncrypted",
            "False",
            Some("encrypted"),
        ),
    ];
    for (outcome, reason, status, metric) in table {
        assert_eq!(outcome.reason().as_str(), reason);
        assert_eq!(outcome.reason().status(), status);
        assert_eq!(outcome.metric_reason(), metric);
        assert!(!outcome.message().is_empty());
    }
}

#[test]
fn a_kept_snapshot_holds_only_what_later_passes_read() {
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    let strings = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let owner = OwnerReference {
        name: "m".into(),
        uid: "u-1".into(),
        ..Default::default()
    };
    let read = Snapshot {
        readable: StateReadable::NotFound,
        secrets: vec![Secret {
            metadata: ObjectMeta {
                name: Some("tfstate-default-s".into()),
                namespace: Some("ns".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                owner_references: Some(vec![owner.clone()]),
                finalizers: Some(vec!["f".into()]),
                annotations: strings(&[(crate::keys::INPUTS_HASH, "h")]),
                labels: strings(&[("tfstate", "true")]),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            data: Some([("tfstate".to_string(), ByteString(vec![1; 64]))].into()),
            ..Default::default()
        }],
    };
    let kept = read.without_data();
    let expected = ObjectMeta {
        name: Some("tfstate-default-s".into()),
        uid: Some("uid-1".into()),
        resource_version: Some("42".into()),
        owner_references: Some(vec![owner]),
        finalizers: Some(vec!["f".into()]),
        annotations: strings(&[(crate::keys::INPUTS_HASH, "h")]),
        ..Default::default()
    };
    assert_eq!(kept.secrets.len(), 1);
    assert_eq!(kept.secrets[0].metadata, expected);
    assert_eq!(kept.secrets[0].data, None);
    assert!(kept.base("s").is_some());
}

#[test]
fn near_limit_is_strictly_above_900_kib() {
    assert_eq!(NEAR_SECRET_LIMIT, 921_600);
    for (bytes, due) in [
        (0, false),
        (921_599, false),
        (921_600, false),
        (921_601, true),
        (1 << 20, true),
    ] {
        assert_eq!(near_secret_limit(bytes), due, "{bytes}");
    }
    let mut state = State {
        serial: 1,
        lineage: String::new(),
        terraform_version: String::new(),
        outputs: BTreeMap::new(),
        managed_resources: 0,
        compressed_bytes: 921_600,
        decompressed_bytes: 0,
    };
    assert_eq!(state.near_secret_limit_note(), None);
    state.compressed_bytes = 921_601;
    assert!(state.near_secret_limit_note().unwrap().contains("921601"));
}

#[test]
fn sensitive_values_never_show_in_debug() {
    let value = Sensitive::new(Json("\"hunter2\"".into()));
    assert_eq!(format!("{value:?}"), "(sensitive)");
    assert_eq!(format!("{value:#?}"), "(sensitive)");
    let output = Output {
        value: OutputValue::Sensitive(value),
        type_: Json("\"string\"".into()),
    };
    assert!(output.sensitive());
    assert!(!format!("{output:?}").contains("hunter2"));
    assert_eq!(output.value.expose().as_str(), "\"hunter2\"");
}

#[test]
fn label_selector_is_the_backends() {
    assert_eq!(
        label_selector("abc-m"),
        "tfstate=true,tfstateSecretSuffix=abc-m,tfstateWorkspace=default"
    );
}

/// A jemalloc value read by name; `refresh` first updates its statistics.
fn jemalloc_stat(name: &std::ffi::CStr) -> usize {
    let mut epoch: u64 = 1;
    let mut value: usize = 0;
    let mut len = std::mem::size_of::<usize>();
    // SAFETY: NUL-terminated names; `epoch` takes a u64, the page counts
    // are size_t, each buffer sized as jemalloc's manual says.
    unsafe {
        let refreshed = tikv_jemalloc_sys::mallctl(
            c"epoch".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut epoch).cast(),
            std::mem::size_of::<u64>(),
        );
        assert_eq!(refreshed, 0);
        let read = tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        );
        assert_eq!(read, 0, "{name:?}");
    }
    value
}

#[test]
fn freed_pages_are_handed_back_after_a_read() {
    use std::alloc::{GlobalAlloc, Layout};
    // Blocks of the size a read frees, through jemalloc as the manager
    // allocates (this test binary runs on the system's allocator).
    let layout = Layout::from_size_align(512 * 1024, 8).unwrap();
    let jemalloc = tikv_jemallocator::Jemalloc;
    let blocks: Vec<*mut u8> = (0..8)
        .map(|_| {
            // SAFETY: a non-zero layout; each block is written whole, then
            // freed once with the same layout.
            unsafe {
                let block = jemalloc.alloc(layout);
                assert!(!block.is_null());
                block.write_bytes(1, layout.size());
                block
            }
        })
        .collect();
    for block in blocks {
        // SAFETY: allocated above with this layout.
        unsafe { jemalloc.dealloc(block, layout) };
    }
    let dirty = c"stats.arenas.4096.pdirty";
    assert!(jemalloc_stat(dirty) > 0, "freed pages stay until the decay");
    assert!(hand_back_freed_pages());
    assert_eq!(jemalloc_stat(dirty), 0);
}
