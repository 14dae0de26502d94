//! Deleting a namespace of many never-applied TerraformMachines, against
//! the real control plane and one manager for every namespace.
//!
//! `cargo bench --bench namespace_deletion` (`CAPTF_BENCH_OBJECTS`, 1000 by
//! default) prints: how long the namespace took to go, in objects per
//! second; the manager's resident set before and its peak after; and how
//! long a TerraformCluster created in another namespace waited for its
//! first Job while the deletion ran, beside the same wait on a quiet
//! manager measured first in the same run.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does
//! nothing: the bounded version is `tests/namespace.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use captf::api::{
    AllowedNamespaces, IdentityReference, SecretReference, TerraformCluster,
    TerraformClusterIdentity, TerraformClusterIdentitySpec, TerraformClusterSpec, TerraformMachine,
    WorkspaceSpec,
};
use captf_testkit::manager::{Manager, install_crds, install_runner_role};
use captf_testkit::scenario::{labels, many_machines, noop};
use captf_testkit::{controlplane, namespace};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

async fn identity(client: &kube::Client, name: &str, secret_ns: &str, allowed: &str) {
    let id = TerraformClusterIdentity::new(
        name,
        TerraformClusterIdentitySpec {
            secret_ref: SecretReference {
                name: "creds".into(),
                namespace: secret_ns.into(),
            },
            allowed_namespaces: Some(AllowedNamespaces {
                list: Some(vec![allowed.into()]),
                selector: None,
            }),
        },
    );
    Api::<TerraformClusterIdentity>::all(client.clone())
        .create(&PostParams::default(), &id)
        .await
        .unwrap();
}

/// From creating a TerraformCluster in a namespace of its own to its first
/// Job.
async fn first_job(client: &kube::Client, prefix: &str) -> Duration {
    let ns = namespace(client, prefix).await;
    let creds = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("K".into(), "v".into())])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    let id = format!("id-{ns}");
    identity(client, &id, &ns, &ns).await;
    let mut cluster = TerraformCluster::new(
        "c",
        TerraformClusterSpec {
            workspace: WorkspaceSpec {
                identity_ref: Some(IdentityReference { name: id }),
                ..noop(None)
            },
            ..Default::default()
        },
    );
    cluster.metadata.labels = labels("c");
    let started = Instant::now();
    Api::<TerraformCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    loop {
        if !jobs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
        {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n: usize = std::env::var("CAPTF_BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let plane = controlplane::shared();
    let client = plane.client().await;
    install_crds(&client).await;
    install_runner_role(&client).await;
    let mut manager = Manager::start(plane, Path::new(MANAGER), &[]);
    manager.wait_ready().await;
    let quiet = first_job(&client, "bench-quiet").await;

    let ns = namespace(&client, "bench-many").await;
    // An identity that does not allow the namespace: nothing is applied.
    let id = format!("id-{ns}");
    identity(&client, &id, &ns, "elsewhere").await;
    let created = Instant::now();
    many_machines(&client, &ns, n, &id).await;
    let machines = Api::<TerraformMachine>::namespaced(client.clone(), &ns);
    loop {
        let listed = machines.list(&ListParams::default()).await.unwrap();
        let finalized = |m: &TerraformMachine| {
            m.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
        };
        if listed.items.len() == n && listed.items.iter().all(finalized) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ready = created.elapsed();
    let rss_before = manager.usage().rss_kib / 1024;

    let namespaces = Api::<Namespace>::all(client.clone());
    let deleting = Instant::now();
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let busy = tokio::spawn({
        let client = client.clone();
        async move { first_job(&client, "bench-busy").await }
    });
    while namespaces.get_opt(&ns).await.unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = deleting.elapsed();
    let busy = busy.await.unwrap();
    let usage = manager.usage();
    let (rss_after, peak) = (usage.rss_kib / 1024, usage.peak_kib / 1024);
    println!(
        "namespace deletion, {n} never-applied TerraformMachines, one manager (debug build unless --release)"
    );
    println!("  created and finalized in {:.1} s", ready.as_secs_f64());
    println!(
        "  namespace gone in {:.1} s: {:.1} objects/s",
        gone.as_secs_f64(),
        n as f64 / gone.as_secs_f64()
    );
    println!("  manager RSS {rss_before} MiB before, {rss_after} MiB after, peak {peak} MiB");
    println!(
        "  another namespace's first Job: {:.1} s during the deletion, {:.1} s quiet ({:.1}x)",
        busy.as_secs_f64(),
        quiet.as_secs_f64(),
        busy.as_secs_f64() / quiet.as_secs_f64()
    );
    manager.stop();
}
