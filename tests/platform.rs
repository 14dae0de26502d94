//! The test platform itself, against the real control plane and OpenTofu:
//! what every later test stands on.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use captf_testkit::controlplane;
use captf_testkit::{eventually, first_pod, run_ok, tofu};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn namespace_and_config_map_round_trip() {
    let client = controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, "roundtrip").await;
    let maps: Api<ConfigMap> = Api::namespaced(client, &ns);
    maps.create(
        &PostParams::default(),
        &config_map("greeting", &[("hello", "world")]),
    )
    .await
    .unwrap();
    let read = maps.get("greeting").await.unwrap();
    assert_eq!(read.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(
        read.data,
        Some(BTreeMap::from([("hello".to_string(), "world".to_string())]))
    );
}

#[tokio::test]
async fn job_controller_creates_a_pod() {
    let client = controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, "jobs").await;
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "sleeper" },
        "spec": {
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "main", "image": "example.invalid/sleep:1" }]
            }}
        }
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod = eventually("the Job's pod", || first_pod(&pods, "job-name=sleeper")).await;
    // No scheduler and no kubelet: the pod exists and stays Pending.
    let phase = pod.status.and_then(|s| s.phase);
    assert!(
        phase.is_none() || phase.as_deref() == Some("Pending"),
        "{phase:?}"
    );
    assert!(pod.metadata.name.unwrap().starts_with("sleeper-"));
}

#[tokio::test]
async fn garbage_collector_removes_dependents() {
    let client = controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, "gc").await;
    let maps: Api<ConfigMap> = Api::namespaced(client, &ns);
    let owner = maps
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await
        .unwrap();
    let mut dependent = config_map("dependent", &[]);
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().unwrap(),
        ..Default::default()
    }]);
    maps.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    // An unrelated ConfigMap must survive: the collector removes dependents only.
    maps.create(&PostParams::default(), &config_map("bystander", &[]))
        .await
        .unwrap();

    maps.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the dependent to be collected", || async {
        match maps.get_opt("dependent").await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(maps.get_opt("bystander").await.unwrap().is_some());
}

#[tokio::test]
async fn opentofu_kubernetes_backend_writes_state_and_holds_the_lock() {
    let plane = controlplane::shared();
    let client = plane.client().await;
    let ns = captf_testkit::namespace(&client, "tofu").await;
    let suffix = "platformtest";

    let work = tempfile::tempdir().unwrap();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modules/slow-noop/main.tf");
    std::fs::copy(&module, work.path().join("main.tf")).unwrap();
    let home = work.path().join("home");
    std::fs::create_dir(&home).unwrap();

    let config_path = format!(
        "-backend-config=config_path={}",
        plane.kubeconfig().display()
    );
    let namespace = format!("-backend-config=namespace={ns}");
    let secret_suffix = format!("-backend-config=secret_suffix={suffix}");
    run_ok(
        tofu(
            work.path(),
            &home,
            &[
                "init",
                "-no-color",
                &config_path,
                &namespace,
                &secret_suffix,
            ],
        ),
        "tofu init",
    )
    .await;

    let apply = tofu(
        work.path(),
        &home,
        &[
            "apply",
            "-auto-approve",
            "-no-color",
            "-var=sleep_seconds=6",
            "-var=message=first",
        ],
    )
    .spawn()
    .unwrap();

    // While the apply sleeps in its provisioner, the lock is held.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lock_name = format!("lock-tfstate-default-{suffix}");
    let held = eventually("the state lock to be held", || async {
        let lease = leases.get_opt(&lock_name).await.ok()??;
        let holder = lease.spec.as_ref()?.holder_identity.clone()?;
        (!holder.is_empty()).then_some(lease)
    })
    .await;
    let info: serde_json::Value = serde_json::from_str(
        held.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("app.terraform.io/lock-info"))
            .expect("the lock-info annotation"),
    )
    .expect("lock info is JSON");
    assert_eq!(info["Operation"], "OperationTypeApply");
    assert!(info["Who"].as_str().unwrap().contains('@'), "{info}");
    assert_eq!(
        info["ID"].as_str(),
        held.spec.as_ref().unwrap().holder_identity.as_deref(),
        "the Lease's holder is the lock ID"
    );

    let out = apply.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "tofu apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let lease = leases.get(&lock_name).await.unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        holder.is_empty(),
        "the lock is released after the apply, held by {holder:?}"
    );

    let secrets: Api<Secret> = Api::namespaced(client, &ns);
    let state = secrets
        .get(&format!("tfstate-default-{suffix}"))
        .await
        .unwrap();
    let labels = state.metadata.labels.unwrap_or_default();
    for (key, value) in [
        ("tfstate", "true"),
        ("tfstateSecretSuffix", suffix),
        ("app.kubernetes.io/managed-by", "terraform"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "label {key}: {labels:?}"
        );
    }
    let payload = state
        .data
        .unwrap()
        .remove("tfstate")
        .expect("data key tfstate")
        .0;
    assert_eq!(&payload[..2], &[0x1f, 0x8b], "the payload is gzip");
    let mut json = String::new();
    flate2::read::GzDecoder::new(&payload[..])
        .read_to_string(&mut json)
        .unwrap();
    let state: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(state["version"], 4);
    assert_eq!(state["outputs"]["message"]["value"], "first");
    assert_eq!(state["resources"][0]["type"], "terraform_data");
}
