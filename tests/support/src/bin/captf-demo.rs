//! `make demo`: a local control plane, the manager against it, and (as the
//! reconcilers land) a sample cluster and machine applied by real OpenTofu.
//! Ctrl-C stops everything.

use std::path::PathBuf;
use std::process::Command;

use captf_testkit::controlplane::{self, binary, spawn_owned, terminate};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn main() {
    println!("==> starting a local control plane (etcd, kube-apiserver, kube-controller-manager)");
    let plane = match controlplane::start() {
        Ok(plane) => plane,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(1);
        }
    };
    let kubeconfig = plane.kubeconfig().display().to_string();
    let kubectl = binary("kubectl");

    let manager_bin = std::env::var_os("CAPTF_MANAGER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/captf-manager"));
    println!("==> starting {}", manager_bin.display());
    let mut manager = match spawn_owned(
        Command::new(&manager_bin)
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--health-addr=127.0.0.1:9440"),
    ) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("demo: starting {}: {e} (run `make demo`, which builds it)", manager_bin.display());
            std::process::exit(1);
        }
    };

    println!(
        "\n==> ready. In another terminal:\n\n    export KUBECONFIG={kubeconfig}\n    alias kubectl={}\n    kubectl get namespaces\n    curl -s http://127.0.0.1:9440/readyz\n\n    Ctrl-C here stops the manager and the control plane.\n",
        kubectl.display()
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a runtime");
    let exited = runtime.block_on(async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => false,
            _ = async {
                loop {
                    if matches!(manager.try_wait(), Ok(Some(_))) { break; }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            } => true,
        }
    });
    if exited {
        eprintln!("demo: the manager exited; stopping");
    }
    println!("==> stopping the manager");
    terminate(&mut manager);
    println!("==> stopping the control plane");
    plane.stop();
    println!("==> stopped");
}
