//! What a pass decided, as plain data: the status it writes, the events
//! due, the ordered writes, the counters, and when to come back. `live`,
//! `deleting` and `settle` make it (pure); `act` carries it out.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::api::WorkspaceStatus;
use crate::backups::BackupSet;
use crate::controllers::conditions::{self, Cond, Transition};
use crate::controllers::credentials::MirrorWrite;
use crate::controllers::deletion::Why;
use crate::controllers::figures::JobFigures;
use crate::controllers::ledger::Outcome;
use crate::jobs::leases::Gate;
use crate::metrics::{
    ApprovalResult, BackupResult, JobResult, RemediationAction, RestoreResult, StateReadError,
};
use crate::names::Op;
use crate::protection::AsRead;

/// The status a pass writes, and the condition transitions it made.
#[derive(Clone, Debug)]
pub struct Draft {
    pub status: WorkspaceStatus,
    pub transitions: Vec<Transition>,
    generation: Option<i64>,
    now: Timestamp,
}

impl Draft {
    pub fn new(status: WorkspaceStatus, generation: Option<i64>, now: Timestamp) -> Draft {
        Draft {
            status,
            transitions: Vec::new(),
            generation,
            now,
        }
    }

    /// Sets `cond`; true when its status or reason changed.
    pub fn set(&mut self, cond: Cond) -> bool {
        let conditions = self.status.conditions.get_or_insert_default();
        match conditions::set(conditions, cond, self.generation, self.now) {
            Some(t) => {
                self.transitions.push(t);
                true
            }
            None => false,
        }
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    pub fn status_of(&self, type_: &str) -> Option<(conditions::Status, &str)> {
        conditions::status_of(self.status.conditions.as_deref()?, type_)
    }
}

/// An event to record on the object, with the Job it is about as the
/// related object (events of distinct Jobs never merge into one series).
#[derive(Clone, Debug)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
    pub related: Option<ObjectReference>,
    /// The event's action, when it is not the reason. Events of the same
    /// reason and action form one series that shows only its first note,
    /// so notes that say different things need different actions.
    pub action: Option<String>,
    /// Tells of something that happens once (a Job created or ended, a
    /// serial backed up, a finalizer removed): published under a name
    /// derived from what it says, so a manager that restarts before its
    /// pass is accounted publishes it again under the same name, which the
    /// API server refuses; never folded into a series.
    pub once: bool,
}

impl Note {
    pub fn normal(reason: &'static str, note: impl Into<String>) -> Note {
        Note {
            type_: EventType::Normal,
            reason,
            note: note.into(),
            related: None,
            action: None,
            once: false,
        }
    }

    pub fn warning(reason: &'static str, note: impl Into<String>) -> Note {
        Note {
            type_: EventType::Warning,
            ..Note::normal(reason, note)
        }
    }

    /// This note with its own action (see [`Note::action`]).
    pub fn action(self, action: String) -> Note {
        Note {
            action: Some(action),
            ..self
        }
    }

    /// This note as a once-only one (see [`Note::once`]).
    pub fn once(self) -> Note {
        Note { once: true, ..self }
    }

    pub fn about(self, job: &Job) -> Note {
        use kube::Resource;
        Note {
            related: Some(job.object_ref(&())),
            ..self
        }
    }
}

/// A counter the pass moves once its writes are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    JobFinished(Op, JobResult),
    StateReadError(StateReadError),
    Backups(BackupResult, u64),
    Restore(RestoreResult),
    PlanApproval(ApprovalResult),
    DestructiveApprovalConsumed,
    Remediation(RemediationAction),
    /// A Job of this op succeeded after this many attempts.
    Attempts(Op, u32),
    /// A drift check found these changes.
    Drift {
        add: i32,
        change: i32,
        destroy: i32,
    },
}

/// One state chunk to adopt: its name and the resourceVersion it was read
/// at, so that a chunk rewritten since is not patched blindly.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    pub name: String,
    pub resource_version: Option<String>,
    pub base: bool,
    /// Its owner references with the object's added.
    pub owner_references: Vec<OwnerReference>,
    /// Its finalizers as read.
    pub finalizers: Vec<String>,
}

/// A Job to start, built in full by the decision.
#[derive(Clone, Debug)]
pub struct Start {
    pub op: Op,
    /// Why it starts, for the log.
    pub why: &'static str,
    pub job: Job,
    /// Without an owner until the Job exists.
    pub run_secret: Secret,
    /// The service account the Job runs as, whose RBAC is ensured first.
    pub service_account: String,
    pub gate: Vec<Gate>,
    /// An apply's durable inputs, written before the Job.
    pub durable: Option<Secret>,
    /// The condition a lease wait reports on.
    pub condition: &'static str,
    pub cluster_name: Option<String>,
    /// The holder's activeDeadlineSeconds, for lease take-over.
    pub deadline: Duration,
    /// Events about the Job once it exists: JobCreated, ForceUnlocked.
    pub job_notes: Vec<Note>,
    /// Other events once it exists: InputsChanged.
    pub notes: Vec<Note>,
    pub counts: StartCounts,
    /// A destroy run from the manager's namespace: the Job is relocated
    /// there already.
    pub away: Option<Away>,
    /// A plan or an approved apply: the plan key and the saved plan's
    /// Secret must exist before the Job.
    pub saves_plan: bool,
}

/// Where a Job away from its object's namespace runs, and the
/// credentials it takes along.
#[derive(Clone, Debug)]
pub struct Away {
    pub namespace: String,
    /// The name of the object's credentials mirror, copied beside the Job
    /// (its data read when the Job starts: the watch has its metadata).
    pub mirror: Option<String>,
}

