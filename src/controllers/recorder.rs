//! Publishing events, with repeats folded into series as kube's
//! `events::Recorder` does, but with a bounded memory of what was published.
//!
//! kube's recorder keeps every event it published in the last six minutes,
//! whole, and forgets them only when it publishes again: at rest it kept
//! about 20 KiB per object, forever (measured with 500 objects: 12 MiB of a
//! 33 MiB heap). Here a series is remembered by its key and the published
//! event's name only, at most [`MAX_SERIES`] of them, for [`SERIES_TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use sha2::{Digest, Sha256};

/// How long a published event takes repeats into its series (kube's value).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The most series remembered; past it the oldest is forgotten, and its
/// next repeat starts a new event.
pub const MAX_SERIES: usize = 4096;

/// What makes two events one series: as kube's recorder, the type, action,
/// reason and both references, compared in full. Kept as a SHA-256 of those
/// fields (each length-prefixed), 32 bytes instead of a dozen strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key([u8; 32]);

impl Key {
    /// The series key.
    fn of(type_: &str, ev: &Event, regarding: &ObjectReference) -> Key {
        Key::hashed(type_, ev, regarding, None)
    }

    /// The key of one occurrence: the series key's fields and the note.
    fn once(type_: &str, ev: &Event, regarding: &ObjectReference) -> Key {
        Key::hashed(type_, ev, regarding, Some(ev.note.as_deref().unwrap_or("")))
    }

    fn hashed(type_: &str, ev: &Event, regarding: &ObjectReference, note: Option<&str>) -> Key {
        let mut hash = Sha256::new();
        let mut field = |value: Option<&str>| match value {
            None => hash.update([0]),
            Some(v) => {
                hash.update([1]);
                hash.update((v.len() as u64).to_le_bytes());
                hash.update(v.as_bytes());
            }
        };
        field(Some(type_));
        field(Some(&ev.action));
        field(Some(&ev.reason));
        if note.is_some() {
            field(note);
        }
        for r in std::iter::once(Some(regarding)).chain([ev.secondary.as_ref()]) {
            match r {
                None => field(None),
                Some(r) => {
                    field(Some(""));
                    for part in [
                        &r.api_version,
                        &r.kind,
                        &r.namespace,
                        &r.name,
                        &r.uid,
                        &r.resource_version,
                        &r.field_path,
                    ] {
                        field(part.as_deref());
                    }
                }
            }
        }
        Key(hash.finalize().into())
    }
}

#[derive(Clone, Debug)]
struct Entry {
    name: String,
    count: i32,
    last: Instant,
}

/// What to send for one event.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Publish {
    /// A new event of this name.
    Create(String),
    /// A repeat: the series of the event of this name, now this long.
    Repeat(String, i32),
}

/// How often expired series are forgotten: sweeping the whole memory on
/// every event cost 2% of the manager's CPU while Jobs ran (150 machines,
/// `cargo bench --bench jobs`). An expired series not yet swept is not
/// repeated into.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The remembered series, and when the expired ones were last forgotten.
#[derive(Default)]
struct Series {
    entries: HashMap<Key, Entry>,
    swept: Option<Instant>,
}

impl Series {
    /// Decides what `key` publishes at `now`; `fresh` names a new event.
    fn next(&mut self, key: &Key, now: Instant, fresh: impl FnOnce() -> String) -> Publish {
        if self
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
        {
            self.forget_expired(now);
        }
        match self.entries.get(key).filter(|e| !expired(e, now)) {
            Some(e) => Publish::Repeat(e.name.clone(), e.count + 1),
            None => Publish::Create(fresh()),
        }
    }

    fn forget_expired(&mut self, now: Instant) {
        self.entries.retain(|_, e| !expired(e, now));
        self.swept = Some(now);
    }

