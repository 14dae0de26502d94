//! The state layer (book: terraform-state.md): everything the controller knows
//! about an object's Terraform or OpenTofu state comes from here.
//!
//! Its only I/O is one label-selected list of Secrets ([`read`]), decoded
//! from the response's bytes without kube's copy of them as text. The rest is
//! pure: [`chunks::assemble`] decides whether the listed Secrets make one whole
//! chunk set and orders it; [`read_chunks`] inflates the concatenated payloads
//! under the caps and parses the state in one streaming pass, without ever
//! holding the decompressed document or the resource instances' attributes
//! (a large state inflates on a second thread meanwhile). What it keeps is
//! capped too ([`MAX_OUTPUTS`], [`MAX_LINEAGE`], [`MAX_TERRAFORM_VERSION`]):
//! a state past a cap is corrupt. A state is either read whole or reported
//! unreadable: never partly.
//!
//! The layer returns plain data and emits nothing itself. The reconciler turns
//! a [`StateReadable`] into
//! - the StateReadable condition: [`StateReadable::reason`] (the reason string
//!   of reference §3, and through [`Reason::status`] the condition status) and
//!   [`StateReadable::message`] (names what is wrong, never any state content);
//! - the metrics: `captf_state_read_errors_total{kind,reason}` with
//!   [`StateReadable::metric_reason`], and the `captf_state_bytes` and
//!   `captf_state_resources` gauges from [`State::compressed_bytes`] and
//!   [`State::managed_resources`];
//! - the StateUnreadable Warning event for an unreadable state, and the
//!   [`NEAR_SECRET_LIMIT_REASON`] Warning event when
//!   [`near_secret_limit`] says the compressed state passed 900 KiB.
//!
//! Sensitive output values are held in [`Sensitive`], whose Debug prints
//! `(sensitive)` and which has no Display, so they reach no log, event or
//! Debug output by accident.

mod capture;
pub mod chunks;
mod envelope;
mod lexer;
mod parse;
mod read;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use tokio::sync::Semaphore;

use crate::error::{Categorized, Category, kube_category};
pub use chunks::ChunkSecret;
pub use read::read_chunks;

/// At most this many chunk Secrets are read.
pub const MAX_CHUNKS: usize = 32;

/// At most this many bytes of decompressed state are read (64 MiB).
pub const MAX_DECOMPRESSED: u64 = 64 * 1024 * 1024;

/// At most this much of the root module's outputs is kept (4 MiB): their
/// names, values and types as compact JSON text, plus [`OUTPUT_COST`] for
/// each. The cap bounds what the reader holds, since the stream's cap does
/// not: a state of a few KiB compressed inflates to a 60 MiB value. Outputs
/// only reach Kubernetes objects (status, a pool's providerIDList, the
/// machines' inputs Secrets), each at most about 1 MiB; four times that
/// leaves room for the escapes a state spells values with (Terraform writes
/// `<`, `>` and `&` as 6-byte `\u` escapes), and for pools with more
/// instances than status keeps.
pub const MAX_OUTPUTS: usize = 4 * 1024 * 1024;

/// What each output is charged beyond its text, about what its map entry
/// and its three allocations cost: a million tiny outputs are refused as one
/// huge one is.
pub const OUTPUT_COST: usize = 128;

/// The longest lineage read. Terraform and OpenTofu write a 36-character
/// UUID; the lineage goes into the annotations of every backup chunk, which
/// hold 256 KiB together.
pub const MAX_LINEAGE: usize = 256;

/// The longest terraform_version read: a version such as
/// `1.12.0-alpha20250319`, with room for build metadata.
pub const MAX_TERRAFORM_VERSION: usize = 128;

/// A compressed state above this size (900 KiB) is near the 1 MiB a single
/// Secret can hold, which is all OpenTofu can write.
pub const NEAR_SECRET_LIMIT: u64 = 900 * 1024;

/// The reason of the Warning event that [`near_secret_limit`] calls for.
pub const NEAR_SECRET_LIMIT_REASON: &str = "StateNearSecretLimit";

/// The data key of a state chunk.
pub const TFSTATE_KEY: &str = "tfstate";

/// Whether a compressed state of this size calls for the near-limit Warning.
pub fn near_secret_limit(compressed_bytes: u64) -> bool {
    compressed_bytes > NEAR_SECRET_LIMIT
}

/// The label selector of the backend's state Secrets for `suffix`. The
/// backend labels each Secret with its workspace too; CAPTF's state is
/// always in `default`, and another workspace's Secrets are not its chunks.
pub fn label_selector(suffix: &str) -> String {
    labels(suffix).map(|(k, v)| format!("{k}={v}")).join(",")
}

