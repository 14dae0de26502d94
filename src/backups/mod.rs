//! State backups (book: terraform-state.md, "State backups"): versioned,
//! verbatim copies of an object's state Secrets, owned by the object so that
//! they outlive a state Secret deleted by hand.
//!
//! The decisions are pure: [`should_back_up`] (whether this read calls for a
//! backup), [`plan_backup`] (the Secrets of a set), [`list`] (what sets exist
//! and which are whole), [`owned_by`] (only the object's own backups count),
//! [`prune`] and [`status_entries`]. The I/O is [`take`], [`read_set`] and
//! [`delete_sets`].

mod io;
pub mod restore;

pub use io::{BackupError, Taken, delete_sets, read_set, take};

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::api::StateBackup;
use crate::error::{Categorized, Category};
use crate::jobs::owner_labels;
use crate::keys::{
    BACKUP_CHUNK, BACKUP_CHUNKS, BACKUP_DIGEST, BACKUP_LABEL, BACKUP_LINEAGE, BACKUP_RESOURCES,
    BACKUP_SERIAL, BACKUP_SET, BACKUP_SOURCE_JOB, BACKUP_SUFFIX_LABEL, BACKUP_TAKEN_AT,
    INPUTS_HASH, MOVE_LABEL,
};
use crate::names::{self, Kind};
use crate::protection::{self, AsRead};
use crate::state::chunks::{ChunkSecret, assemble};
use crate::state::{State, StateReadable, TFSTATE_KEY, Unreadable};

/// status.stateBackups holds at most this many entries.
pub const MAX_STATUS_ENTRIES: usize = 16;

/// Whether a state read calls for a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupDecision {
    Take {
        serial: u64,
    },
    /// `reason` is one of encrypted, corrupt, inconsistent, unchanged,
    /// disabled, deleting, not-found.
    Skip {
        reason: &'static str,
    },
}

/// Never while deleting, never with `--state-backups=0`, never of a state
/// that cannot be read whole within the reader's caps, and not again for the
/// serial already observed.
pub fn should_back_up(
    readable: &StateReadable,
    observed_serial: Option<i64>,
    keep: u32,
    deleting: bool,
) -> BackupDecision {
    let skip = |reason| BackupDecision::Skip { reason };
    if deleting {
        return skip("deleting");
    }
    if keep == 0 {
        return skip("disabled");
    }
    match readable {
        StateReadable::NotFound => skip("not-found"),
        StateReadable::Unreadable(Unreadable::Encrypted) => skip("encrypted"),
        StateReadable::Unreadable(Unreadable::Corrupt(_)) => skip("corrupt"),
        StateReadable::Unreadable(Unreadable::Inconsistent(_)) => skip("inconsistent"),
        StateReadable::Read(state) => {
            if observed_serial.and_then(|s| u64::try_from(s).ok()) == Some(state.serial) {
                skip("unchanged")
            } else {
                BackupDecision::Take {
                    serial: state.serial,
                }
            }
        }
    }
}

/// The object a backup belongs to.
#[derive(Clone, Debug)]
pub struct Owner<'a> {
    /// The object's reference; the backup holds it as a non-controller,
    /// non-blocking owner.
    pub reference: OwnerReference,
    pub kind: Kind,
    pub name: &'a str,
    pub cluster_name: Option<&'a str>,
}

/// The Secrets of one backup set, in chunk order.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupSet {
    pub suffix: String,
    pub serial: u64,
    /// sha256 hex of the concatenated payloads.
    pub digest: String,
    /// The set id, `<serial>-<first 12 hex of the digest>`.
    pub set_id: String,
    pub secrets: Vec<Secret>,
}

/// Why no backup set can be planned from the given Secrets.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("no state Secret to back up")]
    NoState,
    #[error("the state Secrets do not make one chunk set: {0}")]
    Chunks(Unreadable),
    #[error("state serial 0 cannot be backed up (backup serials start at 1)")]
    ZeroSerial,
}