/// The counters a start moves once its Job exists.
#[derive(Clone, Copy, Debug)]
pub struct StartCounts {
    pub reason: &'static str,
    pub force_unlock: bool,
    pub inputs_changed: bool,
    /// An apply of an approved plan.
    pub plan_approved: bool,
}

/// The writes of a pass, performed in order; the first failure ends them.
#[derive(Clone, Debug)]
pub enum Write {
    /// Create or refresh the credentials mirror.
    Mirror(Box<MirrorWrite>),
    /// A successful apply's or restore's state: an owner reference to the
    /// object on every chunk, and the applied inputs hash (or none, for a
    /// restored backup that recorded none) on the base Secret.
    Adopt {
        chunks: Vec<Chunk>,
        inputs_hash: Option<String>,
    },
    /// The durable inputs record that an apply succeeded, and the digest
    /// it ran (none: unknown).
    MarkApplied {
        digest: Option<String>,
    },
    /// A merge patch of the object: the spec fields its outputs set, with
    /// the endpoint source recorded in the same write as the endpoint.
    Patch(serde_json::Value),
    /// An annotation CAPTF records on the object itself.
    Annotate {
        key: &'static str,
        value: &'static str,
    },
    Unannotate {
        key: &'static str,
    },
    /// The remediation request on a machine's Machine (ref §8.8): set with
    /// its reason, or withdrawn.
    RemediateMachine {
        machine: String,
        reason: Option<String>,
    },
    /// A pool's autoscaling write-back to its MachinePool (ref §8.8).
    MachinePoolReplicas {
        pool: String,
        write_back: crate::capi::autoscaling::WriteBack,
    },
    /// The restore of this serial succeeded: the request annotation goes.
    RemoveRestoreRequest {
        serial: String,
    },
    /// A finished Job's run lease and cluster write lease, in the Job's
    /// namespace.
    ReleaseLeases {
        job: String,
        namespace: String,
    },
    DeleteRunSecret {
        job: String,
        namespace: String,
    },
    /// A failed copy leaves no partial set and does not end the pass: the
    /// serial stays unobserved and the next pass copies it again.
    TakeBackup {
        set: BackupSet,
        observed: i64,
    },
    /// The pruned sets' Secrets, deleted only as they were listed.
    PruneBackups {
        sets: u64,
        secrets: Vec<AsRead>,
    },
    /// RBAC, leases, durable inputs, the Job and its per-run Secret.
    Start(Box<Start>),
    /// Cleanup (ref §8.6), each step idempotent.
    DeleteSecrets(Vec<String>),
    /// The state Secrets, each only as it was read.
    DeleteState(Vec<AsRead>),
    /// The durable inputs Secret, by the uid it was read with.
    DeleteDurable {
        uid: String,
    },
    /// The state lock Lease, protected, only as it was seen.
    DeleteLock(AsRead),
    /// CAPTF's own Leases, never protected, in this namespace.
    DeleteLeases {
        namespace: String,
        names: Vec<String>,
    },
    /// Jobs in `namespace`, with what they own (their pods; away from the
    /// object's namespace, their per-run Secrets and credentials copies):
    /// the object's Jobs in the manager's namespace at cleanup, which no
    /// owner reference takes with the object, and the Jobs that fall out of
    /// the history.
    DeleteJobs {
        namespace: String,
        names: Vec<String>,
    },
    /// The backups lose their protection; the garbage collector takes
    /// them once the object is gone.
    ReleaseBackups(Vec<String>),
    ReleaseMirrors,
    RemoveFinalizer {
        why: Why,
    },
}

/// When the object is reconciled again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    After(Duration),
    /// Only on a change: the object is gone, or its own write wakes it.
    OnChange,
}

/// One pass's decision.
#[derive(Clone, Debug)]
pub struct Plan {
    pub draft: Draft,
    /// The status fields of the object's kind alone (from its outputs);
    /// what the object has, unless the pass maps its outputs anew.
    pub kind_status: serde_json::Map<String, serde_json::Value>,
    /// Set at the end of the pass, so that its reason changes at most
    /// once per pass (and DeletionStarted is due only on the first).
    pub deleting: Option<Cond>,
    /// Due whatever the writes do; recorded after them.
    pub notes: Vec<Note>,
    pub writes: Vec<Write>,
    /// `captf_state_bytes`/`captf_state_resources` as read (None removes
    /// them); not touched when the state was not read.
    pub gauges: Option<Option<(u64, u64)>>,
    pub counts: Vec<Count>,
    /// What each Job settled in this pass measured.
    pub figures: Vec<(Op, JobResult, JobFigures)>,
    /// `captf_inputs_bytes`: the size of the inputs rendered in this pass.
    pub inputs_bytes: Option<u64>,
    /// The newest success of each op, where it is exported.
    pub last_success: Vec<(Op, Option<Timestamp>)>,
    /// Jobs whose result this pass's status accounts for, marked bookkept
    /// once it is written.
    /// (namespace, Job, outcome).
    pub bookkept: Vec<(String, String, Outcome)>,
    /// Warnings for the manager's log (never state content).
    pub logs: Vec<String>,
    pub requeue: Requeue,
}

impl Plan {
    pub fn new(draft: Draft, requeue: Requeue) -> Plan {
        Plan {
            draft,
            kind_status: serde_json::Map::new(),
            deleting: None,
            notes: Vec::new(),
            writes: Vec::new(),
            gauges: None,
            counts: Vec::new(),
            figures: Vec::new(),
            inputs_bytes: None,
            last_success: Vec::new(),
            bookkept: Vec::new(),
            logs: Vec::new(),
            requeue,
        }
    }
}