/// The backend's label of a state Secret's suffix.
pub const SUFFIX_LABEL: &str = "tfstateSecretSuffix";

/// The labels the backend puts on the state Secrets of `suffix`.
pub fn labels(suffix: &str) -> [(&'static str, String); 3] {
    [
        ("tfstate", "true".to_owned()),
        (SUFFIX_LABEL, suffix.to_owned()),
        ("tfstateWorkspace", "default".to_owned()),
    ]
}

/// What CAPTF reads from a state.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub serial: u64,
    pub lineage: String,
    pub terraform_version: String,
    /// The root module's outputs, by name.
    pub outputs: BTreeMap<String, Output>,
    /// Managed resources with a current object, in every module; a resource
    /// with count or for_each counts once; data sources and resources left
    /// with only deposed objects do not count.
    pub managed_resources: u64,
    /// The summed size of the chunks' payloads, as stored.
    pub compressed_bytes: u64,
    pub decompressed_bytes: u64,
}

impl State {
    /// The note of the near-limit Warning event, when one is due.
    pub fn near_secret_limit_note(&self) -> Option<String> {
        near_secret_limit(self.compressed_bytes).then(|| {
            format!(
                "the compressed state is {} bytes, above {} bytes; a single state Secret holds at most 1 MiB",
                self.compressed_bytes, NEAR_SECRET_LIMIT
            )
        })
    }
}

/// A root module output.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub value: OutputValue,
    /// The type, as the state records it (cty's JSON type notation).
    pub type_: Json,
}

impl Output {
    pub fn sensitive(&self) -> bool {
        matches!(self.value, OutputValue::Sensitive(_))
    }

    /// A sensitive output holding the JSON text `json`, as the rendered
    /// root's outputs are.
    #[cfg(test)]
    pub(crate) fn sensitive_json(json: &str) -> Output {
        Output {
            value: OutputValue::Sensitive(Sensitive::new(Json(json.into()))),
            type_: Json("\"dynamic\"".into()),
        }
    }
}

/// An output's value: a sensitive one is only reachable through
/// [`Sensitive::expose`].
#[derive(Clone, Debug, PartialEq)]
pub enum OutputValue {
    Plain(Json),
    Sensitive(Sensitive<Json>),
}

impl OutputValue {
    /// The value, sensitive or not; the caller takes care of where it goes.
    pub fn expose(&self) -> &Json {
        match self {
            OutputValue::Plain(json) => json,
            OutputValue::Sensitive(secret) => secret.expose(),
        }
    }
}

/// A value that must not be logged: Debug prints `(sensitive)`, and there is
/// no Display.
#[derive(Clone, PartialEq)]
pub struct Sensitive<T>(T);

impl<T> Sensitive<T> {
    pub fn new(value: T) -> Self {
        Sensitive(value)
    }

    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Sensitive<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(sensitive)")
    }
}

/// A JSON value as text, compact (no whitespace outside strings) and exactly
/// as the state spells it otherwise: numbers keep every digit.
#[derive(Clone, PartialEq, Eq)]
pub struct Json(Box<str>);

impl Json {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value as a serde_json Value. Numbers beyond what f64, i64 and u64
    /// hold exactly are rounded there; [`Json::as_str`] keeps them whole.
    pub fn to_value(&self) -> serde_json::Result<serde_json::Value> {
        serde_json::from_str(&self.0)
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The StateReadable reasons this layer decides (reference §3). StateLocked
/// and StateLost are decided elsewhere, from the lock and from status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    StateRead,
    StateNotFound,
    StateCorrupt,
    StateInconsistent,
    StateEncrypted,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::StateRead => "StateRead",
            Reason::StateNotFound => "StateNotFound",
            Reason::StateCorrupt => "StateCorrupt",
            Reason::StateInconsistent => "StateInconsistent",
            Reason::StateEncrypted => "StateEncrypted",
        }
    }

    /// The condition status that goes with the reason: StateNotFound is
    /// Unknown (never applied), the unreadable reasons are False.
    pub const fn status(self) -> &'static str {
        match self {
            Reason::StateRead => "True",
            Reason::StateNotFound => "Unknown",
            Reason::StateCorrupt | Reason::StateInconsistent | Reason::StateEncrypted => "False",
        }
    }
}

/// The outcome of reading an object's state.
#[derive(Clone, Debug, PartialEq)]
pub enum StateReadable {
    Read(State),
    /// No Secret carries the backend's labels for the suffix.
    NotFound,
    Unreadable(Unreadable),
}

