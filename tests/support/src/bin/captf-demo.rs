//! `make demo`: a local control plane, the CRDs, CAPTF's manager with its
//! webhooks, the Cluster API core manager, the local pod executor standing
//! in for kubelet, and the samples of config/samples (a Cluster with its
//! TerraformCluster, a MachineDeployment of two from a
//! TerraformMachineTemplate), applied by real OpenTofu in their Jobs. It
//! shows progress until the Cluster is provisioned and both Machines run,
//! then prints `clusterctl describe cluster`. Ctrl-C stops everything.

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use captf::api::{TerraformCluster, TerraformMachine, WorkspaceStatus};
use captf_testkit::capi::{self, CapiKind, CapiManager};
use captf_testkit::controlplane::{self, binary};
use captf_testkit::executor::{Executor, Images};
use captf_testkit::manager::{Manager, install_crds, install_runner_role};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::PostParams;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Server-side applies every document of a sample file and returns what the
/// API server stored (after the webhooks).
async fn apply_sample(client: &kube::Client, path: &Path) -> Result<Vec<DynamicObject>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let docs: Vec<DynamicObject> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut stored = Vec::new();
    for mut doc in docs {
        let types = doc
            .types
            .clone()
            .ok_or("a sample without apiVersion/kind")?;
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let (resource, caps) = pinned_kind(client, &gvk).await.map_err(|e| e.to_string())?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                doc.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let name = doc.metadata.name.clone().ok_or("a sample without a name")?;
        if types.kind == "MachineDeployment" {
            doc.data["spec"]["replicas"] = serde_json::json!(machine_count());
        }
        let params = PatchParams::apply("captf-demo").force();
        stored.push(
            api.patch(&name, &params, &Patch::Apply(&doc))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(stored)
}

/// How many Machines the demo's MachineDeployment asks for:
/// `CAPTF_DEMO_MACHINES`, else the sample's 2.
fn machine_count() -> usize {
    std::env::var("CAPTF_DEMO_MACHINES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2)
}

/// One line per change of an object's conditions, active Job or last run.
fn progress(kind: &str, name: &str, status: Option<&WorkspaceStatus>) -> Vec<String> {
    let Some(status) = status else {
        return vec![format!("{kind}/{name}: no status yet")];
    };
    let mut lines: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            format!(
                "{kind}/{name}: {}={} ({}) {}",
                c.type_, c.status, c.reason, c.message
            )
        })
        .collect();
    if let Some(job) = &status.active_job {
        lines.push(format!("{kind}/{name}: running Job {}", job.name));
    }
    if let Some(run) = &status.last_run {
        let steps: Vec<String> = run
            .steps
            .iter()
            .flatten()
            .map(|s| format!("{}={}", s.name, s.exit_code))
            .collect();
        lines.push(format!(
            "{kind}/{name}: last run {} steps [{}]",
            run.job,
            steps.join(" ")
        ));
    }
    lines
}

