//! A Job start, built in full before anything is written (book:
//! inside-the-job.md): the Job and its per-run Secret, the apply's durable
//! inputs, the lease steps, and the events and counters once it exists.
//! Pure.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;

use super::Object;
use super::plan::{Note, Start, StartCounts};
use crate::backups::restore::Push;
use crate::controllers::Settings;
use crate::controllers::conditions;
use crate::controllers::decide::JobReason;
use crate::controllers::workload::Workload;
use crate::jobs::builder::{self, ApplyMode, JobRequest, RestoreRequest};
use crate::jobs::durable;
use crate::jobs::inputs::RenderedInputs;
use crate::jobs::leases;
use crate::jobs::policy::JobSettings;
use crate::keys::{APPROVED_PLAN, DRIFT_REMEDIATION, INPUTS_HASH, RESTORE_SERIAL};
use crate::names::{self, Op};

/// What a start is made from.
pub struct Request<'a> {
    pub op: Op,
    pub rendered: &'a RenderedInputs,
    /// The module image: the spec's, or for a destroy the one applied.
    pub image: &'a str,
    pub policy: &'a JobSettings,
    pub identity: Option<&'a str>,
    /// A stale lock's ID, force-unlocked by this Job after init.
    pub force_unlock: Option<&'a str>,
    pub reason: JobReason,
    pub restore: Option<&'a Push>,
    /// The object's Jobs, for the next attempt number.
    pub jobs: &'a [Job],
    /// How an apply runs.
    pub mode: ApplyMode<'a>,
}

pub fn build<K: Workload>(obj: &K, o: &Object, settings: &Settings, r: &Request<'_>) -> Start {
    let op = r.op;
    let attempt = builder::next_attempt(op, r.jobs);
    let hash6 = builder::hash6(&r.rendered.inputs_hash, op, attempt, 0);
    let job_name = names::job(K::KIND, &o.name, op, attempt, &hash6);
    let chunks = r.restore.map(|p| p.chunks.clone()).unwrap_or_default();
    let built = builder::build(&JobRequest {
        kind: K::KIND,
        namespace: &o.namespace,
        name: &o.name,
        uid: &o.uid,
        cluster_name: obj.cluster_name(),
        op,
        attempt,
        hash6: &hash6,
        image: r.image,
        image_pull_policy: obj.workspace().source.image_pull_policy,
        runner_image: &settings.runner_image,
        settings: r.policy,
        identity: r.identity,
        force_unlock: r.force_unlock,
        inputs: r.rendered,
        restore: r.restore.map(|p| RestoreRequest {
            chunk_secrets: &chunks,
            resources: p.resources,
            serial: p.push_serial,
        }),
        mode: r.mode,
        events: settings.runner_events,
    });
    let mut job = built.job;
    let annotations = job.metadata.annotations.get_or_insert_default();
    match r.restore {
        Some(p) => {
            annotations.insert(RESTORE_SERIAL.into(), p.serial.to_string());
            if let Some(hash) = &p.inputs_hash {
                annotations.insert(INPUTS_HASH.into(), hash.clone());
            }
        }
        None => {
            annotations.insert(INPUTS_HASH.into(), r.rendered.inputs_hash.clone());
        }
    }
    let approved = match (op, r.mode) {
        (Op::Apply, ApplyMode::Approved { plan_hash }) => Some(plan_hash),
        _ => None,
    };
    if let Some(hash) = approved {
        annotations.insert(APPROVED_PLAN.into(), hash.to_owned());
    }
    let remediation = op == Op::Apply && r.reason == JobReason::Remediation;
    if remediation {
        annotations.insert(DRIFT_REMEDIATION.into(), "true".into());
    }
    // Written at the start, whether or not the apply succeeds: a destroy
    // must find what may have been created.
    let durable = (op == Op::Apply).then(|| {
        durable::build(&durable::Record {
            kind: K::KIND,
            namespace: &o.namespace,
            name: &o.name,
            cluster_name: obj.cluster_name(),
            owner: o.owner.clone(),
            inputs: r.rendered,
            image: r.image,
            identity: r.identity,
        })
    });
    let mut job_notes = Vec::new();
    if let Some(id) = r.force_unlock {
        job_notes.push(Note::warning(
            "ForceUnlocked",
            format!("Job {job_name} force-unlocks the stale state lock {id} left by an ended runner pod of this object"),
        ));
    }
    job_notes.push(
        Note::normal(
            "JobCreated",
            format!(
                "{} Job {job_name} (attempt {attempt}, image {}): {}",
                op.as_str(),
                r.image,
                r.reason.as_str()
            ),
        )
        .once(),
    );
    let inputs_changed = r.reason == JobReason::InputsChanged;
    let mut notes = match inputs_changed {
        true => vec![Note::normal(
            "InputsChanged",
            format!(
                "inputs hash {} differs from the state's",
                r.rendered.inputs_hash
            ),
        )],
        false => Vec::new(),
    };
    if remediation {
        notes.push(Note::normal(
            "DriftRemediationStarted",
            format!("Job {job_name} applies the module to remediate the drift found"),
        ));
    }
    if let Some(hash) = approved {
        notes.push(Note::normal(
            "PlanApproved",
            format!("Job {job_name} applies the approved plan {hash}"),
        ));
    }
    Start {
        op,
        why: r.reason.as_str(),
        job,
        run_secret: built.run_secret,
        service_account: r.policy.service_account_name.clone(),
        gate: leases::gate(
            K::KIND,
            op,
            settings.cluster_operation_gate,
            obj.cluster_name().is_some(),
        ),
        durable,
        condition: match op {
            Op::Restore => conditions::RESTORE_JOB_SUCCEEDED,
            _ => conditions::APPLY_JOB_SUCCEEDED,
        },
        cluster_name: obj.cluster_name().map(str::to_owned),
        deadline: Duration::from_secs(u64::try_from(r.policy.active_deadline_seconds).unwrap_or(0)),
        job_notes,
        notes,
        counts: StartCounts {
            reason: r.reason.metric(),
            force_unlock: r.force_unlock.is_some(),
            inputs_changed,
            plan_approved: approved.is_some(),
        },
        away: None,
        saves_plan: op == Op::Plan || approved.is_some(),
    }
}