impl StateReadable {
    pub fn reason(&self) -> Reason {
        match self {
            StateReadable::Read(_) => Reason::StateRead,
            StateReadable::NotFound => Reason::StateNotFound,
            StateReadable::Unreadable(Unreadable::Corrupt(_)) => Reason::StateCorrupt,
            StateReadable::Unreadable(Unreadable::Inconsistent(_)) => Reason::StateInconsistent,
            StateReadable::Unreadable(Unreadable::Encrypted) => Reason::StateEncrypted,
        }
    }

    /// The condition message. It names chunks, Secrets and caps, and never
    /// any state content.
    pub fn message(&self) -> String {
        match self {
            StateReadable::Read(state) => format!(
                "read state serial {} ({} managed resources, {} bytes compressed)",
                state.serial, state.managed_resources, state.compressed_bytes
            ),
            StateReadable::NotFound => {
                "no state Secret yet: the object was never applied".to_owned()
            }
            StateReadable::Unreadable(why) => why.to_string(),
        }
    }

    /// The `reason` label of `captf_state_read_errors_total`, for an
    /// unreadable state.
    pub fn metric_reason(&self) -> Option<&'static str> {
        match self {
            StateReadable::Unreadable(why) => Some(why.metric_reason()),
            StateReadable::Read(_) | StateReadable::NotFound => None,
        }
    }
}

/// Why a state that exists cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("the state is corrupt: {0}")]
    Corrupt(Corruption),
    #[error("the state's chunk set is inconsistent: {0}")]
    Inconsistent(Inconsistency),
    #[error(
        "the state is wrapped in OpenTofu's client-side encryption envelope; reading an encrypted state is not supported"
    )]
    Encrypted,
}

impl Unreadable {
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Unreadable::Corrupt(_) => "corrupt",
            Unreadable::Inconsistent(_) => "inconsistent",
            Unreadable::Encrypted => "encrypted",
        }
    }
}

impl Categorized for Unreadable {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

/// What makes a state corrupt. The details are fixed phrases and positions,
/// never bytes of the state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("{count} chunk Secrets, more than the cap of {MAX_CHUNKS}")]
    TooManyChunks { count: usize },
    #[error("it decompresses to more than the cap of {MAX_DECOMPRESSED} bytes (64 MiB)")]
    TooLarge,
    #[error(
        "the root module's outputs exceed the cap of {MAX_OUTPUTS} bytes (4 MiB of names, values and types as JSON text, and {OUTPUT_COST} bytes per output); the output at byte {offset} of the decompressed state passes it"
    )]
    OutputsTooLarge { offset: u64 },
    #[error(
        "{field} is longer than the cap of {cap} bytes (the string at byte {offset} of the decompressed state)"
    )]
    TooLong {
        field: &'static str,
        cap: usize,
        offset: u64,
    },
    #[error("gzip: {0}")]
    Gzip(String),
    #[error("invalid JSON at byte {offset} of the decompressed state: {detail}")]
    Json { offset: u64, detail: &'static str },
    #[error("not a state file: {detail} (at byte {offset} of the decompressed state)")]
    Shape { offset: u64, detail: String },
    #[error("the state has no version")]
    NoVersion,
    #[error("unsupported state version {0}; only version 4 is read")]
    UnsupportedVersion(u64),
}

/// What makes a chunk set inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Inconsistency {
    #[error("chunk {index} ({name}) is missing")]
    Missing { index: u32, name: String },
    #[error("chunk index {index} is held by both {first} and {second}")]
    Duplicate {
        index: u64,
        first: String,
        second: String,
    },
    #[error("Secret {name} carries the state's labels but is not one of its chunks")]
    Stray { name: String },
    #[error("chunk {index} ({name}) has no {TFSTATE_KEY} key")]
    NoTfstateKey { index: u64, name: String },
}

/// A failure to find out: the list itself failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("listing the state Secrets: {0}")]
    List(#[from] kube::Error),
    #[error("the state reader task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Categorized for ReadError {
    fn category(&self) -> Category {
        match self {
            ReadError::List(error) => kube_category(error),
            ReadError::Task(_) => Category::Internal,
        }
    }
}

