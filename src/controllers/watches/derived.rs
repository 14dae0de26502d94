//! What a pass derives from Secrets' data (the state as read, the backup
//! sets, the durable inputs), kept with the names and resourceVersions of
//! the Secrets it was read from. While the metadata watches show the same
//! versions, nothing is read again; any change reads the data anew.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use crate::backups::BackupInfo;
use crate::state::Snapshot;

/// The names and resourceVersions of a set of Secrets, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Versions(Vec<(String, String)>);

impl Versions {
    pub fn of<'a>(metas: impl IntoIterator<Item = &'a ObjectMeta>) -> Versions {
        let mut v: Vec<_> = metas
            .into_iter()
            .map(|m| {
                (
                    m.name.clone().unwrap_or_default(),
                    m.resource_version.clone().unwrap_or_default(),
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
/// versions of the Secrets it was judged from.
pub type BackupSets = BTreeMap<u64, (Versions, BackupInfo)>;

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
