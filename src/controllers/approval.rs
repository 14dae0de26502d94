//! How a due apply of a TerraformCluster runs (ref §8.2 "Gating"): under
//! applyPolicy Automatic a guarded apply that stops before a delete or a
//! replace until `captf.io/approve-destructive-plan` names its inputs hash;
//! under Manual a plan Job first, then, once `captf.io/approve-plan` names
//! the saved plan's hash, an apply of exactly that plan. A first apply and
//! the applies of machines and pools are never gated. Pure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::decide::{self, Finished, JobReason};
use super::ledger::Outcome;
use crate::api::PlanPreview;
use crate::jobs::builder::ApplyMode;
use crate::names::Op;

/// A wait for an approval is re-checked at least this often; an approval
/// or new inputs wake the object at once.
pub const APPROVAL_RECHECK: Duration = Duration::from_secs(600);

/// How the object's applies are gated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Machines and pools.
    None,
    /// A TerraformCluster with applyPolicy Automatic.
    Guarded,
    /// A TerraformCluster with applyPolicy Manual.
    Manual,
}

#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub policy: Policy,
    pub reason: JobReason,
    /// The inputs hash the object renders now.
    pub inputs_hash: &'a str,
    /// Finished Jobs, newest first.
    pub finished: &'a [Finished],
    pub approve_destructive: Option<&'a str>,
    pub approve_plan: Option<&'a str>,
    /// `status.plan`: the saved plan that waits, if any.
    pub plan: Option<&'a PlanPreview>,
    pub failed_jobs_history_limit: i32,
    pub now: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Gated<'a> {
    Apply(ApplyMode<'a>),
    /// A plan Job, for approval.
    Plan,
    /// A plan is due, but the failed ones back off.
    PlanBackoff {
        wait: Duration,
        failures: u32,
    },
    /// The guarded apply of these inputs stopped before a delete or a
    /// replace: nothing runs until it is approved or the inputs change.
    Blocked,
    /// The saved plan waits for its approval.
    AwaitingApproval(&'a PlanPreview),
}

/// Whether a saved plan changes nothing: it never waits.
pub fn empty(plan: &PlanPreview) -> bool {
    [plan.add, plan.change, plan.destroy]
        .iter()
        .all(|n| n.unwrap_or(0) == 0)
}

pub fn gate<'a>(f: &Facts<'a>) -> Gated<'a> {
    if f.reason == JobReason::NoState {
        return Gated::Apply(ApplyMode::Direct);
    }
    match f.policy {
        Policy::None => Gated::Apply(ApplyMode::Direct),
        Policy::Guarded => {
            let allow_destructive = f.approve_destructive == Some(f.inputs_hash);
            let blocked = f
                .finished
                .iter()
                .find(|j| j.op == Op::Apply)
                .is_some_and(|j| {
                    j.outcome == Outcome::Blocked && j.inputs_hash.as_deref() == Some(f.inputs_hash)
                });
            if blocked && !allow_destructive {
                Gated::Blocked
            } else {
                Gated::Apply(ApplyMode::Guarded { allow_destructive })
            }
        }
        Policy::Manual => match f.plan.filter(|p| p.inputs_hash == f.inputs_hash) {
            Some(plan) if empty(plan) || f.approve_plan == Some(plan.plan_hash.as_str()) => {
                Gated::Apply(ApplyMode::Approved {
                    plan_hash: &plan.plan_hash,
                })
            }
            Some(plan) => Gated::AwaitingApproval(plan),
            None => {
                match decide::backing_off(f.finished, Op::Plan, f.failed_jobs_history_limit, f.now)
                {
                    Some((wait, failures)) => Gated::PlanBackoff { wait, failures },
                    None => Gated::Plan,
                }
            }
        },
    }
}

