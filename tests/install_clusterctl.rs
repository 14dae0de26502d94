//! `clusterctl init --infrastructure terraform` against a local provider
//! repository (issue 21): clusterctl installs cert-manager (its chart,
//! rendered, from images of cert-manager's own code), then Cluster API's
//! core, kubeadm bootstrap and kubeadm control plane providers (their
//! `config/default`) and CAPTF's release, every manager running from its
//! image in a contained pod, its webhook certificate issued by cert-manager
//! and its CA injected by cert-manager's cainjector. Then a Cluster from
//! CAPTF's release template: its TerraformCluster applied by a Job whose
//! pod runs the runner and module images of the registry, and the Cluster
//! API core marking the Cluster's infrastructure provisioned.

use std::time::Instant;

use tokio::task::block_in_place;

use captf::api::{TerraformCluster, TerraformMachine};
use captf_testkit::install::{NAMESPACE, Tenant, manager_pods, ready, run, webhook_refusal};
use captf_testkit::{Executor, controlplane, providers, registry, scenario::images};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

fn capi(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind))
}

// Multi-threaded: clusterctl and kubectl block a thread while the pod
// stand-ins run on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_init_installs_captf_and_its_release_template_provisions_a_cluster() {
    let registry = registry::shared();
    let manager = registry.push(registry::MANAGER);
    let module = registry.push(registry::NOOP_MODULE);
    let plane = controlplane::shared();
    let client = plane.client().await;
    let clusterctl = providers::repository(registry);

    let mut executors = Vec::new();
    for ns in providers::NAMESPACES.iter().chain([&NAMESPACE]) {
        executors.push(Executor::start_contained(client.clone(), plane, images(), ns).await);
    }
    let kubeconfig = plane.kubeconfig().to_string_lossy().into_owned();
    let started = Instant::now();
    let out = block_in_place(|| {
        clusterctl.run(
            &[
                "init",
                "--infrastructure",
                captf_testkit::clusterctl::PROVIDER,
                "--kubeconfig",
                &kubeconfig,
                "--wait-providers",
                "--wait-provider-timeout",
                "600",
            ],
            &[("CAPTF_IMAGE", &manager.reference)],
        )
    });
    eprintln!(
        "clusterctl init: every provider ready in {:.1}s\n{out}",
        started.elapsed().as_secs_f64()
    );
    // clusterctl's inventory: every provider installed, at its version.
    let inventory = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "clusterctl.cluster.x-k8s.io",
            "v1alpha3",
            "Provider",
        )),
    );
    let mut installed: Vec<(String, String)> = inventory
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            let field = |f: &str| p.data[f].as_str().unwrap_or_default().to_string();
            (
                p.metadata.name.clone().unwrap_or_default(),
                field("version"),
            )
        })
        .collect();
    installed.sort();
    let capi_version = format!("v{}", captf_testkit::capi::version());
    let release = captf_testkit::clusterctl::release();
    assert_eq!(
        installed,
        [
            ("bootstrap-kubeadm".to_string(), capi_version.clone()),
            ("cluster-api".to_string(), capi_version.clone()),
            ("control-plane-kubeadm".to_string(), capi_version.clone()),
            ("infrastructure-terraform".to_string(), release),
        ],
        "{out}"
    );
    let pods = manager_pods(&client, 60, "a ready manager", |p| p.iter().any(ready)).await;
    let status = pods[0].status.clone().unwrap_or_default();
    let ids: Vec<String> = status
        .container_statuses
        .into_iter()
        .flatten()
        .map(|s| s.image_id)
        .collect();
    assert_eq!(ids, [manager.by_digest()]);

    let tenant = Tenant::new(&client, "clusterctl").await;
    let refusal = webhook_refusal(&client, &tenant.ns).await;
    assert!(refusal.contains("spec.source.image"), "{refusal}");

    let cluster = block_in_place(|| {
        clusterctl.run(
            &[
                "generate",
                "cluster",
                "c",
                "--infrastructure",
                captf_testkit::clusterctl::PROVIDER,
                "--target-namespace",
                &tenant.ns,
                "--kubernetes-version",
                "v1.36.3",
                "--worker-machine-count",
                "1",
                "--kubeconfig",
                &kubeconfig,
            ],
            &[
                ("CLUSTER_MODULE_IMAGE", &module.reference),
                ("MACHINE_MODULE_IMAGE", &module.reference),
                ("IDENTITY_NAME", &tenant.identity),
            ],
        )
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &cluster).unwrap();
    block_in_place(|| run("kubectl", &["apply", "-f", &file.path().to_string_lossy()]));

    tenant.applied::<TerraformCluster>("c", 300).await;
    let clusters =
        Api::<DynamicObject>::namespaced_with(client.clone(), &tenant.ns, &capi("Cluster"));
    captf_testkit::eventually("the Cluster's infrastructure provisioned", || async {
        let c = clusters.get("c").await.ok()?;
        (c.data["status"]["initialization"]["infrastructureProvisioned"] == true).then_some(())
    })
    .await;
    // The worker's Machine, its TerraformMachine cloned from the template
    // and its KubeadmConfig: waiting for a control plane, as with any
    // provider until one is up.
    let machines =
        Api::<DynamicObject>::namespaced_with(client.clone(), &tenant.ns, &capi("Machine"));
    let machine = captf_testkit::eventually("the worker's Machine", || async {
        machines
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let infra = machine.data["spec"]["infrastructureRef"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let terraform = Api::<TerraformMachine>::namespaced(client.clone(), &tenant.ns);
    captf_testkit::eventually("the worker's TerraformMachine", || async {
        terraform.get_opt(&infra).await.ok().flatten()
    })
    .await;
    // Every provider's manager still up and ready.
    for ns in providers::NAMESPACES.iter().chain([&NAMESPACE]) {
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert!(!pods.is_empty(), "no pods in {ns}");
        for pod in &pods {
            assert!(ready(pod), "{ns}/{}: {:#?}", pod.name_any(), pod.status);
        }
    }
    drop(executors);
}
