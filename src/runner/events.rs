//! Progress events (ref §4 "Runner events", `--runner-events`): the runner
//! reports on the object its Job works for, with the Job as the related
//! object, through `events.k8s.io/v1` under its own identity (reporting
//! controller `captf.io/runner`). Best effort: each request has a short
//! deadline, emission stops after a few failures in a row, and nothing
//! here can fail the run. Notes are redacted by the caller.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// The reporting controller of the runner's events.
pub const REPORTER: &str = "captf.io/runner";
/// How long one event may take to record.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Failures in a row after which no more events are tried.
const GIVE_UP_AFTER: u32 = 3;
/// The API's limit on a note.
const NOTE_MAX: usize = 1024;

/// The object a run reports on, from `--events-for=<kind>/<name>/<uid>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regarding {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl std::str::FromStr for Regarding {
    type Err = String;

    fn from_str(s: &str) -> Result<Regarding, String> {
        let mut parts = s.splitn(3, '/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(kind), Some(name), Some(uid))
                if !kind.is_empty() && !name.is_empty() && !uid.is_empty() =>
            {
                Ok(Regarding {
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                })
            }
            _ => Err(format!("{s:?} is not <kind>/<name>/<uid>")),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Normal,
    Warning,
}

/// One event, before it is sent.
pub fn event(
    namespace: &str,
    regarding: &Regarding,
    job: &str,
    instance: &str,
    (type_, reason, note): (Type, &str, &str),
    seq: u32,
    now: Timestamp,
) -> Event {
    let note = crate::runner::summary::bounded(note, NOTE_MAX);
    Event {
        metadata: ObjectMeta {
            // Unique per run and event: the Job's name is, and so is the
            // sequence number within it.
            name: Some(format!("{job}.{seq:04x}")),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        reporting_controller: Some(REPORTER.into()),
        reporting_instance: Some(instance.into()),
        action: Some(reason.into()),
        reason: Some(reason.into()),
        type_: Some(match type_ {
            Type::Normal => "Normal".into(),
            Type::Warning => "Warning".into(),
        }),
        note: Some(note),
        regarding: Some(ObjectReference {
            api_version: Some(format!("{}/{}", crate::api::GROUP, crate::api::VERSION)),
            kind: Some(regarding.kind.clone()),
            name: Some(regarding.name.clone()),
            namespace: Some(namespace.into()),
            uid: Some(regarding.uid.clone()),
            ..Default::default()
        }),
        related: Some(ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: Some(job.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Sends a run's events, until they fail too often.
pub struct Emitter {
    api: Option<Api<Event>>,
    namespace: String,
    regarding: Regarding,
    job: String,
    instance: String,
    seq: u32,
    failures: u32,
}

impl Emitter {
    /// An emitter that sends nothing.
    pub fn off() -> Emitter {
        Emitter {
            api: None,
            namespace: String::new(),
            regarding: Regarding {
                kind: String::new(),
                name: String::new(),
                uid: String::new(),
            },
            job: String::new(),
            instance: String::new(),
            seq: 0,
            failures: 0,
        }
    }

    pub fn new(
        client: kube::Client,
        namespace: &str,
        regarding: Regarding,
        job: &str,
        instance: &str,
    ) -> Emitter {
        Emitter {
            api: Some(Api::namespaced(client, namespace)),
            namespace: namespace.into(),
            regarding,
            job: job.into(),
            instance: instance.into(),
            seq: 0,
            failures: 0,
        }
    }

    /// Sends one event; returns why it was not recorded, for the log.
    pub async fn emit(&mut self, type_: Type, reason: &str, note: &str) -> Option<String> {
        let api = self.api.as_ref()?;
        self.seq += 1;
        let e = event(
            &self.namespace,
            &self.regarding,
            &self.job,
            &self.instance,
            (type_, reason, note),
            self.seq,
            Timestamp::now(),
        );
        let why = match tokio::time::timeout(TIMEOUT, api.create(&PostParams::default(), &e)).await
        {
            Ok(Ok(_)) => {
                self.failures = 0;
                return None;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}s", TIMEOUT.as_secs()),
        };
        self.failures += 1;
        if self.failures >= GIVE_UP_AFTER {
            self.api = None;
            return Some(format!(
                "event {reason} not recorded: {why}; no more events after {GIVE_UP_AFTER} failures in a row"
            ));
        }
        Some(format!("event {reason} not recorded: {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_for_parses() {
        let r: Regarding = "TerraformCluster/prod/u-1".parse().unwrap();
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
            ("TerraformCluster", "prod", "u-1")
        );
        for bad in ["", "TerraformCluster/prod", "/prod/u", "a//u"] {
            assert!(bad.parse::<Regarding>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_event_regards_the_object_and_relates_the_job() {
        let r: Regarding = "TerraformMachine/m-0/u-2".parse().unwrap();
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let long = "x".repeat(5000);
        let e = event(
            "team-a",
            &r,
            "captf-m-m-0-apply-a1-abcdef",
            "captf-m-m-0-apply-a1-abcdef-xyz12",
            (Type::Warning, "StepFailed", &long),
            3,
            now,
        );
        assert_eq!(
            e.metadata.name.as_deref(),
            Some("captf-m-m-0-apply-a1-abcdef.0003")
        );
        assert_eq!(e.reporting_controller.as_deref(), Some(REPORTER));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert!(e.note.as_ref().unwrap().len() <= NOTE_MAX);
        let regarding = e.regarding.unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("TerraformMachine"));
        assert_eq!(regarding.uid.as_deref(), Some("u-2"));
        let related = e.related.unwrap();
        assert_eq!(
            (related.kind.as_deref(), related.name.as_deref()),
            (Some("Job"), Some("captf-m-m-0-apply-a1-abcdef"))
        );
    }
}
