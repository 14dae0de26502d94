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

mod chunked;
mod documents;
mod fuzz;
mod opentofu;

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
