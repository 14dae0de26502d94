use std::num::NonZeroU32;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;

use super::*;
use crate::names::{Hash6, Op};

const LEASE: &str = "lock-tfstate-default-0123456789abcdef-m";
const HOLDER: &str = "8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";
const OWN_POD: &str = "captf-m-foo-apply-a1-abc123-x7k2p";
const CREATED: &str = "2026-12-02T10:00:00Z";

fn lease(holder: Option<&str>, lock_info: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            annotations: lock_info.map(|i| [(LOCK_INFO.to_owned(), i.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            ..Default::default()
        }),
    }
}

/// The lock info the backend writes, with this `Who` and ID.
fn info_json(who: &str, id: Option<&str>) -> String {
    let mut info = serde_json::json!({
        "Operation": "OperationTypeApply",
        "Info": "",
        "Who": who,
        "Version": "1.12.6",
        "Created": CREATED,
        "Path": "",
    });
    if let Some(id) = id {
        info["ID"] = id.into();
    }
    info.to_string()
}

fn held_by(who: &str) -> Lease {
    lease(Some(HOLDER), Some(&info_json(who, Some(HOLDER))))
}

fn foreign(holder: &str) -> Assessment {
    Assessment::Settled(Verdict::Foreign {
        lease: LEASE.into(),
        holder: holder.into(),
        operation: Some("OperationTypeApply".into()),
        created: Some(CREATED.into()),
        id: HOLDER.into(),
    })
}

fn own(pod: &str, id: &str) -> Assessment {
    Assessment::OwnPod(OwnHold {
        lease: LEASE.into(),
        id: id.into(),
        pod: pod.into(),
    })
}

fn unparsable() -> Assessment {
    Assessment::Settled(Verdict::Unparsable {
        lease: LEASE.into(),
        holder: HOLDER.into(),
    })
}

