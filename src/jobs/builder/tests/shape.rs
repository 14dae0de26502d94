//! A Job's shape: its pod, security, identity and image pulls.

use super::*;

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
