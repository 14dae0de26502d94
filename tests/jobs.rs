//! Every operation's Job, built by the Job builder and run for real: the
//! local pod executor runs the pod's runner with the built tofu against the
//! test API server, and the runner's result document (the pod's
//! termination message) says which steps ran with which flags.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use captf::jobs::builder::{self, JobRequest, RestoreRequest};
use captf::jobs::inputs::{self, InputsRequest};
use captf::jobs::{policy, rbac};
use captf::names::{self, Kind, Op};
use captf_testkit::controlplane;
use captf_testkit::executor::{Executor, Images};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::{Value, json};

const NOOP: &str = "captf.test/modules/noop:dev";

/// The steps that touch state carry -lock-timeout; the others never do
/// (book: inside-the-job.md "Steps by operation").
const STATE_TOUCHING: &[&str] = &[
    "init",
    "plan",
    "apply",
    "destroy",
    "apply-refresh-only",
    "state-push",
];

struct Run {
    document: Value,
    terminated: ContainerStateTerminated,
}

impl Run {
    fn steps(&self) -> Vec<&str> {
        self.document["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect()
    }

    fn args(&self, step: &str) -> Vec<&str> {
        let s = self.document["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == step)
            .unwrap();
        s["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect()
    }

    /// Every step's -lock-timeout is the policy's, and only state-touching
    /// steps have one.
    fn check_lock_timeouts(&self, seconds: i64) {
        for step in self.steps() {
            let with: Vec<&str> = self
                .args(step)
                .into_iter()
                .filter(|a| a.starts_with("-lock-timeout"))
                .collect();
            if STATE_TOUCHING.contains(&step) {
                assert_eq!(
                    with,
                    [format!("-lock-timeout={seconds}s").as_str()],
                    "step {step}"
                );
            } else {
                assert!(
                    with.is_empty(),
                    "step {step} must not pass -lock-timeout: {with:?}"
                );
            }
        }
    }
}

struct Fixture {
    client: kube::Client,
    ns: String,
    uid: String,
    name: String,
    executor: Executor,
    attempts: u32,
}

impl Fixture {
    async fn new() -> Fixture {
        let plane = controlplane::shared();
        let client = plane.client().await;
        captf_testkit::manager::install_runner_role(&client).await;
        let ns = captf_testkit::namespace(&client, "jobs").await;
        rbac::ensure(&client, &ns, names::RUNNER_RBAC)
            .await
            .expect("runner RBAC");
        // The Jobs need an owner; a ConfigMap stands in for the workload
        // object, which the reconcile tests cover.
        let owner = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &k8s_openapi::api::core::v1::ConfigMap {
                    metadata: ObjectMeta {
                        name: Some("owner".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let executor = Executor::start_in(client.clone(), plane, Images::for_tests(), &ns).await;
        Fixture {
            client,
            uid: owner.uid().unwrap(),
            ns,
            name: "m1".into(),
            executor,
            attempts: 0,
        }
    }

    fn suffix(&self) -> String {
        names::suffix(&self.ns, Kind::Machine, &self.name)
    }

    /// Builds, creates and waits for one Job of `op`.
    async fn run(
        &mut self,
        op: Op,
        variables: Value,
        restore: Option<RestoreRequest<'_>>,
        lock_timeout: i64,
    ) -> Run {
        self.attempts += 1;
        let vars: std::collections::BTreeMap<String, Value> =
            serde_json::from_value(variables).unwrap();
        let rendered = inputs::render(&InputsRequest {
            kind: Kind::Machine,
            namespace: &self.ns,
            name: &self.name,
            cluster_name: Some("c1"),
            image: NOOP,
            template: None,
            variables: Some(&vars),
            sensitive: &[],
            role: &[],
        })
        .unwrap();
        let policy = captf::api::JobPolicy {
            lock_timeout_seconds: Some(lock_timeout),
            ..Default::default()
        };
        let settings = policy::resolve(Some(&policy), None);
        let attempt = NonZeroU32::new(self.attempts).unwrap();
        let hash6 = builder::hash6(&rendered.inputs_hash, op, attempt, 0);
        if op == Op::Plan {
            // What the manager provides a plan Job: its key and where the
            // plan is saved.
            let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: self.uid.clone(),
                ..Default::default()
            };
            let secrets = Api::<Secret>::namespaced(self.client.clone(), &self.ns);
            captf::jobs::plans::ensure(
                &secrets,
                &captf::jobs::plans::Owner {
                    kind: Kind::Machine,
                    namespace: &self.ns,
                    name: &self.name,
                    cluster_name: Some("c1"),
                    owner: &owner,
                },
            )
            .await
            .unwrap();
        }
        let mut built = builder::build(&JobRequest {
            kind: Kind::Machine,
            namespace: &self.ns,
            name: &self.name,
            uid: &self.uid,
            cluster_name: Some("c1"),
            op,
            attempt,
            hash6: &hash6,
            image: NOOP,
            image_pull_policy: None,
            runner_image: "captf.test/runner:dev",
            settings: &settings,
            identity: None,
            force_unlock: None,
            inputs: &rendered,
            restore,
            mode: builder::ApplyMode::Direct,
            events: true,
        });
        // The stand-in owner is a ConfigMap.
        for o in built.job.metadata.owner_references.iter_mut().flatten() {
            o.api_version = "v1".into();
            o.kind = "ConfigMap".into();
            o.name = "owner".into();
        }
        let jobs = Api::<Job>::namespaced(self.client.clone(), &self.ns);
        let job = jobs
            .create(&PostParams::default(), &built.job)
            .await
            .unwrap();
        builder::own_run_secret(&mut built.run_secret, &job).unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &built.run_secret)
            .await
            .unwrap();
        let name = job.name_any();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.ns);
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let list = pods
                .list(
                    &ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")),
                )
                .await
                .unwrap();
            let terminated = list.items.iter().find_map(|p| {
                p.status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .iter()
                    .find(|c| c.name == "source")?
                    .state
                    .as_ref()?
                    .terminated
                    .clone()
            });
            if let Some(terminated) = terminated {
                let message = terminated.message.clone().unwrap_or_default();
                let document: Value = serde_json::from_str(&message).unwrap_or_else(|e| {
                    panic!(
                        "{op:?}: result document {message:?}: {e}\n{}",
                        self.executor.log()
                    )
                });
                assert_eq!(terminated.exit_code, 0, "{op:?} failed: {document:#}");
                assert!(message.len() <= 4096);
                assert_eq!(document["operation"], op.as_str());
                assert_eq!(document["job"], name.as_str());
                return Run {
                    document,
                    terminated,
                };
            }
            assert!(
                Instant::now() < deadline,
                "{op:?}: Job {name} never finished\n{}",
                self.executor.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test]
async fn every_operation_runs_its_steps_with_lock_timeout_on_exactly_the_state_touching_ones() {
    let mut f = Fixture::new().await;
    let secrets = Api::<Secret>::namespaced(f.client.clone(), &f.ns);

    let apply = f.run(Op::Apply, json!({"size": "small"}), None, 300).await;
    assert_eq!(apply.steps(), ["init", "validate", "apply"]);
    apply.check_lock_timeouts(300);
    assert!(apply.args("apply").contains(&"-auto-approve"));
    assert_eq!(apply.terminated.reason.as_deref(), Some("Completed"));
    let state = secrets
        .get(&names::state_secret(&f.suffix()))
        .await
        .expect("the state Secret");

    let refresh = f
        .run(Op::Refresh, json!({"size": "small"}), None, 120)
        .await;
    assert_eq!(refresh.steps(), ["init", "apply-refresh-only"]);
    refresh.check_lock_timeouts(120);
    assert!(
        refresh
            .args("apply-refresh-only")
            .contains(&"-refresh-only")
    );

    let drift = f.run(Op::Drift, json!({"size": "small"}), None, 120).await;
    assert_eq!(
        drift.steps(),
        ["init", "apply-refresh-only", "plan", "show"]
    );
    drift.check_lock_timeouts(120);
    assert!(drift.args("plan").contains(&"-refresh=false"));

    let plan = f.run(Op::Plan, json!({"size": "large"}), None, 60).await;
    assert_eq!(plan.steps(), ["init", "validate", "plan", "show"]);
    plan.check_lock_timeouts(60);

    // A restore pushes a backup set: here, a copy of the state Secret as
    // the apply left it.
    let backup = names::backup_secret(&f.suffix(), 1);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some(backup.clone()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "tfstate".to_string(),
                    state.data.unwrap()["tfstate"].clone(),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let chunks = [backup];
    let restore = f
        .run(
            Op::Restore,
            json!({"size": "small"}),
            Some(RestoreRequest {
                chunk_secrets: &chunks,
                resources: 1,
                serial: 50,
            }),
            90,
        )
        .await;
    assert_eq!(restore.steps(), ["init", "state-push", "state-list"]);
    restore.check_lock_timeouts(90);
    // Pushed with the serial it was given, above every serial before it
    // (OpenTofu's remote state manager adds one as it persists a state that
    // differs from the one it read).
    let restored = secrets
        .get(&names::state_secret(&f.suffix()))
        .await
        .unwrap();
    let mut document = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(restored.data.unwrap()["tfstate"].0.as_slice()),
        &mut document,
    )
    .unwrap();
    let document: serde_json::Value = serde_json::from_str(&document).unwrap();
    let serial = document["serial"].as_u64().unwrap();
    assert!((50..=51).contains(&serial), "{serial}");

    let destroy = f
        .run(Op::Destroy, json!({"size": "small"}), None, 300)
        .await;
    assert_eq!(destroy.steps(), ["init", "destroy"]);
    destroy.check_lock_timeouts(300);
}
