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

mod plans;

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

#[tokio::test]
async fn a_failing_module_reports_a_redacted_summary() {
    let object = Object::new("runner-fail").await;
    let credential = "cr3dential-value";
    let password = "p4ssw0rd-value";
    let pod = Pod::new(
        "runner-fail",
        &root_module(&[("password", true)], &[]),
        &json!({"password": password}),
    );
    pod.credential("CAPTF_TEST_CREDENTIAL", &format!("{credential}\n"));
    let mut cmd = pod.runner(&object, "apply", &[]);
    cmd.env("CAPTF_TEST_CREDENTIAL", credential);
    let out = cmd.output().await.unwrap();
    let logs = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{logs}");
    let result = pod.result();
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Step);
    assert_eq!(error.step.as_deref(), Some("apply"));
    let summary = error.summary.unwrap();
    assert!(
        summary.contains("Error: credential (sensitive) and password (sensitive)"),
        "{summary}\n{logs}"
    );
    assert!(summary.len() <= 512);
    assert_eq!(result.steps.last().unwrap().exit_code, 1);
    // The runtime's own output, passed through, is redacted too.
    assert!(logs.contains("(sensitive)"), "{logs}");
    assert!(
        !logs.contains(credential) && !logs.contains(password),
        "{logs}"
    );
}

#[tokio::test]
async fn preflight_failures_are_image_layout() {
    let object = Object::new("runner-layout").await;
    let main = basic_root();

    let no_module = Pod::new("runner-basic", &main, &json!({}));
    let module = no_module.root().join("captf/module");
    std::fs::remove_dir_all(&module).unwrap();
    std::fs::create_dir_all(module.join("nested.tf")).unwrap();
    std::fs::write(module.join("README.md"), "no configuration here").unwrap();

    let no_runtime = Pod::new("runner-basic", &main, &json!({}));
    let runtime = no_runtime.root().join("captf/runtime");
    std::fs::remove_file(&runtime).unwrap();
    std::fs::write(&runtime, "#!/bin/sh\n").unwrap();

    for (pod, want) in [
        (
            &no_module,
            "has no .tf, .tf.json, .tofu or .tofu.json file at its top level",
        ),
        (&no_runtime, "is not an executable file"),
    ] {
        let ran = run(pod, &object, "apply", &[]).await;
        assert_eq!(ran.code, Some(1));
        let error = ran.result.error.unwrap();
        assert_eq!(error.kind, RunErrorKind::ImageLayout);
        assert!(
            error.summary.as_deref().unwrap().contains(want),
            "{error:?}"
        );
        assert!(ran.result.steps.is_empty());
        assert_eq!(
            ran.result.job.as_deref(),
            Some("captf-m-test-apply-a1-abcdef")
        );
        assert!(!pod.work().join("root").exists(), "nothing ran");
    }
}

#[tokio::test]
async fn usage_errors_exit_2() {
    for args in [
        &["run"][..],
        &["run", "--op=upgrade"],
        &["run", "--op=apply", "--lock-timeout=5"],
        &["run", "--op=restore"],
        &["run", "--op=apply", "stray"],
        &["frobnicate"],
    ] {
        let out = tokio::process::Command::new(RUNNER)
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Reads the runner's standard output until a line contains `needle`.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    needle: &str,
) {
    let found = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no line with {needle:?}");
}

#[tokio::test]
async fn sigterm_is_forwarded_to_the_runtime_and_reported_interrupted() {
    let object = Object::new("runner-sigterm").await;
    let root = root_module(
        &[("sleep_seconds", false), ("message", false)],
        &["message"],
    );
    let pod = Pod::new(
        "slow-noop",
        &root,
        &json!({"sleep_seconds": 300, "message": "slow"}),
    );
    // A stop timeout shorter than the wait below, so that a runtime that
    // does not stop shows as killed rather than as a hung test.
    let mut child = pod
        .runner(&object, "apply", &["--stop-timeout=60s"])
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut BufReader::new(stderr), &mut text)
            .await
            .unwrap();
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for_line(&mut lines, "(local-exec): Executing:").await;
    // The provisioner's command is starting; a stop request that arrives
    // before it runs is not what this test is about.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("the runner stops within its stop timeout")
        .unwrap();
    drain.await.unwrap();
    let stderr = stderr.await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}: {stderr}");

    let result = pod.result();
    let names: Vec<&str> = result.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["init", "validate", "apply"]);
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Interrupted);
    assert_eq!(error.step.as_deref(), Some("apply"));
    let summary = error.summary.unwrap();
    assert!(
        summary.starts_with(
            "SIGTERM received during apply and forwarded to the runtime, which exited "
        ),
        "{summary}"
    );
    // The runtime stopped on its own terms: it released the state lock.
    let lease = object
        .leases()
        .get(&captf::names::state_lock_lease(&object.suffix))
        .await
        .unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "the lock is still held by {holder}");
}

