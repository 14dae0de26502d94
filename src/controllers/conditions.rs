//! Conditions of the workload kinds (ref §3): setting one, and the Ready
//! summary. Pure: the reconcile hands in the time.

use crate::names::Kind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";
pub const IDENTITY_ALLOWED: &str = "IdentityAllowed";
pub const CREDENTIALS_MIRRORED: &str = "CredentialsMirrored";
pub const RUNNER_RBAC_READY: &str = "RunnerRBACReady";
pub const APPLY_JOB_SUCCEEDED: &str = "ApplyJobSucceeded";
pub const DRIFT_JOB_SUCCEEDED: &str = "DriftJobSucceeded";
pub const RESTORE_JOB_SUCCEEDED: &str = "RestoreJobSucceeded";
pub const STATE_READABLE: &str = "StateReadable";
/// What the object's inputs need exists and reads well: for now its
/// `variablesFrom` sources (the Cluster API owners come later).
pub const DEPENDENCIES_READY: &str = "DependenciesReady";
/// Negative polarity: True while the object is being deleted.
pub const DELETING: &str = "Deleting";
pub const PAUSED: &str = "Paused";
pub const AUTOSCALING_ACTIVE: &str = "AutoscalingActive";
/// Negative polarity, TerraformCluster only: True while its machines and
/// pools keep it from being destroyed.
pub const DELETION_BLOCKED: &str = "DeletionBlocked";

/// Negative polarity: True while a drift check's findings stand; never in
/// Ready.
pub const DRIFT_DETECTED: &str = "DriftDetected";

pub const OUTPUTS_VALID: &str = "OutputsValid";
pub const INFRASTRUCTURE_HEALTHY: &str = "InfrastructureHealthy";

/// The conditions Ready summarizes before the object is provisioned (ref
/// §3). A condition not set yet counts as Unknown.
const READY_INPUTS: [&str; 8] = [
    DEPENDENCIES_READY,
    IDENTITY_ALLOWED,
    CREDENTIALS_MIRRORED,
    RUNNER_RBAC_READY,
    APPLY_JOB_SUCCEEDED,
    STATE_READABLE,
    OUTPUTS_VALID,
    INFRASTRUCTURE_HEALTHY,
];

/// What Ready summarizes once provisioned: a failed re-apply of a cluster
/// or an identity outage no longer makes it False; a pool's applies still
/// do, since they follow its replicas.
const fn ready_inputs(kind: Kind, provisioned: bool) -> &'static [&'static str] {
    match (provisioned, kind) {
        (false, _) => &READY_INPUTS,
        (true, Kind::MachinePool) => &[INFRASTRUCTURE_HEALTHY, APPLY_JOB_SUCCEEDED],
        (true, _) => &[INFRASTRUCTURE_HEALTHY],
    }
}

/// Whether `type_` at `status`/`reason` is a bad state (ref §3, §4: a
/// ConditionChanged into it is a Warning): False for most conditions, True
/// for the negative ones. Paused either way, or autoscaling simply not
/// asked for, is not.
pub fn bad(type_: &str, status: Status, reason: &str) -> bool {
    match type_ {
        DELETING | DELETION_BLOCKED | DRIFT_DETECTED => status == Status::True,
        PAUSED => false,
        AUTOSCALING_ACTIVE if reason == "AutoscalingDisabled" => false,
        _ => status == Status::False,
    }
}

/// Tri-state condition status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    fn parse(s: &str) -> Status {
        match s {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }
}

