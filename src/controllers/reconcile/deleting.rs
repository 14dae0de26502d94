//! The decision of a pass of an object being deleted, with no Job of it
//! active (book: terraform-state.md "State on deletion"; ref §8.6): wait
//! for dependents, hold, destroy, or clean up. Pure.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use super::common::Common;
use super::observe::Rest;
use super::plan::{Away, Note, Plan, Requeue, Write};
use super::start;
use super::{Object, Pass};
use crate::controllers::conditions::{self, Cond, Status};
use crate::controllers::decide::{JobReason, StateFact};
use crate::controllers::deletion::{self, DestroyInputs, Hold, Next, Why};
use crate::controllers::workload::Workload;
use crate::jobs::away;
use crate::jobs::digest;
use crate::keys::ABANDON;
use crate::locks::Verdict;
use crate::names::{self, Kind, Op};
use crate::protection::AsRead;
use crate::state::StateReadable;

/// A held deletion re-checks this often (ref Appendix B).
pub const HELD_RECHECK: Duration = Duration::from_secs(60);

pub fn plan<K: Workload>(p: &Pass<'_, K>, c: &Common, plan: &mut Plan) {
    let Pass {
        obj,
        o,
        rest,
        finished,
        jobs,
        settings,
        ..
    } = *p;
    plan.requeue = Requeue::After(settings.sync_period);
    if K::KIND == Kind::Cluster && rest.dependents == 0 {
        plan.draft.set(Cond::new(
            conditions::DELETION_BLOCKED,
            Status::False,
            "NotBlocked",
            "no machine or pool of the cluster is left",
        ));
    }
    let abandoned = obj.annotations().get(ABANDON).is_some_and(|v| *v == o.uid);
    let away = away::check(&away::Facts {
        manager_namespace: settings.away.clone(),
        namespace: o.namespace.clone(),
        binding: rest.binding.unwrap_or(away::Binding::Missing),
        service_account: c.settings.service_account_name.clone(),
        image_pull_secrets: !c.settings.image_pull_secrets.is_empty(),
        identity: rest
            .credentials
            .name
            .as_ref()
            .map(|_| rest.credentials.mirror.is_some()),
    });
    let facts = deletion::Situation {
        kind: K::KIND,
        dependents: rest.dependents,
        abandoned,
        state: match c.assessment.lost {
            true => StateFact::NotFound,
            false => c.assessment.fact.clone(),
        },
        ever_applied: c.ever_applied,
        namespace_terminating: rest.namespace_terminating,
        away_possible: away.is_ok(),
        durable_inputs: c.durable.is_some(),
        renders: c.rendered.is_ok(),
        finished: finished.to_vec(),
        failed_jobs_history_limit: c.settings.failed_jobs_history_limit,
        now: plan.draft.now(),
        foreign_lock: matches!(
            rest.lock,
            Verdict::Foreign { .. } | Verdict::Unparsable { .. }
        ),
    };
    let inputs = match deletion::next(&facts) {
        Next::WaitForDependents(n) => {
            let cluster = obj.cluster_name().unwrap_or_default();
            plan.draft.set(Cond::new(
                conditions::DELETION_BLOCKED,
                Status::True,
                "DependentsExist",
                format!("{n} TerraformMachine or TerraformMachinePool objects of cluster {cluster} remain"),
            ));
            return;
        }
        Next::Cleanup(why) => {
            cleanup::<K>(obj, o, rest, jobs, why, plan);
            return;
        }
        Next::Hold(hold) => {
            let detail = match (&hold, &rest.snapshot.readable, &away) {
                (Hold::NamespaceTerminating, StateReadable::Read(st), Err(refusal)) => format!(
                    "{refusal}; state serial {}, {} managed resources",
                    st.serial, st.managed_resources
                ),
                (Hold::NamespaceTerminating, StateReadable::NotFound, _) => {
                    "no state is left to destroy from, but an apply of it started, so infrastructure may remain"
                        .into()
                }
                (Hold::NamespaceTerminating, other, _) => other.message(),
                (Hold::Locked, _, _) => rest.lock.message(),
                (_, other, _) => other.reason().as_str().to_owned(),
            };
            let held = deletion::held(hold, &o.namespace, &o.suffix, &o.uid, &detail);
            let held_before = obj
                .workspace_status()
                .and_then(|s| s.conditions.as_deref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == conditions::DELETING && c.reason == "DeletionHeld")
                });
            if !held_before {
                plan.notes
                    .push(Note::warning("DeletionHeld", held.message.clone()));
            }
            plan.deleting = Some(held);
            plan.requeue = Requeue::After(HELD_RECHECK);
            return;
        }
        Next::MissingInputs => {
            let cond = deletion::missing_inputs(K::KIND, &o.name, &o.uid);
            let message = cond.message.clone();
            if plan.draft.set(cond) {
                plan.notes.push(Note::warning("JobFailed", message));
            }
            return;
        }
        Next::Backoff { wait, failures } => {
            plan.logs.push(format!(
                "destroy due but backing off after {failures} failures"
            ));
            plan.requeue = Requeue::After(wait + Duration::from_secs(1));
            return;
        }
        Next::Destroy(_) if c.paused => {
            plan.deleting = Some(Cond::new(
                conditions::DELETING,
                Status::True,
                "Deleting",
                "paused: the destroy starts once unpaused",
            ));
            return;
        }
        Next::Destroy(inputs) => inputs,
    };
    let (rendered, image) = match (inputs, &c.durable, &c.rendered) {
        (DestroyInputs::Durable, Some(d), _) => (&d.inputs, d.image.clone()),
        (DestroyInputs::Current, _, Ok(r)) => (r, None),
        // next() chose Durable only with durable inputs, Current only when
        // the spec renders.
        _ => return,
    };
    let Some(identity) = c.credentials.identity.as_deref() else {
        return;
    };
    let image = image.unwrap_or_else(|| obj.workspace().source.image.clone());
    let pinned = c.durable.as_ref().and_then(|d| d.digest.as_deref());
    let (image, unknown) = digest::image_for(K::KIND, Op::Destroy, &image, pinned);
    if unknown {
        plan.notes.push(digest_unknown(&image));
    }
    let mut start = start::build(
        obj,
        o,
        settings,
        &start::Request {
            op: Op::Destroy,
            rendered,
            image: &image,
            policy: &c.settings,
            identity: Some(identity),
            force_unlock: c.assessment.force_unlock.as_deref(),
            reason: JobReason::Deleting,
            restore: None,
            jobs,
            mode: crate::jobs::builder::ApplyMode::Direct,
        },
    );
    // next() destroys in a namespace being deleted only when check() let it.
    if let (true, Ok(namespace)) = (rest.namespace_terminating, away) {
        away::relocate(
            &mut start.job,
            &mut start.run_secret,
            &namespace,
            &o.namespace,
            &o.uid,
        );
        start.service_account = names::away_runner(&o.namespace);
        start.away = Some(Away {
            namespace,
            mirror: rest.credentials.mirror.as_ref().map(|m| m.name_any()),
        });
    }
    plan.writes.push(Write::Start(Box::new(start)));
}

