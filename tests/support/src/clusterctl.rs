//! clusterctl as a user runs it: the binary `tests/controlplane/build.sh`
//! builds, a private HOME, no version check and no network, and CAPTF's
//! release artifacts (`hack/release-manifests.sh`) as a local provider
//! repository, `infrastructure-terraform/v<version>/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::controlplane;

/// CAPTF's provider name in clusterctl (`--infrastructure terraform`).
pub const PROVIDER: &str = "terraform";

/// The release clusterctl installs: `v<captf::VERSION>`.
pub fn release() -> String {
    format!("v{}", captf::VERSION)
}

/// The built clusterctl of the pinned Cluster API release.
pub fn binary() -> PathBuf {
    let path = controlplane::bin_dir().join(format!("clusterctl-v{}", crate::capi::version()));
    assert!(
        path.exists(),
        "{} is missing: run tests/controlplane/build.sh",
        path.display()
    );
    path
}

/// A clusterctl with its own HOME and a configuration naming CAPTF's
/// local repository.
pub struct Clusterctl {
    home: tempfile::TempDir,
    /// The release folder: infrastructure-components.yaml, metadata.yaml,
    /// cluster-template.yaml.
    pub release: PathBuf,
}

impl Clusterctl {
    /// Renders the release artifacts into a local repository.
    pub fn with_release() -> Clusterctl {
        let home = tempfile::tempdir().expect("a temporary directory");
        let release = home
            .path()
            .join("repository/infrastructure-terraform")
            .join(release());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/release-manifests.sh");
        let out = Command::new(&script)
            .arg(&release)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let config = format!(
            "providers:\n  - name: {PROVIDER}\n    type: InfrastructureProvider\n    url: {}\n",
            release.join("infrastructure-components.yaml").display()
        );
        std::fs::write(home.path().join("clusterctl.yaml"), config).unwrap();
        Clusterctl { home, release }
    }

    /// The local repository: `<provider label>/<version>/` folders.
    pub fn repository(&self) -> PathBuf {
        self.home.path().join("repository")
    }

    /// Adds `text` to the configuration: provider entries (`  - name: …`)
    /// continue CAPTF's list, then top-level keys.
    pub fn configure(&self, text: &str) {
        use std::io::Write as _;
        let path = self.home.path().join("clusterctl.yaml");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        file.write_all(text.as_bytes()).unwrap();
    }

    /// Runs clusterctl with `args` and the variables `vars`; its stdout, or
    /// a panic with its stderr.
    pub fn run(&self, args: &[&str], vars: &[(&str, &str)]) -> String {
        let out = self
            .command(args, vars)
            .output()
            .expect("running clusterctl");
        assert!(
            out.status.success(),
            "clusterctl {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("clusterctl writes UTF-8")
    }

    /// The command, for a caller that reads its output as it comes.
    pub fn command(&self, args: &[&str], vars: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.arg(format!(
            "--config={}",
            self.home.path().join("clusterctl.yaml").display()
        ))
        .args(args)
        // Nothing of the test's environment steers it: no KUBECONFIG, no
        // variable a developer happens to have set.
        .env_clear()
        .env("HOME", self.home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("GOPROXY", "off")
        .envs(vars.iter().copied())
        .stdin(Stdio::null());
        cmd
    }
}

/// What `clusterctl init` leaves on a management cluster that matters to
/// `clusterctl move`, for a control plane whose Cluster API and CAPTF CRDs
/// the test kit installed: the `clusterctl.cluster.x-k8s.io` and provider
/// labels on those CRDs (move discovers kinds by the first; clusterctl's
/// own merge patch, so that the test kit's server-side applies keep it),
/// clusterctl's Provider CRD, and the inventory of both providers. The
/// controllers run as processes, not from the inventory's Deployments.
pub async fn init_inventory(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crds.list(&ListParams::default()).await.unwrap() {
        let provider = match crd.spec.group.as_str() {
            "infrastructure.cluster.x-k8s.io" => "infrastructure-terraform",
            "cluster.x-k8s.io" | "addons.cluster.x-k8s.io" | "runtime.cluster.x-k8s.io" => {
                "cluster-api"
            }
            _ => continue,
        };
        let labels = json!({"metadata": {"labels": {
            "clusterctl.cluster.x-k8s.io": "",
            "cluster.x-k8s.io/provider": provider,
        }}});
        crds.patch(
            &crd.metadata.name.unwrap(),
            &PatchParams::default(),
            &Patch::Merge(labels),
        )
        .await
        .unwrap();
    }
    let manifest = crate::capi::module_dir().join("cmd/clusterctl/config/manifest");
    crate::manager::apply_crds(client, &crate::upstream::yaml_dir(&manifest)).await;
    let gvk =
        kube::api::GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider");
    let resource = kube::api::ApiResource::from_gvk(&gvk);
    for (name, provider, kind, version, namespace) in [
        (
            "cluster-api",
            "cluster-api",
            "CoreProvider",
            format!("v{}", crate::capi::version()),
            "capi-system",
        ),
        (
            "infrastructure-terraform",
            PROVIDER,
            "InfrastructureProvider",
            release(),
            "captf-system",
        ),
    ] {
        let ns = k8s_openapi::api::core::v1::Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(namespace.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await;
        let mut object = DynamicObject::new(name, &resource).within(namespace);
        object.metadata.labels = Some(
            [
                ("clusterctl.cluster.x-k8s.io".to_string(), String::new()),
                ("cluster.x-k8s.io/provider".to_string(), name.to_string()),
            ]
            .into(),
        );
        object.data = json!({"providerName": provider, "type": kind, "version": version});
        let _ = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
            .create(&PostParams::default(), &object)
            .await;
    }
}
