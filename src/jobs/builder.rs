//! The runner Job of one run and its per-run Secret (book:
//! inside-the-job.md; ref §6.3, §7). Pure: the controller creates the Job,
//! then, with the Job's UID, the Secret ([`own_run_secret`]); the pod cannot
//! start before its config volume exists, so that order is safe.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvFromSource, EnvVar, KeyToPath, PodSpec, PodTemplateSpec,
    ProjectedVolumeSource, ResourceRequirements, Secret, SecretEnvSource, SecretProjection,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::inputs::{
    BACKEND_ONLY_MAIN_TF_JSON, EMPTY_TFVARS_JSON, MAIN_TF_JSON, RenderedInputs, TFVARS_JSON,
};
use super::owner_labels;
use super::plans;
use super::policy::{JobSettings, quantities, runtime_default_seccomp};
use crate::api::{GROUP, ImagePullPolicy, VERSION};
use crate::error::{Categorized, Category};
use crate::keys::{ATTEMPT_LABEL, MOVE_LABEL, OP_LABEL};
use crate::names::{self, Hash6, Kind, Op};
use crate::state::TFSTATE_KEY;

/// The main container, which runs the module image.
pub const SOURCE_CONTAINER: &str = "source";
/// The init container, which copies the runner in.
pub const RUNNER_CONTAINER: &str = "runner";
/// The volume of the credentials mirror.
pub const CREDENTIALS_VOLUME: &str = "creds";
/// The pod's grace period after SIGTERM.
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 600;
/// How long the runner lets an interrupted step finish: within the grace
/// period, with 30 s left to write the result.
pub const STOP_TIMEOUT_SECONDS: i64 = 570;
/// Mode of the Secret volumes: the image's user reads them through the
/// pod's fsGroup.
const SECRET_MODE: i32 = 0o440;
/// The user of the init container.
const RUNNER_USER: i64 = 65532;

const BIN_DIR: &str = "/captf/bin";
const WORK_DIR: &str = "/captf/work";
const TMP_DIR: &str = "/tmp";
const CONFIG_DIR: &str = "/captf/config";
const CREDENTIALS_DIR: &str = "/var/run/captf/credentials";
const PLAN_KEY_DIR: &str = "/captf/plan-key";
const PLAN_KEY_VOLUME: &str = "plan-key";
const TERMINATION_LOG: &str = "/dev/termination-log";

/// A restore's backup: its chunk Secrets in order, the managed resource
/// count the pushed state must show, and the serial it is pushed with.
#[derive(Clone, Copy, Debug)]
pub struct RestoreRequest<'a> {
    pub chunk_secrets: &'a [String],
    pub resources: u64,
    pub serial: u64,
}

/// How an apply runs (book: inside-the-job.md "Steps by operation").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyMode<'a> {
    /// validate, apply -auto-approve: a first apply, machines and pools.
    Direct,
    /// A TerraformCluster's guarded apply: plan, show, then the saved plan,
    /// which stops before a delete or replace unless that was approved.
    Guarded { allow_destructive: bool },
    /// A TerraformCluster's approved apply (applyPolicy Manual): the saved
    /// plan with this hash, and nothing else.
    Approved { plan_hash: &'a str },
}

/// Everything one runner Job is built from.
#[derive(Clone, Copy, Debug)]
pub struct JobRequest<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub cluster_name: Option<&'a str>,
    pub op: Op,
    pub attempt: NonZeroU32,
    pub hash6: &'a Hash6,
    /// `spec.source.image`, or the pinned digest reference where one runs.
    pub image: &'a str,
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// The manager's `--runner-image`.
    pub runner_image: &'a str,
    pub settings: &'a JobSettings,
    /// The TerraformClusterIdentity whose mirror the Job mounts.
    pub identity: Option<&'a str>,
    /// A stale lock ID to force-unlock after init.
    pub force_unlock: Option<&'a str>,
    /// The rendered root; a restore runs a backend-only root instead.
    pub inputs: &'a RenderedInputs,
    pub restore: Option<RestoreRequest<'a>>,
    /// How an apply runs; other operations ignore it.
    pub mode: ApplyMode<'a>,
    /// The runner reports its progress as events on the object.
    pub events: bool,
}

