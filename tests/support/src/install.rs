//! What the install tests share (issue 21): CAPTF installed into
//! `captf-system` of the test control plane the way a user installs it,
//! from the images of the local registry; the pod stand-in runs the
//! manager's pods contained, and a tenant namespace whose Jobs run
//! contained too, from the runner and module images of the registry.

use std::process::Command;
use std::time::Duration;

use captf::api::{
    IdentityReference, Source, TerraformCluster, TerraformClusterSpec, TerraformMachine,
    TerraformMachineSpec, WorkspaceSpec, WorkspaceStatus,
};
use captf::controllers::workload::Workload;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::json;

use crate::Executor;
use crate::controlplane::{self, ControlPlane, binary};
use crate::registry::{self, Pushed, Registry};
use crate::scenario::{applied, images, labels};

/// The namespace of the install.
pub const NAMESPACE: &str = "captf-system";
/// The label of the manager's pods.
pub const MANAGER_PODS: &str = "control-plane=captf-controller-manager";

/// What every install starts from: the manager and noop module images in
/// the registry, and the control plane with Cluster API's CRDs (a provider
/// comes after them).
pub struct Prepared {
    pub registry: &'static Registry,
    pub manager: Pushed,
    pub module: Pushed,
    pub plane: &'static ControlPlane,
    pub client: kube::Client,
}

impl Prepared {
    pub async fn new() -> Prepared {
        let registry = registry::shared();
        let manager = registry.push(registry::MANAGER);
        let module = registry.push(registry::NOOP_MODULE);
        let plane = controlplane::shared();
        let client = plane.client().await;
        crate::capi::install_crds(&client).await;
        Prepared {
            registry,
            manager,
            module,
            plane,
            client,
        }
    }

    /// The manager image's repository, without its tag.
    pub fn manager_repository(&self) -> &str {
        self.manager
            .reference
            .rsplit_once(':')
            .map_or(self.manager.reference.as_str(), |(r, _)| r)
    }
}

/// Runs `program` (a pinned tool) against the test control plane as its
/// admin; panics with its output on failure.
pub fn run(program: &str, args: &[&str]) -> String {
    let kubeconfig = format!(
        "--kubeconfig={}",
        controlplane::shared().kubeconfig().display()
    );
    tool(program, &[args, &[kubeconfig.as_str()]].concat())
}

/// Runs `program` (a pinned tool); panics with its output on failure.
pub fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(binary(program))
        .args(args)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("captf-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("captf-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("captf-helm-data"),
        )
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the pod's Ready condition is True.
pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The manager's pods, once `done` holds for them; panics with their
/// statuses after `secs`.
pub async fn manager_pods(
    client: &kube::Client,
    secs: u64,
    what: &str,
    done: impl Fn(&[Pod]) -> bool,
) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let listed = pods
            .list(&ListParams::default().labels(MANAGER_PODS))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        if done(&listed) {
            return listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            listed
                .iter()
                .map(|p| (&p.metadata.name, &p.status))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates an invalid TerraformMachine in `ns` until the webhook, reached
/// through its Service, answers: its refusal.
pub async fn webhook_refusal(client: &kube::Client, ns: &str) -> String {
    let machine: TerraformMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "TerraformMachine",
        "metadata": { "name": "invalid" },
        "spec": { "source": { "image": "Not A Reference" } },
    }))
    .expect("a TerraformMachine");
    let machines = Api::<TerraformMachine>::namespaced(client.clone(), ns);
    crate::eventually("the webhook's answer through its Service", || async {
        let refused = machines
            .create(&PostParams::default(), &machine)
            .await
            .expect_err("the webhook refuses an invalid image reference");
        let message = refused.to_string();
        // Until the EndpointSlice names the ready pod.
        (!message.contains("no endpoints available")).then_some(message)
    })
    .await
}

/// A namespace with an identity (its Secret `creds`) whose Jobs' pods run
/// contained.
pub struct Tenant {
    pub client: kube::Client,
    pub ns: String,
    pub identity: String,
    _executor: Executor,
}

impl Tenant {
    pub async fn new(client: &kube::Client, prefix: &str) -> Tenant {
        let plane = controlplane::shared();
        let ns = crate::namespace(client, prefix).await;
        let identity = format!("id-{ns}");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating the identity's Secret");
        crate::scenario::create_identity(client, &identity, &ns, &ns).await;
        let executor = Executor::start_contained(client.clone(), plane, images(), &ns).await;
        Tenant {
            client: client.clone(),
            ns,
            identity,
            _executor: executor,
        }
    }

    fn workspace(&self, image: &str) -> WorkspaceSpec {
        WorkspaceSpec {
            source: Source {
                image: image.into(),
                image_pull_policy: None,
            },
            identity_ref: Some(IdentityReference {
                name: self.identity.clone(),
            }),
            ..Default::default()
        }
    }

    /// The TerraformCluster `name` of the module `image`, with its Cluster.
    pub async fn cluster(&self, name: &str, image: &str) {
        let mut c = TerraformCluster::new(
            name,
            TerraformClusterSpec {
                workspace: self.workspace(image),
                ..Default::default()
            },
        );
        c.metadata.labels = labels(name);
        c.metadata.owner_references = Some(vec![
            crate::owners::cluster(&self.client, &self.ns, name).await,
        ]);
        Api::<TerraformCluster>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &c)
            .await
            .expect("creating a TerraformCluster");
    }

    /// The TerraformMachine `name` of the Cluster `cluster`, of the module
    /// `image`, with its Machine.
    pub async fn machine(&self, name: &str, cluster: &str, image: &str) {
        let mut m = TerraformMachine::new(
            name,
            TerraformMachineSpec {
                workspace: WorkspaceSpec {
                    identity_ref: None,
                    ..self.workspace(image)
                },
                ..Default::default()
            },
        );
        m.metadata.labels = labels(cluster);
        m.metadata.owner_references = Some(vec![
            crate::owners::machine(&self.client, &self.ns, name, cluster).await,
        ]);
        Api::<TerraformMachine>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &m)
            .await
            .expect("creating a TerraformMachine");
    }

    /// The pods of the Jobs run so far: at least one.
    pub async fn job_pods(&self) -> Vec<Pod> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels("captf.io/managed=true"))
            .await
            .expect("listing the Jobs' pods")
            .items;
        assert!(!pods.is_empty(), "no Job ran in {}", self.ns);
        pods
    }

    /// The status of the object `name` once applied; panics with what it
    /// says after `secs`.
    pub async fn applied<K: Workload>(&self, name: &str, secs: u64) -> WorkspaceStatus {
        let api = Api::<K>::namespaced(self.client.clone(), &self.ns);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let object = api.get_opt(name).await.ok().flatten();
            if let Some(status) = object
                .as_ref()
                .and_then(|o| o.workspace_status())
                .filter(|s| applied(s))
            {
                return status.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} {name} not applied: {}",
                K::KIND.kind(),
                object
                    .as_ref()
                    .map(crate::scenario::describe)
                    .unwrap_or_else(|| "gone".into())
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
