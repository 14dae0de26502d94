//! The metadata of the Secrets CAPTF watches (state chunks, backups,
//! durable inputs, mirrors), kept compact. There are two or more of them
//! per object, and as kube's `ObjectMeta` each costs 2 to 4 KiB of heap:
//! a B-tree leaf of 544 bytes for its labels and another for its
//! annotations, and a separate allocation for every string. [`Compact`]
//! keeps the same fields (all but the managed fields, which the watch
//! never decodes) in one text of all the strings and a table of where each
//! ends, and gives the `ObjectMeta` back whole when a pass needs one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::runtime::reflector::Lookup;

/// What the watches' own code reads of an object it stores, whole or
/// [`Compact`].
pub trait Labelled {
    fn label(&self, key: &str) -> Option<&str>;
    fn object_namespace(&self) -> Option<&str>;
    fn object_name(&self) -> Option<&str>;
    fn object_uid(&self) -> Option<&str>;
}

impl<K: Resource> Labelled for K {
    fn label(&self, key: &str) -> Option<&str> {
        self.meta().labels.as_ref()?.get(key).map(String::as_str)
    }
    fn object_namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }
    fn object_name(&self) -> Option<&str> {
        self.meta().name.as_deref()
    }
    fn object_uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }
}

/// The strings kept whole or absent, in this order at the start of the
/// text: name, namespace, uid, resourceVersion, generateName, selfLink.
const SINGLES: usize = 6;

/// The metadata of a `K`, compact. What it holds is what it was made
/// from: [`Compact::to_meta`] gives back the same `ObjectMeta`.
pub struct Compact<K> {
    /// Every string, one after the other: the [`SINGLES`], then each
    /// label's key and value, each annotation's, each finalizer, and each
    /// owner reference's apiVersion, kind, name and uid.
    text: Box<str>,
    /// Where each string of `text` ends.
    ends: Box<[usize]>,
    /// Which of the [`SINGLES`] are set, a bit each.
    singles: u8,
    /// How many labels, annotations, finalizers and owner references
    /// there are, each `None` when the field is.
    labels: Option<usize>,
    annotations: Option<usize>,
    finalizers: Option<usize>,
    owners: Option<usize>,
    /// Each owner reference's `controller` and `blockOwnerDeletion`.
    owner_flags: Box<[(Option<bool>, Option<bool>)]>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    generation: Option<i64>,
    kind: PhantomData<fn() -> K>,
}

// By hand: a derive would ask `K` to be `Clone` and `Debug` too.
impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            text: self.text.clone(),
            ends: self.ends.clone(),
            singles: self.singles,
            labels: self.labels,
            annotations: self.annotations,
            finalizers: self.finalizers,
            owners: self.owners,
            owner_flags: self.owner_flags.clone(),
            creation_timestamp: self.creation_timestamp.clone(),
            deletion_timestamp: self.deletion_timestamp.clone(),
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            generation: self.generation,
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_meta().fmt(f)
    }
}

/// The strings of `meta` in the order [`Compact::text`] keeps them.
fn strings(meta: &ObjectMeta) -> impl Iterator<Item = &str> {
    let singles = [
        &meta.name,
        &meta.namespace,
        &meta.uid,
        &meta.resource_version,
        &meta.generate_name,
        &meta.self_link,
    ]
    .into_iter()
    .map(|s| s.as_deref().unwrap_or_default());
    let owners = meta.owner_references.iter().flatten().flat_map(|r| {
        [
            r.api_version.as_str(),
            r.kind.as_str(),
            r.name.as_str(),
            r.uid.as_str(),
        ]
    });
    let labels = meta.labels.iter().flatten();
    let annotations = meta.annotations.iter().flatten();
    singles
        .chain(labels.flat_map(|(k, v)| [k.as_str(), v.as_str()]))
        .chain(annotations.flat_map(|(k, v)| [k.as_str(), v.as_str()]))
        .chain(meta.finalizers.iter().flatten().map(String::as_str))
        .chain(owners)
}