#[test]
fn assess_follows_the_flowchart() {
    let long = "l".repeat(60);
    let long_job = names::job(
        Kind::Machine,
        &long,
        Op::Drift,
        NonZeroU32::new(2).unwrap(),
        &Hash6::new("0a1b2c").unwrap(),
    );
    let long_pod = format!("{long_job}-q1w2e");
    assert!(
        !long_pod.contains(&long),
        "the Job name hashes the long name"
    );
    let no_spec = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            ..Default::default()
        },
        spec: None,
    };

    let table: Vec<(&str, Kind, &str, Option<Lease>, Assessment)> = vec![
        // Rule 1: no holder, or lock info that does not parse.
        (
            "no Lease",
            Kind::Machine,
            "foo",
            None,
            Assessment::Settled(Verdict::Free),
        ),
        (
            "no spec",
            Kind::Machine,
            "foo",
            Some(no_spec),
            Assessment::Settled(Verdict::Free),
        ),
        (
            "holder absent (after unlock)",
            Kind::Machine,
            "foo",
            Some(lease(None, None)),
            Assessment::Settled(Verdict::Free),
        ),
        (
            "holder empty, lock info left behind",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(""),
                Some(&info_json(&format!("runner@{OWN_POD}"), Some(HOLDER))),
            )),
            Assessment::Settled(Verdict::Free),
        ),
        (
            "held, lock info missing",
            Kind::Machine,
            "foo",
            Some(lease(Some(HOLDER), None)),
            unparsable(),
        ),
        (
            "held, lock info garbage",
            Kind::Machine,
            "foo",
            Some(lease(Some(HOLDER), Some("{not json"))),
            unparsable(),
        ),
        (
            "held, lock info empty",
            Kind::Machine,
            "foo",
            Some(lease(Some(HOLDER), Some(""))),
            unparsable(),
        ),
        (
            "held by an own pod, but the ID is a number",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&format!(r#"{{"ID":5,"Who":"runner@{OWN_POD}"}}"#)),
            )),
            unparsable(),
        ),
        (
            "held by an own pod, but Created is a number",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&format!(r#"{{"Created":0,"Who":"runner@{OWN_POD}"}}"#)),
            )),
            unparsable(),
        ),
        // Rule 2: the holder's hostname.
        (
            "a workstation",
            Kind::Machine,
            "foo",
            Some(held_by("alice@laptop")),
            foreign("alice@laptop"),
        ),
        (
            "a pod of object foo-apply",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-apply-a1-abc123-x7k2p")),
            foreign("runner@captf-m-foo-apply-apply-a1-abc123-x7k2p"),
        ),
        (
            "the Job name without the pod suffix",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-a1-abc123")),
            foreign("runner@captf-m-foo-apply-a1-abc123"),
        ),
        (
            "a 6-character pod suffix",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-a1-abc123-x7k2pq")),
            foreign("runner@captf-m-foo-apply-a1-abc123-x7k2pq"),
        ),
        (
            "a 4-character pod suffix",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-a1-abc123-x7k2")),
            foreign("runner@captf-m-foo-apply-a1-abc123-x7k2"),
        ),
        (
            "uppercase",
            Kind::Machine,
            "foo",
            Some(held_by("runner@CAPTF-M-FOO-APPLY-A1-ABC123-X7K2P")),
            foreign("runner@CAPTF-M-FOO-APPLY-A1-ABC123-X7K2P"),
        ),
        (
            "uppercase pod suffix",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-a1-abc123-X7K2P")),
            foreign("runner@captf-m-foo-apply-a1-abc123-X7K2P"),
        ),
        (
            "attempt 0",
            Kind::Machine,
            "foo",
            Some(held_by("runner@captf-m-foo-apply-a0-abc123-x7k2p")),
            foreign("runner@captf-m-foo-apply-a0-abc123-x7k2p"),
        ),
        (
            "a pod of another kind",
            Kind::Cluster,
            "foo",
            Some(held_by(&format!("runner@{OWN_POD}"))),
            foreign(&format!("runner@{OWN_POD}")),
        ),
        (
            "the pod name without any @",
            Kind::Machine,
            "foo",
            Some(held_by(OWN_POD)),
            foreign(OWN_POD),
        ),
        (
            "the pod name before the last @",
            Kind::Machine,
            "foo",
            Some(held_by(&format!("runner@{OWN_POD}@laptop"))),
            foreign(&format!("runner@{OWN_POD}@laptop")),
        ),
        (
            "the pod name with a domain",
            Kind::Machine,
            "foo",
            Some(held_by(&format!("runner@{OWN_POD}.cluster.local"))),
            foreign(&format!("runner@{OWN_POD}.cluster.local")),
        ),
        (
            "Who missing: the holder identity is shown",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&format!(r#"{{"ID":"{HOLDER}"}}"#)),
            )),
            Assessment::Settled(Verdict::Foreign {
                lease: LEASE.into(),
                holder: HOLDER.into(),
                operation: None,
                created: None,
                id: HOLDER.into(),
            }),
        ),
        (
            "an own pod",
            Kind::Machine,
            "foo",
            Some(held_by(&format!("runner@{OWN_POD}"))),
            own(OWN_POD, HOLDER),
        ),
        (
            "an own pod, no user name",
            Kind::Machine,
            "foo",
            Some(held_by(&format!("@{OWN_POD}"))),
            own(OWN_POD, HOLDER),
        ),
        (
            "an own pod after the last of several @",
            Kind::Machine,
            "foo",
            Some(held_by(&format!("user@host@{OWN_POD}"))),
            own(OWN_POD, HOLDER),
        ),
        (
            "an own pod of a long, hashed name",
            Kind::Machine,
            &long,
            Some(held_by(&format!("runner@{long_pod}"))),
            own(&long_pod, HOLDER),
        ),
        (
            "an own pod of object foo-apply",
            Kind::Machine,
            "foo-apply",
            Some(held_by("runner@captf-m-foo-apply-apply-a1-abc123-x7k2p")),
            own("captf-m-foo-apply-apply-a1-abc123-x7k2p", HOLDER),
        ),
        (
            "an own pod, the lock info's ID missing",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&info_json(&format!("runner@{OWN_POD}"), None)),
            )),
            own(OWN_POD, HOLDER),
        ),
        (
            "an own pod, the lock info's ID empty",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&info_json(&format!("runner@{OWN_POD}"), Some(""))),
            )),
            own(OWN_POD, HOLDER),
        ),
        (
            "an own pod, the lock info's ID first",
            Kind::Machine,
            "foo",
            Some(lease(
                Some(HOLDER),
                Some(&info_json(&format!("runner@{OWN_POD}"), Some("other-id"))),
            )),
            own(OWN_POD, "other-id"),
        ),
    ];
    for (what, kind, name, lease, want) in table {
        assert_eq!(assess(kind, name, lease.as_ref()), want, "{what}");
    }
}

