//! A built Job accepted by the API server, owned and collected; the
//! rendered root applied against the noop module.

use super::*;

#[tokio::test]
async fn a_built_job_is_accepted_owned_and_collected() {
    let client = client().await;
    captf_testkit::manager::install_crds(&client).await;
    let ns = namespace(&client, "built-job").await;
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // A name long enough for the hash rule, so that the pod name (the
    // hostname the lock records) is checked against the 63-character cap.
    let name = "machine-with-a-name-long-enough-to-need-the-job-name-hash";
    let machine = TerraformMachine::new(
        name,
        TerraformMachineSpec {
            workspace: WorkspaceSpec {
                source: Source {
                    image: "registry.example/mod:1".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let machine = machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let uid = machine.meta().uid.clone().unwrap();
    // Pods of a missing ServiceAccount are refused at admission.
    rbac::ensure(&client, &ns, names::RUNNER_RBAC)
        .await
        .unwrap();

    let variables: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_value(json!({ "greeting": "hi" })).unwrap();
    let rendered = inputs::render(&InputsRequest {
        kind: Kind::Machine,
        namespace: &ns,
        name,
        cluster_name: Some("prod"),
        image: "registry.example/mod:1",
        template: None,
        variables: Some(&variables),
        sensitive: &[],
        role: &[],
    })
    .unwrap();
    let settings = policy::resolve(None, None);
    let attempt = NonZeroU32::MIN;
    let hash6 = builder::hash6(&rendered.inputs_hash, Op::Restore, attempt, 0);
    let chunks = ["backup-0".to_owned(), "backup-0-part-1".to_owned()];
    let mut built = builder::build(&JobRequest {
        kind: Kind::Machine,
        namespace: &ns,
        name,
        uid: &uid,
        cluster_name: Some("prod"),
        op: Op::Restore,
        attempt,
        hash6: &hash6,
        image: "registry.example/mod:1",
        image_pull_policy: None,
        runner_image: "registry.example/runner:1",
        settings: &settings,
        identity: Some("aws"),
        force_unlock: Some("lock-1"),
        inputs: &rendered,
        restore: Some(builder::RestoreRequest {
            chunk_secrets: &chunks,
            resources: 1,
            serial: 2,
        }),
        mode: builder::ApplyMode::Direct,
        events: false,
    });
    let job = jobs
        .create(&PostParams::default(), &built.job)
        .await
        .unwrap();
    let job_name = job.metadata.name.clone().unwrap();
    builder::own_run_secret(&mut built.run_secret, &job).unwrap();
    let secret = secrets
        .create(&PostParams::default(), &built.run_secret)
        .await
        .unwrap();
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(&owner.uid), job.metadata.uid.as_ref());
    assert_eq!(owner.kind, "Job");

    // The job controller makes its pod from the template; its name, which
    // is its hostname, fits.
    let pod = eventually("the Job's pod", || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("job-name={job_name}")))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await;
    let pod_name = pod.metadata.name.unwrap();
    assert!(pod_name.len() <= 63, "{pod_name}");
    assert!(
        names::is_own_runner_pod(Kind::Machine, name, &pod_name),
        "{pod_name}"
    );

    // Deleting the object collects the Job, and the Job its Secret.
    machines
        .delete(name, &DeleteParams::background())
        .await
        .unwrap();
    eventually("the Job and its Secret to be collected", || async {
        let job_gone = jobs.get_opt(&job_name).await.ok()?.is_none();
        let secret_gone = secrets
            .get_opt(&names::run_secret(&job_name))
            .await
            .ok()?
            .is_none();
        (job_gone && secret_gone).then_some(())
    })
    .await;
}

/// The rendered root, with the image's module beside it as in the Job, is a
/// root that OpenTofu applies: every input reaches the module and every
/// output of the role comes back, sensitive.
#[tokio::test]
async fn the_rendered_root_applies_against_the_noop_module() {
    let dir = tempfile::tempdir().unwrap();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modules/noop");
    std::os::unix::fs::symlink(&module, dir.path().join("module")).unwrap();
    let root = dir.path().join("work/root");
    std::fs::create_dir_all(&root).unwrap();

    let variables: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_value(json!({ "greeting": "hi", "size": 3 })).unwrap();
    for kind in [Kind::Cluster, Kind::Machine, Kind::MachinePool] {
        let rendered = inputs::render(&InputsRequest {
            kind,
            namespace: "ns",
            name: "obj",
            cluster_name: Some("prod"),
            image: "registry.example/mod:1",
            template: Some("tmpl"),
            variables: Some(&variables),
            sensitive: &[],
            role: &[],
        })
        .unwrap();
        std::fs::write(root.join("main.tf.json"), &rendered.main_tf_json).unwrap();
        std::fs::write(root.join("terraform.tfvars.json"), &rendered.tfvars_json).unwrap();
        // Here the state stays local: the kubernetes backend is tested with
        // the runner.
        std::fs::write(
            root.join("override.tf.json"),
            r#"{"terraform":{"backend":{"local":{}}}}"#,
        )
        .unwrap();
        let _ = std::fs::remove_file(root.join("terraform.tfstate"));
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        run_ok(
            tofu(
                &root,
                &home,
                &["init", "-input=false", "-no-color", "-reconfigure"],
            ),
            "init",
        )
        .await;
        run_ok(
            tofu(
                &root,
                &home,
                &[
                    "apply",
                    "-auto-approve",
                    "-input=false",
                    "-no-color",
                    "-var-file=terraform.tfvars.json",
                ],
            ),
            "apply",
        )
        .await;
        let out = run_ok(tofu(&root, &home, &["output", "-json"]), "output").await;
        let outputs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut got: Vec<&str> = outputs
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        got.sort_unstable();
        // OpenTofu keeps no null output, and the noop machine's
        // failure_domain echoes its null input.
        let mut want: Vec<&str> = kind
            .outputs()
            .iter()
            .copied()
            .filter(|o| !(kind == Kind::Machine && *o == "failure_domain"))
            .chain([DECLARED_OUTPUTS])
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "{kind:?}");
        // The noop modules declare every output of their role, a null one
        // too.
        let declared = &outputs[DECLARED_OUTPUTS]["value"];
        assert_eq!(declared, &json!(kind.outputs()), "{kind:?}");
        // Every role output is sensitive; the list of names is not.
        for (name, o) in outputs.as_object().unwrap() {
            assert_eq!(o["sensitive"], name != DECLARED_OUTPUTS, "{name}");
        }
        // The module saw the inputs: its object name and the user variable.
        let provider_id = &outputs["provider_id"]["value"];
        if kind != Kind::Cluster {
            assert_eq!(provider_id, "noop://ns/obj", "{kind:?}");
        } else {
            assert_eq!(
                outputs["exports"]["value"],
                json!({ "cluster": "obj", "greeting": "hi" })
            );
        }
    }
}
