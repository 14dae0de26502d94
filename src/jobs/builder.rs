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
mod tests {
    use std::path::PathBuf;

    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{LocalObjectReference, PodSecurityContext};
    use serde_json::json;

    use super::*;
    use crate::api::{JobPolicy, Variables};
    use crate::jobs::inputs::{self, InputsRequest};
    use crate::jobs::policy::{self, resolve};

    fn n(attempt: u32) -> NonZeroU32 {
        NonZeroU32::new(attempt).unwrap()
    }

    fn rendered(kind: Kind, name: &str, cluster: Option<&str>) -> RenderedInputs {
        let variables: Variables =
            serde_json::from_value(json!({ "region": "eu-west-1", "size": 2 })).unwrap();
        inputs::render(&InputsRequest {
            kind,
            namespace: "team-a",
            name,
            cluster_name: cluster,
            image: "registry.example/modules/net:1.4.0",
            template: None,
            variables: Some(&variables),
            sensitive: &[],
            role: &[],
        })
        .unwrap()
    }

    /// What a case varies; the rest is one TerraformMachine of cluster
    /// "prod" with an identity.
    struct Case {
        kind: Kind,
        name: &'static str,
        cluster: Option<&'static str>,
        op: Op,
        attempt: u32,
        settings: JobSettings,
        identity: Option<&'static str>,
        force_unlock: Option<&'static str>,
        pull: Option<ImagePullPolicy>,
        restore: Option<(Vec<String>, u64)>,
        mode: ApplyMode<'static>,
        events: bool,
    }

    impl Default for Case {
        fn default() -> Case {
            Case {
                kind: Kind::Machine,
                name: "worker-0",
                cluster: Some("prod"),
                op: Op::Apply,
                attempt: 1,
                settings: resolve(None, None),
                identity: Some("aws"),
                force_unlock: None,
                pull: None,
                restore: None,
                mode: ApplyMode::Direct,
                events: false,
            }
        }
    }

    fn build_case(case: &Case) -> BuiltJob {
        let inputs = rendered(case.kind, case.name, case.cluster);
        let attempt = n(case.attempt);
        let hash6 = hash6(&inputs.inputs_hash, case.op, attempt, 0);
        let restore = case
            .restore
            .as_ref()
            .map(|(chunks, resources)| RestoreRequest {
                chunk_secrets: chunks,
                resources: *resources,
                serial: 41,
            });
        build(&JobRequest {
            kind: case.kind,
            namespace: "team-a",
            name: case.name,
            uid: "6f1f1c1e-7a52-4c4e-9d83-2a7f0f6c1b11",
            cluster_name: case.cluster,
            op: case.op,
            attempt,
            hash6: &hash6,
            image: "registry.example/modules/net:1.4.0",
            image_pull_policy: case.pull,
            runner_image: "registry.example/captf/runner:0.1.0",
            settings: &case.settings,
            identity: case.identity,
            force_unlock: case.force_unlock,
            inputs: &inputs,
            restore,
            mode: case.mode,
            events: case.events,
        })
    }

    fn pod(built: &BuiltJob) -> &PodSpec {
        built
            .job
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
    }

    fn source(built: &BuiltJob) -> &Container {
        &pod(built).containers[0]
    }

    fn args(built: &BuiltJob) -> &[String] {
        source(built).args.as_deref().unwrap()
    }

