//! The restore a `captf.io/restore-state` annotation asks for (ref §8.2:
//! it goes before any apply), checked against the backups. Pure.
//!
//! A restore overwrites the current state, so it goes ahead only when that
//! state can be had back: there is none, it cannot be read (no backup can
//! hold it; the book never backs up an unreadable state), or a complete
//! backup of its serial exists. And the state is pushed with a serial above
//! every serial the object has had: Terraform keeps a pushed file's serial,
//! and a serial used twice would name two different states (and their
//! backups) alike.

use k8s_openapi::api::core::v1::Secret;

use super::{Listed, annotation};
use crate::keys::{BACKUP_RESOURCES, INPUTS_HASH, RESTORE_STATE};
use crate::names;

/// The complete backup set a restore Job pushes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub serial: u64,
    /// The serial the state is pushed with: above every one seen.
    pub push_serial: u64,
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
    /// The current state has no complete backup: a restore would lose it.
    NotBackedUp(String),
}

/// The object's current state, as a restore weighs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Current {
    /// No state, or one no backup can hold.
    NothingToKeep,
    /// A readable state of this serial.
    Read { serial: u64 },
}

/// What `raw` asks for, given the object's backups, whether a restore Job
/// of the same serial failed, the current state and the highest serial the
/// object's status has observed.
pub fn request(
    raw: &str,
    suffix: &str,
    existing: &Listed,
    failed_before: bool,
    current: Current,
    observed: Option<u64>,
) -> Request {
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
    let mut seen = existing.infos.iter().map(|i| i.serial).collect::<Vec<_>>();
    seen.extend(observed);
    if let Current::Read { serial: current } = current {
        let kept = existing
            .infos
            .iter()
            .any(|i| i.serial == current && i.complete);
        if !kept {
            return Request::NotBackedUp(format!(
                "the current state (serial {current}) has no complete backup, and a restore would overwrite it; a restore goes ahead once it is backed up (--state-backups above 0)"
            ));
        }
        seen.push(current);
    }
    let push_serial = seen.into_iter().max().unwrap_or(0).saturating_add(1);
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
        push_serial,
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
