//! Cluster API for the tests: its CRDs, read at test time from the Cluster
//! API module in the Go module cache.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use crate::controlplane;

/// The Cluster API module's directory (`go mod download -json`).
pub fn module_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let module = format!(
            "sigs.k8s.io/cluster-api@v{}",
            controlplane::version("CLUSTER_API_VERSION")
        );
        let out = std::process::Command::new("go")
            .args(["mod", "download", "-json", &module])
            .env("GOFLAGS", "-mod=mod")
            .current_dir(std::env::temp_dir())
            .output()
            .expect("running go mod download");
        assert!(out.status.success(), "go mod download {module} failed");
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("go mod download -json output");
        PathBuf::from(info["Dir"].as_str().expect("a module Dir"))
    })
}

/// Installs Cluster API's CRDs (`core/config/crd/bases`) and waits until
/// they serve.
pub async fn install_crds(client: &kube::Client) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("captf-testkit").force();
    let dir = module_dir().join("core/config/crd/bases");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the Cluster API CRDs") {
        let path = entry.expect("a CRD file").path();
        let text = std::fs::read_to_string(&path).expect("reading a CRD");
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect("a CRD");
        let name = crd.metadata.name.clone().expect("a named CRD");
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .expect("applying a Cluster API CRD");
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in names {
        while !api
            .get(&name)
            .await
            .ok()
            .and_then(|c| c.status?.conditions)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
        {
            assert!(
                Instant::now() < deadline,
                "CRD {name} never became established"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
