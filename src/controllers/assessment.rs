//! What one pass makes of the state it read and of the state lock (book:
//! terraform-state.md, state-lock-and-stale-locks.md): the StateReadable
//! condition, what the decision may assume, whether the state is lost, the
//! stale lock to force-unlock, the gauges, and which counter and events are
//! due. Pure.

use super::conditions::{Cond, STATE_READABLE, Status};
use super::decide::StateFact;
use crate::api::WorkspaceStatus;
use crate::locks::Verdict;
use crate::metrics::StateReadError;
use crate::names::Op;
use crate::state::StateReadable;

/// What the assessment looks at.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub readable: &'a StateReadable,
    /// The base Secret's `captf.io/inputs-hash`.
    pub inputs_hash: Option<&'a str>,
    pub lock: &'a Verdict,
    /// An apply succeeded once, so a missing state is lost.
    pub ever_applied: bool,
    /// A destroy succeeded, so a missing state is cleaned up, not lost.
    pub destroyed: bool,
    /// StateReadable as status had it before this pass.
    pub previous: Option<(Status, &'a str)>,
    /// `status.observedStateSerial` before this pass.
    pub observed_serial: Option<i64>,
    /// The base state Secret's name, for messages.
    pub state_secret: &'a str,
}

/// A read error entered in this pass: counted once, with one Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadErrorDue {
    pub reason: StateReadError,
    /// StateUnreadable, StateLost or StateLocked.
    pub event: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    pub condition: Cond,
    pub fact: StateFact,
    /// Applied once, and no state Secret is left: [`Assessment::fact`] is
    /// Unreadable, so that nothing is applied over it.
    pub lost: bool,
    /// A stale lock's ID, for the next Job to force-unlock.
    pub force_unlock: Option<String>,
    /// `captf_state_bytes` and `captf_state_resources`; None removes them.
    pub gauges: Option<(u64, u64)>,
    pub read_error: Option<ReadErrorDue>,
    /// The condition turned to an unreadable reason in this pass (the
    /// backup skip is counted then, not every pass).
    pub entered_unreadable: bool,
    /// The StateNearSecretLimit note, once per new serial past 900 KiB.
    pub near_limit: Option<String>,
}

/// Whether the object's own status shows it was applied: a state serial it
/// observed, or a last run that was a successful apply or restore.
pub fn applied_by_status(status: &WorkspaceStatus) -> bool {
    status.observed_state_serial.is_some_and(|s| s >= 1)
        || status
            .last_run
            .as_ref()
            .is_some_and(|r| matches!(r.operation, Op::Apply | Op::Restore) && r.error.is_none())
}

