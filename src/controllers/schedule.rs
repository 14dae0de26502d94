//! The schedule (ref §8.3): which refresh or drift check is due when no
//! apply or destroy is, or when to look again. The first due wins:
//!
//! 1. a machine's or pool's post-apply refresh, unless the apply's own
//!    reading stood in for it (a machine whose outputs were valid and whose
//!    health was neither pending nor unknown);
//! 2. a pool whose membership still converges: every 30 s (or the
//!    membership interval if shorter);
//! 3. health pending or unknown (cluster, machine): after 30 s, 1 m, 2 m,
//!    4 m, then every 5 m, by the count of pending samples;
//! 4. a pool's membership interval;
//! 5. a machine's health-check interval (only with annotateMachine);
//! 6. the drift interval, the first one after the last successful apply.
//!
//! Every wait but the post-apply refresh gets a jitter of up to 10% of its
//! interval, the same for an object every time: derived from its UID. Pure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::names::Kind;

/// A pool's membership refresh interval when it sets none.
pub const MEMBERSHIP_DEFAULT: Duration = Duration::from_secs(60);
/// How often a converging pool is read again, at most.
const CONVERGING: Duration = Duration::from_secs(30);
/// The health-pending backoff: 30 s, 1 m, 2 m, 4 m, then 5 m.
const PENDING_STEPS: [u64; 5] = [30, 60, 120, 240, 300];

/// What a pending health reading says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// pending or unknown: read again soon.
    Pending,
    Settled,
}

#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub kind: Kind,
    pub uid: &'a str,
    pub now: Timestamp,
    /// The end of the newest successful apply.
    pub last_apply: Option<Timestamp>,
    /// `status.lastRefresh`.
    pub last_refresh: Option<Timestamp>,
    /// `status.lastDriftCheck`.
    pub last_drift_check: Option<Timestamp>,
    pub health: Health,
    pub provisioned: bool,
    /// `status.pendingRefreshes`.
    pub pending_refreshes: u32,
    /// A pool's providerIDList does not match its replicas yet.
    pub converging: bool,
    /// A pool's membership interval.
    pub membership: Option<Duration>,
    /// A machine's health-check interval, with annotateMachine.
    pub health_check: Option<Duration>,
    /// None: drift checks are off.
    pub drift: Option<Duration>,
}

/// Why a refresh is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    PostApply,
    Converging,
    HealthPending,
    Membership,
    HealthCheck,
}

impl Refresh {
    pub const fn as_str(self) -> &'static str {
        match self {
            Refresh::PostApply => "the outputs are read again after the apply",
            Refresh::Converging => "the pool's membership is converging",
            Refresh::HealthPending => "the health is pending",
            Refresh::Membership => "the pool's membership interval elapsed",
            Refresh::HealthCheck => "the machine's health-check interval elapsed",
        }
    }

    /// The `reason` label of `captf_reconcile_op_decisions_total`.
    pub const fn metric(self) -> &'static str {
        match self {
            Refresh::PostApply => "post_apply",
            Refresh::Converging => "converging",
            Refresh::HealthPending => "health_pending",
            Refresh::Membership => "membership",
            Refresh::HealthCheck => "health_check",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    Refresh(Refresh),
    Drift,
    /// Nothing yet: look again after this long.
    Wait(Duration),
    /// Nothing is scheduled.
    Never,
}

/// The drift interval of an object of `kind` that sets `own` and whose
/// cluster's `spec.defaults.drift` sets `inherited` (ref §1.2): a cluster
/// takes only its own; a machine its own, else the inherited, else the
/// manager's default, where 0 turns checks off; a pool likewise, except
/// that 0 means unset, so its checks are never off. None: off.
pub fn drift_interval(
    kind: Kind,
    own: Option<i64>,
    inherited: Option<i64>,
    default: Duration,
) -> Option<Duration> {
    let chosen = match kind {
        Kind::Cluster => own,
        Kind::Machine => own.or(inherited),
        Kind::MachinePool => own.filter(|s| *s > 0).or(inherited.filter(|s| *s > 0)),
    };
    match chosen {
        None => Some(default).filter(|d| !d.is_zero()),
        Some(s) => u64::try_from(s)
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
    }
}

/// The jitter of `interval` for the object `uid`: up to 10% of it.
pub fn jitter(uid: &str, interval: Duration) -> Duration {
    let digest = Sha256::digest(uid.as_bytes());
    let n = u64::from(u16::from_be_bytes([digest[0], digest[1]])) % 1001;
    interval.mul_f64(n as f64 / 10_000.0)
}

