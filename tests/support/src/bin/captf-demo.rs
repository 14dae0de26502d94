//! `make demo`: a local control plane, the CRDs, the manager with its
//! webhooks, and the sample objects of config/samples (later issues add the
//! reconcilers that apply them with real OpenTofu). Ctrl-C stops everything.

use std::path::{Path, PathBuf};

use captf_testkit::controlplane::{self, binary};
use captf_testkit::manager::{Manager, install_crds};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use kube::core::GroupVersionKind;

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
    for doc in docs {
        let types = doc.types.clone().ok_or("a sample without apiVersion/kind")?;
        let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
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
        let params = PatchParams::apply("captf-demo").force();
        stored.push(api.patch(&name, &params, &Patch::Apply(&doc)).await.map_err(|e| e.to_string())?);
    }
    Ok(stored)
}

async fn demo(plane: &controlplane::ControlPlane) -> Result<Manager, String> {
    let client = plane.client().await;
    println!("==> installing the CRDs");
    install_crds(&client).await;

    let manager_bin = std::env::var_os("CAPTF_MANAGER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/captf-manager"));
    println!("==> starting {}", manager_bin.display());
    let mut manager = Manager::start(plane, &manager_bin, &[]);
    manager.wait_ready().await;
    println!("==> registering the webhooks (config/webhook) at https://127.0.0.1:{}", manager.webhook_port);
    manager.register_webhooks(&client).await;

    println!("==> applying config/samples: the webhooks default what nothing inherits");
    for file in ["identity.yaml", "cluster.yaml", "machine.yaml"] {
        for object in apply_sample(&client, &workspace_root().join("config/samples").join(file)).await? {
            let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
            let spec = serde_json::to_string_pretty(&object.data["spec"]).unwrap_or_default();
            println!("--- {kind} {} as stored:\n{spec}", object.metadata.name.unwrap_or_default());
        }
    }
    Ok(manager)
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
    let manager = match runtime.block_on(demo(&plane)) {
        Ok(manager) => manager,
        Err(e) => {
            eprintln!("demo: {e}");
            plane.stop();
            std::process::exit(1);
        }
    };
    println!(
        "\n==> ready. In another terminal:\n\n    export KUBECONFIG={}\n    alias kubectl={}\n    kubectl get terraformclusters,terraformmachines -A\n    kubectl explain terraformmachine.spec.jobs\n    curl -s http://127.0.0.1:{}/readyz\n\n    The manager's log: {}\n    Ctrl-C here stops the manager and the control plane.\n",
        plane.kubeconfig().display(),
        binary("kubectl").display(),
        manager.health_port,
        manager.log_path().display(),
    );
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    println!("==> stopping the manager");
    drop(manager);
    println!("==> stopping the control plane");
    plane.stop();
    println!("==> stopped");
}