impl<K> From<ObjectMeta> for Compact<K> {
    fn from(meta: ObjectMeta) -> Self {
        let mut text = String::with_capacity(strings(&meta).map(str::len).sum());
        let ends = strings(&meta)
            .map(|s| {
                text.push_str(s);
                text.len()
            })
            .collect();
        let singles = [
            meta.name.is_some(),
            meta.namespace.is_some(),
            meta.uid.is_some(),
            meta.resource_version.is_some(),
            meta.generate_name.is_some(),
            meta.self_link.is_some(),
        ]
        .iter()
        .enumerate()
        .fold(0, |bits, (i, set)| bits | (u8::from(*set) << i));
        Compact {
            text: text.into_boxed_str(),
            ends,
            singles,
            labels: meta.labels.as_ref().map(BTreeMap::len),
            annotations: meta.annotations.as_ref().map(BTreeMap::len),
            finalizers: meta.finalizers.as_ref().map(Vec::len),
            owners: meta.owner_references.as_ref().map(Vec::len),
            owner_flags: meta
                .owner_references
                .iter()
                .flatten()
                .map(|r| (r.controller, r.block_owner_deletion))
                .collect(),
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            generation: meta.generation,
            kind: PhantomData,
        }
    }
}

impl<K> Compact<K> {
    /// The `i`th string of the text.
    fn at(&self, i: usize) -> &str {
        let start = i.checked_sub(1).map_or(0, |before| self.ends[before]);
        &self.text[start..self.ends[i]]
    }

    fn single(&self, i: usize) -> Option<&str> {
        (self.singles & (1 << i) != 0).then(|| self.at(i))
    }

    /// Where the labels, annotations, finalizers and owner references
    /// start among the strings.
    fn starts(&self) -> [usize; 4] {
        let labels = SINGLES;
        let annotations = labels + 2 * self.labels.unwrap_or(0);
        let finalizers = annotations + 2 * self.annotations.unwrap_or(0);
        let owners = finalizers + self.finalizers.unwrap_or(0);
        [labels, annotations, finalizers, owners]
    }

    /// The `count` key-value pairs from string `start` on.
    fn pairs(&self, start: usize, count: usize) -> impl Iterator<Item = (&str, &str)> {
        (0..count).map(move |p| (self.at(start + 2 * p), self.at(start + 2 * p + 1)))
    }

    fn map(&self, start: usize, count: Option<usize>) -> Option<BTreeMap<String, String>> {
        let pairs = self.pairs(start, count?);
        Some(pairs.map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
    }

    pub fn resource_version(&self) -> Option<&str> {
        self.single(3)
    }

    /// The metadata whole, as it was made from.
    pub fn to_meta(&self) -> ObjectMeta {
        let [labels, annotations, finalizers, owners] = self.starts();
        let owned = |i| self.single(i).map(str::to_owned);
        ObjectMeta {
            name: owned(0),
            namespace: owned(1),
            uid: owned(2),
            resource_version: owned(3),
            generate_name: owned(4),
            self_link: owned(5),
            labels: self.map(labels, self.labels),
            annotations: self.map(annotations, self.annotations),
            finalizers: self
                .finalizers
                .map(|n| (0..n).map(|i| self.at(finalizers + i).to_owned()).collect()),
            owner_references: self.owners.map(|n| {
                (0..n)
                    .map(|i| {
                        let at = |field| self.at(owners + 4 * i + field).to_owned();
                        let (controller, block_owner_deletion) = self.owner_flags[i];
                        OwnerReference {
                            api_version: at(0),
                            kind: at(1),
                            name: at(2),
                            uid: at(3),
                            controller,
                            block_owner_deletion,
                        }
                    })
                    .collect()
            }),
            creation_timestamp: self.creation_timestamp.clone(),
            deletion_timestamp: self.deletion_timestamp.clone(),
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            generation: self.generation,
            managed_fields: None,
        }
    }
}

impl<K> Labelled for Compact<K> {
    fn label(&self, key: &str) -> Option<&str> {
        let [start, ..] = self.starts();
        self.pairs(start, self.labels.unwrap_or(0))
            .find_map(|(k, v)| (k == key).then_some(v))
    }
    fn object_namespace(&self) -> Option<&str> {
        self.single(1)
    }
    fn object_name(&self) -> Option<&str> {
        self.single(0)
    }
    fn object_uid(&self) -> Option<&str> {
        self.single(2)
    }
}

impl<K: Resource<DynamicType = ()>> Lookup for Compact<K> {
    type DynamicType = ();

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        self.single(0).map(Cow::Borrowed)
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.single(1).map(Cow::Borrowed)
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.single(3).map(Cow::Borrowed)
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        self.single(2).map(Cow::Borrowed)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;

