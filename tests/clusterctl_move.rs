//! A real `clusterctl move` between two control planes, each with the
//! Cluster API core manager and a CAPTF manager (ref §8.7): the state,
//! its backups and the inputs travel, the target applies nothing, and the
//! source destroys nothing.

mod capi_shared;

use std::collections::BTreeMap;
use std::time::Instant;

use capi_shared::*;
use captf::api::{TerraformCluster, TerraformMachine};
use captf::keys::BLOCK_MOVE;
use captf::names::{self, Kind};
use captf_testkit::capi::{self, CapiKind, CapiManager, MachineOptions};
use captf_testkit::clusterctl::{Clusterctl, init_inventory};
use captf_testkit::controlplane;
use captf_testkit::manager::install_crds;
use captf_testkit::scenario::{Env, condition, put_lock, setup, setup_in, within};
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Every Secret of the namespace that CAPTF keeps for its objects, by
/// name: the state, its backups, the durable inputs and the mirror.
async fn captf_secrets(env: &Env) -> BTreeMap<String, BTreeMap<String, ByteString>> {
    env.secrets()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| {
            let name = s.metadata.name.as_deref().unwrap_or_default();
            name.starts_with("tfstate-")
                || name.starts_with("captf-state-backup-")
                || name.starts_with("captf-inputs-")
                || name.starts_with("captf-creds-")
        })
        .map(|s| (s.metadata.name.unwrap(), s.data.unwrap_or_default()))
        .collect()
}

/// The lineage of a gzipped state.
fn lineage(gz: &[u8]) -> serde_json::Value {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["lineage"].clone()
}

async fn jobs(env: &Env) -> Vec<String> {
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|j| j.metadata.name.unwrap())
        .collect()
}

