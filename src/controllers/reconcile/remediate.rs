//! A TerraformMachine keeps `cluster.x-k8s.io/remediate-machine` on its
//! Machine in sync with its health (ref §8.1 step 12, §8.8). Pure: the
//! write, events and counter go into the plan.

use kube::Resource;

use super::Pass;
use super::common::Common;
use super::drift::UNHEALTHY_SAMPLES;
use super::plan::{Count, Note, Plan, Write};
use crate::controllers::conditions::INFRASTRUCTURE_HEALTHY;
use crate::controllers::remediation::{self, Change, Facts};
use crate::controllers::workload::Workload;
use crate::keys::{REMEDIATE_MACHINE, REMEDIATION_REQUESTED};
use crate::metrics::RemediationAction;

pub fn plan<K: Workload>(p: &Pass<'_, K>, c: &Common, plan: &mut Plan) {
    let Some(settings) = p.obj.remediation() else {
        return;
    };
    // Nothing is written while paused.
    let Some(machine) = p.rest.capi.machine().filter(|_| !c.paused) else {
        return;
    };
    let annotations = machine.meta().annotations.as_ref();
    let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
    let reason = plan
        .draft
        .status_of(INFRASTRUCTURE_HEALTHY)
        .map_or("", |(_, r)| r);
    let samples = plan
        .kind_status
        .get(UNHEALTHY_SAMPLES)
        .and_then(|v| v.as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let facts = Facts {
        annotate: settings.annotate_machine == Some(true),
        threshold: settings
            .unhealthy_threshold
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(remediation::DEFAULT_THRESHOLD),
        samples,
        now: remediation::sample(reason),
        reason,
        annotated: has(REMEDIATE_MACHINE),
        marked: has(REMEDIATION_REQUESTED),
        machine_deleting: machine.meta().deletion_timestamp.is_some(),
    };
    let name = machine.meta().name.clone().unwrap_or_default();
    match remediation::decide(&facts) {
        Some(Change::Request(why)) => {
            plan.notes.push(Note::warning(
                "RemediationRequested",
                format!("Machine {name} is marked for remediation: {why}"),
            ));
            plan.counts
                .push(Count::Remediation(RemediationAction::Requested));
            plan.writes.push(Write::RemediateMachine {
                machine: name,
                reason: Some(why),
            });
        }
        Some(Change::Withdraw) => {
            plan.notes.push(Note::normal(
                "RemediationWithdrawn",
                format!("Machine {name} reads healthy again: the remediation request is withdrawn"),
            ));
            plan.counts
                .push(Count::Remediation(RemediationAction::Withdrawn));
            plan.writes.push(Write::RemediateMachine {
                machine: name,
                reason: None,
            });
        }
        None => {}
    }
}