#[test]
fn own_pods_are_stale_only_when_ended() {
    let hold = || OwnHold {
        lease: LEASE.into(),
        id: HOLDER.into(),
        pod: OWN_POD.into(),
    };
    let stale = Verdict::Stale {
        lease: LEASE.into(),
        id: HOLDER.into(),
        pod: OWN_POD.into(),
    };
    let alive = Verdict::Alive {
        lease: LEASE.into(),
        pod: OWN_POD.into(),
    };
    for (fact, want) in [
        (PodFact::Gone, &stale),
        (PodFact::Succeeded, &stale),
        (PodFact::Failed, &stale),
        (PodFact::Pending, &alive),
        (PodFact::Running, &alive),
        (PodFact::Terminating, &alive),
        (PodFact::Unknown, &alive),
    ] {
        assert_eq!(&hold().verdict(fact), want, "{fact:?}");
    }
    assert_eq!(hold().pod(), OWN_POD);
}

fn pod(phase: Option<&str>, deleting: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(OWN_POD.into()),
            deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        status: phase.map(|p| PodStatus {
            phase: Some(p.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn pod_facts() {
    assert_eq!(PodFact::of(None), PodFact::Gone);
    for (phase, want) in [
        (Some("Pending"), PodFact::Pending),
        (Some("Running"), PodFact::Running),
        (Some("Succeeded"), PodFact::Succeeded),
        (Some("Failed"), PodFact::Failed),
        (Some("Unknown"), PodFact::Unknown),
        (Some("running"), PodFact::Unknown),
        (Some(""), PodFact::Unknown),
        (None, PodFact::Unknown),
    ] {
        assert_eq!(PodFact::of(Some(&pod(phase, false))), want, "{phase:?}");
        assert_eq!(
            PodFact::of(Some(&pod(phase, true))),
            PodFact::Terminating,
            "{phase:?} while terminating"
        );
    }
    let no_phase = Pod {
        status: Some(PodStatus::default()),
        ..Default::default()
    };
    assert_eq!(PodFact::of(Some(&no_phase)), PodFact::Unknown);
}

#[test]
fn lock_ids() {
    let info = |id: Option<&str>| LockInfo::parse(&info_json("a@b", id)).unwrap();
    let with = info(Some("from-info"));
    let without = info(None);
    let empty = info(Some(""));
    for (info, holder, want) in [
        (Some(&with), Some("from-lease"), Some("from-info")),
        (Some(&with), None, Some("from-info")),
        (Some(&without), Some("from-lease"), Some("from-lease")),
        (Some(&empty), Some("from-lease"), Some("from-lease")),
        (None, Some("from-lease"), Some("from-lease")),
        (Some(&without), Some(""), None),
        (Some(&without), None, None),
        (None, None, None),
    ] {
        assert_eq!(
            lock_id(info, holder).as_deref(),
            want,
            "{info:?} {holder:?}"
        );
    }
}

#[test]
fn holder_pods() {
    let info = |who: Option<&str>| LockInfo {
        id: None,
        operation: None,
        info: None,
        who: who.map(str::to_owned),
        version: None,
        created: None,
        path: None,
    };
    for (who, want) in [
        (
            Some("runner@captf-m-foo-apply-a1-abc123-x7k2p"),
            Some(OWN_POD),
        ),
        (Some("a@b@captf-m-foo-apply-a1-abc123-x7k2p"), Some(OWN_POD)),
        (Some("captf-m-foo-apply-a1-abc123-x7k2p"), None),
        (Some("captf-m-foo-apply-a1-abc123-x7k2p@"), None),
        (Some("alice@laptop"), None),
        (None, None),
    ] {
        assert_eq!(
            holder_pod(Kind::Machine, "foo", &info(who)).as_deref(),
            want,
            "{who:?}"
        );
    }
}

#[test]
fn messages() {
    let foreign = Verdict::Foreign {
        lease: LEASE.into(),
        holder: "alice@laptop".into(),
        operation: Some("OperationTypeApply".into()),
        created: Some(CREATED.into()),
        id: HOLDER.into(),
    };
    assert_eq!(
        foreign.message(),
        format!(
            "the state lock {LEASE} is held by alice@laptop (OperationTypeApply) since \
             {CREATED}; it is not one of this object's runner pods, so CAPTF never unlocks it: \
             release it with force-unlock {HOLDER} once the holder is gone"
        )
    );
    let bare = Verdict::Foreign {
        lease: LEASE.into(),
        holder: HOLDER.into(),
        operation: None,
        created: None,
        id: HOLDER.into(),
    };
    assert_eq!(
        bare.message(),
        format!(
            "the state lock {LEASE} is held by {HOLDER}; it is not one of this object's runner \
             pods, so CAPTF never unlocks it: release it with force-unlock {HOLDER} once the \
             holder is gone"
        )
    );
    let long = Verdict::Foreign {
        lease: LEASE.into(),
        holder: format!("{}@laptop", "u".repeat(5000)),
        operation: Some("o".repeat(5000)),
        created: Some("c".repeat(5000)),
        id: "i".repeat(5000),
    };
    let message = long.message();
    assert!(message.len() < 2000, "{}", message.len());
    assert!(!message.contains(&"u".repeat(201)));

    let unparsable = Verdict::Unparsable {
        lease: LEASE.into(),
        holder: HOLDER.into(),
    }
    .message();
    assert!(unparsable.contains(LEASE), "{unparsable}");
    assert!(unparsable.contains(HOLDER), "{unparsable}");
    assert!(unparsable.contains("never unlocks"), "{unparsable}");

    let alive = Verdict::Alive {
        lease: LEASE.into(),
        pod: OWN_POD.into(),
    }
    .message();
    assert!(alive.contains(OWN_POD) && alive.contains(LEASE), "{alive}");
    let stale = Verdict::Stale {
        lease: LEASE.into(),
        id: HOLDER.into(),
        pod: OWN_POD.into(),
    }
    .message();
    assert!(
        stale.contains(OWN_POD) && stale.contains(HOLDER) && stale.contains("force-unlock"),
        "{stale}"
    );
    assert_eq!(Verdict::Free.message(), "the state lock is free");
}

#[test]
fn error_categories() {
    let api = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("boom", "Reason")
                .with_code(code)
                .boxed(),
        )
    };
    let lease = LockError::Lease {
        lease: LEASE.into(),
        source: api(403),
    };
    assert_eq!(lease.category(), Category::Invalid);
    let pod = LockError::Pod {
        pod: OWN_POD.into(),
        source: api(500),
    };
    assert_eq!(pod.category(), Category::Transient);
    assert!(pod.to_string().contains(OWN_POD), "{pod}");
}
