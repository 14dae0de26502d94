//! The steps every pass without an active Job takes, live or deleting:
//! credentials, the state and its lock, backups, the Job policy and the
//! inputs rendered now. Pure: conditions go to the draft, writes, events
//! and counters to the plan.

use super::dependencies;
use super::mapping;
use super::observe::Rest;
use super::plan::{Count, Note, Plan, Write};
use super::settle::Settled;
use super::{Object, Pass};
use crate::backups::{self, BackupDecision};
use crate::controllers::assessment::{self, Assessment};
use crate::controllers::conditions::{self, Cond, Status};
use crate::controllers::credentials::{self, Credentials};
use crate::controllers::decide::StateFact;
use crate::controllers::workload::Workload;
use crate::jobs::durable::{self, Recorded};
use crate::jobs::inputs::{self, InputsError, InputsRequest, RenderedInputs};
use crate::jobs::policy::{self, JobSettings};
use crate::jobs::variables::{self, Fetched};
use crate::keys::{CLONED_FROM_NAME, ENDPOINT_SOURCE, INPUTS_HASH, PAUSED};
use crate::metrics::BackupResult;
use crate::names::{self, Kind};
use crate::state::StateReadable;

/// What the common steps found, for the live or deleting decision.
pub struct Common {
    pub credentials: Credentials,
    pub assessment: Assessment,
    pub durable: Option<Recorded>,
    /// An apply succeeded once: the durable inputs say so, a backup
    /// exists, or the object's status shows it.
    pub ever_applied: bool,
    pub settings: JobSettings,
    pub rendered: Result<RenderedInputs, Unrendered>,
    /// The object or its Cluster is paused: nothing starts.
    pub paused: bool,
}

/// Why no inputs are rendered this pass.
#[derive(Debug)]
pub enum Unrendered {
    /// DependenciesReady says what is awaited (or what is wrong with the
    /// variables).
    Waiting,
    Invalid(InputsError),
}

pub fn steps<K: Workload>(p: &Pass<'_, K>, plan: &mut Plan) -> Common {
    let Pass {
        obj,
        o,
        rest,
        settled,
        destroyed,
        ..
    } = *p;
    let spec = obj.workspace();
    let mut credentials = credentials::decide(&rest.credentials, &o.namespace, &o.owner);
    if p.deleting && rest.namespace_terminating {
        credentials = credentials::last_copy(&rest.credentials, credentials);
    }
    plan.draft.set(credentials.allowed.clone());
    plan.draft.set(credentials.mirrored.clone());
    if let Some(w) = &credentials.write {
        plan.writes.push(Write::Mirror(Box::new(w.clone())));
    }

    let durable = rest.durable.as_deref().and_then(durable::read);
    // What a namespace deletion can take (the durable inputs, the backups)
    // is never the only witness: the object's own status counts too.
    let ever_applied = settled.applied
        || durable.as_ref().is_some_and(|d| d.applied)
        || !rest.backups.secrets.is_empty()
        || obj
            .workspace_status()
            .is_some_and(assessment::applied_by_status);
    let assessment = state(o, rest, settled, ever_applied, destroyed, plan);
    backup(p, &assessment, plan);
    mapping::outputs(
        obj,
        rest,
        &assessment.fact,
        durable.as_ref(),
        ever_applied,
        p.deleting,
        plan,
    );

    let job_settings = policy::resolve(
        spec.jobs.as_ref(),
        rest.cluster
            .as_ref()
            .and_then(|c| c.spec.defaults.as_ref())
            .and_then(|d| d.jobs.as_ref()),
    );
    let paused = paused(obj, rest, plan);
    // Nothing is written to a MachinePool while paused (a move may be under
    // way) or while the pool is deleting (its owner may be going too).
    let write_owner = !paused && !p.deleting;
    let rendered = render(obj, o, rest, durable.as_ref(), write_owner, plan);
    plan.inputs_bytes = match &rendered {
        Ok(r) => Some((r.main_tf_json.len() + r.tfvars_json.len()) as u64),
        Err(Unrendered::Invalid(InputsError::TooLarge { bytes })) => Some(*bytes as u64),
        Err(_) => None,
    };
    Common {
        paused,
        credentials,
        assessment,
        durable,
        ever_applied,
        settings: job_settings,
        rendered,
    }
}