impl Categorized for PlanError {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

fn sha256_hex(payloads: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for payload in payloads {
        hasher.update(payload);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The backup set of `state`, read from `chunks` (the state's Secrets in any
/// order): chunk i of the state, by its name, becomes chunk i of the backup,
/// with its data copied verbatim.
pub fn plan_backup(
    suffix: &str,
    state: &State,
    chunks: &[Secret],
    owner: &Owner<'_>,
    source_job: Option<&str>,
    now: Timestamp,
) -> Result<BackupSet, PlanError> {
    if state.serial == 0 {
        return Err(PlanError::ZeroSerial);
    }
    let views: Vec<ChunkSecret<'_>> = chunks.iter().map(ChunkSecret::of).collect();
    // `assemble` orders by the index in each name and checks the set is whole.
    let payloads = assemble(suffix, &views)
        .map_err(PlanError::Chunks)?
        .ok_or(PlanError::NoState)?;
    let digest = sha256_hex(&payloads);
    let set_id = format!("{}-{}", state.serial, &digest[..12]);
    // Every name has an index and the indexes are 0..n: `assemble` said so.
    let mut ordered: Vec<(u64, &Secret)> = views
        .iter()
        .zip(chunks)
        .filter_map(|(view, secret)| {
            names::state_chunk_index(suffix, view.name).map(|index| (index, secret))
        })
        .collect();
    ordered.sort_by_key(|(index, _)| *index);
    let mut labels = owner_labels(owner.kind, owner.name, owner.cluster_name);
    labels.insert(BACKUP_LABEL.into(), "true".into());
    labels.insert(BACKUP_SUFFIX_LABEL.into(), suffix.into());
    labels.insert(MOVE_LABEL.into(), String::new());
    let reference = OwnerReference {
        controller: Some(false),
        block_owner_deletion: Some(false),
        ..owner.reference.clone()
    };
    // Whole seconds, as metav1.Time keeps them.
    let taken_at = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let total = ordered.len();
    let mut secrets = Vec::with_capacity(total);
    for (index, (_, source)) in ordered.into_iter().enumerate() {
        let index = index as u32;
        let mut annotations = BTreeMap::from([
            (BACKUP_SERIAL.into(), state.serial.to_string()),
            (BACKUP_LINEAGE.into(), state.lineage.clone()),
            (BACKUP_TAKEN_AT.into(), taken_at.to_string()),
            (BACKUP_DIGEST.into(), digest.clone()),
            (BACKUP_RESOURCES.into(), state.managed_resources.to_string()),
            (BACKUP_SET.into(), set_id.clone()),
            (BACKUP_CHUNK.into(), index.to_string()),
            (BACKUP_CHUNKS.into(), total.to_string()),
        ]);
        if let Some(job) = source_job {
            annotations.insert(BACKUP_SOURCE_JOB.into(), job.into());
        }
        if index == 0
            && let Some(hash) = source
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INPUTS_HASH))
        {
            annotations.insert(INPUTS_HASH.into(), hash.clone());
        }
        let mut metadata = ObjectMeta {
            name: Some(names::backup_chunk(suffix, state.serial, index)),
            labels: Some(labels.clone()),
            annotations: Some(annotations),
            owner_references: Some(vec![reference.clone()]),
            ..Default::default()
        };
        // Collected with the object, but never before its cleanup.
        protection::protect(&mut metadata);
        secrets.push(Secret {
            metadata,
            data: source.data.clone(),
            type_: Some("Opaque".into()),
            ..Default::default()
        });
    }
    Ok(BackupSet {
        suffix: suffix.to_owned(),
        serial: state.serial,
        digest,
        set_id,
        secrets,
    })
}

/// Sets (or, with None, removes) the inputs hash on chunk 0 of `set`: the
/// hash of the state it copies, when that was adopted after it was read.
pub fn record_inputs_hash(set: &mut BackupSet, hash: Option<&str>) {
    let Some(first) = set.secrets.first_mut() else {
        return;
    };
    let annotations = first.metadata.annotations.get_or_insert_default();
    match hash {
        Some(h) => annotations.insert(INPUTS_HASH.to_owned(), h.to_owned()),
        None => annotations.remove(INPUTS_HASH),
    };
}

/// An object's backup Secrets as listed, without their data, and the
/// sets they make up (judged from the data when it was read).
#[derive(Debug, Default)]
pub struct Listed {
    pub secrets: Vec<Secret>,
    pub infos: Vec<BackupInfo>,
}

impl Listed {
    /// The listed Secrets of the sets of `serials`, as they were listed.
    pub fn of_serials(&self, suffix: &str, serials: &[u64]) -> Vec<AsRead> {
        self.secrets
            .iter()
            .filter(|s| {
                s.metadata.name.as_deref().is_some_and(|name| {
                    serials
                        .iter()
                        .any(|serial| names::backup_chunk_index(suffix, *serial, name).is_some())
                })
            })
            .filter_map(|s| AsRead::of(&s.metadata))
            .collect()
    }
}

/// Whether the object of `uid` owns this backup Secret. Anyone who may
/// create Secrets in the namespace can label one as a backup; only the
/// object's own are listed, pruned or restored.
pub fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.uid == uid))
}

