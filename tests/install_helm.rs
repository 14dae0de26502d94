//! `helm install` from the local registry (issue 21): the manager runs in a
//! pod from its image, with its ServiceAccount's in-cluster credentials,
//! behind its Service, its serving certificate self-signed by its init
//! container (no cert-manager); Jobs run the runner and module images of
//! the registry; `helm upgrade` rolls the manager to a new image without
//! losing a reconcile; `helm uninstall` leaves the CRDs and the state.

use captf::api::{TerraformCluster, TerraformMachine};
use captf_testkit::identity;
use captf_testkit::install::{
    NAMESPACE, Prepared, Tenant, manager_pods, ready, run, webhook_refusal,
};
use captf_testkit::registry::TAG;
use captf_testkit::{Executor, scenario::images};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/captf");

/// The image IDs of a pod's init containers and containers.
fn image_ids(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let status = pod.status.clone().unwrap_or_default();
    let ids = |s: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        s.into_iter().flatten().map(|s| s.image_id).collect()
    };
    (
        ids(status.init_container_statuses),
        ids(status.container_statuses),
    )
}

/// The names of the state Secrets of a namespace.
async fn states(client: &kube::Client, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .filter(|n| n.starts_with("tfstate-default-"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_a_working_captf() {
    let prepared = Prepared::new().await;
    let repository = prepared.manager_repository().to_string();
    let Prepared {
        registry,
        manager,
        module,
        plane,
        client,
    } = prepared;
    let started = std::time::Instant::now();
    run(
        "helm",
        &[
            "install",
            "captf",
            CHART,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            &format!("image.tag={TAG}"),
            "--set",
            "certManager.enabled=false",
        ],
    );
    let _executor = Executor::start_contained(client.clone(), plane, images(), NAMESPACE).await;
    let pods = manager_pods(&client, 120, "a ready manager", |p| p.iter().any(ready)).await;
    eprintln!(
        "helm install: a ready manager in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let (init, main) = image_ids(&pods[0]);
    assert_eq!(
        (init, main),
        (vec![manager.by_digest()], vec![manager.by_digest()])
    );

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

    let tenant = Tenant::new(&client, "helm").await;
    // The account the pod runs as may do what the reviewed allow-list says:
    // the manager's, and the init container's two webhook configurations.
    let account =
        identity::account_kubeconfig(plane, NAMESPACE, "captf-controller-manager").unwrap();
    let in_tenant = identity::rules(&account, &tenant.ns);
    let own = identity::rules(&account, NAMESPACE);
    identity::check_allowed(
        "manager-self-signed.txt",
        &format!("# in a tenant namespace\n{in_tenant}# in {NAMESPACE}\n{own}"),
    );
    let refusal = webhook_refusal(&client, &tenant.ns).await;
    assert!(refusal.contains("spec.source.image"), "{refusal}");

    // A cluster and a machine, applied by Jobs whose runner comes from the
    // manager's image and whose module from its own, both pulled.
    tenant.cluster("c", &module.reference).await;
    tenant.machine("m1", "c", &module.reference).await;
    tenant.applied::<TerraformCluster>("c", 240).await;
    let status = tenant.applied::<TerraformMachine>("m1", 240).await;
    let source = status.source.expect("status.source");
    assert_eq!(
        source.image_digest.as_deref(),
        Some(module.by_digest().as_str())
    );
    for pod in &tenant.job_pods().await {
        assert_eq!(
            image_ids(pod),
            (vec![manager.by_digest()], vec![module.by_digest()])
        );
    }

    // A new release of the manager rolls out; a machine created meanwhile
    // is applied.
    let old: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let release = registry.variant(&manager, "dev-2");
    let started = std::time::Instant::now();
    run(
        "helm",
        &[
            "upgrade",
            "captf",
            CHART,
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "image.tag=dev-2",
        ],
    );
    tenant.machine("m2", "c", &module.reference).await;
    let rolled = manager_pods(
        &client,
        180,
        "the manager rolled to the new image",
        |pods| {
            pods.len() == 1
                && !old.contains(&pods[0].name_any())
                && ready(&pods[0])
                && image_ids(&pods[0]).1 == [release.by_digest()]
        },
    )
    .await;
    eprintln!(
        "helm upgrade: the new manager ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(image_ids(&rolled[0]).0, [release.by_digest()]);
    tenant.applied::<TerraformMachine>("m2", 240).await;

    // Uninstalled, the CRDs, the objects and their state stay.
    let kept = states(&client, &tenant.ns).await;
    assert_eq!(kept.len(), 3, "{kept:?}");
    run(
        "helm",
        &["uninstall", "captf", "--namespace", NAMESPACE, "--wait"],
    );
    manager_pods(&client, 120, "the manager gone", |pods| pods.is_empty()).await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in [
        "terraformclusters",
        "terraformmachines",
        "terraformmachinepools",
    ] {
        crds.get(&format!("{crd}.infrastructure.cluster.x-k8s.io"))
            .await
            .unwrap();
    }
    for name in ["m1", "m2"] {
        let machine = Api::<TerraformMachine>::namespaced(client.clone(), &tenant.ns)
            .get(name)
            .await
            .unwrap();
        assert!(machine.metadata.deletion_timestamp.is_none());
        assert!(!machine.finalizers().is_empty());
    }
    assert_eq!(states(&client, &tenant.ns).await, kept);
}