/// A condition to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Cond {
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Cond {
        Cond {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// What changed when a condition was set: the status or the reason. A new
/// message alone is not a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub type_: &'static str,
    pub from: Option<(Status, String)>,
    pub to: Status,
    pub reason: &'static str,
}

/// Sets `cond` in `conditions`, keeping lastTransitionTime unless the status
/// changes, and reports a transition of status or reason.
pub fn set(
    conditions: &mut Vec<Condition>,
    cond: Cond,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Transition> {
    let existing = conditions.iter_mut().find(|c| c.type_ == cond.type_);
    match existing {
        Some(c) => {
            let old_status = Status::parse(&c.status);
            let changed = old_status != cond.status || c.reason != cond.reason;
            if old_status != cond.status {
                c.last_transition_time = Time(now);
            }
            let from = (old_status, c.reason.clone());
            c.status = cond.status.as_str().to_string();
            c.reason = cond.reason.to_string();
            c.message = cond.message;
            c.observed_generation = generation;
            changed.then_some(Transition {
                type_: cond.type_,
                from: Some(from),
                to: cond.status,
                reason: cond.reason,
            })
        }
        None => {
            conditions.push(Condition {
                type_: cond.type_.to_string(),
                status: cond.status.as_str().to_string(),
                reason: cond.reason.to_string(),
                message: cond.message,
                last_transition_time: Time(now),
                observed_generation: generation,
            });
            Some(Transition {
                type_: cond.type_,
                from: None,
                to: cond.status,
                reason: cond.reason,
            })
        }
    }
}

/// The status of a condition, if set.
pub fn status_of<'a>(conditions: &'a [Condition], type_: &str) -> Option<(Status, &'a str)> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (Status::parse(&c.status), c.reason.as_str()))
}

/// The Ready summary (ref §3): False when any input is False, True when all
/// are True, else Unknown. The message names the first condition that keeps
/// it from True.
pub fn ready(conditions: &[Condition], kind: Kind, provisioned: bool) -> Cond {
    let mut first_unknown = None;
    for &type_ in ready_inputs(kind, provisioned) {
        match conditions.iter().find(|c| c.type_ == type_) {
            Some(c) if c.status == "False" => {
                return Cond::new(
                    READY,
                    Status::False,
                    "NotReady",
                    format!("{type_} is False: {}", c.reason),
                );
            }
            Some(c) if c.status == "True" => {}
            Some(c) => {
                first_unknown.get_or_insert_with(|| format!("{type_} is Unknown: {}", c.reason));
            }
            None => {
                first_unknown.get_or_insert_with(|| format!("{type_} is not set yet"));
            }
        }
    }
    match first_unknown {
        Some(message) => Cond::new(READY, Status::Unknown, "ReadyUnknown", message),
        None => Cond::new(READY, Status::True, "Ready", ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn set_reports_transitions_of_status_or_reason_only() {
        let mut cs = Vec::new();
        let t = set(
            &mut cs,
            Cond::new(STATE_READABLE, Status::Unknown, "StateNotFound", "a"),
            Some(1),
            at(10),
        );
        assert_eq!(t.map(|t| t.from), Some(None));
        // Same status and reason, new message: no transition, time kept.
        assert_eq!(
            set(
                &mut cs,
                Cond::new(STATE_READABLE, Status::Unknown, "StateNotFound", "b"),
                Some(2),
                at(20)
            ),
            None
        );
        assert_eq!(cs[0].message, "b");
        assert_eq!(cs[0].observed_generation, Some(2));
        assert_eq!(cs[0].last_transition_time, Time(at(10)));
        // New reason, same status: a transition, time kept.
        let t = set(
            &mut cs,
            Cond::new(STATE_READABLE, Status::Unknown, "Other", ""),
            None,
            at(30),
        )
        .unwrap();
        assert_eq!(t.from, Some((Status::Unknown, "StateNotFound".to_string())));
        assert_eq!(cs[0].last_transition_time, Time(at(10)));
        // New status: the time moves.
        set(
            &mut cs,
            Cond::new(STATE_READABLE, Status::True, "StateRead", ""),
            None,
            at(40),
        )
        .unwrap();
        assert_eq!(cs[0].last_transition_time, Time(at(40)));
        assert_eq!(cs.len(), 1);
    }

    #[test]
    fn ready_summary() {
        let all = |status: Status| {
            let mut cs = Vec::new();
            for t in READY_INPUTS {
                set(&mut cs, Cond::new(t, status, "R", ""), None, at(1));
            }
            cs
        };
        let ready = |cs: &[Condition]| super::ready(cs, Kind::Machine, false);
        assert_eq!(ready(&all(Status::True)).status, Status::True);
        assert_eq!(ready(&all(Status::Unknown)).status, Status::Unknown);
        assert_eq!(ready(&[]).status, Status::Unknown);
        let mut cs = all(Status::True);
        set(
            &mut cs,
            Cond::new(APPLY_JOB_SUCCEEDED, Status::False, "ApplyFailed", ""),
            None,
            at(2),
        );
        set(
            &mut cs,
            Cond::new(IDENTITY_ALLOWED, Status::Unknown, "X", ""),
            None,
            at(2),
        );
        let r = ready(&cs);
        assert_eq!((r.status, r.reason), (Status::False, "NotReady"));
        assert!(r.message.contains("ApplyJobSucceeded"), "{}", r.message);
        // Provisioned: only health counts, and for a pool its applies.
        let after = |kind| super::ready(&cs, kind, true).status;
        assert_eq!(after(Kind::Cluster), Status::True);
        assert_eq!(after(Kind::Machine), Status::True);
        assert_eq!(after(Kind::MachinePool), Status::False);
    }
}