/// The command that approves `hash` under `key` on a TerraformCluster.
pub fn approve_command(namespace: &str, name: &str, key: &str, hash: &str) -> String {
    format!("kubectl annotate terraformcluster {name} -n {namespace} --overwrite {key}={hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(NOW + secs).unwrap()
    }

    fn job(op: Op, outcome: Outcome, hash: &str, secs: i64) -> Finished {
        Finished {
            op,
            outcome,
            succeeded: outcome == Outcome::Succeeded,
            counts_for_backoff: outcome == Outcome::Failed,
            finished_at: at(secs),
            inputs_hash: Some(hash.into()),
            remediation: false,
        }
    }

    fn preview(inputs: &str, hash: &str, add: i32) -> PlanPreview {
        PlanPreview {
            inputs_hash: inputs.into(),
            job: "captf-c-prod-plan-a1-abcdef".into(),
            plan_hash: hash.into(),
            add: Some(add),
            change: Some(0),
            destroy: Some(0),
            ..Default::default()
        }
    }

    fn facts<'a>(
        policy: Policy,
        finished: &'a [Finished],
        plan: Option<&'a PlanPreview>,
    ) -> Facts<'a> {
        Facts {
            policy,
            reason: JobReason::InputsChanged,
            inputs_hash: "h2:new",
            finished,
            approve_destructive: None,
            approve_plan: None,
            plan,
            failed_jobs_history_limit: 3,
            now: at(0),
        }
    }

    #[test]
    fn first_applies_machines_and_pools_are_never_gated() {
        for policy in [Policy::None, Policy::Guarded, Policy::Manual] {
            let f = Facts {
                reason: JobReason::NoState,
                ..facts(policy, &[], None)
            };
            assert_eq!(gate(&f), Gated::Apply(ApplyMode::Direct), "{policy:?}");
        }
        let blocked = [job(Op::Apply, Outcome::Blocked, "h2:new", -5)];
        assert_eq!(
            gate(&facts(Policy::None, &blocked, None)),
            Gated::Apply(ApplyMode::Direct)
        );
    }

    #[test]
    fn guarded_applies() {
        let guarded = |allow_destructive| Gated::Apply(ApplyMode::Guarded { allow_destructive });
        let blocked_new = [job(Op::Apply, Outcome::Blocked, "h2:new", -5)];
        let blocked_old = [job(Op::Apply, Outcome::Blocked, "h2:old", -5)];
        let failed_after_block = [
            job(Op::Apply, Outcome::Failed, "h2:new", -1),
            job(Op::Apply, Outcome::Blocked, "h2:new", -5),
        ];
        // (case, finished, approve-destructive-plan, gated)
        for (case, finished, approval, want) in [
            ("nothing blocked", &[][..], None, guarded(false)),
            (
                "these inputs blocked",
                &blocked_new[..],
                None,
                Gated::Blocked,
            ),
            (
                "blocked, approved for other inputs",
                &blocked_new[..],
                Some("h2:old"),
                Gated::Blocked,
            ),
            (
                "blocked and approved",
                &blocked_new[..],
                Some("h2:new"),
                guarded(true),
            ),
            (
                "other inputs blocked",
                &blocked_old[..],
                None,
                guarded(false),
            ),
            (
                "approved before any block",
                &[][..],
                Some("h2:new"),
                guarded(true),
            ),
            (
                "a failure since the block",
                &failed_after_block[..],
                None,
                guarded(false),
            ),
        ] {
            let f = Facts {
                approve_destructive: approval,
                ..facts(Policy::Guarded, finished, None)
            };
            assert_eq!(gate(&f), want, "{case}");
        }
    }

    #[test]
    fn manual_approval() {
        let waiting = preview("h2:new", "p1:aaa", 2);
        let stale = preview("h2:old", "p1:aaa", 2);
        let nothing = preview("h2:new", "p1:e3b0", 0);
        let failed_plans = [
            job(Op::Plan, Outcome::Failed, "h2:new", -30),
            job(Op::Plan, Outcome::Failed, "h2:new", -200),
        ];
        let approved = |hash| Gated::Apply(ApplyMode::Approved { plan_hash: hash });
        // (case, status.plan, approve-plan, finished, gated)
        for (case, plan, approval, finished, want) in [
            ("no plan yet", None, None, &[][..], Gated::Plan),
            (
                "a plan of other inputs",
                Some(&stale),
                Some("p1:aaa"),
                &[][..],
                Gated::Plan,
            ),
            (
                "waiting",
                Some(&waiting),
                None,
                &[][..],
                Gated::AwaitingApproval(&waiting),
            ),
            (
                "another hash approved",
                Some(&waiting),
                Some("p1:bbb"),
                &[][..],
                Gated::AwaitingApproval(&waiting),
            ),
            (
                "approved",
                Some(&waiting),
                Some("p1:aaa"),
                &[][..],
                approved("p1:aaa"),
            ),
            (
                "an empty plan never waits",
                Some(&nothing),
                None,
                &[][..],
                approved("p1:e3b0"),
            ),
            (
                "failed plans back off",
                None,
                None,
                &failed_plans[..],
                Gated::PlanBackoff {
                    wait: Duration::from_secs(90),
                    failures: 2,
                },
            ),
        ] {
            let f = Facts {
                approve_plan: approval,
                ..facts(Policy::Manual, finished, plan)
            };
            assert_eq!(gate(&f), want, "{case}");
        }
    }

    #[test]
    fn the_approve_command() {
        assert_eq!(
            approve_command("team-a", "prod", "captf.io/approve-plan", "p1:ab"),
            "kubectl annotate terraformcluster prod -n team-a --overwrite captf.io/approve-plan=p1:ab"
        );
    }
}