#[tokio::test]
async fn a_runtime_that_ignores_sigterm_is_killed_after_the_stop_timeout() {
    let object = Object::new("runner-sigkill").await;
    let pod = Pod::new("runner-basic", &basic_root(), &json!({}));
    // A hung runtime: it answers `version` and then ignores SIGTERM in its
    // first step. `exec` keeps the ignored disposition, so SIGKILL is what
    // ends the sleep.
    let runtime = pod.root().join("captf/runtime");
    std::fs::remove_file(&runtime).unwrap();
    std::fs::write(
        &runtime,
        "#!/bin/sh\n\
         if [ \"$1\" = version ]; then echo '{\"terraform_version\":\"0.0.0\"}'; exit 0; fi\n\
         trap '' TERM\n\
         echo started\n\
         exec sleep 300\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut cmd = pod.runner(&object, "apply", &["--stop-timeout=2s"]);
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for_line(&mut lines, "started").await;

    let started = Instant::now();
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(status.code(), Some(1));
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(30),
        "{took:?}"
    );

    let result = pod.result();
    assert_eq!(result.runtime_version.as_deref(), Some("0.0.0"));
    let init = &result.steps[0];
    assert_eq!((init.name.as_str(), init.exit_code), ("init", 137));
    let error = result.error.unwrap();
    assert_eq!(error.kind, RunErrorKind::Interrupted);
    assert_eq!(
        error.summary.as_deref(),
        Some(
            "SIGTERM received during init and forwarded to the runtime, which did not stop within 2s and was killed"
        )
    );
}

#[tokio::test]
async fn force_unlock_of_an_unlocked_state_succeeds() {
    let object = Object::new("runner-unlock").await;
    let vars = json!({"message": "first", "password": "hunter2-password"});
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    run(&pod, &object, "apply", &[]).await.assert_ok();

    // The lock's Lease exists and is free: the stale lock is gone already.
    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(&pod, &object, "apply", &["--force-unlock=6c4a1e22-stale"]).await;
    ran.assert_ok();
    assert_eq!(
        ran.step_names(),
        ["init", "force-unlock", "validate", "apply"]
    );
    assert_eq!(
        ran.args("force-unlock"),
        ["force-unlock", "-force", "6c4a1e22-stale"]
    );
    assert_eq!(ran.exit_code("force-unlock"), 1);
    assert!(
        ran.stderr.contains(
            "step force-unlock exited 1 and counts as succeeded: the state is already unlocked"
        ),
        "{}",
        ran.stderr
    );
}

#[tokio::test]
async fn force_unlock_of_a_lock_held_by_another_holder_is_not_an_error() {
    let object = Object::new("runner-relocked").await;
    let vars = json!({"message": "first", "password": "hunter2-password"});
    run(
        &Pod::new("runner-basic", &basic_root(), &vars),
        &object,
        "apply",
        &[],
    )
    .await
    .assert_ok();

    // Someone else holds the lock now, under another ID.
    let name = captf::names::state_lock_lease(&object.suffix);
    let mut lease = object.leases().get(&name).await.unwrap();
    let info = json!({"ID": "other-holder-id", "Operation": "OperationTypeApply", "Info": "",
                      "Who": "someone@elsewhere", "Version": "1.12.6", "Created": "2026-01-01T00:00:00Z",
                      "Path": ""});
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("app.terraform.io/lock-info".into(), info.to_string());
    lease.spec.get_or_insert_default().holder_identity = Some("other-holder-id".into());
    object
        .leases()
        .replace(&name, &PostParams::default(), &lease)
        .await
        .unwrap();

    let pod = Pod::new("runner-basic", &basic_root(), &vars);
    let ran = run(
        &pod,
        &object,
        "destroy",
        &["--force-unlock=6c4a1e22-stale", "--lock-timeout=1s"],
    )
    .await;
    assert_eq!(
        ran.step_names(),
        ["init", "force-unlock", "destroy"],
        "{}",
        ran.stderr
    );
    assert!(
        ran.stderr.contains("step force-unlock exited 1 and counts as succeeded: the lock is now held under another ID"),
        "{}",
        ran.stderr
    );
    // The other holder's lock is left alone: destroy waits for it, then fails.
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("destroy"))
    );
    assert!(
        error
            .summary
            .unwrap()
            .contains("Error acquiring the state lock")
    );
    let lease = object.leases().get(&name).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("other-holder-id")
    );
}

