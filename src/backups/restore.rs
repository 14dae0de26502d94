//! The restore a `captf.io/restore-state` annotation asks for (ref §8.2:
//! it goes before any apply), checked against the backups. Pure.

use k8s_openapi::api::core::v1::Secret;

use super::{Listed, annotation};
use crate::keys::{BACKUP_RESOURCES, INPUTS_HASH, RESTORE_STATE};
use crate::names;

/// The complete backup set a restore Job pushes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub serial: u64,
    /// The set's Secrets, in chunk order.
    pub chunks: Vec<String>,
    pub resources: u64,
    /// The inputs hash recorded with the backup, adopted after the restore.
    pub inputs_hash: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Push(Push),
    /// No complete backup of that serial: RestoreBackupNotFound, no Job.
    NotFound(String),
    /// A restore of that serial failed already: it is not tried again
    /// (ref §8.4); RestoreJobSucceeded says why.
    FailedBefore,
}

/// What `raw` asks for, given the object's backups and whether a restore
/// Job of the same serial failed.
pub fn request(raw: &str, suffix: &str, existing: &Listed, failed_before: bool) -> Request {
    if failed_before {
        return Request::FailedBefore;
    }
    let Some(serial) = raw.parse::<u64>().ok().filter(|s| *s >= 1) else {
        return Request::NotFound(format!("{RESTORE_STATE} is {raw:?}, not a state serial"));
    };
    let complete = existing
        .infos
        .iter()
        .any(|i| i.serial == serial && i.complete);
    if !complete {
        return Request::NotFound(format!(
            "no complete backup of state serial {serial} ({})",
            names::backup_secret(suffix, serial)
        ));
    }
    let mut chunks: Vec<(u64, &Secret)> = existing
        .secrets
        .iter()
        .filter_map(|s| {
            Some((
                names::backup_chunk_index(suffix, serial, s.metadata.name.as_deref()?)?,
                s,
            ))
        })
        .collect();
    chunks.sort_by_key(|(i, _)| *i);
    let first = chunks.first().map(|(_, s)| *s);
    Request::Push(Push {
        serial,
        chunks: chunks
            .iter()
            .filter_map(|(_, s)| s.metadata.name.clone())
            .collect(),
        resources: first
            .and_then(|s| annotation(s, BACKUP_RESOURCES))
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
        inputs_hash: first
            .and_then(|s| annotation(s, INPUTS_HASH))
            .map(str::to_string),
    })
}
