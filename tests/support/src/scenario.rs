//! The reconcilers end to end, shared by their test files: a namespace
//! with an identity, the local pod executor in place of kubelet (real
//! OpenTofu in the Jobs' pods), and a manager process for that namespace
//! (`--namespace`), against the real API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use captf::api::{
    AllowedNamespaces, IdentityReference, LastRun, SecretReference, Source, TerraformCluster,
    TerraformClusterIdentity, TerraformClusterIdentitySpec, TerraformClusterSpec, TerraformMachine,
    TerraformMachineSpec, Variables, WorkspaceSpec, WorkspaceStatus,
};
use captf::controllers::workload::Workload;
use captf::names::{self, Kind};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::controlplane::{self, ControlPlane};
use crate::executor::{Executor, Image, Images};
use crate::manager::{Manager, install_crds, install_runner_role};

mod env;
mod states;
mod watches;

pub use states::*;
pub use watches::{JobsSeen, Statuses};

/// The noop module (tests/modules/noop).
pub const NOOP: &str = "captf.test/modules/noop:dev";
/// The noop module in an image whose ENV tries to steer tofu.
pub const POISONED: &str = "captf.test/modules/noop:poisoned-env";
/// A copy of the noop module that a test may change under the same
/// reference, as a module image republished under its tag would be
/// ([`Env::mutable_module`]).
pub const MUTABLE: &str = "captf.test/modules/mutable:dev";

/// One test's world.
pub struct Env {
    /// The control plane the namespace is on.
    pub plane: &'static ControlPlane,
    pub client: kube::Client,
    pub ns: String,
    /// The identity that allows `ns`; its Secret is `creds` in `ns`.
    pub identity: String,
    pub manager: Manager,
    pub executor: Executor,
    /// The manager's own namespace (its POD_NAMESPACE), where the destroys
    /// of a namespace being deleted run.
    pub away: String,
    /// The executor of `away`, once [`Env::run_away_pods`] started it.
    pub away_executor: Option<Executor>,
    binary: PathBuf,
    /// The module directory of [`MUTABLE`].
    pub mutable_module: PathBuf,
    _mutable: tempfile::TempDir,
}

/// A namespace with an identity that allows it (its Secret `creds` holds
/// `creds`), an executor and a manager (`binary`, the test crate's
/// `env!("CARGO_BIN_EXE_captf-manager")`) for that namespace, with `extra`
/// flags.
pub async fn setup(binary: &str, prefix: &str, creds: &[(&str, &str)], extra: &[&str]) -> Env {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    crate::capi::install_crds(&client).await;
    let ns = crate::namespace(&client, prefix).await;
    let identity = format!("id-{ns}");
    create_identity(&client, &identity, &ns, &ns).await;
    setup_in(controlplane::shared(), binary, &ns, &identity, creds, extra).await
}