/// Classifies a label-selected list of Secrets: assembles the chunk set,
/// then reads it.
pub fn classify(suffix: &str, secrets: &[ChunkSecret<'_>]) -> StateReadable {
    match chunks::assemble(suffix, secrets) {
        Ok(None) => StateReadable::NotFound,
        Ok(Some(payloads)) => match read_chunks(&payloads) {
            Ok(state) => StateReadable::Read(state),
            Err(why) => StateReadable::Unreadable(why),
        },
        Err(why) => StateReadable::Unreadable(why),
    }
}

/// Reads the state of `suffix` from `secrets` (the object's namespace): one
/// label-selected list, paged so that no more than [`MAX_CHUNKS`] + 1 Secrets
/// are ever held, then [`classify`] on a blocking thread, since inflating and
/// scanning 64 MiB takes a while.
pub async fn read(secrets: &Api<Secret>, suffix: &str) -> Result<StateReadable, ReadError> {
    Ok(snapshot(secrets, suffix).await?.readable)
}

/// A state as read, with the Secrets it was read from: the controller owns
/// and annotates those after a successful apply.
pub struct Snapshot {
    pub readable: StateReadable,
    pub secrets: Vec<Secret>,
}

impl Snapshot {
    /// No state: no Secret carries its labels.
    pub fn not_found() -> Snapshot {
        Snapshot {
            readable: StateReadable::NotFound,
            secrets: Vec::new(),
        }
    }

    /// The same snapshot with only what a later pass reads of its Secrets:
    /// the name, uid and resourceVersion (to know them unchanged and delete
    /// them as read), the owners and finalizers (to adopt them) and the
    /// annotations (the inputs hash). The data, labels and the rest are
    /// dropped: kept for every object, they cost memory at rest.
    pub fn without_data(&self) -> Snapshot {
        Snapshot {
            readable: self.readable.clone(),
            secrets: self
                .secrets
                .iter()
                .map(|s| Secret {
                    metadata: ObjectMeta {
                        name: s.metadata.name.clone(),
                        uid: s.metadata.uid.clone(),
                        resource_version: s.metadata.resource_version.clone(),
                        owner_references: s.metadata.owner_references.clone(),
                        finalizers: s.metadata.finalizers.clone(),
                        annotations: s.metadata.annotations.clone(),
                        ..ObjectMeta::default()
                    },
                    ..Secret::default()
                })
                .collect(),
        }
    }

    /// The base Secret `tfstate-default-<suffix>`, when listed.
    pub fn base<'a>(&'a self, suffix: &str) -> Option<&'a Secret> {
        let base = crate::names::state_secret(suffix);
        self.secrets
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(base.as_str()))
    }
}

/// The states being read at once: one per core. Reading is CPU-bound, so
/// more at once only adds blocking threads, each with its allocator cache
/// (2,200 states read after a start: 18 threads and a peak of 75 MiB, 8
/// threads and 72 MiB so; `cargo bench --bench scale`).
static READING: LazyLock<Semaphore> = LazyLock::new(|| {
    Semaphore::new(std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
});

/// [`read`], keeping the Secrets.
pub async fn snapshot(secrets: &Api<Secret>, suffix: &str) -> Result<Snapshot, ReadError> {
    let selector = label_selector(suffix);
    let mut items: Vec<Secret> = Vec::new();
    let mut params = ListParams::default().labels(&selector);
    loop {
        let room = MAX_CHUNKS + 1 - items.len();
        params = params.limit(room as u32);
        let page = crate::secret_io::page(secrets, &params).await?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() && items.len() <= MAX_CHUNKS => {
                params = params.continue_token(&token);
            }
            _ => break,
        }
    }
    let suffix = suffix.to_owned();
    // Never closed, so the permit is always granted.
    let _reading = READING.acquire().await;
    let (readable, secrets) = tokio::task::spawn_blocking(move || {
        let chunks: Vec<ChunkSecret<'_>> = items.iter().map(ChunkSecret::of).collect();
        let readable = classify(&suffix, &chunks);
        hand_back_freed_pages();
        (readable, items)
    })
    .await?;
    Ok(Snapshot { readable, secrets })
}

/// jemalloc's control that purges the unused pages of every arena
/// (`MALLCTL_ARENAS_ALL` is 4096).
const PURGE: &std::ffi::CStr = c"arena.4096.purge";

/// Hands the pages that reads freed back to the system now rather than
/// after the allocator's decay (a second in the manager). A read frees
/// more than its compressed state (the listing's bytes, the decoded data,
/// the inflater's blocks) and after a start 2,200 states are read in
/// a minute: what the decay kept of that was about half of the peak's
/// excess over the memory at rest (`cargo bench --bench scale`; the README
/// has the figures). A backup's copy of a state frees as much. Whether it
/// succeeded is returned for the test; failing, the decay does it later.
pub(crate) fn hand_back_freed_pages() -> bool {
    // SAFETY: a NUL-terminated name, and no value read or written, which
    // is what this control takes.
    let code = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    code == 0
}

#[cfg(test)]
mod tests;