/// DigestUnknown (ref §4): a machine's Job runs the tag for lack of a
/// pinned digest.
pub fn digest_unknown(image: &str) -> Note {
    Note::warning(
        "DigestUnknown",
        format!("no digest was pinned for this machine: its Job runs {image} by tag"),
    )
}

/// Cleanup (ref §8.6), in order, each step idempotent so that a pass cut
/// short anywhere is finished by the next: the state Secrets and the lock
/// Lease; the durable inputs Secret; a cluster's plan key and saved plan;
/// the run lease and a cluster's write
/// lease; the object's share of the credentials mirror; the finalizer.
/// Backups are left to the garbage collector, with the object.
fn cleanup<K: Workload>(obj: &K, o: &Object, rest: &Rest, jobs: &[Job], why: Why, plan: &mut Plan) {
    let base = names::state_secret(&o.suffix);
    let state: Vec<AsRead> = rest
        .snapshot
        .secrets
        .iter()
        .filter_map(|s| AsRead::of(&s.metadata))
        .filter(|s| s.name == base || names::state_chunk_index(&o.suffix, &s.name).is_some())
        .collect();
    plan.writes.push(Write::DeleteState(state));
    // A Lease the watch has not shown is not known to be ours to delete.
    if let Some(lease) = &rest.lock_lease {
        plan.writes.push(Write::DeleteLock(lease.clone()));
    }
    if let Some(uid) = rest.durable.as_ref().and_then(|d| d.metadata.uid.clone()) {
        plan.writes.push(Write::DeleteDurable { uid });
    }
    if K::KIND == Kind::Cluster {
        plan.writes.push(Write::DeleteSecrets(vec![
            names::plan_key(K::KIND, &o.name),
            names::plan_secret(K::KIND, &o.name),
        ]));
    }
    let mut leases = vec![names::run_lease(&o.suffix)];
    if let (Kind::Cluster, Some(cluster)) = (K::KIND, obj.cluster_name()) {
        leases.push(names::cluster_write_lease(&o.namespace, cluster));
    }
    // What destroys run from the manager's namespace left there.
    let away: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.namespace().is_some_and(|ns| ns != o.namespace))
        .collect();
    if let Some(namespace) = away.first().and_then(|j| j.namespace()) {
        plan.writes.push(Write::DeleteJobs {
            names: away.iter().map(|j| j.name_any()).collect(),
            namespace: namespace.clone(),
        });
        plan.writes.push(Write::DeleteLeases {
            namespace,
            names: leases.clone(),
        });
    }
    plan.writes.push(Write::DeleteLeases {
        namespace: o.namespace.clone(),
        names: leases,
    });
    let backups = rest.backups.secrets.iter().map(|s| s.name_any()).collect();
    plan.writes.push(Write::ReleaseBackups(backups));
    plan.writes.push(Write::ReleaseMirrors);
    plan.writes.push(Write::RemoveFinalizer { why });
    plan.requeue = Requeue::OnChange;
}