/// Follows the sample cluster and its machines, printing what changes,
/// until the Cluster's infrastructure is provisioned and both Machines run.
/// Cluster API needs a workload cluster to see a Machine run: the demo's is
/// the local API server itself (`demo-kubeconfig`), where a Node with each
/// machine's provider ID stands in for the node that would join.
async fn follow(client: &kube::Client, plane: &controlplane::ControlPlane) -> Result<(), String> {
    let clusters: Api<TerraformCluster> = Api::namespaced(client.clone(), "default");
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let capi_machines = capi::api(client, "default", CapiKind::Machine);
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    loop {
        let cluster = clusters.get("demo").await.map_err(|e| e.to_string())?;
        let mut lines = progress(
            "TerraformCluster",
            "demo",
            cluster.status.as_ref().map(|s| &s.workspace),
        );
        let list = machines
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        for m in &list.items {
            let name = m.metadata.name.clone().unwrap_or_default();
            lines.extend(progress(
                "TerraformMachine",
                &name,
                m.status.as_ref().map(|s| &s.workspace),
            ));
            // Its Node, once it has a provider ID.
            if let Some(id) = &m.spec.provider_id {
                if secrets
                    .get_opt("demo-kubeconfig")
                    .await
                    .map_err(|e| e.to_string())?
                    .is_none()
                {
                    println!(
                        "    creating Secret demo-kubeconfig: the workload cluster is this API server"
                    );
                    secrets
                        .create(
                            &PostParams::default(),
                            &capi::kubeconfig_secret(plane, "demo"),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                }
                if nodes
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_none()
                {
                    println!("    creating Node {name} with providerID {id}");
                    nodes
                        .create(&PostParams::default(), &capi::node(&name, id))
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        for line in lines {
            if seen.insert(line.clone(), ()).is_none() {
                println!("    {line}");
            }
        }
        let provisioned = capi::status_field(
            client,
            "default",
            CapiKind::Cluster,
            "demo",
            "initialization.infrastructureProvisioned",
        )
        .await
            == Some(serde_json::json!(true));
        let phases: Vec<String> = capi_machines
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter_map(|m| m.data.pointer("/status/phase")?.as_str().map(str::to_owned))
            .collect();
        if provisioned && phases.len() == machine_count() && phases.iter().all(|p| p == "Running") {
            let jobs = Api::<Job>::namespaced(client.clone(), "default")
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut names: Vec<String> = jobs
                .items
                .iter()
                .filter_map(|j| j.metadata.name.clone())
                .collect();
            names.sort();
            println!(
                "\n==> the Cluster is provisioned and its {} Machines run, {}s after the samples, with {} Jobs:\n    {}",
                machine_count(),
                started.elapsed().as_secs(),
                names.len(),
                names.join("\n    ")
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(
                "the samples did not come up within 10 minutes; see the managers' logs".into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `clusterctl describe cluster demo`, which reads the objects.
fn describe(plane: &controlplane::ControlPlane) -> Result<(), String> {
    let clusterctl = controlplane::bin_dir().join(format!("clusterctl-v{}", capi::version()));
    let out = std::process::Command::new(&clusterctl)
        .args([
            "describe",
            "cluster",
            "demo",
            "--namespace",
            "default",
            "--show-conditions",
            "all",
        ])
        .env("KUBECONFIG", plane.kubeconfig())
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .map_err(|e| format!("running {}: {e}", clusterctl.display()))?;
    println!(
        "==> clusterctl describe cluster demo\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    if !out.status.success() {
        return Err(format!(
            "clusterctl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

async fn demo(
    plane: &controlplane::ControlPlane,
) -> Result<(Manager, CapiManager, Executor), String> {
    let client = plane.client().await;
    println!("==> installing the CRDs, CAPTF's and Cluster API's");
    install_crds(&client).await;
    capi::install_crds(&client).await;
    println!("==> installing the runner ClusterRole (config/rbac/runner_clusterrole.yaml)");
    install_runner_role(&client).await;
    println!("==> starting the local pod executor (it runs the Jobs' pods in place of kubelet)");
    let executor = Executor::start(client.clone(), plane, Images::for_tests()).await;

    let manager_bin = std::env::var_os("CAPTF_MANAGER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/captf-manager"));
    println!("==> starting {}", manager_bin.display());
    let mut manager = Manager::start(plane, &manager_bin, &[]);
    manager.wait_ready().await;
    println!(
        "==> registering the webhooks (config/webhook) at https://127.0.0.1:{}",
        manager.webhook_port
    );
    manager.register_webhooks(&client).await;
    println!(
        "==> starting the Cluster API core manager v{}",
        capi::version()
    );
    let capi_manager = CapiManager::start_for_all_namespaces(plane).await;

    println!("==> creating Secret default/demo-credentials, which the sample identity names");
    let credentials = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("demo-credentials".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "EXAMPLE_API_TOKEN".to_string(),
            "not-a-real-token".to_string(),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &credentials)
        .await
        .map_err(|e| format!("creating the credentials Secret: {e}"))?;

    println!("==> applying config/samples: the webhooks default what nothing inherits");
    for file in ["identity.yaml", "cluster.yaml", "machinedeployment.yaml"] {
        for object in
            apply_sample(&client, &workspace_root().join("config/samples").join(file)).await?
        {
            let kind = object
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_default();
            let spec = serde_json::to_string_pretty(&object.data["spec"]).unwrap_or_default();
            println!(
                "--- {kind} {} as stored:\n{spec}",
                object.metadata.name.unwrap_or_default()
            );
        }
    }
    println!("==> Cluster API and CAPTF bring them up; progress:");
    follow(&client, plane).await?;
    describe(plane)?;
    Ok((manager, capi_manager, executor))
}

fn main() {
    println!("==> starting a local control plane (etcd, kube-apiserver, kube-controller-manager)");
    let plane = controlplane::start().unwrap_or_else(|e| {
        eprintln!("demo: {e}");
        std::process::exit(1);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building a runtime");
    let (manager, capi_manager, executor) = match runtime.block_on(demo(&plane)) {
        Ok(running) => running,
        Err(e) => {
            eprintln!("demo: {e}");
            plane.stop();
            std::process::exit(1);
        }
    };
    // `--once`: the demo's test, which needs no terminal.
    let once = std::env::args().any(|a| a == "--once");
    if !once {
        println!(
            "\n==> ready. In another terminal:\n\n    export KUBECONFIG={}\n    alias kubectl={}\n    kubectl get clusters,machines,terraformclusters,terraformmachines,jobs -A\n    kubectl explain terraformmachine.spec.jobs\n    curl -s http://127.0.0.1:{}/readyz\n\n    The manager's log: {}\n    Ctrl-C here stops the manager and the control plane.\n",
            plane.kubeconfig().display(),
            binary("kubectl").display(),
            manager.health_port,
            manager.log_path().display(),
        );
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
    }
    println!("==> stopping the managers and the executor");
    drop(manager);
    drop(capi_manager);
    runtime.block_on(executor.stop());
    println!("==> stopping the control plane");
    plane.stop();
    println!("==> stopped");
}
