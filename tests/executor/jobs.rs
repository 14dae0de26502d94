//! Jobs the builder makes, run by the executor: the noop module applied,
//! and an apply OOM-killed midway.

use super::*;

/// The Job of one run.
struct RunJob {
    name: String,
    suffix: String,
}

/// Creates, as the controller does, the apply Job of the TerraformMachine
/// `machine` with the image of `tests/modules/<module>`, then its per-run
/// Secret.
async fn apply_job(t: &Setup, module: &str, machine: &str, inputs: &RenderedInputs) -> RunJob {
    let image = test_module_image(module);
    let settings = policy::resolve(None, None);
    let hash6 = builder::hash6(&inputs.inputs_hash, Op::Apply, NonZeroU32::MIN, 0);
    let built = builder::build(&JobRequest {
        kind: Kind::Machine,
        namespace: &t.ns,
        name: machine,
        uid: "no-such-object",
        cluster_name: None,
        op: Op::Apply,
        attempt: NonZeroU32::MIN,
        hash6: &hash6,
        image: &image,
        image_pull_policy: None,
        runner_image: TEST_RUNNER_IMAGE,
        settings: &settings,
        identity: None,
        force_unlock: None,
        inputs,
        restore: None,
        mode: builder::ApplyMode::Direct,
        events: false,
    });
    let mut job = built.job;
    // No TerraformMachine exists here, and the garbage collector deletes
    // what a missing owner owns.
    job.metadata.owner_references = None;
    let job = Api::<Job>::namespaced(t.client.clone(), &t.ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let mut secret = built.run_secret;
    builder::own_run_secret(&mut secret, &job).unwrap();
    Api::<Secret>::namespaced(t.client.clone(), &t.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    RunJob {
        name: job.metadata.name.unwrap(),
        suffix: names::suffix(&t.ns, Kind::Machine, machine),
    }
}

/// A condition of the Job that is True.
async fn job_condition(t: &Setup, job: &str, seconds: u64) -> String {
    let jobs: Api<Job> = Api::namespaced(t.client.clone(), &t.ns);
    within(
        seconds,
        &format!("job {job} to finish"),
        &t.executor,
        || async {
            let job = jobs.get(job).await.ok()?;
            job.status?
                .conditions?
                .into_iter()
                .find(|c| c.status == "True" && (c.type_ == "Complete" || c.type_ == "Failed"))
                .map(|c| c.type_)
        },
    )
    .await
}

async fn job_pod(t: &Setup, job: &str) -> Pod {
    let pods = t
        .pods()
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 1, "one pod for {job}");
    pods.items.into_iter().next().unwrap()
}

#[tokio::test]
async fn an_apply_job_of_the_noop_module_completes() {
    let t = Setup::new("exec-apply").await;
    let image = test_module_image("noop");
    let greeting = serde_json::from_value(json!({ "greeting": "hi" })).unwrap();
    let inputs = inputs::render(&InputsRequest {
        kind: Kind::Machine,
        namespace: &t.ns,
        name: "m1",
        cluster_name: Some("c1"),
        image: &image,
        template: None,
        variables: Some(&greeting),
        sensitive: &[],
        role: &[],
    })
    .unwrap();
    let job = apply_job(&t, "noop", "m1", &inputs).await;
    let condition = job_condition(&t, &job.name, 240).await;
    let pod = job_pod(&t, &job.name).await;
    let logs = std::fs::read_to_string(
        t.executor
            .pod_dir(&t.ns, pod.metadata.name.as_deref().unwrap())
            .join("source.log"),
    )
    .unwrap_or_default();
    assert_eq!(condition, "Complete", "the runner's log:\n{logs}");

    assert_eq!(phase(&pod), Some("Succeeded"));
    let terminated = main_terminated(&pod).unwrap();
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (0, Some("Completed"))
    );
    let result: serde_json::Value =
        serde_json::from_str(terminated.message.as_deref().unwrap()).unwrap();
    assert_eq!(result["operation"], "apply");
    assert_eq!(result["job"], job.name.as_str());
    let steps: Vec<&str> = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["init", "validate", "apply"]);
    assert!(
        result["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["exitCode"] == 0),
        "{result}"
    );

    let state = Api::<Secret>::namespaced(t.client.clone(), &t.ns)
        .get_opt(&names::state_secret(&job.suffix))
        .await
        .unwrap();
    let state = state.expect("the backend wrote the state Secret");
    assert_eq!(state.metadata.labels.unwrap()["captf.io/managed"], "true");
}

#[tokio::test]
async fn an_apply_job_oom_killed_mid_apply_fails() {
    let t = Setup::new("exec-oom-job").await;
    let main = json!({
        "terraform": { "backend": { "kubernetes": {} } },
        "variable": { "sleep_seconds": {} },
        "module": { "role": { "source": "../../module", "sleep_seconds": "${var.sleep_seconds}" } },
    });
    // slow-noop takes no contract input: a root of its own.
    let inputs = RenderedInputs {
        main_tf_json: main.to_string().into_bytes(),
        tfvars_json: json!({ "sleep_seconds": 120 }).to_string().into_bytes(),
        inputs_hash: "h2:slow".into(),
    };
    let job = apply_job(&t, "slow-noop", "slow", &inputs).await;

    // The apply holds the state lock while its provisioner sleeps.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(t.client.clone(), &t.ns);
    let lock = names::state_lock_lease(&job.suffix);
    let info = within(
        180,
        "the apply to hold the state lock",
        &t.executor,
        || async {
            let lease = leases.get_opt(&lock).await.ok()??;
            lease.spec?.holder_identity.filter(|h| !h.is_empty())?;
            let info = lease
                .metadata
                .annotations?
                .remove("app.terraform.io/lock-info")?;
            let info: serde_json::Value = serde_json::from_str(&info).ok()?;
            (info["Operation"] == "OperationTypeApply").then_some(info)
        },
    )
    .await;
    let pod = job_pod(&t, &job.name).await;
    let pod_name = pod.metadata.name.unwrap();
    // The lock names the pod, as in a cluster: the hostname is the pod's.
    let who = info["Who"].as_str().unwrap();
    assert!(who.ends_with(&format!("@{pod_name}")), "{who}");
    assert!(t.executor.kill_oom(&t.ns, &pod_name));

    assert_eq!(job_condition(&t, &job.name, 60).await, "Failed");
    let pod = t.pods().get(&pod_name).await.unwrap();
    let terminated = main_terminated(&pod).unwrap();
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    assert_eq!(terminated.message, None);
}
