//! The Cluster API owners of the objects of tests that do not run Cluster
//! API's manager: each object gets what Cluster API would give it (a
//! Cluster whose infrastructure is provisioned, a controlling Machine with
//! its bootstrap data, the owner references), written by the kit. The
//! tests of the Cluster API contract itself run the real manager instead
//! (`crate::capi`).

use std::collections::BTreeMap;

use captf::api::TerraformCluster;
use captf::capi::objects::{Bootstrap, Cluster, ClusterSpec, ContractRef, Machine, MachineSpec};
use captf::names::Kind;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

/// The bootstrap data every kit Machine carries.
pub const BOOTSTRAP_DATA: &str = "#cloud-config\nruncmd: [echo captf-test]\n";

fn infra(kind: Kind, name: &str) -> Option<ContractRef> {
    Some(ContractRef {
        api_group: captf::api::GROUP.into(),
        kind: kind.kind().into(),
        name: name.into(),
    })
}

fn owner(kind: &str, name: &str, uid: Option<String>, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.expect("a created object has a uid"),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    }
}

/// The Cluster `name` whose infrastructure is the TerraformCluster `name`,
/// created unless it exists, with its infrastructure marked provisioned (as
/// Cluster API marks it): the owner reference a TerraformCluster `name`
/// gets.
pub async fn cluster(client: &kube::Client, ns: &str, name: &str) -> OwnerReference {
    let api = Api::<Cluster>::namespaced(client.clone(), ns);
    let existing = api.get_opt(name).await.expect("reading a Cluster");
    let cluster = match existing {
        Some(c) => c,
        None => {
            let c = Cluster::new(
                name,
                ClusterSpec {
                    infrastructure_ref: infra(Kind::Cluster, name),
                    ..Default::default()
                },
            );
            let created = api
                .create(&PostParams::default(), &c)
                .await
                .expect("creating a Cluster");
            let status = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("marking the Cluster's infrastructure provisioned");
            created
        }
    };
    owner("Cluster", name, cluster.metadata.uid, false)
}

/// A TerraformCluster `name` that something else manages (no Job, no
/// status), with `identity` for its machines to inherit, unless one exists:
/// the infrastructure of the Cluster of a test's machines that has no
/// TerraformCluster of its own.
pub async fn external_cluster(client: &kube::Client, ns: &str, name: &str, identity: &str) {
    let api = Api::<TerraformCluster>::namespaced(client.clone(), ns);
    if api
        .get_opt(name)
        .await
        .expect("reading a TerraformCluster")
        .is_some()
    {
        return;
    }
    let reference = cluster(client, ns, name).await;
    let mut c = TerraformCluster::new(
        name,
        captf::api::TerraformClusterSpec {
            workspace: captf::api::WorkspaceSpec {
                identity_ref: Some(captf::api::IdentityReference {
                    name: identity.into(),
                }),
                ..crate::scenario::noop(None)
            },
            ..Default::default()
        },
    );
    c.metadata.labels = crate::scenario::labels(name);
    c.metadata.annotations = Some(BTreeMap::from([(
        captf::keys::MANAGED_BY.to_string(),
        "captf-testkit".to_string(),
    )]));
    c.metadata.owner_references = Some(vec![reference]);
    api.create(&PostParams::default(), &c)
        .await
        .expect("creating an externally managed TerraformCluster");
}

/// The Machine `name` of Cluster `cluster` whose infrastructure is the
/// TerraformMachine `name`, with the bootstrap Secret `<name>-bootstrap`:
/// the controller reference a TerraformMachine `name` gets.
pub async fn machine(client: &kube::Client, ns: &str, name: &str, cluster: &str) -> OwnerReference {
    let secret_name = format!("{name}-bootstrap");
    let labels = crate::scenario::labels(cluster);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name.clone()),
            labels: labels.clone(),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(BOOTSTRAP_DATA.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating a bootstrap Secret");
    let mut m = Machine::new(
        name,
        MachineSpec {
            cluster_name: cluster.into(),
            bootstrap: Some(Bootstrap {
                data_secret_name: Some(secret_name),
            }),
            infrastructure_ref: infra(Kind::Machine, name),
            version: Some("v1.36.3".into()),
            failure_domain: None,
        },
    );
    m.metadata.labels = labels;
    let created = Api::<Machine>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &m)
        .await
        .expect("creating a Machine");
    owner("Machine", name, created.metadata.uid, true)
}