impl JobRequest<'_> {
    /// Whether the Job saves or applies a saved plan, and so mounts the
    /// plan key: a plan and an approved apply, nothing else.
    fn saves_plan(&self) -> bool {
        self.op == Op::Plan
            || self.op == Op::Apply && matches!(self.mode, ApplyMode::Approved { .. })
    }
}

/// A Job and the per-run Secret it mounts, not yet created.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltJob {
    pub job: Job,
    /// Without an owner until [`own_run_secret`].
    pub run_secret: Secret,
}

/// Builds the Job and its per-run Secret.
pub fn build(req: &JobRequest) -> BuiltJob {
    let job_name = names::job(req.kind, req.name, req.op, req.attempt, req.hash6);
    let secret_name = names::run_secret(&job_name);

    let mut labels = owner_labels(req.kind, req.name, req.cluster_name);
    labels.insert(OP_LABEL.into(), req.op.as_str().into());
    labels.insert(ATTEMPT_LABEL.into(), req.attempt.to_string());

    let mut volumes = vec![
        empty_dir("runner"),
        empty_dir("work"),
        empty_dir("tmp"),
        config_volume(&secret_name, req.restore),
    ];
    let mut mounts = vec![
        mount("runner", BIN_DIR, true),
        mount("work", WORK_DIR, false),
        mount("tmp", TMP_DIR, false),
        mount("config", CONFIG_DIR, true),
    ];
    if req.saves_plan() {
        volumes.push(Volume {
            name: PLAN_KEY_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::plan_key(req.kind, req.name)),
                default_mode: Some(SECRET_MODE),
                items: Some(vec![KeyToPath {
                    key: plans::KEY.into(),
                    path: plans::KEY.into(),
                    mode: None,
                }]),
                optional: Some(false),
            }),
            ..Default::default()
        });
        mounts.push(mount(PLAN_KEY_VOLUME, PLAN_KEY_DIR, true));
    }
    let mut env_from = None;
    if let Some(identity) = req.identity {
        let mirror = names::credentials_mirror(identity);
        volumes.push(Volume {
            name: CREDENTIALS_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(mirror.clone()),
                default_mode: Some(SECRET_MODE),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(CREDENTIALS_VOLUME, CREDENTIALS_DIR, true));
        env_from = Some(vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: mirror,
                optional: Some(false),
            }),
            ..Default::default()
        }]);
    }

    let source = Container {
        name: SOURCE_CONTAINER.into(),
        image: Some(req.image.into()),
        image_pull_policy: Some(pull_policy(req.image_pull_policy.unwrap_or_default()).into()),
        command: Some(vec![format!("{BIN_DIR}/runner"), "run".into()]),
        args: Some(runner_args(req, &job_name)),
        env: Some(env(req)),
        env_from,
        resources: Some(req.settings.resources.clone()),
        security_context: Some(req.settings.security_context.clone()),
        volume_mounts: Some(mounts),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    };
    let runner = Container {
        name: RUNNER_CONTAINER.into(),
        image: Some(req.runner_image.into()),
        command: Some(vec![
            "/runner".into(),
            "copy".into(),
            format!("{BIN_DIR}/runner"),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "10m"), ("memory", "32Mi")])),
            limits: Some(quantities(&[("cpu", "100m"), ("memory", "64Mi")])),
            ..Default::default()
        }),
        security_context: Some(runner_security_context()),
        volume_mounts: Some(vec![mount("runner", BIN_DIR, false)]),
        ..Default::default()
    };

    let settings = req.settings;
    let job = Job {
        metadata: ObjectMeta {
            name: Some(job_name),
            namespace: Some(req.namespace.into()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: format!("{GROUP}/{VERSION}"),
                kind: req.kind.kind().into(),
                name: req.name.into(),
                uid: req.uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(settings.active_deadline_seconds),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    termination_grace_period_seconds: Some(TERMINATION_GRACE_PERIOD_SECONDS),
                    service_account_name: Some(settings.service_account_name.clone()),
                    // The backend reaches the API with the pod's token.
                    automount_service_account_token: Some(true),
                    image_pull_secrets: (!settings.image_pull_secrets.is_empty())
                        .then(|| settings.image_pull_secrets.clone()),
                    security_context: Some(settings.pod_security_context.clone()),
                    init_containers: Some(vec![runner]),
                    containers: vec![source],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    };

    let (main_tf_json, tfvars_json) = if req.op == Op::Restore {
        (BACKEND_ONLY_MAIN_TF_JSON, EMPTY_TFVARS_JSON)
    } else {
        (&req.inputs.main_tf_json[..], &req.inputs.tfvars_json[..])
    };
    let run_secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name),
            namespace: Some(req.namespace.into()),
            labels: Some(owner_labels(req.kind, req.name, req.cluster_name)),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (MAIN_TF_JSON.into(), ByteString(main_tf_json.to_vec())),
            (TFVARS_JSON.into(), ByteString(tfvars_json.to_vec())),
        ])),
        ..Default::default()
    };
    BuiltJob { job, run_secret }
}

