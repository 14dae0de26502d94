//! `helm install` from the local registry (issue 21): the manager runs in a
//! pod from its image, with its ServiceAccount's in-cluster credentials,
//! behind its Service, its serving certificate self-signed by its init
//! container (no cert-manager).

use std::process::Command;
use std::time::Duration;

use captf_testkit::Executor;
use captf_testkit::controlplane::{self, binary};
use captf_testkit::registry::{self, MANAGER as MANAGER_IMAGE, TAG};
use captf_testkit::scenario::images;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NAMESPACE: &str = "captf-system";

fn helm(args: &[&str]) -> String {
    let plane = controlplane::shared();
    let out = Command::new(binary("helm"))
        .args(args)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("captf-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("captf-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("captf-helm-data"),
        )
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Whether the pod's Ready condition is True.
fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn helm_install_runs_the_manager_from_its_image_behind_its_service() {
    let registry = registry::shared();
    let manager = registry.push(MANAGER_IMAGE);
    let plane = controlplane::shared();
    let client = plane.client().await;
    // A provider comes after Cluster API's own CRDs.
    captf_testkit::capi::install_crds(&client).await;
    let repository = manager
        .reference
        .trim_end_matches(&format!(":{TAG}"))
        .to_string();
    helm(&[
        "install",
        "captf",
        &format!("{ROOT}/charts/captf"),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--set",
        &format!("image.repository={repository}"),
        "--set",
        &format!("image.tag={TAG}"),
        "--set",
        "certManager.enabled=false",
    ]);

    let _executor = Executor::start_contained(client.clone(), plane, images(), NAMESPACE).await;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let listed = pods
            .list(&ListParams::default().labels("control-plane=captf-controller-manager"))
            .await
            .unwrap();
        if listed.items.iter().any(ready) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ready manager pod: {:#?}",
            listed.items.iter().map(|p| &p.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The init container made the serving certificate and set the CA.
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get("captf-webhook-service-cert")
        .await
        .expect("the Secret the init container keeps");
    let ca = secret.data.unwrap_or_default()["ca.crt"].0.clone();
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("captf-validating-webhook-configuration")
        .await
        .unwrap();
    for webhook in validating.webhooks.unwrap_or_default() {
        assert_eq!(
            webhook.client_config.ca_bundle.map(|b| b.0),
            Some(ca.clone()),
            "{}",
            webhook.name
        );
    }

    // The webhook answers through the Service.
    let ns = captf_testkit::namespace(&client, "helm").await;
    let machine: captf::api::TerraformMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "TerraformMachine",
        "metadata": { "name": "bad" },
        "spec": { "source": { "image": "Not A Reference" } },
    }))
    .unwrap();
    let machines = Api::<captf::api::TerraformMachine>::namespaced(client.clone(), &ns);
    let message = captf_testkit::eventually("the webhook's answer through its Service", || async {
        let refused = machines
            .create(&PostParams::default(), &machine)
            .await
            .expect_err("the webhook refuses an invalid image reference");
        let message = refused.to_string();
        (!message.contains("no endpoints available")).then_some(message)
    })
    .await;
    assert!(message.contains("spec.source.image"), "{message}");
    assert!(
        message.contains("vterraformmachine") || message.contains("denied"),
        "{message}"
    );
}