/// The serial each backup Secret of `suffix` belongs to, by its name;
/// Secrets not named as a chunk of a set are left out.
pub fn by_serial<'a>(secrets: &'a [Secret], suffix: &str) -> BTreeMap<u64, Vec<&'a Secret>> {
    let mut sets: BTreeMap<u64, Vec<&Secret>> = BTreeMap::new();
    for secret in secrets {
        let Some(name) = secret.metadata.name.as_deref() else {
            continue;
        };
        if let Some(serial) = serial_of(suffix, name) {
            sets.entry(serial).or_default().push(secret);
        }
    }
    sets
}

/// One backup set as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupInfo {
    pub serial: u64,
    /// From chunk 0's taken-at annotation.
    pub taken_at: Option<Timestamp>,
    /// The payloads' sizes (compressed), summed over the set's Secrets.
    pub bytes: u64,
    /// Every chunk 0..chunks present once, all agreeing on the set, the
    /// chunk count and the digest, which matches the payloads.
    pub complete: bool,
}

impl BackupInfo {
    /// A set whose Secrets were gone by the time they were read.
    pub fn gone(serial: u64) -> Self {
        Self {
            serial,
            taken_at: None,
            bytes: 0,
            complete: false,
        }
    }
}

pub(crate) fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn payload(secret: &Secret) -> Option<&[u8]> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(TFSTATE_KEY))
        .map(|b: &ByteString| b.0.as_slice())
}

/// The serial a backup Secret name of `suffix` stands for, read from the
/// name.
fn serial_of(suffix: &str, name: &str) -> Option<u64> {
    let of_zero = names::backup_secret(suffix, 0);
    let prefix = of_zero.strip_suffix('0')?;
    let rest = name.strip_prefix(prefix)?;
    let serial = rest.split("-part-").next()?.parse::<u64>().ok()?;
    // Only the canonical spelling of that serial's set round-trips.
    names::backup_chunk_index(suffix, serial, name).map(|_| serial)
}