/// The created Job lacks a name or a UID, so nothing can be owned by it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the Job has no name or UID: it was not read back from the API")]
pub struct JobNotCreated;

impl Categorized for JobNotCreated {
    fn category(&self) -> Category {
        Category::Internal
    }
}

/// Makes the created `job` the controller owner of its per-run Secret, so the
/// Secret goes with the Job.
pub fn own_run_secret(secret: &mut Secret, job: &Job) -> Result<(), JobNotCreated> {
    let mut owner = job.controller_owner_ref(&()).ok_or(JobNotCreated)?;
    owner.block_owner_deletion = Some(true);
    secret.metadata.owner_references = Some(vec![owner]);
    Ok(())
}

/// The six hex characters that end the Job name: over the inputs hash, the
/// operation, the attempt and the tick (ref §7).
pub fn hash6(inputs_hash: &str, op: Op, attempt: NonZeroU32, tick: u64) -> Hash6 {
    Hash6::of(format!("{inputs_hash}\n{}\n{attempt}\n{tick}", op.as_str()).as_bytes())
}

/// The attempt of the next Job of `op`: 1 + the highest attempt among the
/// object's retained `jobs` of that operation, read from their labels.
pub fn next_attempt<'a>(op: Op, jobs: impl IntoIterator<Item = &'a Job>) -> NonZeroU32 {
    let highest = jobs
        .into_iter()
        .filter_map(|job| job.metadata.labels.as_ref())
        .filter(|labels| labels.get(OP_LABEL).map(String::as_str) == Some(op.as_str()))
        .filter_map(|labels| labels.get(ATTEMPT_LABEL)?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    NonZeroU32::MIN.saturating_add(highest)
}

/// The runner's arguments, in the agreed order; the fixed paths keep their
/// defaults.
fn runner_args(req: &JobRequest, job_name: &str) -> Vec<String> {
    let suffix = names::suffix(req.namespace, req.kind, req.name);
    let mut args = vec![
        format!("--op={}", req.op.as_str()),
        format!("--image={}", req.image),
        format!("--job-name={job_name}"),
        format!("--lock-timeout={}s", req.settings.lock_timeout_seconds),
        format!("--stop-timeout={STOP_TIMEOUT_SECONDS}s"),
        format!("--backend-config=secret_suffix={suffix}"),
        format!("--backend-config=namespace={}", req.namespace),
        "--backend-config=in_cluster_config=true".into(),
        format!(
            "--backend-config=labels={}",
            backend_labels(req.kind, req.name, req.cluster_name)
        ),
    ];
    if let Some(lock_id) = req.force_unlock {
        args.push(format!("--force-unlock={lock_id}"));
    }
    if let Some(restore) = req.restore {
        args.push(format!("--restore-chunks={}", restore.chunk_secrets.len()));
        args.push(format!("--restore-resources={}", restore.resources));
        args.push(format!("--restore-serial={}", restore.serial));
    }
    if req.op == Op::Apply {
        match req.mode {
            ApplyMode::Direct => {}
            ApplyMode::Guarded { allow_destructive } => {
                args.push("--guarded".into());
                if allow_destructive {
                    args.push("--allow-destructive".into());
                }
            }
            ApplyMode::Approved { plan_hash } => {
                args.push(format!("--approved-plan={plan_hash}"));
            }
        }
    }
    if req.events {
        args.push(format!(
            "--events-for={}/{}/{}",
            req.kind.kind(),
            req.name,
            req.uid
        ));
    }
    if req.saves_plan() {
        args.push(format!(
            "--plan-secret={}",
            names::plan_secret(req.kind, req.name)
        ));
        args.push(format!("--inputs-hash={}", req.inputs.inputs_hash));
    }
    // The names of the variables a Secret fills, whose values the runner
    // redacts; the values stay in the pod's environment.
    for var in &req.settings.env {
        if var
            .value_from
            .as_ref()
            .is_some_and(|from| from.secret_key_ref.is_some())
        {
            args.push(format!("--secret-env={}", var.name));
        }
    }
    args
}

/// The labels the backend puts on the state Secrets (ref §6.3), as an HCL
/// object literal in sorted key order. Each key and value is quoted as a
/// JSON string, which HCL reads the same way; label keys and values hold no
/// `${` that HCL would interpolate.
fn backend_labels(kind: Kind, name: &str, cluster_name: Option<&str>) -> String {
    let mut labels = owner_labels(kind, name, cluster_name);
    labels.insert(MOVE_LABEL.into(), String::new());
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{}={}", quote(k), quote(v)))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// The Job's own variables, then the policy's (already without `TF_` and
/// `KUBE_` names).
fn env(req: &JobRequest) -> Vec<EnvVar> {
    let fixed = [
        ("TF_IN_AUTOMATION", "1"),
        ("TF_INPUT", "0"),
        ("HOME", WORK_DIR),
        ("TMPDIR", TMP_DIR),
        ("KUBE_NAMESPACE", req.namespace),
        ("CHECKPOINT_DISABLE", "1"),
    ];
    fixed
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        })
        .chain(req.settings.env.iter().cloned())
        .collect()
}

