//! Real OpenTofu through the kubernetes backend.

use super::*;

/// A working directory with `module`'s files, initialized against the
/// kubernetes backend in `ns` with `suffix`.
async fn init_module(module: &str, ns: &str, suffix: &str) -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/modules")
        .join(module);
    std::fs::copy(source.join("main.tf"), work.path().join("main.tf")).unwrap();
    std::fs::create_dir(work.path().join("home")).unwrap();
    let config_path = format!(
        "-backend-config=config_path={}",
        controlplane::shared().kubeconfig().display()
    );
    let namespace = format!("-backend-config=namespace={ns}");
    let secret_suffix = format!("-backend-config=secret_suffix={suffix}");
    run_ok(
        tofu(
            work.path(),
            &work.path().join("home"),
            &[
                "init",
                "-no-color",
                &config_path,
                &namespace,
                &secret_suffix,
            ],
        ),
        "tofu init",
    )
    .await;
    work
}

async fn apply(work: &Path, vars: &[&str]) {
    let mut args = vec!["apply", "-auto-approve", "-no-color"];
    args.extend_from_slice(vars);
    run_ok(tofu(work, &work.join("home"), &args), "tofu apply").await;
}

/// The state as an independent reader sees it: the base Secret's payload,
/// gunzipped and parsed whole by serde_json.
async fn oracle(secrets: &Api<Secret>, suffix: &str) -> (Secret, Value) {
    let secret = secrets.get(&names::state_secret(suffix)).await.unwrap();
    let payload = &secret.data.as_ref().unwrap()["tfstate"].0;
    let value = serde_json::from_slice(&gunzip(payload)).unwrap();
    (secret, value)
}

/// Checks a read state against the oracle field by field.
fn agrees_with_oracle(read: &State, oracle: &Value, payload_len: usize) {
    assert_eq!(oracle["version"], 4);
    assert_eq!(Some(read.serial), oracle["serial"].as_u64());
    assert_eq!(Some(read.lineage.as_str()), oracle["lineage"].as_str());
    assert_eq!(
        Some(read.terraform_version.as_str()),
        oracle["terraform_version"].as_str()
    );
    assert_eq!(read.compressed_bytes, payload_len as u64);
    let outputs = oracle["outputs"].as_object().unwrap();
    assert_eq!(read.outputs.len(), outputs.len());
    for (name, expected) in outputs {
        let output = &read.outputs[name];
        assert_eq!(
            output.value.expose().to_value().unwrap(),
            expected["value"],
            "{name}"
        );
        assert_eq!(output.type_.to_value().unwrap(), expected["type"], "{name}");
        assert_eq!(output.sensitive(), expected["sensitive"] == true, "{name}");
    }
}