/// [`setup`] on `plane`, in the namespace `ns` (created if missing), for
/// the identity `identity` that is left to the caller: what a namespace
/// needs once its objects arrive by a move.
pub async fn setup_in(
    plane: &'static ControlPlane,
    binary: &str,
    ns: &str,
    identity: &str,
    creds: &[(&str, &str)],
    extra: &[&str],
) -> Env {
    let client = plane.client().await;
    install_runner_role(&client).await;
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    let ns = ns.to_string();
    let identity = identity.to_string();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        string_data: Some(
            creds
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mutable = tempfile::tempdir().unwrap();
    let images = images();
    let Some(Image::Module(noop)) = images.get(NOOP) else {
        panic!("no {NOOP} image")
    };
    std::fs::copy(noop.module.join("main.tf"), mutable.path().join("main.tf")).unwrap();
    let images = images.with_module(
        MUTABLE,
        crate::executor::ModuleImage {
            module: mutable.path().to_owned(),
            ..noop
        },
    );
    let executor = Executor::start_in(client.clone(), plane, images, &ns).await;
    let away = crate::namespace(&client, &format!("{ns}-mgr")).await;
    let manager = start_manager(plane, Path::new(binary), &ns, &away, extra).await;
    Env {
        plane,
        client,
        ns,
        identity,
        manager,
        executor,
        away,
        away_executor: None,
        binary: PathBuf::from(binary),
        mutable_module: mutable.path().to_owned(),
        _mutable: mutable,
    }
}

/// The identity `name` over the Secret `creds` of `ns`, allowing only
/// `allowed`.
pub async fn create_identity(client: &kube::Client, name: &str, ns: &str, allowed: &str) {
    let id = TerraformClusterIdentity::new(
        name,
        TerraformClusterIdentitySpec {
            secret_ref: SecretReference {
                name: "creds".into(),
                namespace: ns.to_string(),
            },
            allowed_namespaces: Some(AllowedNamespaces {
                list: Some(vec![allowed.to_string()]),
                selector: None,
            }),
        },
    );
    Api::<TerraformClusterIdentity>::all(client.clone())
        .create(&PostParams::default(), &id)
        .await
        .unwrap();
}

async fn start_manager(
    plane: &'static ControlPlane,
    binary: &Path,
    ns: &str,
    away: &str,
    extra: &[&str],
) -> Manager {
    let namespace = format!("--namespace={ns}");
    let args: Vec<&str> = std::iter::once(namespace.as_str())
        .chain(extra.iter().copied())
        .collect();
    let mut manager = Manager::start_with_env(plane, binary, &args, &[("POD_NAMESPACE", away)]);
    manager.wait_ready().await;
    manager
}

/// Waits up to `secs` for `probe`; on a timeout, panics with what the
/// objects say and the manager's and executor's logs.
pub async fn within<T, F, Fut>(env: &Env, secs: u64, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() > deadline {
            let clusters = env
                .api::<TerraformCluster>()
                .list(&ListParams::default())
                .await;
            let machines = env
                .api::<TerraformMachine>()
                .list(&ListParams::default())
                .await;
            let statuses: Vec<String> = clusters
                .into_iter()
                .flat_map(|l| l.items.into_iter().map(|c| describe(&c)))
                .chain(
                    machines
                        .into_iter()
                        .flat_map(|l| l.items.into_iter().map(|m| describe(&m))),
                )
                .collect();
            panic!(
                "timed out after {secs}s waiting for {what}\n--- objects:\n{}{}",
                statuses.join("\n"),
                env.context()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An object's deletion, finalizers and conditions, one line each.
pub fn describe<K: Workload>(object: &K) -> String {
    let name = object.name_any();
    let deleting = object
        .meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| format!(" (deleting since {})", t.0))
        .unwrap_or_default();
    let header = format!(
        "{} {name}{deleting}, finalizers {:?}",
        K::KIND.kind(),
        object.finalizers()
    );
    let Some(status) = object.workspace_status() else {
        return format!("{header}: no status");
    };
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("  {}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "{header}:\n{}\n  lastRun: {:?}",
        conditions.join("\n"),
        status.last_run
    )
}

/// The last 60 lines of a log.
pub fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The test images, plus the noop module in an image whose ENV tries to
/// steer tofu ([`POISONED`]), and those of the test process's registry
/// once it runs ([`crate::registry::shared`]).
pub fn images() -> Images {
    let mut images = Images::for_tests();
    if let Some(registry) = crate::registry::started() {
        images = images.with_registry(registry.host());
    }
    let Some(Image::Module(noop)) = images.get(NOOP) else {
        panic!("no {NOOP} image")
    };
    let mut poisoned = noop.clone();
    poisoned.env = [
        ("TF_WORKSPACE", "poisoned"),
        ("TF_CLI_ARGS", "-poisoned-flag"),
        ("TF_VAR_message", "poisoned"),
        ("KUBE_CONFIG_PATH", "/poisoned"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec();
    images.with_module(POISONED, poisoned)
}

pub fn vars(pairs: &[(&str, serde_json::Value)]) -> Option<Variables> {
    let map: serde_json::Map<_, _> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Some(serde_json::from_value(map.into()).expect("an object is variables"))
}

/// The cluster-name label of the objects of `cluster`.
pub fn labels(cluster: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        "cluster.x-k8s.io/cluster-name".to_string(),
        cluster.to_string(),
    )]))
}

/// A workspace of the noop module with `variables`.
pub fn noop(variables: Option<Variables>) -> WorkspaceSpec {
    WorkspaceSpec {
        source: Source {
            image: NOOP.into(),
            image_pull_policy: None,
        },
        variables,
        ..Default::default()
    }
}

/// The finalizer of a kind, `<kind, lowercase>.infrastructure.cluster.x-k8s.io`.
pub fn finalizer(kind: Kind) -> String {
    format!(
        "{}.infrastructure.cluster.x-k8s.io",
        kind.kind().to_lowercase()
    )
}

/// The condition `type_` as (status, reason).
pub fn condition<'a>(status: &'a WorkspaceStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// The message of the condition `type_`.
pub fn condition_message<'a>(status: &'a WorkspaceStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.as_str())
}

pub fn applied(status: &WorkspaceStatus) -> bool {
    condition(status, "ApplyJobSucceeded") == Some(("True", "ApplySucceeded"))
        && condition(status, "StateReadable") == Some(("True", "StateRead"))
}

/// The names of the steps of a run.
pub fn steps(run: &LastRun) -> Vec<&str> {
    run.steps
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect()
}

pub fn job_failed(job: &Job) -> bool {
    failed_at(job).is_some()
}

/// When a Job failed: its Failed condition's transition.
pub fn failed_at(job: &Job) -> Option<Timestamp> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    let failed = conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")?;
    failed.last_transition_time.as_ref().map(|t| t.0)
}