/// The wait after `pending` consecutive pending samples.
pub fn pending_wait(pending: u32) -> Duration {
    let i = usize::try_from(pending.saturating_sub(1)).unwrap_or(usize::MAX);
    Duration::from_secs(PENDING_STEPS[i.min(PENDING_STEPS.len() - 1)])
}

pub fn due(f: &Facts) -> Due {
    let machine_or_pool = matches!(f.kind, Kind::Machine | Kind::MachinePool);
    let refreshed = f.last_refresh.max(f.last_apply);
    if machine_or_pool
        && let Some(applied) = f.last_apply
        && f.last_refresh.is_none_or(|r| r < applied)
    {
        return Due::Refresh(Refresh::PostApply);
    }
    // (what, interval, since): each is due `interval` plus its jitter after
    // `since`.
    let mut candidates: Vec<(Due, Duration, Option<Timestamp>)> = Vec::new();
    if f.kind == Kind::MachinePool && (f.converging || f.health == Health::Pending) {
        let every = f.membership.map_or(CONVERGING, |m| m.min(CONVERGING));
        candidates.push((Due::Refresh(Refresh::Converging), every, refreshed));
    }
    // Drift checks off also turn off health sampling once provisioned
    // (ref §1.2 DriftPolicy).
    let sampling = f.drift.is_some() || !f.provisioned;
    if f.kind != Kind::MachinePool && f.health == Health::Pending && sampling {
        candidates.push((
            Due::Refresh(Refresh::HealthPending),
            pending_wait(f.pending_refreshes),
            refreshed,
        ));
    }
    if let (Kind::MachinePool, Some(every)) = (f.kind, f.membership) {
        candidates.push((Due::Refresh(Refresh::Membership), every, refreshed));
    }
    if let (Kind::Machine, Some(every), true) = (f.kind, f.health_check, sampling) {
        candidates.push((Due::Refresh(Refresh::HealthCheck), every, refreshed));
    }
    if let Some(every) = f.drift {
        candidates.push((Due::Drift, every, f.last_drift_check.max(f.last_apply)));
    }
    let mut soonest: Option<Duration> = None;
    for (what, every, since) in candidates {
        // Never applied: nothing to read yet.
        let Some(since) = since else { continue };
        let at = since + (every + jitter(f.uid, every));
        let left = Duration::try_from(f.now.duration_until(at)).unwrap_or(Duration::ZERO);
        if left.is_zero() {
            return what;
        }
        soonest = Some(soonest.map_or(left, |s| s.min(left)));
    }
    soonest.map_or(Due::Never, Due::Wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b8e3f4a-5c36-4c0c-a7d2-3f1d3a9f2e10";

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + secs).unwrap()
    }

    fn facts(kind: Kind) -> Facts<'static> {
        Facts {
            kind,
            uid: UID,
            now: at(0),
            last_apply: Some(at(-10_000)),
            last_refresh: Some(at(-10_000)),
            last_drift_check: None,
            health: Health::Settled,
            provisioned: true,
            pending_refreshes: 0,
            converging: false,
            membership: None,
            health_check: None,
            drift: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn jitter_is_the_objects_own_and_at_most_a_tenth() {
        let j = jitter(UID, secs(600));
        assert_eq!(j, jitter(UID, secs(600)));
        assert!(j <= secs(60), "{j:?}");
        let others: Vec<Duration> = (0..50)
            .map(|i| jitter(&format!("uid-{i}"), secs(600)))
            .collect();
        assert!(others.iter().all(|j| *j <= secs(60)));
        assert!(others.iter().any(|o| *o != j), "the jitter spreads objects");
    }

    #[test]
    fn drift_intervals_and_their_inheritance() {
        let d = secs(1800);
        // (kind, own, inherited, interval)
        for (kind, own, inherited, want) in [
            (Kind::Cluster, None, Some(60), Some(d)),
            (Kind::Cluster, Some(120), None, Some(secs(120))),
            (Kind::Cluster, Some(0), None, None),
            (Kind::Machine, None, None, Some(d)),
            (Kind::Machine, None, Some(60), Some(secs(60))),
            (Kind::Machine, Some(90), Some(60), Some(secs(90))),
            (Kind::Machine, None, Some(0), None),
            (Kind::Machine, Some(0), Some(60), None),
            (Kind::MachinePool, None, Some(0), Some(d)),
            (Kind::MachinePool, Some(0), Some(60), Some(secs(60))),
            (Kind::MachinePool, Some(30), Some(60), Some(secs(30))),
        ] {
            assert_eq!(
                drift_interval(kind, own, inherited, d),
                want,
                "{kind:?} {own:?} {inherited:?}"
            );
        }
        assert_eq!(
            drift_interval(Kind::Machine, None, None, Duration::ZERO),
            None
        );
    }

    #[test]
    fn the_health_pending_backoff() {
        let got: Vec<u64> = (0..8).map(|n| pending_wait(n).as_secs()).collect();
        assert_eq!(got, [30, 30, 60, 120, 240, 300, 300, 300]);
    }

    #[test]
    fn first_due_wins() {
        let j = |s: u64| jitter(UID, secs(s));
        let drift = |f: Facts<'static>| Facts {
            drift: Some(secs(600)),
            ..f
        };
        // (case, facts, due)
        let table: Vec<(&str, Facts, Due)> = vec![
            (
                "a cluster with nothing scheduled",
                facts(Kind::Cluster),
                Due::Never,
            ),
            (
                "never applied: nothing to read",
                Facts {
                    last_apply: None,
                    last_refresh: None,
                    ..drift(facts(Kind::Cluster))
                },
                Due::Never,
            ),
            (
                "a machine's post-apply refresh",
                Facts {
                    last_apply: Some(at(-5)),
                    ..drift(facts(Kind::Machine))
                },
                Due::Refresh(Refresh::PostApply),
            ),
            (
                "a cluster has no post-apply refresh",
                Facts {
                    last_apply: Some(at(-5)),
                    ..facts(Kind::Cluster)
                },
                Due::Never,
            ),
            (
                "a converging pool, read 20 s ago",
                Facts {
                    converging: true,
                    last_refresh: Some(at(-20)),
                    membership: Some(secs(60)),
                    ..facts(Kind::MachinePool)
                },
                Due::Wait(secs(10) + j(30)),
            ),
            (
                "a converging pool with a shorter interval",
                Facts {
                    converging: true,
                    last_refresh: Some(at(-20)),
                    membership: Some(secs(15)),
                    ..facts(Kind::MachinePool)
                },
                Due::Refresh(Refresh::Converging),
            ),
            (
                "pending health, third sample, read 100 s ago",
                Facts {
                    health: Health::Pending,
                    pending_refreshes: 3,
                    last_refresh: Some(at(-100)),
                    last_drift_check: Some(at(-1)),
                    ..drift(facts(Kind::Machine))
                },
                Due::Wait(secs(20) + j(120)),
            ),
            (
                "pending health, drift off, provisioned: not sampled",
                Facts {
                    health: Health::Pending,
                    pending_refreshes: 1,
                    last_refresh: Some(at(-40)),
                    ..facts(Kind::Cluster)
                },
                Due::Never,
            ),
            (
                "pending health, drift off, not provisioned yet",
                Facts {
                    health: Health::Pending,
                    pending_refreshes: 1,
                    last_refresh: Some(at(-40)),
                    provisioned: false,
                    ..facts(Kind::Cluster)
                },
                Due::Refresh(Refresh::HealthPending),
            ),
            (
                "pending health, due",
                Facts {
                    health: Health::Pending,
                    pending_refreshes: 1,
                    last_refresh: Some(at(-40)),
                    ..drift(facts(Kind::Cluster))
                },
                Due::Refresh(Refresh::HealthPending),
            ),
            (
                "a pool's membership interval",
                Facts {
                    membership: Some(secs(60)),
                    last_refresh: Some(at(-70)),
                    ..facts(Kind::MachinePool)
                },
                Due::Refresh(Refresh::Membership),
            ),
            (
                "a machine's health check",
                Facts {
                    health_check: Some(secs(300)),
                    last_refresh: Some(at(-400)),
                    last_drift_check: Some(at(-1)),
                    ..drift(facts(Kind::Machine))
                },
                Due::Refresh(Refresh::HealthCheck),
            ),
            (
                "drift one interval after the apply",
                Facts {
                    last_apply: Some(at(-300)),
                    last_refresh: Some(at(-300)),
                    ..drift(facts(Kind::Cluster))
                },
                Due::Wait(secs(300) + j(600)),
            ),
            ("drift due", drift(facts(Kind::Cluster)), Due::Drift),
            (
                "drift one interval after the last check",
                Facts {
                    last_drift_check: Some(at(-100)),
                    ..drift(facts(Kind::Cluster))
                },
                Due::Wait(secs(500) + j(600)),
            ),
            (
                "the soonest of two waits",
                Facts {
                    last_drift_check: Some(at(-550)),
                    health_check: Some(secs(300)),
                    last_refresh: Some(at(-100)),
                    ..drift(facts(Kind::Machine))
                },
                Due::Wait((secs(50) + j(600)).min(secs(200) + j(300))),
            ),
        ];
        for (case, f, want) in table {
            assert_eq!(due(&f), want, "{case}");
        }
    }
}