/// StateReadable, the gauges, the read-error counter and events.
fn state(
    o: &Object,
    rest: &Rest,
    settled: &Settled,
    ever_applied: bool,
    destroyed: bool,
    plan: &mut Plan,
) -> Assessment {
    let snapshot = &rest.snapshot;
    let base_hash = snapshot
        .base(&o.suffix)
        .and_then(|b| b.metadata.annotations.as_ref()?.get(INPUTS_HASH))
        .map(String::as_str);
    let state_secret = names::state_secret(&o.suffix);
    let mut a = assessment::assess(&assessment::Inputs {
        readable: &snapshot.readable,
        inputs_hash: base_hash,
        lock: &rest.lock,
        ever_applied,
        destroyed,
        previous: plan.draft.status_of(conditions::STATE_READABLE),
        observed_serial: plan.draft.status.observed_state_serial,
        state_secret: &state_secret,
    });
    // The adoption this pass writes is what the state carries from now on.
    if let (Some(hash), StateFact::Read { inputs_hash }) = (&settled.adopted, &mut a.fact) {
        inputs_hash.clone_from(hash);
    }
    plan.draft.set(a.condition.clone());
    plan.gauges = Some(a.gauges);
    if let Some(due) = a.read_error {
        plan.counts.push(Count::StateReadError(due.reason));
        plan.notes
            .push(Note::warning(due.event, a.condition.message.clone()));
    }
    if let Some(note) = &a.near_limit {
        plan.notes.push(Note::warning(
            crate::state::NEAR_SECRET_LIMIT_REASON,
            note.clone(),
        ));
    }
    a
}

/// Versioned backups (book: terraform-state.md "State backups"): a serial
/// not observed before is copied verbatim into its backup set, older sets
/// are pruned to `--state-backups`, and status lists the complete ones. A
/// serial counts as observed only once its backup exists (or backups are
/// off), so a failed copy is retried on the next pass. Never while
/// deleting.
fn backup<K: Workload>(p: &Pass<'_, K>, a: &Assessment, plan: &mut Plan) {
    let Pass {
        obj,
        o,
        settled,
        rest,
        deleting,
        ..
    } = *p;
    let keep = p.settings.state_backups;
    let readable = &rest.snapshot.readable;
    let serial = match readable {
        StateReadable::Read(st) => i64::try_from(st.serial).ok().filter(|s| *s >= 1),
        _ => None,
    };
    let mut infos = rest.backups.infos.clone();
    let decision = backups::should_back_up(
        readable,
        plan.draft.status.observed_state_serial,
        keep,
        deleting,
    );
    match (decision, readable, serial) {
        (BackupDecision::Take { serial: taken }, StateReadable::Read(st), Some(observed)) => {
            let owner = backups::Owner {
                reference: o.owner.clone(),
                kind: K::KIND,
                name: &o.name,
                cluster_name: obj.cluster_name(),
            };
            let source_job = plan.draft.status.last_run.as_ref().map(|r| r.job.clone());
            match backups::plan_backup(
                &o.suffix,
                st,
                &rest.snapshot.secrets,
                &owner,
                source_job.as_deref(),
                plan.draft.now(),
            ) {
                Ok(mut set) => {
                    // The state was read before this pass's adoption: its
                    // backup carries the inputs hash adopted now.
                    if let Some(adopted) = &settled.adopted {
                        backups::record_inputs_hash(&mut set, adopted.as_deref());
                    }
                    // The set may be there already: status, with the
                    // observed serial, does not survive a clusterctl move.
                    // Listed twice, it would read as incomplete and be pruned.
                    infos.retain(|i| i.serial != set.serial);
                    infos.extend(backups::list(&set.secrets, &o.suffix));
                    infos.sort_by_key(|i| std::cmp::Reverse(i.serial));
                    plan.writes.push(Write::TakeBackup { set, observed });
                }
                Err(e) => {
                    plan.logs
                        .push(format!("backing up state serial {taken} failed: {e}"));
                    plan.counts.push(Count::Backups(BackupResult::Skipped, 1));
                }
            }
        }
        (BackupDecision::Skip { reason }, _, _) => {
            // Unchanged, or backups are off: the serial is observed. While
            // deleting it is not: nothing was looked at for a backup.
            if serial.is_some() && reason != "deleting" {
                plan.draft.status.observed_state_serial = serial;
            }
            if a.entered_unreadable {
                plan.logs
                    .push(format!("the state is not backed up: it is {reason}"));
                plan.counts.push(Count::Backups(BackupResult::Skipped, 1));
            }
        }
        // should_back_up takes only a readable state with a serial.
        (BackupDecision::Take { .. }, _, _) => {}
    }
    if !deleting {
        let pruned = backups::prune(&infos, keep);
        if !pruned.is_empty() {
            infos.retain(|i| !pruned.contains(&i.serial));
            let secrets = rest.backups.of_serials(&o.suffix, &pruned);
            plan.writes.push(Write::PruneBackups {
                sets: pruned.len() as u64,
                secrets,
            });
        }
    }
    let entries = backups::status_entries(&infos);
    plan.draft.status.state_backups = (!entries.is_empty()).then_some(entries);
}

