use super::*;
use captf::error::{Categorized, Category};

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

#[test]
fn container_paths_stay_in_the_root() {
    let root = Path::new("/r");
    let cases: &[(&str, Option<&str>)] = &[
        ("/captf/work", Some("/r/captf/work")),
        ("/captf/./bin/", Some("/r/captf/bin")),
        ("/", Some("/r")),
        ("captf/work", None),
        ("/captf/../etc", None),
    ];
    for (path, want) in cases {
        let got = in_root(root, path).ok();
        assert_eq!(got.as_deref(), want.map(Path::new), "{path}");
    }
    let items: &[(&str, bool)] = &[
        ("restore/0", true),
        ("token", true),
        ("../x", false),
        ("/x", false),
        ("", false),
    ];
    for (path, ok) in items {
        assert_eq!(item_path(path).is_ok(), *ok, "{path:?}");
    }
}

#[test]
fn volume_files_follow_the_items_and_modes() {
    let data = BTreeMap::from([
        ("a".to_string(), b"1".to_vec()),
        ("b".to_string(), b"2".to_vec()),
    ]);
    let item = |key: &str, path: &str, mode: Option<i32>| KeyToPath {
        key: key.into(),
        path: path.into(),
        mode,
    };
    let file = |path: &str, contents: &[u8], mode: u32| VolumeFile {
        path: PathBuf::from(path),
        contents: contents.to_vec(),
        mode,
    };
    let all = key_files("secret", "s", &data, None, 0o440, false).unwrap();
    assert_eq!(all, vec![file("a", b"1", 0o440), file("b", b"2", 0o440)]);

    let items = [item("b", "restore/0", None), item("a", "x", Some(0o400))];
    let some = key_files("secret", "s", &data, Some(&items), 0o440, false).unwrap();
    assert_eq!(
        some,
        vec![file("restore/0", b"2", 0o440), file("x", b"1", 0o400)]
    );

    let missing = [item("c", "c", None)];
    let error = key_files("secret", "s", &data, Some(&missing), 0o440, false).unwrap_err();
    assert!(
        matches!(error, PodError::MissingKey { ref key, .. } if key == "c"),
        "{error}"
    );
    assert_eq!(error.category(), Category::Transient);
    assert_eq!(
        key_files("secret", "s", &data, Some(&missing), 0o440, true).unwrap(),
        vec![]
    );

    let escaping = [item("a", "../a", None)];
    assert!(key_files("secret", "s", &data, Some(&escaping), 0o440, false).is_err());
}

#[test]
fn downward_fields_resolve_from_the_pod() {
    let pod = pod(serde_json::json!({
        "metadata": { "name": "p", "namespace": "ns", "uid": "u-1", "labels": { "job-name": "j", "a": "b" } },
        "spec": { "containers": [], "serviceAccountName": "captf-runner" },
    }));
    let cases: &[(&str, Option<&str>)] = &[
        ("metadata.name", Some("p")),
        ("metadata.namespace", Some("ns")),
        ("metadata.uid", Some("u-1")),
        ("metadata.labels['job-name']", Some("j")),
        ("metadata.labels['none']", Some("")),
        ("metadata.labels", Some("a=\"b\"\njob-name=\"j\"")),
        ("spec.nodeName", Some(NODE)),
        ("spec.serviceAccountName", Some("captf-runner")),
        ("status.podIP", None),
    ];
    for (path, want) in cases {
        assert_eq!(field_value(&pod, path).ok().as_deref(), *want, "{path}");
    }
    let files = downward_files(
        &pod,
        &[DownwardAPIVolumeFile {
            path: "namespace".into(),
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: "metadata.namespace".into(),
                api_version: None,
            }),
            ..Default::default()
        }],
        0o644,
    )
    .unwrap();
    assert_eq!(
        files,
        vec![VolumeFile {
            path: "namespace".into(),
            contents: b"ns".to_vec(),
            mode: 0o644
        }]
    );
}