    fn owner(uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "infrastructure.cluster.x-k8s.io/v1beta2".into(),
            kind: "TerraformMachine".into(),
            name: "m-1".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: Some(false),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn time(s: &str) -> Time {
        Time(s.parse().expect("a timestamp"))
    }

    #[test]
    fn the_metadata_comes_back_as_it_was_kept() {
        let whole = ObjectMeta {
            name: Some("captf-backup-x-7-0".into()),
            namespace: Some("team-a".into()),
            uid: Some("0b4e-…-é".into()),
            resource_version: Some("4711".into()),
            generate_name: Some(String::new()),
            self_link: None,
            labels: Some(map(&[("captf.io/managed", "true"), ("empty", "")])),
            annotations: Some(map(&[("captf.io/state-backup-serial", "7")])),
            finalizers: Some(vec!["captf.io/protect".into(), "b".into()]),
            owner_references: Some(vec![owner("u1", Some(true)), owner("u2", None)]),
            creation_timestamp: Some(time("2026-12-07T06:00:00Z")),
            deletion_timestamp: Some(time("2026-12-07T06:01:00Z")),
            deletion_grace_period_seconds: Some(0),
            generation: Some(3),
            managed_fields: None,
        };
        let cases = [
            whole.clone(),
            ObjectMeta::default(),
            // Present but empty stays present.
            ObjectMeta {
                labels: Some(BTreeMap::new()),
                annotations: Some(BTreeMap::new()),
                finalizers: Some(vec![]),
                owner_references: Some(vec![]),
                name: Some(String::new()),
                ..Default::default()
            },
            ObjectMeta {
                labels: None,
                owner_references: None,
                ..whole
            },
        ];
        for meta in cases {
            let kept = Compact::<Secret>::from(meta.clone());
            assert_eq!(kept.to_meta(), meta);
            assert_eq!(kept.object_name(), meta.name.as_deref());
            assert_eq!(kept.object_namespace(), meta.namespace.as_deref());
            assert_eq!(kept.object_uid(), meta.uid.as_deref());
            assert_eq!(kept.resource_version(), meta.resource_version.as_deref());
            for (k, v) in meta.labels.iter().flatten() {
                assert_eq!(kept.label(k), Some(v.as_str()));
            }
            let annotations = kept.to_meta().annotations;
            for (k, v) in meta.annotations.iter().flatten() {
                assert_eq!(annotations.as_ref().and_then(|a| a.get(k)), Some(v));
            }
            // A label is not an annotation, nor the other way round.
            assert_eq!(kept.label("captf.io/state-backup-serial"), None);
            assert!(annotations.is_none_or(|a| !a.contains_key("captf.io/managed")));
        }
    }

    #[test]
    fn the_store_key_is_the_objects() {
        let kept = Compact::<Secret>::from(ObjectMeta {
            name: Some("n".into()),
            namespace: Some("ns".into()),
            uid: Some("u".into()),
            resource_version: Some("1".into()),
            ..Default::default()
        });
        let key = kept.to_object_ref(());
        assert_eq!(
            key,
            kube::runtime::reflector::ObjectRef::new("n").within("ns")
        );
        assert_eq!(key.extra.uid.as_deref(), Some("u"));
        assert_eq!(key.extra.resource_version.as_deref(), Some("1"));
    }
}