/// DependenciesReady and the inputs rendered now: the owners' role inputs
/// and the merged `variablesFrom` sources. A provisioned machine is never
/// rendered again: its inputs are the ones it was applied with.
fn render<K: Workload>(
    obj: &K,
    o: &Object,
    rest: &Rest,
    durable: Option<&Recorded>,
    write_owner: bool,
    plan: &mut Plan,
) -> Result<RenderedInputs, Unrendered> {
    let ready = || {
        Cond::new(
            conditions::DEPENDENCIES_READY,
            Status::True,
            "DependenciesReady",
            "",
        )
    };
    if let (Kind::Machine, true, Some(d)) = (K::KIND, provisioned(obj), durable) {
        plan.draft.set(ready());
        return Ok(d.inputs.clone());
    }
    // What the outputs of the state read in this pass say.
    let observed_replicas = plan
        .kind_status
        .get("replicas")
        .and_then(serde_json::Value::as_i64)
        .and_then(|n| i32::try_from(n).ok());
    let role = match dependencies::role(obj, &rest.capi, durable, observed_replicas) {
        Ok(role) => role,
        Err(cond) => {
            plan.draft.set(cond);
            return Err(Unrendered::Waiting);
        }
    };
    if let Some(cond) = role.autoscaling.clone() {
        plan.draft.set(cond);
    }
    if let Some((pool, write_back)) = role.write_back.filter(|_| write_owner) {
        plan.writes
            .push(Write::MachinePoolReplicas { pool, write_back });
    }
    if let Some(source) = role.record_endpoint_source {
        plan.writes.push(Write::Annotate {
            key: ENDPOINT_SOURCE,
            value: source.as_str(),
        });
    }
    let spec = obj.workspace();
    let fetched: Vec<Fetched> = spec
        .variables_from
        .iter()
        .flatten()
        .zip(&rest.sources)
        .map(|(source, data)| Fetched {
            source,
            data: data.clone(),
        })
        .collect();
    let merged = match variables::merge(&fetched, spec.variables.as_ref(), K::KIND) {
        Ok(merged) => merged,
        Err(e) => {
            plan.draft.set(Cond::new(
                conditions::DEPENDENCIES_READY,
                Status::False,
                e.reason(),
                e.to_string(),
            ));
            return Err(Unrendered::Waiting);
        }
    };
    plan.draft.set(ready());
    inputs::render(&InputsRequest {
        kind: K::KIND,
        namespace: &o.namespace,
        name: &o.name,
        cluster_name: obj.cluster_name(),
        image: &spec.source.image,
        template: obj
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLONED_FROM_NAME))
            .map(String::as_str),
        variables: Some(&merged.variables),
        sensitive: &merged.sensitive,
        role: &role.inputs,
    })
    .map_err(Unrendered::Invalid)
}

/// Paused (ref §8.1 step 4): the object's own annotation or its Cluster's
/// `spec.paused`; the Paused condition says which.
fn paused<K: Workload>(obj: &K, rest: &Rest, plan: &mut Plan) -> bool {
    let cluster = rest
        .capi
        .cluster
        .as_ref()
        .is_some_and(|c| c.spec.paused == Some(true));
    let own = super::has_annotation(obj, PAUSED);
    let cond = match (own, cluster) {
        (true, _) => Cond::new(
            conditions::PAUSED,
            Status::True,
            "Paused",
            format!("the object has the {PAUSED} annotation: no Job starts"),
        ),
        (false, true) => Cond::new(
            conditions::PAUSED,
            Status::True,
            "Paused",
            "its Cluster is paused: no Job starts",
        ),
        (false, false) => Cond::new(conditions::PAUSED, Status::False, "NotPaused", ""),
    };
    plan.draft.set(cond);
    own || cluster
}

/// The provisioned latch of the object's status.
pub fn provisioned<K: Workload>(obj: &K) -> bool {
    obj.workspace_status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
}