/// The per-run Secret, or for a restore a projection of it with the backup
/// chunks, key `tfstate` of chunk i at `restore/<i>`.
fn config_volume(secret_name: &str, restore: Option<RestoreRequest>) -> Volume {
    let Some(restore) = restore else {
        return Volume {
            name: "config".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name.into()),
                default_mode: Some(SECRET_MODE),
                ..Default::default()
            }),
            ..Default::default()
        };
    };
    let run_secret = VolumeProjection {
        secret: Some(SecretProjection {
            name: secret_name.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let chunks = restore
        .chunk_secrets
        .iter()
        .enumerate()
        .map(|(i, chunk)| VolumeProjection {
            secret: Some(SecretProjection {
                name: chunk.clone(),
                items: Some(vec![KeyToPath {
                    key: TFSTATE_KEY.into(),
                    path: format!("restore/{i}"),
                    mode: None,
                }]),
                optional: Some(false),
            }),
            ..Default::default()
        });
    Volume {
        name: "config".into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(SECRET_MODE),
            sources: Some(std::iter::once(run_secret).chain(chunks).collect()),
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn pull_policy(policy: ImagePullPolicy) -> &'static str {
    match policy {
        ImagePullPolicy::IfNotPresent => "IfNotPresent",
        ImagePullPolicy::Always => "Always",
        ImagePullPolicy::Never => "Never",
    }
}

/// Not configurable: the init container only copies a file.
fn runner_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUNNER_USER),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
