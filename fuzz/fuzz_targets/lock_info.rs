//! The lock info parser (`LockInfo::parse`) and the stale-lock decision
//! over it (`locks::assess`, `OwnHold::verdict`, `Verdict::message`), on a
//! state lock Lease whose `app.terraform.io/lock-info` annotation is the
//! input, as the reconciler reads it. The object is TerraformMachine `foo`,
//! whose runner pods are named like `captf-m-foo-apply-a1-abc123-x7k2p`.
//!
//! Input: the annotation's text (not UTF-8: skipped, as an annotation is a
//! string).
//!
//! Properties, beyond "no panic, no OOM, no hang":
//! - a lock held by the object's own pod is one whose `Who` host is such a
//!   pod (`names::is_own_runner_pod`), and only then can it be stale;
//! - the lock ID to release is never empty;
//! - the messages and the Debug form clip what the lock info chooses.

#![no_main]

use captf::keys::LOCK_INFO;
use captf::locks::{self, Assessment, LockInfo, PodFact, Verdict};
use captf::names::{self, Kind};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use libfuzzer_sys::fuzz_target;

const NAME: &str = "foo";
const LEASE: &str = "lock-tfstate-default-0123456789abcdef-m";
const HOLDER: &str = "8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";

/// The longest message: its fixed text, the lease and pod names, and four
/// clipped fields of 200 characters and a mark each.
const MESSAGE_MAX_CHARS: usize = 600 + 4 * 201;

fn check_message(verdict: &Verdict) {
    let message = verdict.message();
    let chars = message.chars().count();
    assert!(
        chars <= MESSAGE_MAX_CHARS,
        "a message of {chars} characters"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = LockInfo::parse(json);
    if let Ok(info) = &parsed {
        let debug = format!("{info:?}");
        let info_chars = info.info.as_deref().map_or(0, |i| i.chars().count());
        let others: usize = [
            &info.id,
            &info.operation,
            &info.who,
            &info.version,
            &info.path,
        ]
        .iter()
        .filter_map(|f| f.as_deref())
        .chain(info.created.as_ref().map(|c| c.raw.as_str()))
        // As Debug shows them: it escapes combining marks anywhere, where
        // `escape_debug` escapes them only first in the string.
        .map(|f| format!("{f:?}").chars().count() + 8)
        .sum();
        // Info shows at most 200 characters and the mark, each escaped to at
        // most 10 (`\u{10ffff}`).
        assert!(
            debug.chars().count() <= 400 + others + 10 * info_chars.min(201),
            "the Debug form does not clip Info: {} characters",
            debug.chars().count()
        );
        // Empty strings read as missing.
        for field in [
            &info.id,
            &info.operation,
            &info.info,
            &info.who,
            &info.version,
            &info.path,
        ] {
            assert_ne!(field.as_deref(), Some(""));
        }
    }

    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            annotations: Some([(LOCK_INFO.to_owned(), json.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(HOLDER.into()),
            ..Default::default()
        }),
    };
    match locks::assess(Kind::Machine, NAME, Some(&lease)) {
        Assessment::Settled(verdict) => {
            match &verdict {
                Verdict::Free => panic!("a held lock read as free"),
                Verdict::Unparsable { .. } => assert!(parsed.is_err(), "parsed, yet unparsable"),
                Verdict::Foreign { id, .. } => {
                    assert!(!id.is_empty());
                    let info = parsed
                        .as_ref()
                        .expect("a foreign holder comes from the lock info");
                    assert!(locks::holder_pod(Kind::Machine, NAME, info).is_none());
                }
                Verdict::Alive { .. } | Verdict::Stale { .. } => {
                    panic!("decided alive or stale without the pod")
                }
            }
            check_message(&verdict);
        }
        Assessment::OwnPod(hold) => {
            let info = parsed
                .as_ref()
                .expect("an own pod comes from the lock info");
            let host = info
                .who
                .as_deref()
                .and_then(|w| w.rsplit_once('@'))
                .map(|(_, host)| host)
                .expect("an own pod comes from Who");
            assert_eq!(hold.pod(), host);
            assert!(names::is_own_runner_pod(Kind::Machine, NAME, hold.pod()));
            for fact in [
                PodFact::Gone,
                PodFact::Pending,
                PodFact::Running,
                PodFact::Succeeded,
                PodFact::Failed,
                PodFact::Terminating,
                PodFact::Unknown,
            ] {
                let verdict = hold.clone().verdict(fact);
                match (&verdict, fact) {
                    (
                        Verdict::Stale { id, pod, .. },
                        PodFact::Gone | PodFact::Succeeded | PodFact::Failed,
                    ) => {
                        assert!(!id.is_empty());
                        assert_eq!(pod, host);
                    }
                    (
                        Verdict::Alive { .. },
                        PodFact::Pending
                        | PodFact::Running
                        | PodFact::Terminating
                        | PodFact::Unknown,
                    ) => {}
                    (verdict, fact) => panic!("{fact:?} gave {verdict:?}"),
                }
                check_message(&verdict);
            }
        }
    }
});