#[tokio::test]
async fn restore_pushes_the_backup_and_lists_it() {
    let object = Object::new("runner-restore").await;
    let vars = json!({"message": "kept", "password": "hunter2-password"});
    run(
        &Pod::new("runner-basic", &basic_root(), &vars),
        &object,
        "apply",
        &[],
    )
    .await
    .assert_ok();
    let before = object.state().await;

    // The backup: the state Secret's gzip payload, in two chunks. Then the
    // state is lost.
    let state_name = captf::names::state_secret(&object.suffix);
    let secret = object.secrets().get(&state_name).await.unwrap();
    let gz = secret.data.unwrap()["tfstate"].0.clone();
    object
        .secrets()
        .delete(&state_name, &DeleteParams::default())
        .await
        .unwrap();

    // A restore root is backend-only.
    let backend_only = json!({"terraform": {"backend": {"kubernetes": {}}}});
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    let restore = pod.root().join("captf/config/restore");
    std::fs::create_dir(&restore).unwrap();
    let (a, b) = gz.split_at(gz.len() / 2);
    std::fs::write(restore.join("0"), a).unwrap();
    std::fs::write(restore.join("1"), b).unwrap();
    let ran = run(
        &pod,
        &object,
        "restore",
        &["--restore-chunks=2", "--restore-resources=1"],
    )
    .await;
    ran.assert_ok();
    assert_eq!(ran.step_names(), ["init", "state-push", "state-list"]);
    assert_eq!(lock_timeout_steps(&ran), ["init", "state-push"]);
    let file = pod.work().join("restore.tfstate");
    assert_eq!(
        ran.args("state-push"),
        [
            "state",
            "push",
            "-force",
            "-lock-timeout=30s",
            &file.display().to_string()
        ]
    );
    assert_eq!(ran.args("state-list"), ["state", "list"]);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        !pod.work().join("root/restore").exists(),
        "the chunks are not copied"
    );
    let after = object.state().await;
    assert_eq!(after["lineage"], before["lineage"]);
    assert_eq!(after["resources"], before["resources"]);

    // A backup said to hold resources must list at least one once pushed.
    let empty = json!({"version": 4, "terraform_version": "1.12.6", "serial": 1,
                       "lineage": "empty-lineage", "outputs": {}, "resources": []});
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, empty.to_string().as_bytes()).unwrap();
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    std::fs::create_dir(pod.root().join("captf/config/restore")).unwrap();
    std::fs::write(
        pod.root().join("captf/config/restore/0"),
        enc.finish().unwrap(),
    )
    .unwrap();
    let ran = run(
        &pod,
        &object,
        "restore",
        &["--restore-chunks=1", "--restore-resources=3"],
    )
    .await;
    assert_eq!(ran.code, Some(1));
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("state-list"))
    );
    assert_eq!(
        error.summary.as_deref(),
        Some("the restored state lists no resource, but the backup had 3")
    );
}

#[tokio::test]
async fn a_corrupt_backup_fails_the_push() {
    let object = Object::new("runner-corrupt").await;
    let backend_only = json!({"terraform": {"backend": {"kubernetes": {}}}});
    let pod = Pod::new("runner-basic", &backend_only, &json!({}));
    std::fs::create_dir(pod.root().join("captf/config/restore")).unwrap();
    std::fs::write(pod.root().join("captf/config/restore/0"), b"not gzip").unwrap();
    let ran = run(&pod, &object, "restore", &["--restore-chunks=1"]).await;
    assert_eq!(ran.code, Some(1));
    assert!(ran.result.steps.is_empty());
    let error = ran.result.error.unwrap();
    assert_eq!(
        (error.kind, error.step.as_deref()),
        (RunErrorKind::Step, Some("state-push"))
    );
    assert!(
        error
            .summary
            .unwrap()
            .starts_with("the backup is not a valid gzip stream")
    );
}

const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The runner as `make runner` builds it, built here the same way when
/// missing.
fn static_runner() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("target"));
    let path = target_dir.join(STATIC_TARGET).join("debug/captf-runner");
    if !path.exists() {
        let status =
            std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
                .args(["build", "--bin", "captf-runner", "--target", STATIC_TARGET])
                .env(
                    "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                    "-C target-feature=+crt-static",
                )
                .current_dir(manifest)
                .status()
                .unwrap();
        assert!(status.success(), "building the static runner");
    }
    path
}

/// Whether an ELF executable asks for a program interpreter (the dynamic
/// loader).
fn has_interpreter(path: &Path) -> bool {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<object::Endianness>::parse(&*data).unwrap();
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP)
}

#[tokio::test]
async fn the_built_runner_is_static() {
    let runner = static_runner();
    assert!(
        !has_interpreter(&runner),
        "{} is dynamically linked",
        runner.display()
    );
    // The check tells the difference: the ordinary build is dynamic.
    assert!(has_interpreter(Path::new(RUNNER)));

    // And it runs: in an otherwise empty pod it reports the image's layout.
    let pod = tempfile::tempdir().unwrap();
    std::fs::create_dir(pod.path().join("dev")).unwrap();
    let out = std::process::Command::new(&runner)
        .args(["run", "--op=apply", "--job-name=static"])
        .arg(format!("--root={}", pod.path().display()))
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: RunResult =
        serde_json::from_slice(&std::fs::read(pod.path().join("dev/termination-log")).unwrap())
            .unwrap();
    assert_eq!(result.error.unwrap().kind, RunErrorKind::ImageLayout);
}