#[tokio::test]
async fn opentofu_states_read_back() {
    let (_, ns, secrets, suffix) = setup("state-tofu").await;
    assert_eq!(
        read(&secrets, &suffix).await,
        StateReadable::NotFound,
        "before any apply"
    );

    let work = init_module("state-single", &ns, &suffix).await;
    apply(work.path(), &[]).await;

    // What a real state Secret carries: exactly the backend's labels.
    let (secret, value) = oracle(&secrets, &suffix).await;
    assert_eq!(
        secret.metadata.labels.clone().unwrap(),
        backend_labels(&suffix)
    );
    let payload_len = secret.data.as_ref().unwrap()["tfstate"].0.len();

    let first = read_ok(read(&secrets, &suffix).await);
    agrees_with_oracle(&first, &value, payload_len);
    assert_eq!(first.terraform_version, "1.12.6");
    assert_eq!(first.managed_resources, 1);
    assert!(!state::near_secret_limit(first.compressed_bytes));

    let plain = |name: &str| {
        let output = &first.outputs[name];
        assert!(!output.sensitive(), "{name}");
        (
            output.value.expose().as_str().to_owned(),
            output.type_.as_str().to_owned(),
        )
    };
    assert_eq!(
        plain("plain_string"),
        (r#""hello""#.into(), r#""string""#.into())
    );
    assert_eq!(plain("plain_number"), ("6443".into(), r#""number""#.into()));
    // Every digit survives, where a float would not.
    assert_eq!(
        plain("plain_big_number").0,
        "123456789012345678901234567890"
    );
    assert_eq!(
        plain("plain_list"),
        (r#"["a","b"]"#.into(), r#"["list","string"]"#.into())
    );
    assert_eq!(
        plain("plain_object"),
        (
            r#"{"host":"10.0.0.1","port":6443}"#.into(),
            r#"["object",{"host":"string","port":"number"}]"#.into()
        )
    );
    for (name, value) in [
        ("secret_string", r#""hunter2-hello""#),
        ("secret_number", "7777123"),
        ("secret_list", r#"["s3cr3t-a","s3cr3t-b"]"#),
        ("secret_object", r#"{"token":"t0k3n-xyz","ttl":3600}"#),
    ] {
        let output = &first.outputs[name];
        assert!(output.sensitive(), "{name}");
        assert_eq!(output.value.expose().as_str(), value, "{name}");
    }
    // No sensitive value in Debug output or in the condition message.
    let outcome = StateReadable::Read(first.clone());
    let shown = format!("{first:?} {first:#?} {outcome:?} {}", outcome.message());
    for secret in ["hunter2", "7777123", "s3cr3t", "t0k3n"] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }
    assert!(shown.contains("(sensitive)"));

    // A second apply: a new serial, the same lineage.
    apply(work.path(), &["-var=message=again"]).await;
    let second = read_ok(read(&secrets, &suffix).await);
    assert!(
        second.serial > first.serial,
        "{} then {}",
        first.serial,
        second.serial
    );
    assert_eq!(second.lineage, first.lineage);
    assert_eq!(
        second.outputs["plain_string"].value.expose().as_str(),
        r#""again""#
    );
}

/// Applies `module` and checks the read against the oracle; returns the
/// oracle's resources.
async fn apply_and_compare(
    module: &str,
    prefix: &str,
    extra: Option<(&str, &str)>,
) -> (State, Vec<Value>) {
    let (_, ns, secrets, suffix) = setup(prefix).await;
    let work = init_module(module, &ns, &suffix).await;
    if let Some((name, content)) = extra {
        std::fs::write(work.path().join(name), content).unwrap();
    }
    apply(work.path(), &[]).await;
    let (secret, value) = oracle(&secrets, &suffix).await;
    let read = read_ok(read(&secrets, &suffix).await);
    agrees_with_oracle(
        &read,
        &value,
        secret.data.as_ref().unwrap()["tfstate"].0.len(),
    );
    (read, value["resources"].as_array().unwrap().clone())
}

#[tokio::test]
async fn opentofu_count_of_three_counts_once() {
    let (read, resources) = apply_and_compare("state-count", "state-count", None).await;
    assert_eq!(resources.len(), 1);
    assert_eq!(
        resources[0]["instances"].as_array().unwrap().len(),
        3,
        "the premise: three instances"
    );
    assert_eq!(read.managed_resources, 1);
    assert_eq!(
        read.outputs["inputs"].value.expose().as_str(),
        r#"["instance-0","instance-1","instance-2"]"#
    );
}

#[tokio::test]
async fn opentofu_for_each_over_two_keys_counts_once() {
    let (read, resources) = apply_and_compare("state-for-each", "state-each", None).await;
    assert_eq!(resources.len(), 1);
    let keys: Vec<&Value> = resources[0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["index_key"])
        .collect();
    assert_eq!(
        keys,
        ["blue", "green"],
        "the premise: two instances, by key"
    );
    assert_eq!(read.managed_resources, 1);
    assert_eq!(
        read.outputs["keys"].value.expose().as_str(),
        r#"["blue","green"]"#
    );
}

#[tokio::test]
async fn opentofu_data_source_does_not_count() {
    let upstream = r#"{"version": 4, "terraform_version": "1.12.6", "serial": 1,
        "lineage": "00000000-0000-4000-8000-000000000001",
        "outputs": {"greeting": {"value": "hi from upstream", "type": "string"}},
        "resources": [], "check_results": null}"#;
    let (read, resources) = apply_and_compare(
        "state-data",
        "state-data",
        Some(("upstream.tfstate", upstream)),
    )
    .await;
    assert_eq!(resources.len(), 1);
    assert_eq!(
        resources[0]["mode"], "data",
        "the premise: the state records the data source"
    );
    assert_eq!(read.managed_resources, 0);
    assert_eq!(
        read.outputs["upstream_greeting"].value.expose().as_str(),
        r#""hi from upstream""#
    );
}

#[tokio::test]
async fn opentofu_encrypted_state_is_reported_encrypted() {
    let (_, ns, secrets, suffix) = setup("state-enc").await;
    let work = init_module("state-encrypted", &ns, &suffix).await;
    apply(work.path(), &[]).await;
    let (_, envelope) = oracle(&secrets, &suffix).await;
    assert!(
        envelope["encryption_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{envelope}"
    );
    assert!(envelope.get("version").is_none());
    let outcome = read(&secrets, &suffix).await;
    assert_eq!(outcome, StateReadable::Unreadable(Unreadable::Encrypted));
    assert_eq!(outcome.reason().as_str(), "StateEncrypted");
    assert_eq!(outcome.metric_reason(), Some("encrypted"));
    assert!(!outcome.message().contains("never-readable"));
}