pub fn assess(i: &Inputs<'_>) -> Assessment {
    let reason = i.readable.reason();
    let status = match reason.status() {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    };
    let lost = i.ever_applied && !i.destroyed && *i.readable == StateReadable::NotFound;
    let mut condition = Cond::new(
        STATE_READABLE,
        status,
        reason.as_str(),
        i.readable.message(),
    );
    let mut read_error = i
        .readable
        .metric_reason()
        .and_then(|r| {
            StateReadError::ALL
                .iter()
                .copied()
                .find(|m| m.as_str() == r)
        })
        .map(|reason| ReadErrorDue {
            reason,
            event: "StateUnreadable",
        });
    let mut gauges = None;
    let mut near_limit = None;
    let fact = match i.readable {
        // Applied once and gone: nothing may run from the spec alone (a
        // machine would be created twice) until it is restored.
        StateReadable::NotFound if lost => {
            condition = Cond::new(
                STATE_READABLE,
                Status::False,
                "StateLost",
                format!(
                    "state Secret {} is missing although the object was applied; restore it from a backup",
                    i.state_secret
                ),
            );
            read_error = Some(ReadErrorDue {
                reason: StateReadError::Lost,
                event: "StateLost",
            });
            StateFact::Unreadable
        }
        StateReadable::NotFound => StateFact::NotFound,
        StateReadable::Read(st) => {
            gauges = Some((st.compressed_bytes, st.managed_resources));
            let serial = i64::try_from(st.serial).ok().filter(|s| *s >= 1);
            if serial.is_some() && serial != i.observed_serial {
                near_limit = st.near_secret_limit_note();
            }
            StateFact::Read {
                inputs_hash: i.inputs_hash.map(str::to_owned),
            }
        }
        StateReadable::Unreadable(_) => StateFact::Unreadable,
    };
    let force_unlock = match i.lock {
        Verdict::Stale { id, .. } => Some(id.clone()),
        Verdict::Free | Verdict::Alive { .. } => None,
        // Never unlocked; Jobs keep starting, and each waits
        // lockTimeoutSeconds for the lock and fails. A state that cannot
        // be read says so first.
        held @ (Verdict::Foreign { .. } | Verdict::Unparsable { .. }) => {
            if fact != StateFact::Unreadable {
                condition = Cond::new(STATE_READABLE, Status::False, "StateLocked", held.message());
                read_error = Some(ReadErrorDue {
                    reason: StateReadError::Locked,
                    event: "StateLocked",
                });
            }
            None
        }
    };
    let entered = i.previous != Some((condition.status, condition.reason));
    Assessment {
        entered_unreadable: entered && matches!(i.readable, StateReadable::Unreadable(_)),
        read_error: read_error.filter(|_| entered),
        condition,
        fact,
        lost,
        force_unlock,
        gauges,
        near_limit,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::{State, Unreadable};

    fn read(serial: u64, compressed_bytes: u64) -> StateReadable {
        StateReadable::Read(State {
            serial,
            lineage: "l".into(),
            terraform_version: "1.12.6".into(),
            outputs: BTreeMap::new(),
            managed_resources: 3,
            compressed_bytes,
            decompressed_bytes: compressed_bytes * 10,
        })
    }

    fn foreign() -> Verdict {
        Verdict::Foreign {
            lease: "lock".into(),
            holder: "me@laptop".into(),
            operation: Some("OperationTypeApply".into()),
            created: None,
            id: "id-1".into(),
        }
    }

    struct Row {
        what: &'static str,
        readable: StateReadable,
        lock: Verdict,
        ever_applied: bool,
        destroyed: bool,
        previous: Option<(Status, &'static str)>,
        reason: &'static str,
        fact: StateFact,
        lost: bool,
        read_error: Option<(StateReadError, &'static str)>,
    }

    fn row(
        what: &'static str,
        readable: StateReadable,
        reason: &'static str,
        fact: StateFact,
    ) -> Row {
        Row {
            what,
            readable,
            lock: Verdict::Free,
            ever_applied: false,
            destroyed: false,
            previous: None,
            reason,
            fact,
            lost: false,
            read_error: None,
        }
    }

    #[test]
    fn the_state_and_its_lock_assessed() {
        let corrupt = || StateReadable::Unreadable(Unreadable::Encrypted);
        let read_hash = || StateFact::Read {
            inputs_hash: Some("h2:x".into()),
        };
        let rows = [
            row(
                "never applied",
                StateReadable::NotFound,
                "StateNotFound",
                StateFact::NotFound,
            ),
            Row {
                ever_applied: true,
                lost: true,
                read_error: Some((StateReadError::Lost, "StateLost")),
                ..row(
                    "applied and gone",
                    StateReadable::NotFound,
                    "StateLost",
                    StateFact::Unreadable,
                )
            },
            Row {
                ever_applied: true,
                destroyed: true,
                ..row(
                    "destroyed and gone",
                    StateReadable::NotFound,
                    "StateNotFound",
                    StateFact::NotFound,
                )
            },
            Row {
                ever_applied: true,
                previous: Some((Status::False, "StateLost")),
                lost: true,
                ..row(
                    "still lost: no second event",
                    StateReadable::NotFound,
                    "StateLost",
                    StateFact::Unreadable,
                )
            },
            row("read", read(2, 10), "StateRead", read_hash()),
            Row {
                read_error: Some((StateReadError::Encrypted, "StateUnreadable")),
                ..row(
                    "encrypted",
                    corrupt(),
                    "StateEncrypted",
                    StateFact::Unreadable,
                )
            },
            Row {
                lock: foreign(),
                read_error: Some((StateReadError::Locked, "StateLocked")),
                ..row("foreign lock", read(2, 10), "StateLocked", read_hash())
            },
            Row {
                lock: foreign(),
                previous: Some((Status::False, "StateLocked")),
                ..row("still locked", read(2, 10), "StateLocked", read_hash())
            },
            Row {
                lock: foreign(),
                read_error: Some((StateReadError::Encrypted, "StateUnreadable")),
                ..row(
                    "unreadable wins over a lock",
                    corrupt(),
                    "StateEncrypted",
                    StateFact::Unreadable,
                )
            },
        ];
        for r in rows {
            let a = assess(&Inputs {
                readable: &r.readable,
                inputs_hash: Some("h2:x"),
                lock: &r.lock,
                ever_applied: r.ever_applied,
                destroyed: r.destroyed,
                previous: r.previous,
                observed_serial: None,
                state_secret: "tfstate-default-s",
            });
            assert_eq!(a.condition.reason, r.reason, "{}", r.what);
            assert_eq!(a.fact, r.fact, "{}", r.what);
            assert_eq!(a.lost, r.lost, "{}", r.what);
            assert_eq!(
                a.read_error.map(|e| (e.reason, e.event)),
                r.read_error,
                "{}",
                r.what
            );
        }
    }

    #[test]
    fn gauges_force_unlock_and_the_near_limit_note() {
        let stale = Verdict::Stale {
            lease: "lock".into(),
            id: "id-9".into(),
            pod: "pod".into(),
        };
        let big = read(7, 950 * 1024);
        let inputs = |observed, lock| Inputs {
            readable: &big,
            inputs_hash: None,
            lock,
            ever_applied: true,
            destroyed: false,
            previous: Some((Status::True, "StateRead")),
            observed_serial: observed,
            state_secret: "s",
        };
        let a = assess(&inputs(None, &stale));
        assert_eq!(a.force_unlock.as_deref(), Some("id-9"));
        assert_eq!(a.gauges, Some((950 * 1024, 3)));
        assert!(a.near_limit.is_some());
        assert!(a.read_error.is_none() && !a.entered_unreadable);
        let seen = assess(&inputs(Some(7), &Verdict::Free));
        assert_eq!(seen.force_unlock, None);
        assert_eq!(seen.near_limit, None, "once per serial");
        let gone = assess(&Inputs {
            readable: &StateReadable::NotFound,
            ..inputs(None, &Verdict::Free)
        });
        assert_eq!(gone.gauges, None);
        let unreadable = StateReadable::Unreadable(Unreadable::Encrypted);
        let entered = assess(&Inputs {
            readable: &unreadable,
            ..inputs(None, &Verdict::Free)
        });
        assert!(entered.entered_unreadable);
    }

    #[test]
    fn the_status_shows_an_applied_object() {
        use crate::api::{LastRun, RunError, RunErrorKind};
        let run = |operation, failed: bool| LastRun {
            job: "j".into(),
            operation,
            steps: None,
            error: failed.then_some(RunError {
                kind: RunErrorKind::Step,
                step: None,
                summary: None,
            }),
            drift: None,
        };
        let rows = [
            ("nothing yet", None, None, false),
            ("a serial observed", Some(3), None, true),
            (
                "a successful apply",
                None,
                Some(run(Op::Apply, false)),
                true,
            ),
            (
                "a successful restore",
                None,
                Some(run(Op::Restore, false)),
                true,
            ),
            (
                "a failed first apply",
                None,
                Some(run(Op::Apply, true)),
                false,
            ),
            (
                "a failed apply after a serial",
                Some(2),
                Some(run(Op::Apply, true)),
                true,
            ),
            (
                "a successful destroy only",
                None,
                Some(run(Op::Destroy, false)),
                false,
            ),
        ];
        for (what, serial, last_run, want) in rows {
            let status = WorkspaceStatus {
                observed_state_serial: serial,
                last_run,
                ..Default::default()
            };
            assert_eq!(applied_by_status(&status), want, "{what}");
        }
    }
}
