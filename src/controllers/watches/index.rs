//! A watch's objects by the value of one label in their namespace: a pass
//! finds an object's Jobs, pods, state and backups without going through
//! everything the watch holds.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::Labelled;

/// The names under each namespace and value, sorted: one or two as a rule
/// (an object's state or backup chunks, a Job's pods), for which a B-tree
/// leaf of 272 bytes would be most of an entry.
type Names = HashMap<(String, String), Vec<String>>;

pub struct Index {
    pub label: &'static str,
    names: Mutex<Names>,
}

impl Index {
    pub fn new(label: &'static str) -> Index {
        Index {
            label,
            names: Mutex::default(),
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(&self, o: &impl Labelled) -> Option<((String, String), String)> {
        let value = o.label(self.label)?;
        Some((
            (
                o.object_namespace().unwrap_or_default().to_owned(),
                value.to_owned(),
            ),
            o.object_name()?.to_owned(),
        ))
    }

    /// Takes a change the watch saw. An object whose label changed stays
    /// under its old value too: lookups check the label again.
    pub fn update(&self, o: &impl Labelled, deleted: bool) {
        let Some((key, name)) = self.key(o) else {
            return;
        };
        let mut names = self.names();
        if deleted {
            if let Some(set) = names.get_mut(&key) {
                if let Ok(at) = set.binary_search(&name) {
                    set.remove(at);
                }
                if set.is_empty() {
                    names.remove(&key);
                }
            }
        } else {
            let set = names.entry(key).or_default();
            if let Err(at) = set.binary_search(&name) {
                set.insert(at, name);
            }
        }
    }

    /// The names of the objects of `namespace` seen with the label at
    /// `value`.
    pub fn lookup(&self, namespace: &str, value: &str) -> Vec<String> {
        self.names()
            .get(&(namespace.to_owned(), value.to_owned()))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    use super::super::Compact;
    use super::*;

    fn meta(ns: &str, name: &str, value: Option<&str>) -> Compact<Secret> {
        Compact::from(ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: value.map(|v| [("l".to_owned(), v.to_owned())].into()),
            ..Default::default()
        })
    }

    #[test]
    fn objects_are_found_by_namespace_and_value_until_deleted() {
        let index = Index::new("l");
        index.update(&meta("a", "x", Some("v")), false);
        index.update(&meta("a", "y", Some("v")), false);
        // A change of an object already kept keeps it once.
        index.update(&meta("a", "x", Some("v")), false);
        index.update(&meta("b", "z", Some("v")), false);
        index.update(&meta("a", "unlabelled", None), false);
        assert_eq!(index.lookup("a", "v"), ["x", "y"]);
        assert_eq!(index.lookup("b", "v"), ["z"]);
        index.update(&meta("a", "x", Some("v")), true);
        assert_eq!(index.lookup("a", "v"), ["y"]);
        index.update(&meta("a", "y", Some("v")), true);
        assert!(index.lookup("a", "v").is_empty());
        index.update(&meta("b", "z", Some("v")), true);
        // Nothing is kept for a value no object has.
        assert!(index.names().is_empty());
    }
}
