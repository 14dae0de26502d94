//! The local pod executor against the real control plane: pods of CAPTF
//! Jobs run as local processes, with their volumes, environment, status and
//! deletion as a kubelet would give them.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use captf::jobs::builder::{self, JobRequest};
use captf::jobs::inputs::{self, InputsRequest, RenderedInputs};
use captf::jobs::policy;
use captf::names::{self, Kind, Op};
use captf_testkit::controlplane;
use captf_testkit::executor::{TEST_RUNNER_IMAGE, test_module_image};
use captf_testkit::{Executor, Images, ModuleImage, namespace};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const CUSTOM_IMAGE: &str = "captf.test/custom:dev";

mod jobs;

/// One test's namespace, with the runner's ServiceAccount and RBAC as the
/// manager sets them up, and an executor of its own for that namespace.
struct Setup {
    client: kube::Client,
    ns: String,
    executor: Executor,
}

impl Setup {
    async fn new(prefix: &str) -> Setup {
        let plane = controlplane::shared();
        let client = plane.client().await;
        let ns = namespace(&client, prefix).await;
        install_runner_rbac(&client, &ns).await;
        let images = Images::for_tests().with_module(
            CUSTOM_IMAGE,
            ModuleImage {
                module: workspace().join("tests/modules/noop"),
                runtime: controlplane::binary("tofu"),
                providers: None,
                env: vec![
                    ("FROM_IMAGE".into(), "image".into()),
                    ("OVERRIDDEN".into(), "image".into()),
                ],
            },
        );
        let executor = Executor::start_in(client.clone(), plane, images, &ns).await;
        Setup {
            client,
            ns,
            executor,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn secret(&self, name: &str, data: &[(&str, &str)]) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": name },
            "stringData": data.iter().cloned().collect::<BTreeMap<_, _>>(),
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    async fn create_pod(&self, pod: serde_json::Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    /// Waits until `probe` holds for the pod, up to `seconds`.
    async fn pod_until(
        &self,
        name: &str,
        what: &str,
        seconds: u64,
        probe: impl Fn(&Pod) -> bool,
    ) -> Pod {
        let pods = self.pods();
        within(
            seconds,
            &format!("{what} ({name})"),
            &self.executor,
            || async { pods.get_opt(name).await.ok().flatten().filter(|p| probe(p)) },
        )
        .await
    }

    async fn gone(&self, name: &str, seconds: u64) {
        let pods = self.pods();
        within(
            seconds,
            &format!("{name} removed"),
            &self.executor,
            || async { matches!(pods.get_opt(name).await, Ok(None)).then_some(()) },
        )
        .await
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The ClusterRole of config/rbac, and the ServiceAccount and RoleBinding
/// `captf-runner` in `ns`, as the manager creates them before a first Job.
async fn install_runner_rbac(client: &kube::Client, ns: &str) {
    let text =
        std::fs::read_to_string(workspace().join("config/rbac/runner_clusterrole.yaml")).unwrap();
    let role: ClusterRole = serde_saphyr::from_str(&text).unwrap();
    Api::<ClusterRole>::all(client.clone())
        .patch(
            names::RUNNER_RBAC,
            &PatchParams::apply("captf-executor-test").force(),
            &Patch::Apply(&role),
        )
        .await
        .unwrap();
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": names::RUNNER_RBAC } })).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": names::RUNNER_RBAC },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": names::RUNNER_RBAC },
        "subjects": [{ "kind": "ServiceAccount", "name": names::RUNNER_RBAC, "namespace": ns }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Polls `probe` until it yields, up to `seconds`; on a timeout, panics with
/// the executor's log, which says what it did.
async fn within<T, F, Fut>(seconds: u64, what: &str, executor: &Executor, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}; the executor's log:\n{}",
                executor.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn main_terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

fn main_waiting_reason(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    status.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// A bare pod of the shape of a CAPTF Job's: the runner copied by the init
/// container, then `script` run by /bin/sh in the root (its working
/// directory) with the custom module image.
fn shell_pod(name: &str, script: &str, grace: i64) -> serde_json::Value {
    json!({
        "metadata": { "name": name, "labels": { "captf.io/managed": "true" } },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": names::RUNNER_RBAC,
            "terminationGracePeriodSeconds": grace,
            "volumes": [
                { "name": "runner", "emptyDir": {} },
                { "name": "work", "emptyDir": {} },
                { "name": "tmp", "emptyDir": {} },
            ],
            "initContainers": [{
                "name": "runner",
                "image": TEST_RUNNER_IMAGE,
                "command": ["/runner", "copy", "/captf/bin/runner"],
                "volumeMounts": [{ "name": "runner", "mountPath": "/captf/bin" }],
            }],
            "containers": [{
                "name": "source",
                "image": CUSTOM_IMAGE,
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": [
                    { "name": "runner", "mountPath": "/captf/bin", "readOnly": true },
                    { "name": "work", "mountPath": "/captf/work" },
                    { "name": "tmp", "mountPath": "/tmp" },
                ],
            }],
        },
    })
}

#[tokio::test]
async fn a_pod_runs_with_its_volumes_environment_and_hostname() {
    let t = Setup::new("exec-run").await;
    t.secret(
        "config",
        &[
            ("main.tf.json", "{}"),
            ("terraform.tfvars.json", "{\"a\":1}"),
        ],
    )
    .await;
    t.secret(
        "creds",
        &[("API_KEY", "from-secret"), ("OVERRIDDEN", "secret")],
    )
    .await;
    t.secret("extra", &[("token", "s3cret")]).await;
    let script = r#"
        set -e
        test -x captf/bin/runner
        {
            echo "hostname=$(cat /proc/sys/kernel/hostname)"
            echo "config=$(stat -c %a captf/config/main.tf.json) $(cat captf/config/terraform.tfvars.json)"
            echo "projected=$(stat -c %a captf/projected/restore/0) $(cat captf/projected/restore/0)"
            echo "module=$(ls captf/module)"
            echo "runtime=$(test -x captf/runtime && echo executable)"
            env | sort
        } > captf/work/seen
        printf 'the message' > dev/termination-log
        exit 3
    "#;
    let mut pod = shell_pod("run", script, 30);
    pod["spec"]["volumes"].as_array_mut().unwrap().extend([
        json!({ "name": "config", "secret": { "secretName": "config", "defaultMode": 0o440 } }),
        json!({ "name": "projected", "projected": { "defaultMode": 0o440, "sources": [
            { "secret": { "name": "extra", "items": [{ "key": "token", "path": "restore/0" }] } },
        ] } }),
    ]);
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .extend([
            json!({ "name": "config", "mountPath": "/captf/config", "readOnly": true }),
            json!({ "name": "projected", "mountPath": "/captf/projected", "readOnly": true }),
        ]);
    pod["spec"]["containers"][0]["envFrom"] = json!([{ "secretRef": { "name": "creds" } }]);
    pod["spec"]["containers"][0]["env"] = json!([
        { "name": "OVERRIDDEN", "value": "env" },
        { "name": "HOME", "value": "/captf/work" },
        { "name": "FROM_REF", "valueFrom": { "secretKeyRef": { "name": "extra", "key": "token" } } },
        { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
    ]);
    t.create_pod(pod).await;

    let pod = t
        .pod_until("run", "the pod failed", 60, |p| phase(p) == Some("Failed"))
        .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("captf-executor")
    );
    let terminated = main_terminated(&pod).expect("the main container terminated");
    assert_eq!(terminated.exit_code, 3);
    assert_eq!(terminated.reason.as_deref(), Some("Error"));
    assert_eq!(terminated.message.as_deref(), Some("the message"));
    let init = &pod
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .as_ref()
        .unwrap()[0];
    let init = init
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .expect("the init container terminated");
    assert_eq!(
        (init.exit_code, init.reason.as_deref()),
        (0, Some("Completed"))
    );

    let root = t.executor.pod_dir(&t.ns, "run");
    let seen = std::fs::read_to_string(root.join("captf/work/seen")).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    for expected in [
        "hostname=run".to_string(),
        "config=440 {\"a\":1}".to_string(),
        "projected=440 s3cret".to_string(),
        "module=main.tf".to_string(),
        "runtime=executable".to_string(),
        "FROM_IMAGE=image".to_string(),
        "OVERRIDDEN=env".to_string(),
        "API_KEY=from-secret".to_string(),
        "FROM_REF=s3cret".to_string(),
        format!("POD_NAMESPACE={}", t.ns),
        format!("HOME={}", root.join("captf/work").display()),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "{expected:?} is not in what the pod saw:\n{seen}"
        );
    }
    assert!(lines.iter().any(|l| l.starts_with("PATH=")), "{seen}");
    assert!(root.join("source.log").exists());
    assert_eq!(t.executor.runs(), vec![(t.ns.clone(), "run".to_string())]);

    // A finished pod that is deleted is removed at once.
    t.pods()
        .delete("run", &DeleteParams::default())
        .await
        .unwrap();
    t.gone("run", 30).await;
}

#[tokio::test]
async fn a_deleted_running_pod_gets_sigterm_and_is_removed() {
    let t = Setup::new("exec-term").await;
    let script = r#"
        trap 'echo term > captf/work/term; exit 0' TERM
        echo up > captf/work/up
        while :; do sleep 0.1; done
    "#;
    t.create_pod(shell_pod("term", script, 600)).await;
    t.pod_until("term", "the pod running", 60, |p| {
        phase(p) == Some("Running")
    })
    .await;
    let root = t.executor.pod_dir(&t.ns, "term");
    within(30, "the script started", &t.executor, || async {
        root.join("captf/work/up").exists().then_some(())
    })
    .await;

    t.pods()
        .delete("term", &DeleteParams::default())
        .await
        .unwrap();
    // Long before the grace period of 600 seconds is over.
    t.gone("term", 30).await;
    assert_eq!(
        std::fs::read_to_string(root.join("captf/work/term")).unwrap(),
        "term\n"
    );
}

#[tokio::test]
async fn a_held_pod_stays_terminating_after_its_process_is_killed() {
    let t = Setup::new("exec-hold").await;
    // A process that ignores SIGTERM is killed when its grace period is over.
    let script = r#"
        trap '' TERM
        echo up > captf/work/up
        while :; do sleep 0.1; done
    "#;
    t.create_pod(shell_pod("held", script, 2)).await;
    t.pod_until("held", "the pod running", 60, |p| {
        phase(p) == Some("Running")
    })
    .await;
    let root = t.executor.pod_dir(&t.ns, "held");
    within(30, "the script started", &t.executor, || async {
        root.join("captf/work/up").exists().then_some(())
    })
    .await;

    t.executor.hold_terminating(&t.ns, "held", true);
    t.pods()
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let pod = t
        .pod_until("held", "the process killed", 30, |p| {
            main_terminated(p).is_some()
        })
        .await;
    let terminated = main_terminated(&pod).unwrap();
    assert_eq!(terminated.exit_code, 137, "SIGKILL after the grace period");
    assert_eq!(phase(&pod), Some("Failed"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = t
        .pods()
        .get("held")
        .await
        .expect("the held pod is still there");
    assert!(pod.metadata.deletion_timestamp.is_some());

    t.executor.hold_terminating(&t.ns, "held", false);
    t.gone("held", 30).await;
}

#[tokio::test]
async fn an_oom_killed_pod_fails_with_oomkilled() {
    let t = Setup::new("exec-oom").await;
    let script = r#"
        echo up > captf/work/up
        printf 'not to be read' > dev/termination-log
        while :; do sleep 0.1; done
    "#;
    t.create_pod(shell_pod("oom", script, 30)).await;
    t.pod_until("oom", "the pod running", 60, |p| {
        phase(p) == Some("Running")
    })
    .await;
    let root = t.executor.pod_dir(&t.ns, "oom");
    within(30, "the script started", &t.executor, || async {
        root.join("captf/work/up").exists().then_some(())
    })
    .await;

    assert!(t.executor.kill_oom(&t.ns, "oom"));
    let pod = t
        .pod_until("oom", "the pod failed", 30, |p| phase(p) == Some("Failed"))
        .await;
    let terminated = main_terminated(&pod).unwrap();
    assert_eq!(terminated.exit_code, 137);
    assert_eq!(terminated.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(terminated.message, None);
    assert!(!t.executor.kill_oom(&t.ns, "oom"), "nothing runs any more");
}

#[tokio::test]
async fn a_pod_of_an_unknown_image_stays_pending() {
    let t = Setup::new("exec-pull").await;
    let mut pod = shell_pod("pull", "exit 0", 30);
    pod["spec"]["containers"][0]["image"] = json!("captf.test/modules/no-such-module:dev");
    t.create_pod(pod).await;
    let pod = t
        .pod_until("pull", "ErrImagePull", 60, |p| {
            main_waiting_reason(p) == Some("ErrImagePull")
        })
        .await;
    assert_eq!(phase(&pod), Some("Pending"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = t.pods().get("pull").await.unwrap();
    assert_eq!(phase(&pod), Some("Pending"));
    assert_eq!(main_waiting_reason(&pod), Some("ErrImagePull"));
    assert!(t.executor.runs().is_empty(), "no container started");

    t.pods()
        .delete("pull", &DeleteParams::default())
        .await
        .unwrap();
    t.gone("pull", 30).await;
}

#[tokio::test]
async fn a_pod_waits_for_its_secret() {
    let t = Setup::new("exec-mount").await;
    let mut pod = shell_pod("mount", "test \"$(cat captf/config/key)\" = value", 30);
    pod["spec"]["volumes"].as_array_mut().unwrap().push(
        json!({ "name": "config", "secret": { "secretName": "late", "defaultMode": 0o440 } }),
    );
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "name": "config", "mountPath": "/captf/config", "readOnly": true }));
    t.create_pod(pod).await;
    let pod = t
        .pod_until("mount", "ContainerCreating", 60, |p| {
            main_waiting_reason(p) == Some("ContainerCreating")
        })
        .await;
    assert_eq!(phase(&pod), Some("Pending"));
    let status = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let message = status
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(message.contains("\"late\""), "{message}");

    t.secret("late", &[("key", "value")]).await;
    t.pod_until("mount", "the pod succeeded", 60, |p| {
        phase(p) == Some("Succeeded")
    })
    .await;
}
