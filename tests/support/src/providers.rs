//! The providers `clusterctl init` installs (issue 21), in a local
//! repository as a user mirrors them: cert-manager, rendered from its Helm
//! chart (the `github.com/cert-manager/cert-manager` module's
//! `deploy/charts`); Cluster API's core, kubeadm bootstrap and kubeadm
//! control plane providers, rendered from their `config/default` in the
//! Cluster API module; each with images of the platform's binaries
//! (tests/controlplane/build.sh) pushed to the test registry; and CAPTF's
//! release artifacts.

use std::path::Path;

use crate::clusterctl::Clusterctl;
use crate::controlplane::version;
use crate::install::tool;
use crate::registry::Registry;

/// A provider of the Cluster API module.
struct CapiProvider {
    /// clusterctl's name and type.
    name: &'static str,
    type_: &'static str,
    /// The repository's folder (clusterctl's provider label).
    label: &'static str,
    components: &'static str,
    /// Its kustomization in the module.
    config: &'static str,
    /// The platform binary, and its image's name.
    program: &'static str,
    image: &'static str,
    /// The image its config names, which a release replaces.
    placeholder: &'static str,
}

const CAPI: [CapiProvider; 3] = [
    CapiProvider {
        name: "cluster-api",
        type_: "CoreProvider",
        label: "cluster-api",
        components: "core-components.yaml",
        config: "core/config/default",
        program: "capi-manager",
        image: "cluster-api-controller",
        placeholder: "gcr.io/k8s-staging-cluster-api/cluster-api-controller:main",
    },
    CapiProvider {
        name: "kubeadm",
        type_: "BootstrapProvider",
        label: "bootstrap-kubeadm",
        components: "bootstrap-components.yaml",
        config: "bootstrap/kubeadm/config/default",
        program: "capi-kubeadm-bootstrap-manager",
        image: "kubeadm-bootstrap-controller",
        placeholder: "gcr.io/k8s-staging-cluster-api/kubeadm-bootstrap-controller:main",
    },
    CapiProvider {
        name: "kubeadm",
        type_: "ControlPlaneProvider",
        label: "control-plane-kubeadm",
        components: "control-plane-components.yaml",
        config: "controlplane/kubeadm/config/default",
        program: "capi-kubeadm-control-plane-manager",
        image: "kubeadm-control-plane-controller",
        placeholder: "gcr.io/k8s-staging-cluster-api/kubeadm-control-plane-controller:main",
    },
];

/// cert-manager's namespace, and those of Cluster API's providers.
pub const NAMESPACES: [&str; 4] = [
    "cert-manager",
    "capi-system",
    "capi-kubeadm-bootstrap-system",
    "capi-kubeadm-control-plane-system",
];

/// CAPTF's release with every provider `clusterctl init` installs beside
/// it, their images pushed to `registry`.
pub fn repository(registry: &Registry) -> Clusterctl {
    let clusterctl = Clusterctl::with_release();
    let repository = clusterctl.repository();
    let module = crate::capi::module_dir();
    let capi = format!("v{}", crate::capi::version());
    let mut config = String::new();
    for p in &CAPI {
        let image = registry.program(p.program, "/manager", p.image, &capi);
        let rendered = tool(
            "kubectl",
            &["kustomize", &module.join(p.config).to_string_lossy()],
        );
        assert!(
            rendered.contains(p.placeholder),
            "{} names no {}",
            p.config,
            p.placeholder
        );
        let dir = repository.join(p.label).join(&capi);
        write(
            &dir.join(p.components),
            &rendered.replace(p.placeholder, &image.reference),
        );
        std::fs::copy(module.join("metadata.yaml"), dir.join("metadata.yaml"))
            .expect("copying Cluster API's metadata.yaml");
        config.push_str(&format!(
            "  - name: {}\n    type: {}\n    url: {}\n",
            p.name,
            p.type_,
            dir.join(p.components).display()
        ));
    }

    let cm = format!("v{}", version("CERT_MANAGER_VERSION"));
    let mut values = vec![
        "crds.enabled=true".to_string(),
        // Its Job checks what clusterctl checks itself.
        "startupapicheck.enabled=false".to_string(),
    ];
    for (component, key) in [
        ("controller", "image"),
        ("cainjector", "cainjector.image"),
        ("webhook", "webhook.image"),
    ] {
        let path = format!("/app/cmd/{component}/{component}");
        let name = format!("cert-manager-{component}");
        let image = registry.program(&name, &path, &name, &cm);
        let (repository, _) = image.reference.rsplit_once(':').expect("a tag");
        values.push(format!("{key}.repository={repository}"));
        values.push(format!("{key}.tag={cm}"));
    }
    let chart = crate::upstream::go_module(&format!("github.com/cert-manager/cert-manager@{cm}"))
        .join("deploy/charts/cert-manager");
    let kube = version("KUBERNETES_VERSION");
    let mut args = vec![
        "template".to_string(),
        "cert-manager".into(),
        chart.to_string_lossy().into_owned(),
        "--namespace=cert-manager".into(),
        format!("--kube-version={kube}"),
    ];
    for v in values {
        args.push("--set".into());
        args.push(v);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rendered = tool("helm", &args);
    let manifest = repository
        .join("cert-manager")
        .join(&cm)
        .join("cert-manager.yaml");
    // The release manifest creates its namespace; the chart leaves it to helm.
    write(
        &manifest,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cert-manager\n---\n{rendered}"
        ),
    );
    config.push_str(&format!(
        "cert-manager:\n  url: {}\n  version: {cm}\n",
        manifest.display()
    ));
    clusterctl.configure(&config);
    clusterctl
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a file in a folder")).unwrap();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
