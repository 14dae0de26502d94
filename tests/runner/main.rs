//! The runner as a Job runs it: the `captf-runner run` process with `--root`
//! laid out like a pod, the real OpenTofu, and the kubernetes backend
//! against the real control plane.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use captf::api::RunErrorKind;
use captf::runner::result::RunResult;
use captf_testkit::controlplane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

mod failures;
mod plans;
mod restore;
mod signals;
mod static_build;
mod unlock;

const RUNNER: &str = env!("CARGO_BIN_EXE_captf-runner");

/// The backend labels map as the Job builder writes it.
const LABELS: &str = r#"labels={"captf.io/managed"="true","clusterctl.cluster.x-k8s.io/move"=""}"#;

/// A pod's filesystem: `<root>/captf/{runtime,module,config,work}`, the
/// credentials mount and the termination log.
struct Pod {
    dir: tempfile::TempDir,
}

impl Pod {
    fn new(module: &str, main: &Value, tfvars: &Value) -> Pod {
        let pod = Pod {
            dir: tempfile::tempdir().unwrap(),
        };
        let captf = pod.root().join("captf");
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/modules")
            .join(module);
        std::fs::create_dir_all(captf.join("module")).unwrap();
        for entry in std::fs::read_dir(&source).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), captf.join("module").join(entry.file_name())).unwrap();
        }
        std::os::unix::fs::symlink(controlplane::binary("tofu"), captf.join("runtime")).unwrap();
        std::fs::create_dir_all(captf.join("config")).unwrap();
        std::fs::write(captf.join("config/main.tf.json"), main.to_string()).unwrap();
        std::fs::write(
            captf.join("config/terraform.tfvars.json"),
            tfvars.to_string(),
        )
        .unwrap();
        std::fs::create_dir_all(captf.join("work")).unwrap();
        std::fs::create_dir_all(pod.root().join("dev")).unwrap();
        pod
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn work(&self) -> PathBuf {
        self.root().join("captf/work")
    }

    /// The plan key file and an empty plan Secret, as the manager provides
    /// them to a plan Job; the flags that name them.
    async fn saving(&self, object: &Object, secret: &str) -> Vec<String> {
        let key = self.root().join("captf/plan-key/key");
        std::fs::create_dir_all(key.parent().unwrap()).unwrap();
        std::fs::write(&key, [42u8; 32]).unwrap();
        let empty = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(secret.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match object
            .secrets()
            .create(&PostParams::default(), &empty)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("{e}"),
        }
        vec![
            format!("--plan-secret={secret}"),
            "--inputs-hash=h2:test".into(),
        ]
    }

    fn credential(&self, key: &str, value: &str) {
        let dir = self.root().join("var/run/captf/credentials");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(key), value).unwrap();
    }

    fn result(&self) -> RunResult {
        let path = self.root().join("dev/termination-log");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.len() <= 4096, "{} bytes", bytes.len());
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The runner, with the Job's arguments and a pod's environment, against
    /// the test control plane's admin kubeconfig instead of in-cluster config.
    fn runner(&self, object: &Object, op: &str, extra: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(RUNNER);
        cmd.arg("run")
            .arg(format!("--op={op}"))
            .arg("--image=registry.example/roles/test:1")
            .arg(format!("--job-name=captf-m-test-{op}-a1-abcdef"));
        // The Job's timeouts, unless the test sets its own.
        for (flag, value) in [("--lock-timeout", "30s"), ("--stop-timeout", "570s")] {
            if !extra.iter().any(|e| e.starts_with(flag)) {
                cmd.arg(format!("{flag}={value}"));
            }
        }
        cmd.arg(format!("--backend-config=secret_suffix={}", object.suffix))
            .arg(format!("--backend-config=namespace={}", object.namespace))
            .arg(format!(
                "--backend-config=config_path={}",
                controlplane::shared().kubeconfig().display()
            ))
            .arg(format!("--backend-config={LABELS}"))
            .args(extra)
            .arg(format!("--root={}", self.root().display()))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("HOME", "/captf/work")
            .env("KUBE_NAMESPACE", &object.namespace)
            .env("CHECKPOINT_DISABLE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// The object a series of runs works for: its namespace and state suffix.
struct Object {
    client: kube::Client,
    namespace: String,
    suffix: String,
}

impl Object {
    async fn new(prefix: &str) -> Object {
        let client = controlplane::shared().client().await;
        let namespace = captf_testkit::namespace(&client, prefix).await;
        let suffix = captf::names::suffix(&namespace, captf::names::Kind::Machine, "test");
        Object {
            client,
            namespace,
            suffix,
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The decompressed state document.
    async fn state(&self) -> Value {
        let secret = self
            .secrets()
            .get(&captf::names::state_secret(&self.suffix))
            .await
            .unwrap();
        let gz = &secret.data.unwrap()["tfstate"].0;
        let mut json = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut json)
            .unwrap();
        serde_json::from_str(&json).unwrap()
    }
}

/// One finished run: exit code, output, result.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    result: RunResult,
}

impl Ran {
    fn step_names(&self) -> Vec<&str> {
        self.result.steps.iter().map(|s| s.name.as_str()).collect()
    }

    fn args(&self, step: &str) -> &[String] {
        let step = self.result.steps.iter().find(|s| s.name == step).unwrap();
        step.args.as_deref().unwrap()
    }

    fn exit_code(&self, step: &str) -> i32 {
        self.result
            .steps
            .iter()
            .find(|s| s.name == step)
            .unwrap()
            .exit_code
    }

    fn assert_ok(&self) {
        assert_eq!(
            self.code,
            Some(0),
            "runner failed: {:?}\n{}\n{}",
            self.result.error,
            self.stdout,
            self.stderr
        );
        assert_eq!(self.result.error, None);
    }

    fn logs(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

async fn run(pod: &Pod, object: &Object, op: &str, extra: &[&str]) -> Ran {
    let out = pod.runner(object, op, extra).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let written = pod.root().join("dev/termination-log").exists();
    assert!(
        written,
        "no result from {op} ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let result = pod.result();
    Ran {
        code: out.status.code(),
        stdout,
        stderr,
        result,
    }
}

/// A rendered root in the shape of ref §9.2: a partial kubernetes backend,
/// the variables, the module call and sensitive re-exports.
fn root_module(variables: &[(&str, bool)], outputs: &[&str]) -> Value {
    let mut variable = serde_json::Map::new();
    let mut call = serde_json::Map::new();
    call.insert("source".into(), json!("../../module"));
    for (name, sensitive) in variables {
        let decl = if *sensitive {
            json!({"sensitive": true})
        } else {
            json!({})
        };
        variable.insert(name.to_string(), decl);
        call.insert(name.to_string(), json!(format!("${{var.{name}}}")));
    }
    let mut output = serde_json::Map::new();
    for name in outputs {
        output.insert(
            name.to_string(),
            json!({"value": format!("${{module.role.{name}}}"), "sensitive": true}),
        );
    }
    let mut root = json!({
        "terraform": {"backend": {"kubernetes": {}}},
        "module": {"role": call},
    });
    if !variable.is_empty() {
        root["variable"] = Value::Object(variable);
    }
    if !output.is_empty() {
        root["output"] = Value::Object(output);
    }
    root
}

fn basic_root() -> Value {
    root_module(&[("message", false), ("password", true)], &["message"])
}

fn lock_timeout_steps(ran: &Ran) -> Vec<&str> {
    ran.result
        .steps
        .iter()
        .filter(|s| {
            s.args
                .as_ref()
                .unwrap()
                .iter()
                .any(|a| a.starts_with("-lock-timeout="))
        })
        .map(|s| s.name.as_str())
        .collect()
}

#[tokio::test]
async fn apply_refresh_drift_plan_and_destroy() {
    let object = Object::new("runner-ops").await;
    let vars = json!({"message": "first", "password": "hunter2-password"});

    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let apply = run(&pod, &object, "apply", &[]).await;
    apply.assert_ok();
    assert_eq!(apply.step_names(), ["init", "validate", "apply"]);
    assert_eq!(lock_timeout_steps(&apply), ["init", "apply"]);
    assert_eq!(
        apply.args("init"),
        [
            "init",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            "-backend-config=secret_suffix",
            "-backend-config=namespace",
            "-backend-config=config_path",
            "-backend-config=labels",
        ]
    );
    assert_eq!(
        apply.args("apply"),
        [
            "apply",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            "-auto-approve",
            "-var-file=terraform.tfvars.json"
        ]
    );
    assert_eq!(apply.args("validate"), ["validate", "-json", "-no-color"]);
    let result = &apply.result;
    assert_eq!(result.job.as_deref(), Some("captf-m-test-apply-a1-abcdef"));
    assert_eq!(
        result.image.as_deref(),
        Some("registry.example/roles/test:1")
    );
    let version = result.runtime_version.as_deref().unwrap();
    assert!(
        version.starts_with(&controlplane::version("OPENTOFU_VERSION")),
        "{version}"
    );
    assert_eq!(
        object.state().await["resources"][0]["instances"][0]["attributes"]["input"]["value"],
        "first"
    );
    let secret = object
        .secrets()
        .get(&captf::names::state_secret(&object.suffix))
        .await
        .unwrap();
    let labels = secret.metadata.labels.unwrap();
    assert_eq!(labels["captf.io/managed"], "true", "{labels:?}");
    assert_eq!(labels["clusterctl.cluster.x-k8s.io/move"], "", "{labels:?}");
    assert!(
        !apply.logs().contains("hunter2-password"),
        "{}",
        apply.logs()
    );

    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let refresh = run(&pod, &object, "refresh", &[]).await;
    refresh.assert_ok();
    assert_eq!(refresh.step_names(), ["init", "apply-refresh-only"]);
    assert_eq!(lock_timeout_steps(&refresh), ["init", "apply-refresh-only"]);
    assert_eq!(
        refresh.args("apply-refresh-only"),
        [
            "apply",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            "-refresh-only",
            "-auto-approve",
            "-var-file=terraform.tfvars.json"
        ]
    );

    // Changed inputs: the drift check's plan exits 2, which is not a failure.
    let changed = json!({"message": "second", "password": "hunter2-password"});
    let pod = Pod::new("runner-basic", &basic_root(), &changed);
    let drift = run(&pod, &object, "drift", &[]).await;
    drift.assert_ok();
    assert_eq!(
        drift.step_names(),
        ["init", "apply-refresh-only", "plan", "show"]
    );
    assert_eq!(
        lock_timeout_steps(&drift),
        ["init", "apply-refresh-only", "plan"]
    );
    assert_eq!(drift.exit_code("plan"), 2);
    let plan_file = pod.work().join("plan.out").display().to_string();
    assert_eq!(
        drift.args("plan"),
        [
            "plan",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            "-refresh=false",
            "-detailed-exitcode",
            "-var-file=terraform.tfvars.json",
            &format!("-out={plan_file}"),
        ]
    );
    assert_eq!(
        drift.args("show"),
        ["show", "-json", "-no-color", &plan_file]
    );
    // show -json prints every value of the plan: never logged.
    assert!(
        !drift.stdout.contains("\"format_version\""),
        "{}",
        drift.stdout
    );

    let pod = Pod::new("runner-basic", &basic_root(), &changed);
    let saving = pod.saving(&object, "captf-plan-m-test").await;
    let saving: Vec<&str> = saving.iter().map(String::as_str).collect();
    let plan = run(&pod, &object, "plan", &saving).await;
    plan.assert_ok();
    let report = plan.result.plan.as_ref().unwrap();
    assert_eq!((report.add, report.change, report.destroy), (0, 1, 0));
    assert_eq!(plan.step_names(), ["init", "validate", "plan", "show"]);
    assert_eq!(lock_timeout_steps(&plan), ["init", "plan"]);
    assert_eq!(plan.exit_code("plan"), 0);
    assert!(
        !plan
            .args("plan")
            .contains(&"-detailed-exitcode".to_string())
    );
    assert!(pod.work().join("plan.out").is_file());

    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let destroy = run(&pod, &object, "destroy", &[]).await;
    destroy.assert_ok();
    assert_eq!(destroy.step_names(), ["init", "destroy"]);
    assert_eq!(lock_timeout_steps(&destroy), ["init", "destroy"]);
    assert_eq!(object.state().await["resources"], json!([]));
}

#[tokio::test]
async fn steering_variables_never_reach_the_runtime() {
    let object = Object::new("runner-env").await;
    let pod = Pod::new("runner-env", &root_module(&[], &[]), &json!({}));
    // An (empty) provider mirror: the runner points the runtime at it.
    std::fs::create_dir(pod.root().join("captf/providers")).unwrap();
    let steering = [
        ("TF_WORKSPACE", "evil-workspace"),
        ("TF_VAR_x", "value-of-x"),
        ("TF_CLI_ARGS", "-no-such-flag"),
        ("TF_CLI_ARGS_init", "-no-such-flag"),
        ("TF_LOG", "TRACE"),
        ("TF_DATA_DIR", "/nonexistent/data"),
        ("TF_CLI_CONFIG_FILE", "/nonexistent/cli.tfrc"),
        ("TERRAFORM_CONFIG", "/nonexistent/terraform.rc"),
        ("XDG_CONFIG_HOME", "/nonexistent/xdg"),
        ("KUBE_CONFIG_PATH", "/nonexistent/kubeconfig"),
        ("KUBE_TOKEN", "kube-token-value"),
    ];
    // They arrive in the pod's environment, as the credentials mirror's
    // envFrom would bring them, and as files of its mount.
    for (name, value) in steering {
        pod.credential(name, value);
    }
    let mut cmd = pod.runner(&object, "apply", &[]);
    cmd.envs(steering)
        // A credential must not flip these either.
        .env("TF_IN_AUTOMATION", "")
        .env("TF_INPUT", "1");
    let out = cmd.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{:?}", pod.result());

    let work = pod.work();
    let seen = std::fs::read_to_string(work.join("root/env.txt")).unwrap();
    let env: std::collections::BTreeMap<&str, &str> =
        seen.lines().filter_map(|l| l.split_once('=')).collect();
    let reserved: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TF_") || k.starts_with("KUBE_"))
        .map(|(k, v)| (*k, *v))
        .collect();
    let data_dir = work.join(".terraform").display().to_string();
    let cli_config = work.join("cli.tfrc").display().to_string();
    assert_eq!(
        reserved,
        [
            ("KUBE_NAMESPACE", object.namespace.as_str()),
            ("TF_CLI_CONFIG_FILE", cli_config.as_str()),
            ("TF_DATA_DIR", data_dir.as_str()),
            ("TF_INPUT", "0"),
            ("TF_IN_AUTOMATION", "1"),
        ],
        "{seen}"
    );
    assert_eq!(env["HOME"], work.display().to_string());
    assert!(!env.contains_key("TERRAFORM_CONFIG") && !env.contains_key("XDG_CONFIG_HOME"));
    assert_eq!(env["TMPDIR"], work.join("tmp").display().to_string());
    assert!(work.join("tmp").is_dir());
    assert!(work.join(".terraform").is_dir());
    let tfrc = std::fs::read_to_string(&cli_config).unwrap();
    assert!(
        tfrc.contains(&pod.root().join("captf/providers").display().to_string()),
        "{tfrc}"
    );

    // Dropped names are logged, their values never.
    for (name, value) in steering {
        assert!(
            stderr.contains(&format!("dropped {name} from the step environment")),
            "{stderr}"
        );
        assert!(!stderr.contains(value), "{value} in {stderr}");
    }
}