    fn golden_cases() -> Vec<(&'static str, Case)> {
        let cluster_defaults = JobPolicy {
            active_deadline_seconds: Some(7200),
            lock_timeout_seconds: Some(600),
            service_account_name: Some("cluster-runner".into()),
            image_pull_secrets: Some(vec![
                LocalObjectReference {
                    name: "registry".into(),
                },
                LocalObjectReference {
                    name: "mirror".into(),
                },
            ]),
            env: Some(vec![
                EnvVar {
                    name: "HTTPS_PROXY".into(),
                    value: Some("http://proxy:3128".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "TF_LOG".into(),
                    value: Some("trace".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "REGION".into(),
                    value: Some("from-cluster".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let machine_policy = JobPolicy {
            lock_timeout_seconds: Some(120),
            image_pull_secrets: Some(vec![LocalObjectReference {
                name: "mirror".into(),
            }]),
            env: Some(vec![
                EnvVar {
                    name: "REGION".into(),
                    value: Some("from-machine".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "KUBE_CONTEXT".into(),
                    value: Some("x".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        vec![
            ("apply", Case::default()),
            (
                "destroy",
                Case {
                    op: Op::Destroy,
                    attempt: 2,
                    force_unlock: Some("2b5c1e0e-3c4d-4e4f-8a9b-0c1d2e3f4a5b"),
                    pull: Some(ImagePullPolicy::Always),
                    ..Case::default()
                },
            ),
            (
                "refresh",
                Case {
                    kind: Kind::MachinePool,
                    name: "pool-a",
                    op: Op::Refresh,
                    identity: None,
                    ..Case::default()
                },
            ),
            (
                "drift",
                Case {
                    kind: Kind::Cluster,
                    name: "prod",
                    op: Op::Drift,
                    attempt: 3,
                    ..Case::default()
                },
            ),
            (
                "restore",
                Case {
                    op: Op::Restore,
                    restore: Some((
                        vec![
                            "captf-state-backup-0123456789abcdef-m-7".into(),
                            "captf-state-backup-0123456789abcdef-m-7-part-1".into(),
                        ],
                        4,
                    )),
                    ..Case::default()
                },
            ),
            (
                "plan",
                Case {
                    kind: Kind::Cluster,
                    name: "prod",
                    cluster: None,
                    op: Op::Plan,
                    ..Case::default()
                },
            ),
            (
                "machine-cluster-defaults",
                Case {
                    settings: resolve(Some(&machine_policy), Some(&cluster_defaults)),
                    ..Case::default()
                },
            ),
            // A user context sets only its users: the hardened defaults stay.
            (
                "security-context",
                Case {
                    settings: resolve(
                        Some(&JobPolicy {
                            security_context: Some(SecurityContext {
                                run_as_user: Some(1000),
                                run_as_non_root: Some(true),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        None,
                    ),
                    ..Case::default()
                },
            ),
            (
                "pod-security-context",
                Case {
                    settings: resolve(
                        None,
                        Some(&JobPolicy {
                            pod_security_context: Some(PodSecurityContext {
                                run_as_user: Some(1000),
                                run_as_group: Some(1000),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                    ),
                    ..Case::default()
                },
            ),
        ]
    }

    /// The Job, then the Secret; the Secret's data as text, so that a
    /// change of the rendered root shows in review.
    fn golden_yaml(built: &BuiltJob) -> String {
        let mut secret = built.run_secret.clone();
        secret.string_data = secret.data.take().map(|data| {
            data.into_iter()
                .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
                .collect()
        });
        format!(
            "{}---\n{}",
            serde_saphyr::to_string(&built.job).unwrap(),
            serde_saphyr::to_string(&secret).unwrap()
        )
    }

    #[test]
    fn golden_jobs() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/jobs");
        let update = std::env::var_os("CAPTF_UPDATE_GOLDEN").is_some_and(|v| v == "1");
        let mut stale = Vec::new();
        for (case, spec) in golden_cases() {
            let got = golden_yaml(&build_case(&spec));
            let path = dir.join(format!("{case}.yaml"));
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&path).unwrap_or_default();
            if got != want {
                stale.push(format!("{case}:\n{got}"));
            }
        }
        assert!(
            stale.is_empty(),
            "Jobs differ from tests/golden/jobs (CAPTF_UPDATE_GOLDEN=1 rewrites them):\n{}",
            stale.join("\n")
        );
    }

    #[test]
    fn shape_of_an_apply_job() {
        let built = build_case(&Case::default());
        let job = &built.job;
        let name = job.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("captf-m-worker-0-apply-a1-"), "{name}");
        assert_eq!(
            built.run_secret.metadata.name.as_deref(),
            Some(format!("captf-run-{name}").as_str())
        );
        let labels = job.metadata.labels.as_ref().unwrap();
        for (k, v) in [
            ("captf.io/managed", "true"),
            (
                "captf.infrastructure.cluster.x-k8s.io/owner-kind",
                "TerraformMachine",
            ),
            (
                "captf.infrastructure.cluster.x-k8s.io/owner-name",
                "worker-0",
            ),
            ("cluster.x-k8s.io/cluster-name", "prod"),
            ("captf.infrastructure.cluster.x-k8s.io/op", "apply"),
            ("captf.infrastructure.cluster.x-k8s.io/attempt", "1"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(
            spec.template.metadata.as_ref().unwrap().labels.as_ref(),
            Some(labels)
        );
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.ttl_seconds_after_finished, None);
        assert_eq!(spec.active_deadline_seconds, Some(3600));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str()
            ),
            (
                "infrastructure.cluster.x-k8s.io/v1alpha1",
                "TerraformMachine",
                "worker-0"
            )
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );

        let pod = pod(&built);
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.termination_grace_period_seconds, Some(600));
        assert_eq!(pod.service_account_name.as_deref(), Some("captf-runner"));
        assert_eq!(pod.automount_service_account_token, Some(true));
        assert_eq!(pod.image_pull_secrets, None);
        assert_eq!(
            pod.security_context,
            Some(policy::default_pod_security_context())
        );

        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.name, "runner");
        assert_eq!(
            init.image.as_deref(),
            Some("registry.example/captf/runner:0.1.0")
        );
        assert_eq!(
            init.command.as_deref().unwrap(),
            ["/runner", "copy", "/captf/bin/runner"]
        );
        let init_mounts: Vec<_> = init
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(init_mounts, [("runner", "/captf/bin", None)]);

        let main = source(&built);
        assert_eq!(main.name, "source");
        assert_eq!(
            main.image.as_deref(),
            Some("registry.example/modules/net:1.4.0")
        );
        assert_eq!(main.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            main.command.as_deref().unwrap(),
            ["/captf/bin/runner", "run"]
        );
        assert_eq!(
            main.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(main.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(main.resources, Some(policy::default_resources()));
        assert_eq!(
            main.security_context,
            Some(policy::default_security_context())
        );
        let mounts: Vec<_> = main
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m.name.as_str(),
                    m.mount_path.as_str(),
                    m.read_only == Some(true),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                ("runner", "/captf/bin", true),
                ("work", "/captf/work", false),
                ("tmp", "/tmp", false),
                ("config", "/captf/config", true),
                ("creds", "/var/run/captf/credentials", true),
            ]
        );
        let env_from = main.env_from.as_ref().unwrap();
        assert_eq!(
            env_from[0].secret_ref.as_ref().unwrap().name,
            "captf-creds-aws"
        );

        let volumes = pod.volumes.as_ref().unwrap();
        let config = volumes.iter().find(|v| v.name == "config").unwrap();
        let config = config.secret.as_ref().unwrap();
        assert_eq!(config.secret_name, built.run_secret.metadata.name);
        assert_eq!(config.default_mode, Some(0o440));
        let creds = volumes.iter().find(|v| v.name == "creds").unwrap();
        let creds = creds.secret.as_ref().unwrap();
        assert_eq!(creds.secret_name.as_deref(), Some("captf-creds-aws"));
        assert_eq!(
            (creds.default_mode, creds.optional),
            (Some(0o440), Some(false))
        );

        let data = built.run_secret.data.as_ref().unwrap();
        let inputs = rendered(Kind::Machine, "worker-0", Some("prod"));
        assert_eq!(data["main.tf.json"].0, inputs.main_tf_json);
        assert_eq!(data["terraform.tfvars.json"].0, inputs.tfvars_json);
        assert_eq!(data.len(), 2);
        assert_eq!(built.run_secret.metadata.owner_references, None);
        let secret_labels = built.run_secret.metadata.labels.as_ref().unwrap();
        assert_eq!(secret_labels["captf.io/managed"], "true");
        assert_eq!(
            secret_labels["captf.infrastructure.cluster.x-k8s.io/owner-name"],
            "worker-0"
        );
    }

    #[test]
    fn runner_args_in_order() {
        let built = build_case(&Case::default());
        let job = built.job.metadata.name.as_deref().unwrap();
        let suffix = names::suffix("team-a", Kind::Machine, "worker-0");
        assert_eq!(
            args(&built),
            [
                "--op=apply".to_owned(),
                "--image=registry.example/modules/net:1.4.0".into(),
                format!("--job-name={job}"),
                "--lock-timeout=300s".into(),
                "--stop-timeout=570s".into(),
                format!("--backend-config=secret_suffix={suffix}"),
                "--backend-config=namespace=team-a".into(),
                "--backend-config=in_cluster_config=true".into(),
                concat!(
                    r#"--backend-config=labels={"#,
                    r#""captf.infrastructure.cluster.x-k8s.io/owner-kind"="TerraformMachine","#,
                    r#""captf.infrastructure.cluster.x-k8s.io/owner-name"="worker-0","#,
                    r#""captf.io/managed"="true","#,
                    r#""cluster.x-k8s.io/cluster-name"="prod","#,
                    r#""clusterctl.cluster.x-k8s.io/move"=""}"#
                )
                .into(),
            ]
        );
        // Without a cluster, no cluster-name label on the state.
        let alone = build_case(&Case {
            cluster: None,
            ..Case::default()
        });
        let labels = args(&alone).iter().find(|a| a.contains("labels=")).unwrap();
        assert!(!labels.contains("cluster-name"), "{labels}");
        assert!(
            !alone
                .job
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("cluster.x-k8s.io/cluster-name")
        );
    }

    #[test]
    fn long_names_use_the_hash_rule() {
        let name = "a-very-long-machine-name-that-does-not-fit-the-job-name";
        let built = build_case(&Case {
            name,
            ..Case::default()
        });
        let job = built.job.metadata.name.as_deref().unwrap();
        assert!(job.len() <= 57, "{job}");
        assert!(!job.contains(name), "{job}");
        assert!(
            job.starts_with("captf-m-") && job.contains("-apply-a1-"),
            "{job}"
        );
        assert_eq!(
            built.run_secret.metadata.name.as_deref(),
            Some(format!("captf-run-{job}").as_str())
        );
        // The owner reference and the label keep the real name, which fits a
        // label value.
        assert_eq!(
            built.job.metadata.owner_references.as_ref().unwrap()[0].name,
            name
        );
        assert_eq!(
            built.job.metadata.labels.as_ref().unwrap()["captf.infrastructure.cluster.x-k8s.io/owner-name"],
            name
        );
    }

    #[test]
    fn env_is_fixed_then_policy_without_reserved_names() {
        let own = JobPolicy {
            env: Some(
                [
                    ("TF_VAR_x", "1"),
                    ("REGION", "eu"),
                    ("KUBE_NAMESPACE", "evil"),
                    ("TFX", "y"),
                ]
                .into_iter()
                .map(|(name, value)| EnvVar {
                    name: name.into(),
                    value: Some(value.into()),
                    ..Default::default()
                })
                .collect(),
            ),
            ..Default::default()
        };
        let built = build_case(&Case {
            settings: resolve(Some(&own), None),
            ..Case::default()
        });
        let env: Vec<_> = source(&built)
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(
            env,
            [
                ("TF_IN_AUTOMATION", "1"),
                ("TF_INPUT", "0"),
                ("HOME", "/captf/work"),
                ("TMPDIR", "/tmp"),
                ("KUBE_NAMESPACE", "team-a"),
                ("CHECKPOINT_DISABLE", "1"),
                ("REGION", "eu"),
                ("TFX", "y"),
            ]
        );
    }

    #[test]
    fn secret_env_names_the_variables_a_secret_fills() {
        use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVarSource, SecretKeySelector};
        let from = |secret: bool| EnvVarSource {
            secret_key_ref: secret.then(|| SecretKeySelector {
                name: "db".into(),
                key: "password".into(),
                optional: None,
            }),
            config_map_key_ref: (!secret).then(|| ConfigMapKeySelector {
                name: "settings".into(),
                key: "region".into(),
                optional: None,
            }),
            ..Default::default()
        };
        let own = JobPolicy {
            env: Some(vec![
                EnvVar {
                    name: "DB_PASSWORD".into(),
                    value_from: Some(from(true)),
                    ..Default::default()
                },
                EnvVar {
                    name: "REGION".into(),
                    value_from: Some(from(false)),
                    ..Default::default()
                },
                EnvVar {
                    name: "PLAIN".into(),
                    value: Some("not-secret".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "API_TOKEN".into(),
                    value_from: Some(from(true)),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let built = build_case(&Case {
            settings: resolve(Some(&own), None),
            ..Case::default()
        });
        let secret_env: Vec<&str> = args(&built)
            .iter()
            .filter(|a| a.starts_with("--secret-env"))
            .map(String::as_str)
            .collect();
        assert_eq!(
            secret_env,
            ["--secret-env=DB_PASSWORD", "--secret-env=API_TOKEN"]
        );
        // The values never reach the arguments.
        assert!(!args(&built).iter().any(|a| a.contains("not-secret")));
        assert!(
            !args(&build_case(&Case::default()))
                .iter()
                .any(|a| a.starts_with("--secret-env"))
        );
    }

    #[test]
    fn force_unlock_only_when_asked() {
        let plain = build_case(&Case::default());
        assert!(!args(&plain).iter().any(|a| a.starts_with("--force-unlock")));
        let unlocking = build_case(&Case {
            force_unlock: Some("lock-id-1"),
            ..Case::default()
        });
        let a = args(&unlocking);
        assert_eq!(
            a.iter().filter(|a| a.starts_with("--force-unlock")).count(),
            1
        );
        assert_eq!(
            a.last().map(String::as_str),
            Some("--force-unlock=lock-id-1")
        );
    }

    #[test]
    fn lock_timeout_and_deadline_come_from_the_policy() {
        let own = JobPolicy {
            lock_timeout_seconds: Some(45),
            active_deadline_seconds: Some(900),
            service_account_name: Some("custom".into()),
            ..Default::default()
        };
        let built = build_case(&Case {
            settings: resolve(Some(&own), None),
            ..Case::default()
        });
        assert!(args(&built).contains(&"--lock-timeout=45s".to_owned()));
        assert_eq!(
            built.job.spec.as_ref().unwrap().active_deadline_seconds,
            Some(900)
        );
        assert_eq!(pod(&built).service_account_name.as_deref(), Some("custom"));
        let zero = build_case(&Case {
            settings: resolve(
                Some(&JobPolicy {
                    lock_timeout_seconds: Some(0),
                    ..Default::default()
                }),
                None,
            ),
            ..Case::default()
        });
        assert!(args(&zero).contains(&"--lock-timeout=0s".to_owned()));
    }

    #[test]
    fn no_identity_no_credentials() {
        let built = build_case(&Case {
            identity: None,
            ..Case::default()
        });
        let main = source(&built);
        assert_eq!(main.env_from, None);
        assert!(
            !main
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.name == "creds")
        );
        assert!(
            !pod(&built)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.name == "creds")
        );
    }

    #[test]
    fn restore_projects_the_chunks_and_runs_a_backend_only_root() {
        let chunks: Vec<String> = vec![
            "backup-a".into(),
            "backup-a-part-1".into(),
            "backup-a-part-2".into(),
        ];
        let built = build_case(&Case {
            op: Op::Restore,
            restore: Some((chunks.clone(), 12)),
            ..Case::default()
        });
        let a = args(&built);
        assert_eq!(
            a[a.len() - 3..],
            [
                "--restore-chunks=3".to_owned(),
                "--restore-resources=12".to_owned(),
                "--restore-serial=41".to_owned()
            ]
        );
        let config = pod(&built)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "config")
            .unwrap();
        assert_eq!(config.secret, None);
        let projected = config.projected.as_ref().unwrap();
        assert_eq!(projected.default_mode, Some(0o440));
        let sources = projected.sources.as_ref().unwrap();
        assert_eq!(sources.len(), 4);
        let first = sources[0].secret.as_ref().unwrap();
        assert_eq!(Some(&first.name), built.run_secret.metadata.name.as_ref());
        assert_eq!(first.items, None, "every key of the per-run Secret");
        for (i, chunk) in chunks.iter().enumerate() {
            let s = sources[i + 1].secret.as_ref().unwrap();
            assert_eq!(&s.name, chunk);
            let items = s.items.as_ref().unwrap();
            assert_eq!(items.len(), 1);
            assert_eq!(
                (items[0].key.as_str(), items[0].path.as_str()),
                ("tfstate", format!("restore/{i}").as_str())
            );
        }
        let data = built.run_secret.data.as_ref().unwrap();
        assert_eq!(data["main.tf.json"].0, BACKEND_ONLY_MAIN_TF_JSON);
        assert_eq!(data["terraform.tfvars.json"].0, EMPTY_TFVARS_JSON);

        // Other operations carry no restore flags.
        for op in [Op::Apply, Op::Plan, Op::Destroy, Op::Refresh, Op::Drift] {
            let built = build_case(&Case {
                op,
                ..Case::default()
            });
            assert!(
                !args(&built).iter().any(|a| a.starts_with("--restore")),
                "{op:?}"
            );
            assert_eq!(args(&built)[0], format!("--op={}", op.as_str()));
        }
    }

    #[test]
    fn apply_modes_and_the_plan_key() {
        let cluster = |op, mode| Case {
            kind: Kind::Cluster,
            name: "prod",
            cluster: None,
            op,
            mode,
            ..Case::default()
        };
        let plan_flags = |built: &BuiltJob| -> Vec<String> {
            args(built)
                .iter()
                .filter(|a| {
                    [
                        "--guarded",
                        "--allow",
                        "--approved",
                        "--plan-",
                        "--inputs-hash",
                    ]
                    .iter()
                    .any(|p| a.starts_with(p))
                })
                .cloned()
                .collect()
        };
        let key_mounted = |built: &BuiltJob| {
            let mounted = source(built)
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.name == PLAN_KEY_VOLUME && m.mount_path == PLAN_KEY_DIR);
            let volume = pod(built)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .find(|v| v.name == PLAN_KEY_VOLUME)
                .and_then(|v| v.secret.clone());
            assert_eq!(mounted, volume.is_some());
            volume.map(|v| v.secret_name.unwrap())
        };
        let hash = rendered(Kind::Cluster, "prod", None).inputs_hash;
        // (op, mode, flags, plan key mounted)
        for (op, mode, flags, key) in [
            (Op::Apply, ApplyMode::Direct, vec![], false),
            (
                Op::Apply,
                ApplyMode::Guarded {
                    allow_destructive: false,
                },
                vec!["--guarded".to_string()],
                false,
            ),
            (
                Op::Apply,
                ApplyMode::Guarded {
                    allow_destructive: true,
                },
                vec!["--guarded".into(), "--allow-destructive".into()],
                false,
            ),
            (
                Op::Apply,
                ApplyMode::Approved { plan_hash: "p1:ab" },
                vec![
                    "--approved-plan=p1:ab".into(),
                    "--plan-secret=captf-plan-c-prod".into(),
                    format!("--inputs-hash={hash}"),
                ],
                true,
            ),
            (
                Op::Plan,
                ApplyMode::Direct,
                vec![
                    "--plan-secret=captf-plan-c-prod".into(),
                    format!("--inputs-hash={hash}"),
                ],
                true,
            ),
            // Only an apply has a mode.
            (
                Op::Destroy,
                ApplyMode::Approved { plan_hash: "p1:ab" },
                vec![],
                false,
            ),
        ] {
            let built = build_case(&cluster(op, mode));
            assert_eq!(plan_flags(&built), flags, "{op:?} {mode:?}");
            assert_eq!(
                key_mounted(&built).as_deref(),
                key.then_some("captf-plankey-c-prod"),
                "{op:?} {mode:?}"
            );
        }
    }

    #[test]
    fn runner_events_name_the_object() {
        let on = build_case(&Case {
            events: true,
            ..Case::default()
        });
        assert!(
            args(&on).contains(
                &"--events-for=TerraformMachine/worker-0/6f1f1c1e-7a52-4c4e-9d83-2a7f0f6c1b11"
                    .to_string()
            ),
            "{:?}",
            args(&on)
        );
        let off = build_case(&Case::default());
        assert!(!args(&off).iter().any(|a| a.starts_with("--events-for")));
    }

    #[test]
    fn pull_policy_and_pull_secrets() {
        for (policy, want) in [
            (None, "IfNotPresent"),
            (Some(ImagePullPolicy::IfNotPresent), "IfNotPresent"),
            (Some(ImagePullPolicy::Always), "Always"),
            (Some(ImagePullPolicy::Never), "Never"),
        ] {
            let built = build_case(&Case {
                pull: policy,
                ..Case::default()
            });
            assert_eq!(source(&built).image_pull_policy.as_deref(), Some(want));
            // The runner image keeps the kubelet's default.
            assert_eq!(
                pod(&built).init_containers.as_ref().unwrap()[0].image_pull_policy,
                None
            );
        }
        let own = JobPolicy {
            image_pull_secrets: Some(vec![LocalObjectReference { name: "reg".into() }]),
            ..Default::default()
        };
        let built = build_case(&Case {
            settings: resolve(Some(&own), None),
            ..Case::default()
        });
        assert_eq!(pod(&built).image_pull_secrets, own.image_pull_secrets);
    }

    #[test]
    fn run_secret_is_owned_by_the_created_job() {
        let mut built = build_case(&Case::default());
        assert_eq!(
            own_run_secret(&mut built.run_secret, &built.job),
            Err(JobNotCreated)
        );
        let mut created = built.job.clone();
        created.metadata.uid = Some("job-uid".into());
        own_run_secret(&mut built.run_secret, &created).unwrap();
        let owner = &built.run_secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            (
                "batch/v1",
                "Job",
                created.metadata.name.as_deref().unwrap(),
                "job-uid"
            )
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn hash6_depends_on_every_part() {
        let base = hash6("h2:abc", Op::Apply, n(1), 0);
        assert_eq!(base, hash6("h2:abc", Op::Apply, n(1), 0));
        let others = [
            hash6("h2:abd", Op::Apply, n(1), 0),
            hash6("h2:abc", Op::Plan, n(1), 0),
            hash6("h2:abc", Op::Apply, n(2), 0),
            hash6("h2:abc", Op::Apply, n(1), 1),
        ];
        let all: std::collections::BTreeSet<_> =
            others.iter().chain([&base]).map(Hash6::as_str).collect();
        assert_eq!(all.len(), 5);
        assert_eq!(base, Hash6::of(b"h2:abc\napply\n1\n0"));
    }

    #[test]
    fn next_attempt_counts_retained_jobs_of_the_op() {
        let job = |op: &str, attempt: &str| Job {
            metadata: ObjectMeta {
                labels: Some(
                    [
                        (OP_LABEL.to_owned(), op.to_owned()),
                        (ATTEMPT_LABEL.to_owned(), attempt.to_owned()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition::default()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let jobs = [
            job("apply", "1"),
            job("apply", "3"),
            job("destroy", "7"),
            job("apply", "x"),
            job("apply", "-2"),
            Job::default(),
        ];
        let table: &[(Op, &[Job], u32)] = &[
            (Op::Apply, &jobs, 4),
            (Op::Destroy, &jobs, 8),
            (Op::Drift, &jobs, 1),
            (Op::Apply, &[], 1),
            (Op::Apply, &jobs[..1], 2),
        ];
        for (op, jobs, want) in table {
            assert_eq!(next_attempt(*op, jobs.iter()).get(), *want, "{op:?}");
        }
        let max = [job("apply", &u32::MAX.to_string())];
        assert_eq!(next_attempt(Op::Apply, max.iter()).get(), u32::MAX);
    }
}
