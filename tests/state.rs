//! The state layer against real OpenTofu states on the test control plane,
//! Terraform's chunked shape written by hand, every broken variant, and a
//! seeded fuzz that compares the streaming reader with serde_json.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use captf::names::{self, Kind};
use captf::state::{
    self, ChunkSecret, Corruption, Inconsistency, State, StateReadable, Unreadable,
};
use captf_testkit::controlplane;
use captf_testkit::{run_ok, tofu};
use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::Deserialize;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

// ---------------------------------------------------------------------------
// A per-thread count of heap bytes, to show that reading stays bounded.

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are const-initialized thread locals without destructors, so
// touching them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            note(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result and the peak of heap bytes it held on
/// this thread above what was live before.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let out = f();
    (out, (PEAK.with(Cell::get) - before).max(0) as usize)
}

// ---------------------------------------------------------------------------
// Helpers.

const MIB: usize = 1 << 20;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// The labels Terraform's and OpenTofu's kubernetes backend put on every
/// state Secret (read from a real one in `opentofu_states_read_back`).
fn backend_labels(suffix: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".into(), "terraform".into()),
        ("tfstate".into(), "true".into()),
        ("tfstateSecretSuffix".into(), suffix.into()),
        ("tfstateWorkspace".into(), "default".into()),
    ])
}

/// Writes a Secret with the backend's labels; `payload` None leaves out the
/// `tfstate` key.
async fn put(secrets: &Api<Secret>, name: &str, suffix: &str, payload: Option<&[u8]>) {
    put_in_workspace(secrets, name, suffix, "default", payload).await;
}

/// [`put`], labelled as the backend labels a state of `workspace`.
async fn put_in_workspace(
    secrets: &Api<Secret>,
    name: &str,
    suffix: &str,
    workspace: &str,
    payload: Option<&[u8]>,
) {
    let mut labels = backend_labels(suffix);
    labels.insert("tfstateWorkspace".into(), workspace.into());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([("encoding".into(), "gzip".into())])),
            ..Default::default()
        },
        data: payload.map(|bytes| BTreeMap::from([("tfstate".into(), ByteString(bytes.to_vec()))])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
}

/// Terraform's shape: the gzip cut into 1 MiB pieces, in the base Secret and
/// `-part-1`, `-part-2`, ...
async fn put_chunked(secrets: &Api<Secret>, suffix: &str, compressed: &[u8]) -> usize {
    let pieces: Vec<&[u8]> = compressed.chunks(MIB).collect();
    for (index, piece) in pieces.iter().enumerate() {
        put(
            secrets,
            &names::state_chunk(suffix, index as u32),
            suffix,
            Some(piece),
        )
        .await;
    }
    pieces.len()
}

/// A namespace, its Secrets API and an object's suffix in it.
async fn setup(prefix: &str) -> (kube::Client, String, Api<Secret>, String) {
    let client = controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, prefix).await;
    let secrets = Api::namespaced(client.clone(), &ns);
    let suffix = names::suffix(&ns, Kind::Machine, "worker-0");
    (client, ns, secrets, suffix)
}

async fn read(secrets: &Api<Secret>, suffix: &str) -> StateReadable {
    state::read(secrets, suffix).await.unwrap()
}

fn read_ok(outcome: StateReadable) -> State {
    match outcome {
        StateReadable::Read(state) => state,
        other => panic!("expected a read state, got {other:?}"),
    }
}

/// A deterministic generator (xorshift64*), so that every failure replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn word(&mut self, words: &[&'static str]) -> &'static str {
        words[self.below(words.len())]
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn base64(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..len).map(|_| char::from(*self.pick(ALPHABET))).collect()
    }
}

/// A version 4 state of `instances` instances in resources of up to 10,
/// with `attribute_bytes` of hard-to-compress attributes each.
fn synthetic_state(
    rng: &mut Rng,
    serial: u64,
    instances: usize,
    attribute_bytes: usize,
) -> (String, u64) {
    let mut resources = Vec::new();
    let mut left = instances;
    while left > 0 {
        let count = left.min(10);
        left -= count;
        let items: Vec<Value> = (0..count)
            .map(|i| {
                serde_json::json!({
                    "index_key": i,
                    "schema_version": 0,
                    "attributes": {"id": rng.base64(16), "blob": rng.base64(attribute_bytes), "n": [1, 2.5, -3e2]},
                    "sensitive_attributes": []
                })
            })
            .collect();
        resources.push(serde_json::json!({
            "mode": "managed", "type": "terraform_data", "name": format!("r{}", resources.len()),
            "provider": "provider[\"terraform.io/builtin/terraform\"]", "instances": items
        }));
    }
    let managed = resources.len() as u64;
    resources.push(serde_json::json!({"mode": "data", "type": "terraform_remote_state", "name": "up", "instances": [{"attributes": {}}]}));
    let document = serde_json::json!({
        "version": 4, "terraform_version": "1.12.6", "serial": serial,
        "lineage": "7c0e6e4e-1f0b-4b35-9d3a-5a5f5d1b2c3d",
        "outputs": {"endpoint": {"value": "10.0.0.1", "type": "string"}},
        "resources": resources, "check_results": null
    });
    (serde_json::to_string_pretty(&document).unwrap(), managed)
}

// ---------------------------------------------------------------------------
// Real OpenTofu through the kubernetes backend.

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

// ---------------------------------------------------------------------------
// Terraform's chunked shape and its broken variants, written by hand.

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

// ---------------------------------------------------------------------------
// Seeded fuzz: bounded and reproducible (CAPTF_FUZZ_SEED replays another).

fn seed() -> u64 {
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
fn random_state(rng: &mut Rng) -> String {
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
fn mutate(rng: &mut Rng, text: &str) -> Vec<u8> {
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
