//! The real Cluster API core manager against the test control plane, with
//! the kit's CRDs and objects and without CAPTF's manager: CAPTF's status is
//! written by hand, so what is tested is Cluster API's side of the contract.

use captf::api::{TerraformCluster, TerraformClusterSpec};
use captf_testkit::capi::{self, CapiKind, CapiManager};
use captf_testkit::scenario::noop;
use captf_testkit::{controlplane, manager};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn cluster_api_owns_a_terraform_cluster_and_sees_it_provisioned() {
    let plane = controlplane::shared();
    let client = plane.client().await;
    manager::install_crds(&client).await;
    capi::install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "capi").await;
    let capi = CapiManager::start(plane, &ns).await;

    let infra = Api::<TerraformCluster>::namespaced(client.clone(), &ns);
    let cluster = TerraformCluster::new(
        "c1",
        TerraformClusterSpec {
            workspace: noop(None),
            ..Default::default()
        },
    );
    infra
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    capi::create(&client, &ns, capi::cluster("c1", "c1", false, None)).await;

    let adopted = capi
        .within(
            60,
            "Cluster API's owner reference on the TerraformCluster",
            || async {
                infra.get_opt("c1").await.ok()?.filter(|c| {
                    c.owner_references()
                        .iter()
                        .any(|o| o.kind == "Cluster" && o.name == "c1")
                })
            },
        )
        .await;
    let owner = adopted
        .owner_references()
        .iter()
        .find(|o| o.kind == "Cluster")
        .unwrap();
    assert_eq!(owner.api_version, "cluster.x-k8s.io/v1beta2");
    assert_eq!(
        adopted
            .labels()
            .get(capi::CLUSTER_NAME_LABEL)
            .map(String::as_str),
        Some("c1"),
        "Cluster API labels what it owns"
    );
    assert_ne!(
        capi::status_field(
            &client,
            &ns,
            CapiKind::Cluster,
            "c1",
            "initialization.infrastructureProvisioned"
        )
        .await,
        Some(json!(true)),
        "not provisioned before the TerraformCluster says so"
    );

    infra
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "initialization": { "provisioned": true } } })),
        )
        .await
        .unwrap();
    capi.within(60, "the Cluster's infrastructure provisioned", || async {
        let provisioned = capi::status_field(
            &client,
            &ns,
            CapiKind::Cluster,
            "c1",
            "initialization.infrastructureProvisioned",
        )
        .await;
        (provisioned == Some(json!(true))).then_some(())
    })
    .await;
}