    /// Remembers what was published; when full, forgets the expired series,
    /// or else the oldest.
    fn published(&mut self, key: Key, publish: &Publish, now: Instant) {
        let (name, count) = match publish {
            Publish::Create(name) => (name.clone(), 1),
            Publish::Repeat(name, count) => (name.clone(), *count),
        };
        if !self.entries.contains_key(&key) && self.entries.len() >= MAX_SERIES {
            self.forget_expired(now);
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= MAX_SERIES {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(
            key,
            Entry {
                name,
                count,
                last: now,
            },
        );
    }
}

fn expired(entry: &Entry, now: Instant) -> bool {
    now.saturating_duration_since(entry.last) >= SERIES_TTL
}

/// Publishes events in the regarded object's namespace.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Recorder {
        Recorder {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    /// Creates the event, or counts a repeat of one published within
    /// [`SERIES_TTL`] into its series.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        let type_ = type_name(ev);
        let key = Key::of(type_, ev, regarding);
        let now = Timestamp::now();
        let events = self.api(regarding);
        let fresh = || format!("{}.{:x}", self.subject(regarding), now.as_nanosecond());
        let publish = self.lock().next(&key, Instant::now(), fresh);
        match &publish {
            Publish::Create(name) => {
                let event = self.event(ev, regarding, name, now);
                events.create(&PostParams::default(), &event).await?;
            }
            Publish::Repeat(name, count) => {
                let series = EventSeries {
                    count: *count,
                    last_observed_time: MicroTime(now),
                };
                let patch = serde_json::json!({ "series": series });
                events
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        self.lock().published(key, &publish, Instant::now());
        Ok(())
    }

    /// Creates the event under a name derived from the occurrence (the
    /// series key and the note): published already, by this manager or
    /// one before it, it is not published again.
    pub async fn publish_once(&self, ev: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        let key = Key::once(type_name(ev), ev, regarding);
        let mut first = [0; 8];
        first.copy_from_slice(&key.0[..8]);
        let name = format!(
            "{}.{:016x}",
            self.subject(regarding),
            u64::from_be_bytes(first)
        );
        let event = self.event(ev, regarding, &name, Timestamp::now());
        match self
            .api(regarding)
            .create(&PostParams::default(), &event)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn api(&self, regarding: &ObjectReference) -> Api<K8sEvent> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        Api::namespaced(self.client.clone(), namespace)
    }

    fn subject<'a>(&'a self, regarding: &'a ObjectReference) -> &'a str {
        regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller)
    }

    fn event(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
        name: &str,
        now: Timestamp,
    ) -> K8sEvent {
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(type_name(ev).into()),
            related: ev.secondary.clone(),
            ..K8sEvent::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Series> {
        // A panic while holding it leaves only a map of names: go on with it.
        self.series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn type_name(ev: &Event) -> &'static str {
    match ev.type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str, rv: &str) -> Key {
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: reason.into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            name: Some("m".into()),
            resource_version: Some(rv.into()),
            ..ObjectReference::default()
        };
        Key::of("Normal", &event, &regarding)
    }

    #[test]
    fn repeats_fold_into_a_series_until_it_expires() {
        let mut series = Series::default();
        let t0 = Instant::now();
        let a = key("Applied", "1");
        let first = series.next(&a, t0, || "m.1".into());
        assert_eq!(first, Publish::Create("m.1".into()));
        series.published(a, &first, t0);
        let t1 = t0 + Duration::from_secs(60);
        let second = series.next(&a, t1, || "m.2".into());
        assert_eq!(second, Publish::Repeat("m.1".into(), 2));
        series.published(a, &second, t1);
        assert_eq!(
            series.next(&a, t1 + Duration::from_secs(1), || "m.3".into()),
            Publish::Repeat("m.1".into(), 3)
        );
        // Another reason, or another version of the object, is its own series.
        assert_eq!(
            series.next(&key("Failed", "1"), t1, || "m.4".into()),
            Publish::Create("m.4".into())
        );
        assert_eq!(
            series.next(&key("Applied", "2"), t1, || "m.5".into()),
            Publish::Create("m.5".into())
        );
        // Six minutes after its last repeat the series is over, even before
        // the next sweep forgets it.
        let swept = t1 + SERIES_TTL - Duration::from_secs(30);
        series.next(&key("Failed", "1"), swept, || "m.s".into());
        assert!(series.entries.contains_key(&a), "not expired at the sweep");
        assert_eq!(
            series.next(&a, t1 + SERIES_TTL, || "m.6".into()),
            Publish::Create("m.6".into())
        );
        assert!(series.entries.contains_key(&a), "not swept yet");
        assert_eq!(
            series.next(&a, t1 + SERIES_TTL + SWEEP_EVERY, || "m.7".into()),
            Publish::Create("m.7".into())
        );
        assert!(series.entries.is_empty());
    }

    #[test]
    fn a_full_memory_forgets_its_oldest_series() {
        let mut series = Series::default();
        let t0 = Instant::now();
        for i in 0..MAX_SERIES {
            let k = key("Applied", &i.to_string());
            let at = t0 + Duration::from_millis(i as u64);
            let p = series.next(&k, at, || format!("m.{i}"));
            series.published(k, &p, at);
        }
        let at = t0 + Duration::from_secs(10);
        let newest = key("Applied", "new");
        let p = series.next(&newest, at, || "m.new".into());
        series.published(newest, &p, at);
        assert_eq!(series.entries.len(), MAX_SERIES);
        assert!(!series.entries.contains_key(&key("Applied", "0")));
        assert!(series.entries.contains_key(&key("Applied", "1")));
        assert_eq!(
            series.next(&newest, at, || "x".into()),
            Publish::Repeat("m.new".into(), 2)
        );
    }

    #[test]
    fn keys_tell_fields_apart() {
        let event = |action: &str, reason: &str, secondary: Option<ObjectReference>| Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some("notes are not part of the key".into()),
            action: action.into(),
            secondary,
        };
        let m = ObjectReference {
            name: Some("m".into()),
            ..ObjectReference::default()
        };
        let of = |e: &Event| Key::of("Normal", e, &m);
        assert_eq!(of(&event("a", "b", None)), of(&event("a", "b", None)));
        assert_ne!(of(&event("ab", "", None)), of(&event("a", "b", None)));
        assert_ne!(
            of(&event("a", "b", None)),
            of(&event("a", "b", Some(ObjectReference::default())))
        );
        assert_ne!(
            Key::of("Normal", &event("a", "b", None), &m),
            Key::of("Warning", &event("a", "b", None), &m)
        );
    }

    #[test]
    fn a_once_only_key_is_its_occurrence() {
        let event = |note: &str| Event {
            type_: EventType::Normal,
            reason: "StateBackedUp".into(),
            note: Some(note.into()),
            action: "StateBackedUp".into(),
            secondary: None,
        };
        let m = |uid: &str| ObjectReference {
            name: Some("m".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        };
        let once = |note: &str, uid: &str| Key::once("Normal", &event(note), &m(uid));
        assert_eq!(once("serial 2", "u1"), once("serial 2", "u1"));
        assert_ne!(once("serial 2", "u1"), once("serial 3", "u1"));
        // The object of the same name created anew tells its own story.
        assert_ne!(once("serial 2", "u1"), once("serial 2", "u2"));
        assert_ne!(
            once("serial 2", "u1"),
            Key::of("Normal", &event("serial 2"), &m("u1"))
        );
    }
}
