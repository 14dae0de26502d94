//! Leader election (DESIGN "Processes"; ref §6.1): with `--leader-elect`
//! the reconcilers and the namespace sweep run only in the replica that
//! holds the Lease `controller-leader-election-captf` in the manager's
//! namespace; webhooks and health run in every replica.
//!
//! The rules are client-go's, so that the Lease means the same to a Go
//! manager and to kubectl:
//! - a candidate takes the Lease when it names no holder, or when its record
//!   has not changed for the holder's `leaseDurationSeconds`, measured on the
//!   candidate's own clock from when it saw the record change (another
//!   node's `renewTime` is never compared with this clock);
//! - the leader renews every retry period and gives up leading once it has
//!   not renewed for the renew deadline, which is shorter than the lease
//!   duration, so it stops before anyone may take over;
//! - every write carries the resourceVersion it read, so two candidates
//!   cannot both win;
//! - a leader that stops releases the Lease (no holder, one second) so that
//!   a standby takes over at once.
//!
//! kube-lease-manager was considered: it keeps reporting leadership while
//! its renewals fail, which is exactly the case a renew deadline is for.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tracing::{info, warn};

use crate::jobs::lost_race;

/// The Lease's fixed name (ref §6.1, §7).
pub const LEASE: &str = "controller-leader-election-captf";

/// `--leader-elect-lease-duration`, `-renew-deadline` and `-retry-period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What a candidate may do with the Lease as it last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// It holds the Lease: renew it.
    Renew,
    /// Nobody holds it, or the holder let it expire: take it.
    Take,
    /// Another candidate holds it.
    Wait,
}

/// The claim of `me` on a Lease held by `holder` for `held_for` (its
/// `leaseDurationSeconds`), whose record has not changed for `unchanged_for`
/// on this candidate's clock.
pub fn claim(me: &str, holder: Option<&str>, held_for: Duration, unchanged_for: Duration) -> Claim {
    match holder {
        Some(h) if h == me => Claim::Renew,
        None | Some("") => Claim::Take,
        Some(_) if unchanged_for >= held_for => Claim::Take,
        Some(_) => Claim::Wait,
    }
}

/// The Lease spec `me` writes to take or renew `previous` (None: the
/// Lease does not exist yet) at `now`.
pub fn held(previous: Option<&LeaseSpec>, me: &str, now: Timestamp, timing: &Timing) -> LeaseSpec {
    let previous = previous.cloned().unwrap_or_default();
    let renewing = previous.holder_identity.as_deref() == Some(me);
    let transitions = previous.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds(timing.lease_duration)),
        renew_time: Some(MicroTime(now)),
        acquire_time: if renewing {
            previous.acquire_time
        } else {
            Some(MicroTime(now))
        },
        // A Lease that had a holder changes hands; a new or released one
        // is merely taken.
        lease_transitions: Some(match previous.holder_identity.as_deref() {
            Some(h) if !renewing && !h.is_empty() => transitions + 1,
            _ => transitions,
        }),
        ..previous
    }
}

/// The spec of a Lease its leader gives up at `now`: no holder, and a one
/// second duration for candidates that still saw it held.
pub fn released(previous: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        acquire_time: Some(MicroTime(now)),
        ..previous.clone()
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// An identity unique to this process: the pod's name (or the host's),
/// and a random part so that a restarted process never takes itself for
/// the holder its predecessor was.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "captf-manager".into());
    // RandomState is seeded from the OS's randomness per process.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}_{random:016x}")
}

/// Why a leader stopped leading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// No renewal succeeded within the renew deadline.
    DeadlinePassed,
    /// The Lease names another holder.
    TakenBy(String),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::DeadlinePassed => {
                write!(f, "the Lease was not renewed within the renew deadline")
            }
            Lost::TakenBy(holder) => write!(f, "the Lease is held by {holder}"),
        }
    }
}

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    timing: Timing,
    /// The resourceVersion last seen, and when this candidate first saw it.
    seen: Option<(String, Instant)>,
}

