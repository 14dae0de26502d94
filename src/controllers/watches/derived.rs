//! What a pass derives from Secrets' data (the state as read, the backup
//! sets, the durable inputs), kept with the names and resourceVersions of
//! the Secrets it was read from. While the metadata watches show the same
//! versions, nothing is read again; any change reads the data anew.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use super::{Compact, Labelled};
use crate::backups::BackupInfo;
use crate::state::Snapshot;

/// A Secret's metadata, whole as read or [`Compact`] as watched: its name
/// and resourceVersion.
pub trait Versioned {
    fn name_and_version(&self) -> (Option<&str>, Option<&str>);
}

impl Versioned for ObjectMeta {
    fn name_and_version(&self) -> (Option<&str>, Option<&str>) {
        (self.name.as_deref(), self.resource_version.as_deref())
    }
}

impl<K> Versioned for Compact<K> {
    fn name_and_version(&self) -> (Option<&str>, Option<&str>) {
        (self.object_name(), self.resource_version())
    }
}

/// The names and resourceVersions of a set of Secrets, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Versions(Vec<(String, String)>);

impl Versions {
    pub fn of<'a, M: Versioned + 'a>(metas: impl IntoIterator<Item = &'a M>) -> Versions {
        let mut v: Vec<_> = metas
            .into_iter()
            .map(|m| {
                let (name, version) = m.name_and_version();
                (
                    name.unwrap_or_default().to_owned(),
                    version.unwrap_or_default().to_owned(),
                )
            })
            .collect();
        v.sort();
        Versions(v)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Values by key, each valid for the versions it was read at.
pub struct Cache<T>(Mutex<HashMap<String, (Versions, Arc<T>)>>);

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Cache(Mutex::default())
    }
}

impl<T> Cache<T> {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Versions, Arc<T>)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value read at exactly `versions`.
    pub fn get(&self, key: &str, versions: &Versions) -> Option<Arc<T>> {
        self.entries()
            .get(key)
            .filter(|(at, _)| at == versions)
            .map(|(_, value)| value.clone())
    }

    pub fn put(&self, key: &str, versions: Versions, value: Arc<T>) {
        self.entries().insert(key.to_owned(), (versions, value));
    }

    /// The value last read, whatever versions it was read at.
    pub fn last(&self, key: &str) -> Option<Arc<T>> {
        self.entries().get(key).map(|(_, value)| value.clone())
    }

    fn forget(&self, key: &str) {
        self.entries().remove(key);
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }
}

/// Each backup set of an object as judged from its data, with the
/// versions of the Secrets it was judged from, by serial in order. A few
/// per object, kept in a vector: a B-tree leaf of them takes 880 bytes.
#[derive(Clone, Debug, Default)]
pub struct BackupSets(Vec<(u64, (Versions, BackupInfo))>);

impl BackupSets {
    pub fn get(&self, serial: u64) -> Option<&(Versions, BackupInfo)> {
        let at = self.0.binary_search_by_key(&serial, |(s, _)| *s).ok()?;
        Some(&self.0[at].1)
    }

    /// Keeps `judged` as the set of `serial`, in place of any before.
    pub fn insert(&mut self, serial: u64, judged: (Versions, BackupInfo)) {
        match self.0.binary_search_by_key(&serial, |(s, _)| *s) {
            Ok(at) => self.0[at].1 = judged,
            Err(at) => self.0.insert(at, (serial, judged)),
        }
    }

    /// The sets as judged, the newest serial first.
    pub fn newest_first(&self) -> impl Iterator<Item = &BackupInfo> {
        self.0.iter().rev().map(|(_, (_, info))| info)
    }
}

/// Everything derived, by the key of the object it belongs to
/// ([`key`]).
#[derive(Default)]
pub struct Derived {
    /// The state as read, its Secrets without their data.
    pub states: Cache<Snapshot>,
    /// The object's backup sets as judged, by serial.
    pub backups: Cache<BackupSets>,
    pub durable: Cache<Secret>,
}

impl Derived {
    /// Drops what was kept for an object that is gone.
    pub fn forget(&self, namespace: &str, suffix: &str) {
        let key = key(namespace, suffix);
        self.states.forget(&key);
        self.backups.forget(&key);
        self.durable.forget(&key);
    }
}

/// The key of an object's entries: its namespace and state suffix.
pub fn key(namespace: &str, suffix: &str) -> String {
    format!("{namespace}/{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(serial: u64, bytes: u64) -> (Versions, BackupInfo) {
        let info = BackupInfo {
            bytes,
            ..BackupInfo::gone(serial)
        };
        (Versions(vec![(format!("b-{serial}"), "1".into())]), info)
    }

    #[test]
    fn backup_sets_are_kept_by_serial_newest_first() {
        let mut sets = BackupSets::default();
        sets.insert(7, judged(7, 1));
        sets.insert(3, judged(3, 1));
        sets.insert(9, judged(9, 1));
        // A set judged again takes the place of the one before.
        sets.insert(7, judged(7, 2));
        let serials: Vec<_> = sets.newest_first().map(|i| (i.serial, i.bytes)).collect();
        assert_eq!(serials, [(9, 1), (7, 2), (3, 1)]);
        assert_eq!(sets.get(7).map(|(_, i)| i.bytes), Some(2));
        assert_eq!(sets.get(3).map(|(v, _)| v.clone()), Some(judged(3, 1).0));
        assert!(sets.get(8).is_none());
    }
}