/// The source: a Cluster with a control-plane Machine and a worker, each
/// a TerraformMachine, their Nodes in the workload cluster (the source's
/// own API server), provisioned and settled as clusterctl requires.
async fn ready_source(prefix: &str) -> (Env, CapiManager) {
    let source = setup(MANAGER, prefix, &[], &["--sync-period=10s"]).await;
    init_inventory(&source.client).await;
    let capi_source = CapiManager::start(controlplane::shared(), &source.ns).await;
    cluster(&source, "c", None, false).await;
    workload_kubeconfig(&source, "c").await;
    for (name, control_plane) in [("cp", true), ("w", false)] {
        terraform_machine(&source, name, "c", None).await;
        bootstrap(&source, &format!("{name}-boot"), "c").await;
        let options = MachineOptions {
            version: Some("1.36.3"),
            control_plane,
            failure_domain: None,
        };
        let boot = format!("{name}-boot");
        capi::create(
            &source.client,
            &source.ns,
            capi::machine(name, "c", name, &boot, &options),
        )
        .await;
    }
    for name in ["cp", "w"] {
        within(&source, 240, &format!("{name} provisioned"), || async {
            source.machine_status(name).await.filter(provisioned)
        })
        .await;
        let node = capi::node(
            &format!("{}-{name}", source.ns),
            &format!("captf-test://{}/{name}", source.ns),
        );
        Api::<Node>::all(source.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    // What clusterctl waits for: the control plane initialized, every
    // Machine with its Node, and no Job running for any object.
    capi_source
        .within(240, "the Cluster ready to move", || async {
            let initialized = field(&source, CapiKind::Cluster, "c", "/status/conditions")
                .await?
                .as_array()?
                .iter()
                .any(|c| c["type"] == "ControlPlaneInitialized" && c["status"] == "True");
            let cp = field(&source, CapiKind::Machine, "cp", "/status/nodeRef").await;
            let w = field(&source, CapiKind::Machine, "w", "/status/nodeRef").await;
            (initialized && cp.is_some() && w.is_some()).then_some(())
        })
        .await;
    within(&source, 240, "the cluster settled", || async {
        let s = source.cluster_status("c").await?;
        let cp_initialized =
            resource_input(&source, Kind::Cluster, "c", "cluster").await["control_plane_initialized"]
                == true;
        (cp_initialized && s.active_job.is_none() && provisioned(&s)).then_some(())
    })
    .await;
    (source, capi_source)
}

/// The target: the same namespace with the identity's Secret copied by
/// hand, as the README says; CAPTF and Cluster API running there.
async fn target_for(source: &Env) -> (Env, CapiManager) {
    let plane = controlplane::other();
    let client = plane.client().await;
    install_crds(&client).await;
    capi::install_crds(&client).await;
    init_inventory(&client).await;
    let target = setup_in(
        plane,
        MANAGER,
        &source.ns,
        &source.identity,
        &[],
        &["--sync-period=5s"],
    )
    .await;
    let capi_target = CapiManager::start(plane, &source.ns).await;

    (target, capi_target)
}

/// `clusterctl move` from the shared control plane to the other one, for
/// `source`'s namespace.
fn move_args(source: &Env, extra: &[&str]) -> Vec<String> {
    ["move".to_string()]
        .into_iter()
        .chain([
            format!(
                "--kubeconfig={}",
                controlplane::shared().kubeconfig().display()
            ),
            format!(
                "--to-kubeconfig={}",
                controlplane::other().kubeconfig().display()
            ),
            format!("--namespace={}", source.ns),
        ])
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioned_cluster_moves_with_its_state_and_nothing_is_applied_or_destroyed() {
    let (source, _capi_source) = ready_source("move").await;
    let source_jobs = jobs(&source).await;
    let before = captf_secrets(&source).await;
    let suffix = names::suffix(&source.ns, Kind::Cluster, "c");
    assert!(
        before.contains_key(&names::state_secret(&suffix)),
        "{:?}",
        before.keys()
    );

    let (target, _capi_target) = target_for(&source).await;
    let clusterctl = Clusterctl::with_release();
    let dry = move_args(&source, &["--dry-run", "-v", "5"]);
    let plan = clusterctl.command(&strs(&dry), &[]).output().unwrap();
    println!(
        "clusterctl move --dry-run -v 5:\n{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let real = move_args(&source, &[]);
    let started = Instant::now();
    let out = clusterctl.run(&strs(&real), &[]);
    println!("clusterctl move took {:?}:\n{out}", started.elapsed());

    // On the target: the same state, backups, inputs and mirror, the
    // objects provisioned and Ready, and no Job.
    let after = captf_secrets(&target).await;
    println!("before: {:?}\nafter: {:?}", before.keys(), after.keys());
    for (name, data) in &before {
        assert_eq!(after.get(name), Some(data), "{name} moved byte for byte");
    }
    within(&target, 240, "the moved cluster Ready", || async {
        let s = target.cluster_status("c").await?;
        let backups = s.state_backups.as_ref().map_or(0, |b| b.len());
        (provisioned(&s) && backups > 0 && condition(&s, "Ready") == Some(("True", "Ready")))
            .then_some(())
    })
    .await;
    for name in ["cp", "w"] {
        within(&target, 240, &format!("the moved {name} Ready"), || async {
            let s = target.machine_status(name).await?;
            (provisioned(&s) && condition(&s, "Ready") == Some(("True", "Ready"))).then_some(())
        })
        .await;
    }
    // Passes after the objects settled decide nothing either.
    for (kind, name) in [
        (Kind::Cluster, "c"),
        (Kind::Machine, "cp"),
        (Kind::Machine, "w"),
    ] {
        target.more_passes(kind, name, 2).await;
    }
    assert_eq!(
        jobs(&target).await,
        Vec::<String>::new(),
        "no Job on the target"
    );

    // An input change on the target applies over the moved state: the
    // serial goes on from the source's, in the same lineage.
    let moved = target.cluster_status("c").await.unwrap();
    let serial = moved.observed_state_serial.unwrap();
    let state_secret = names::state_secret(&suffix);
    let source_lineage = lineage(&before[&state_secret]["tfstate"].0);
    let target_lineage = || async {
        let s = target.secrets().get(&state_secret).await.unwrap();
        lineage(&s.data.unwrap()["tfstate"].0)
    };
    let clusters = target.api::<TerraformCluster>();
    clusters
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"note": "moved"}}})),
        )
        .await
        .unwrap();
    within(&target, 240, "the apply on the target", || async {
        let s = target.cluster_status("c").await?;
        (s.observed_state_serial == Some(serial + 1)
            && condition(&s, "ApplyJobSucceeded") == Some(("True", "ApplySucceeded")))
        .then_some(())
    })
    .await;
    assert_eq!(target_lineage().await, source_lineage);
    assert_eq!(
        resource_input(&target, Kind::Cluster, "c", "cluster").await["note"],
        "moved"
    );

    // A backup taken on the source restores on the target.
    clusters
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"captf.io/restore-state": serial.to_string()}}})),
        )
        .await
        .unwrap();
    within(&target, 240, "the restore on the target", || async {
        let s = target.cluster_status("c").await?;
        (condition(&s, "RestoreJobSucceeded") == Some(("True", "StateRestored"))).then_some(())
    })
    .await;
    assert_eq!(target_lineage().await, source_lineage);

    // On the source: no destroy, and nothing of CAPTF's left after the
    // sweep.
    assert_eq!(
        jobs(&source)
            .await
            .iter()
            .filter(|j| !source_jobs.contains(j))
            .count(),
        0
    );
    within(
        &source,
        120,
        "the source namespace empty of CAPTF",
        || async {
            let clusters = source
                .api::<TerraformCluster>()
                .list(&ListParams::default())
                .await
                .ok()?;
            let machines = source
                .api::<TerraformMachine>()
                .list(&ListParams::default())
                .await
                .ok()?;
            let secrets = captf_secrets(&source).await;
            let leases = Api::<Lease>::namespaced(source.client.clone(), &source.ns)
                .list(&ListParams::default())
                .await
                .ok()?;
            (clusters.items.is_empty()
                && machines.items.is_empty()
                && secrets.is_empty()
                && leases.items.is_empty())
            .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_waits_for_a_running_job_and_leaves_a_foreign_lock_alone() {
    let (source, _capi_source) = ready_source("movejob").await;
    // Someone else holds the worker's state lock on the source.
    let lock = put_lock(&source, "w", "alice@laptop").await;
    let (target, _capi_target) = target_for(&source).await;
    // A slow apply of the cluster is running when the move starts.
    source
        .api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"note": "slow", "sleep_seconds": 20}}})),
        )
        .await
        .unwrap();
    within(&source, 120, "the slow apply running", || async {
        let c = source.api::<TerraformCluster>().get("c").await.ok()?;
        let running = c.status.as_ref()?.workspace.active_job.is_some();
        (running && c.metadata.annotations?.contains_key(BLOCK_MOVE)).then_some(())
    })
    .await;
    let clusterctl = Clusterctl::with_release();
    let out = clusterctl
        .command(&strs(&move_args(&source, &[])), &[])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    // clusterctl saw the Job's block-move and waited for it to go.
    assert!(log.contains("Move blocked by"), "{log}");

    // The state that moved is the one the Job wrote, and the target has
    // nothing left to apply.
    within(&target, 240, "the moved cluster Ready", || async {
        let s = target.cluster_status("c").await?;
        (provisioned(&s) && condition(&s, "Ready") == Some(("True", "Ready"))).then_some(())
    })
    .await;
    assert_eq!(
        resource_input(&target, Kind::Cluster, "c", "cluster").await["note"],
        "slow"
    );
    target.more_passes(Kind::Cluster, "c", 2).await;
    assert_eq!(
        jobs(&target).await,
        Vec::<String>::new(),
        "no Job on the target"
    );

    // The foreign lock did not hold the move up, and is left as it was.
    let held = source
        .leases()
        .get(&lock.metadata.name.clone().unwrap())
        .await
        .unwrap();
    assert_eq!(
        held.spec.unwrap().holder_identity,
        lock.spec.unwrap().holder_identity
    );
}