/// The outcome of one attempt.
enum Attempt {
    Holding,
    HeldBy(String),
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, identity: String, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            identity,
            timing,
            seen: None,
        }
    }

    /// Waits to lead, then runs `lead()` while leading. Ok once `stopped`
    /// resolves before leading or `lead()` returns (the Lease then
    /// released), Err as soon as leading is lost (`lead()` dropped).
    pub async fn while_leading<F: Future<Output = ()>>(
        mut self,
        stopped: impl Future<Output = ()>,
        lead: impl FnOnce() -> F,
    ) -> Result<(), Lost> {
        tokio::select! {
            () = self.acquire() => {}
            () = stopped => return Ok(()),
        }
        let outcome = tokio::select! {
            () = lead() => Ok(()),
            lost = self.hold() => Err(lost),
        };
        if outcome.is_ok() {
            self.release().await;
        }
        outcome
    }

    /// Returns once this candidate leads.
    async fn acquire(&mut self) {
        info!(lease = LEASE, identity = %self.identity, "waiting to lead");
        loop {
            match self.attempt().await {
                Ok(Attempt::Holding) => {
                    info!(lease = LEASE, identity = %self.identity, "leading");
                    return;
                }
                Ok(Attempt::HeldBy(_)) => {}
                Err(e) => warn!(lease = LEASE, "trying to lead: {e}"),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews the Lease every retry period; returns when leading is lost.
    async fn hold(&mut self) -> Lost {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            // A request that hangs counts as a failed renewal.
            let left = self.timing.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.attempt()).await {
                Ok(Ok(Attempt::Holding)) => renewed = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => return Lost::TakenBy(holder),
                Ok(Err(e)) => warn!(lease = LEASE, "renewing: {e}"),
                Err(_) => warn!(lease = LEASE, "renewing: no answer in time"),
            }
            if renewed.elapsed() >= self.timing.renew_deadline {
                return Lost::DeadlinePassed;
            }
        }
    }

    /// Gives the Lease up if this candidate holds it.
    async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(LEASE).await? else {
                return Ok(());
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            lease.spec = Some(released(&spec, Timestamp::now()));
            self.api
                .replace(LEASE, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        .await;
        match result {
            Ok(()) => info!(lease = LEASE, "released"),
            Err(e) => warn!(lease = LEASE, "releasing: {e}"),
        }
    }

    /// Reads the Lease and takes or renews it when `claim` allows.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let now = Instant::now();
        let Some(mut lease) = self.api.get_opt(LEASE).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE.into()),
                    ..Default::default()
                },
                spec: Some(held(None, &self.identity, Timestamp::now(), &self.timing)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Holding),
                Err(e) if lost_race(&e) => Ok(Attempt::HeldBy(String::new())),
                Err(e) => Err(e),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let since = match &self.seen {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                self.seen = Some((version, now));
                now
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref();
        let held_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.lease_duration, Duration::from_secs);
        match claim(&self.identity, holder, held_for, now.duration_since(since)) {
            Claim::Wait => Ok(Attempt::HeldBy(holder.unwrap_or_default().to_string())),
            Claim::Renew | Claim::Take => {
                lease.spec = Some(held(
                    Some(&spec),
                    &self.identity,
                    Timestamp::now(),
                    &self.timing,
                ));
                // The resourceVersion read guards the write.
                match self
                    .api
                    .replace(LEASE, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(Attempt::Holding),
                    Err(e) if lost_race(&e) => Ok(Attempt::HeldBy(String::new())),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn claims() {
        // (holder, held for, unchanged for) -> claim of "me"
        let table: &[(Option<&str>, u64, u64, Claim)] = &[
            (Some("me"), 15, 0, Claim::Renew),
            (Some("me"), 15, 99, Claim::Renew),
            (None, 15, 0, Claim::Take),
            (Some(""), 15, 0, Claim::Take),
            (Some("other"), 15, 14, Claim::Wait),
            (Some("other"), 15, 15, Claim::Take),
            (Some("other"), 1, 1, Claim::Take),
            (Some("meself"), 15, 0, Claim::Wait),
        ];
        for (holder, held_for, unchanged, want) in table {
            assert_eq!(
                claim("me", *holder, S(*held_for), S(*unchanged)),
                *want,
                "{holder:?} {held_for} {unchanged}"
            );
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn spec(holder: Option<&str>, acquired: i64, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(Into::into),
            acquire_time: Some(MicroTime(at(acquired))),
            renew_time: Some(MicroTime(at(acquired))),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    #[test]
    fn taking_renewing_and_releasing() {
        let timing = Timing {
            lease_duration: S(4),
            renew_deadline: S(3),
            retry_period: S(1),
        };
        // (previous, now) -> (acquired at, transitions)
        let table: &[(Option<LeaseSpec>, i64, i64, i32)] = &[
            (None, 100, 100, 0),
            (Some(spec(Some("me"), 50, 2)), 100, 50, 2),
            (Some(spec(Some("other"), 50, 2)), 100, 100, 3),
            (Some(spec(None, 50, 2)), 100, 100, 2),
            (Some(spec(Some(""), 50, 2)), 100, 100, 2),
        ];
        for (previous, now, acquired, transitions) in table {
            let got = held(previous.as_ref(), "me", at(*now), &timing);
            assert_eq!(got.holder_identity.as_deref(), Some("me"));
            assert_eq!(got.lease_duration_seconds, Some(4));
            assert_eq!(got.renew_time, Some(MicroTime(at(*now))));
            assert_eq!(
                got.acquire_time,
                Some(MicroTime(at(*acquired))),
                "{previous:?}"
            );
            assert_eq!(got.lease_transitions, Some(*transitions), "{previous:?}");
        }
        let gone = released(&spec(Some("me"), 50, 2), at(100));
        assert_eq!(gone.holder_identity, None);
        assert_eq!(gone.lease_duration_seconds, Some(1));
        assert_eq!(gone.lease_transitions, Some(2));
        assert_eq!(
            claim("other", gone.holder_identity.as_deref(), S(1), S(0)),
            Claim::Take
        );
    }

    #[test]
    fn identities_are_unique() {
        assert_ne!(identity(), identity());
    }
}