fn is_complete(chunks: &BTreeMap<u64, Vec<&Secret>>) -> bool {
    let Some(first) = chunks.get(&0).and_then(|v| v.first()) else {
        return false;
    };
    let (Some(set), Some(count), Some(digest)) = (
        annotation(first, BACKUP_SET),
        annotation(first, BACKUP_CHUNKS).and_then(|c| c.parse::<u64>().ok()),
        annotation(first, BACKUP_DIGEST),
    ) else {
        return false;
    };
    if count == 0 || chunks.len() as u64 != count || chunks.keys().next_back() != Some(&(count - 1))
    {
        return false;
    }
    let mut payloads = Vec::with_capacity(chunks.len());
    for (index, secrets) in chunks {
        let [secret] = secrets.as_slice() else {
            return false;
        };
        let agrees = annotation(secret, BACKUP_SET) == Some(set)
            && annotation(secret, BACKUP_CHUNKS) == Some(count.to_string().as_str())
            && annotation(secret, BACKUP_CHUNK) == Some(index.to_string().as_str());
        match payload(secret) {
            Some(bytes) if agrees => payloads.push(bytes),
            _ => return false,
        }
    }
    sha256_hex(&payloads) == digest
}

/// The backup sets of `suffix` among `secrets`, newest (highest serial)
/// first. Secrets of another suffix or not named as a backup chunk are
/// ignored.
pub fn list(secrets: &[Secret], suffix: &str) -> Vec<BackupInfo> {
    let mut sets: BTreeMap<u64, BTreeMap<u64, Vec<&Secret>>> = BTreeMap::new();
    for secret in secrets {
        let labels = secret.metadata.labels.as_ref();
        if labels
            .and_then(|l| l.get(BACKUP_SUFFIX_LABEL))
            .map(String::as_str)
            != Some(suffix)
        {
            continue;
        }
        let Some(name) = secret.metadata.name.as_deref() else {
            continue;
        };
        let Some(serial) = serial_of(suffix, name) else {
            continue;
        };
        if let Some(index) = names::backup_chunk_index(suffix, serial, name) {
            sets.entry(serial)
                .or_default()
                .entry(index)
                .or_default()
                .push(secret);
        }
    }
    sets.into_iter()
        .rev()
        .map(|(serial, chunks)| BackupInfo {
            serial,
            taken_at: chunks
                .get(&0)
                .and_then(|v| v.first())
                .and_then(|s| annotation(s, BACKUP_TAKEN_AT))
                .and_then(|t| t.parse().ok()),
            bytes: chunks
                .values()
                .flatten()
                .filter_map(|s| payload(s))
                .map(|p| p.len() as u64)
                .sum(),
            complete: is_complete(&chunks),
        })
        .collect()
}

/// The serials to delete to keep the newest `keep` complete sets: every
/// other set, incomplete ones too. `keep` = 0 deletes nothing:
/// `--state-backups=0` leaves the existing backups restorable.
pub fn prune(existing: &[BackupInfo], keep: u32) -> Vec<u64> {
    if keep == 0 {
        return Vec::new();
    }
    let mut complete: Vec<u64> = existing
        .iter()
        .filter(|b| b.complete)
        .map(|b| b.serial)
        .collect();
    complete.sort_unstable_by(|a, b| b.cmp(a));
    complete.truncate(keep as usize);
    let mut delete: Vec<u64> = existing
        .iter()
        .map(|b| b.serial)
        .filter(|s| !complete.contains(s))
        .collect();
    delete.sort_unstable_by(|a, b| b.cmp(a));
    delete.dedup();
    delete
}

/// status.stateBackups: the newest complete sets, at most
/// [`MAX_STATUS_ENTRIES`], newest first.
pub fn status_entries(infos: &[BackupInfo]) -> Vec<StateBackup> {
    let mut entries: Vec<StateBackup> = infos
        .iter()
        .filter(|b| b.complete)
        .filter_map(|b| {
            Some(StateBackup {
                serial: i64::try_from(b.serial).ok().filter(|s| *s >= 1)?,
                taken_at: Time(b.taken_at?),
                bytes: i64::try_from(b.bytes).ok().filter(|s| *s >= 1)?,
            })
        })
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.serial));
    entries.truncate(MAX_STATUS_ENTRIES);
    entries
}

#[cfg(test)]
mod tests;
