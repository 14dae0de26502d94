//! The namespace RBAC sweep against the real API server: an empty namespace
//! loses exactly its managed ServiceAccounts, RoleBindings and Leases; a
//! namespace with workloads keeps them and has its runner RoleBinding pruned
//! to the accounts in use, cluster defaults included; --namespace limits the
//! sweep.

use std::collections::{BTreeMap, BTreeSet};

use captf::api::{
    ClusterDefaults, JobPolicy, Source, TerraformCluster, TerraformClusterSpec, TerraformMachine,
    TerraformMachineSpec, TerraformMachineTemplate, TerraformMachineTemplateResource,
    TerraformMachineTemplateSpec, WorkspaceSpec,
};
use captf::controllers::sweep::{self, Swept};
use captf::controllers::watches::{self, Scope, Watches, Workloads};
use captf::jobs::leases::{self, LeaseRequest};
use captf::jobs::{self, rbac};
use captf::keys;
use captf::names::{self, Kind, Op};
use captf_testkit::controlplane;
use captf_testkit::manager::install_crds;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Client, Resource};
use std::sync::Arc;
use tokio::sync::RwLock;

/// Held for reading by every test that sweeps one namespace, for writing by
/// the test that sweeps all of them (which would sweep the others' too).
static ALL_NAMESPACES: RwLock<()> = RwLock::const_new(());

const IMAGE: &str = "example.invalid/module:1";

mod scope;

async fn setup(prefix: &str) -> (Client, String) {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, prefix).await;
    (client, ns)
}

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..Default::default()
    }
}

async fn create<K>(client: &Client, ns: &str, object: &K) -> K
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), object)
        .await
        .unwrap()
}

async fn exists<K>(client: &Client, ns: &str, name: &str) -> bool
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn cluster_labels(cluster: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        keys::CLUSTER_NAME_LABEL.to_owned(),
        cluster.to_owned(),
    )]))
}

fn workspace(account: Option<&str>) -> WorkspaceSpec {
    WorkspaceSpec {
        source: Source {
            image: IMAGE.into(),
            image_pull_policy: None,
        },
        jobs: account.map(|a| JobPolicy {
            service_account_name: Some(a.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A TerraformCluster labelled for `name` whose machines default to the
/// account `default`.
async fn terraform_cluster(client: &Client, ns: &str, name: &str, default: Option<&str>) {
    let mut cluster = TerraformCluster::new(
        name,
        TerraformClusterSpec {
            workspace: workspace(None),
            defaults: default.map(|d| ClusterDefaults {
                jobs: Some(JobPolicy {
                    service_account_name: Some(d.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    cluster.metadata.labels = cluster_labels(name);
    create(client, ns, &cluster).await;
}

async fn machine(client: &Client, ns: &str, name: &str, cluster: &str, account: Option<&str>) {
    let mut machine = TerraformMachine::new(
        name,
        TerraformMachineSpec {
            workspace: workspace(account),
            ..Default::default()
        },
    );
    machine.metadata.labels = cluster_labels(cluster);
    create(client, ns, &machine).await;
}

/// The managed runner RoleBinding of `ns` for `accounts`.
async fn binding(client: &Client, ns: &str, accounts: &[&str]) {
    create(client, ns, &rbac::role_binding(ns, &set(accounts))).await;
}

/// The accounts bound by the RoleBinding `name` of `ns`, in order.
async fn subjects(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// A user's RoleBinding `name`, as the sweep must leave it.
fn user_binding(ns: &str, name: &str, labels: &[(&str, &str)], accounts: &[&str]) -> RoleBinding {
    RoleBinding {
        metadata: meta(name, labels),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: names::RUNNER_RBAC.into(),
        },
        subjects: Some(
            accounts
                .iter()
                .map(|a| Subject {
                    kind: "ServiceAccount".into(),
                    name: (*a).into(),
                    namespace: Some(ns.into()),
                    api_group: None,
                })
                .collect(),
        ),
    }
}

fn lease_request<'a>(ns: &'a str, name: &'a str) -> LeaseRequest<'a> {
    LeaseRequest {
        kind: Kind::Machine,
        namespace: ns,
        name,
        cluster_name: Some("prod"),
        op: Op::Destroy,
        job: "captf-m-gone-destroy-a1-abcdef",
        now: Timestamp::now(),
    }
}

fn deleted(kind: &str, name: &str) -> (String, String) {
    (kind.into(), name.into())
}

#[tokio::test]
async fn an_empty_namespace_loses_only_its_managed_objects() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-empty").await;
    let managed = [(keys::MANAGED_LABEL, "true")];

    // What CAPTF left behind: the runner account and binding, the run and
    // cluster leases, and the backend's lock Lease with its labels.
    create(&client, &ns, &rbac::service_account(&ns)).await;
    binding(&client, &ns, &["captf-runner", "builder"]).await;
    let req = lease_request(&ns, "gone");
    let run = leases::run_lease(&req);
    let cluster = leases::cluster_write_lease(&req).unwrap();
    create(&client, &ns, &run).await;
    create(&client, &ns, &cluster).await;
    let suffix = names::suffix(&ns, Kind::Machine, "gone");
    let mut lock_labels = jobs::owner_labels(Kind::Machine, "gone", Some("prod"));
    lock_labels.insert(keys::MOVE_LABEL.into(), String::new());
    let lock = Lease {
        metadata: ObjectMeta {
            name: Some(names::state_lock_lease(&suffix)),
            labels: Some(lock_labels),
            ..Default::default()
        },
        spec: None,
    };
    create(&client, &ns, &lock).await;
    // A managed account of another name is the sweep's too.
    create(
        &client,
        &ns,
        &ServiceAccount {
            metadata: meta("captf-extra", &managed),
            ..Default::default()
        },
    )
    .await;

    // The user's: unlabelled, or labelled anything but managed=true.
    let not_managed = [(keys::MANAGED_LABEL, "false")];
    create(
        &client,
        &ns,
        &ServiceAccount {
            metadata: meta("builder", &[(keys::RUNNER_LABEL, "true")]),
            ..Default::default()
        },
    )
    .await;
    create(
        &client,
        &ns,
        &ServiceAccount {
            metadata: meta("other", &not_managed),
            ..Default::default()
        },
    )
    .await;
    create(
        &client,
        &ns,
        &user_binding(&ns, "user-binding", &[], &["builder"]),
    )
    .await;
    create(
        &client,
        &ns,
        &Lease {
            metadata: meta("lock-tfstate-default-someone-else", &[]),
            spec: None,
        },
    )
    .await;
    create(
        &client,
        &ns,
        &Lease {
            metadata: meta("user-lease", &not_managed),
            spec: None,
        },
    )
    .await;
    // A template does not keep a namespace.
    create(
        &client,
        &ns,
        &TerraformMachineTemplate::new(
            "tmpl",
            TerraformMachineTemplateSpec {
                template: TerraformMachineTemplateResource {
                    metadata: None,
                    spec: TerraformMachineSpec {
                        workspace: workspace(None),
                        ..Default::default()
                    },
                },
            },
        ),
    )
    .await;

    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    let mut got = swept.deleted.clone();
    got.sort();
    let mut want = vec![
        deleted("ServiceAccount", "captf-runner"),
        deleted("ServiceAccount", "captf-extra"),
        deleted("RoleBinding", "captf-runner"),
        deleted("Lease", run.metadata.name.as_deref().unwrap()),
        deleted("Lease", cluster.metadata.name.as_deref().unwrap()),
        deleted("Lease", &names::state_lock_lease(&suffix)),
    ];
    want.sort();
    assert_eq!(got, want);
    assert!(swept.pruned.is_empty(), "{swept:?}");

    for name in ["captf-runner", "captf-extra"] {
        assert!(
            !exists::<ServiceAccount>(&client, &ns, name).await,
            "{name}"
        );
    }
    assert!(!exists::<RoleBinding>(&client, &ns, "captf-runner").await);
    for (_, name) in want.iter().filter(|(kind, _)| kind == "Lease") {
        assert!(!exists::<Lease>(&client, &ns, name).await, "{name}");
    }
    for name in ["builder", "other"] {
        assert!(exists::<ServiceAccount>(&client, &ns, name).await, "{name}");
    }
    assert_eq!(
        subjects(&client, &ns, "user-binding").await,
        ["builder"],
        "the user's binding is untouched"
    );
    for name in ["lock-tfstate-default-someone-else", "user-lease"] {
        assert!(exists::<Lease>(&client, &ns, name).await, "{name}");
    }
    assert!(exists::<TerraformMachineTemplate>(&client, &ns, "tmpl").await);

    // Nothing is left to do.
    assert_eq!(
        sweep::sweep(&client, &ns, None).await.unwrap(),
        Swept::default()
    );
}

#[tokio::test]
async fn subjects_no_object_uses_are_pruned() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-prune").await;
    terraform_cluster(&client, &ns, "prod", None).await;
    machine(&client, &ns, "m", "prod", None).await;
    create(&client, &ns, &rbac::service_account(&ns)).await;
    create(
        &client,
        &ns,
        &ServiceAccount {
            metadata: meta("builder", &[(keys::RUNNER_LABEL, "true")]),
            ..Default::default()
        },
    )
    .await;
    binding(&client, &ns, &["builder", "captf-runner"]).await;
    let run = leases::run_lease(&lease_request(&ns, "m"));
    create(&client, &ns, &run).await;

    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            deleted: vec![],
            pruned: vec!["builder".into()],
            released: vec![],
        }
    );
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["captf-runner"]
    );
    for name in ["captf-runner", "builder"] {
        assert!(exists::<ServiceAccount>(&client, &ns, name).await, "{name}");
    }
    assert!(exists::<Lease>(&client, &ns, run.metadata.name.as_deref().unwrap()).await);
    assert_eq!(
        sweep::sweep(&client, &ns, None).await.unwrap(),
        Swept::default()
    );

    // An override comes back into use: the sweep keeps it.
    // The binding is protected: it goes once unprotected.
    captf::protection::unprotect_and_delete(
        &Api::<RoleBinding>::namespaced(client.clone(), &ns),
        "captf-runner",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    binding(&client, &ns, &["builder", "captf-runner"]).await;
    machine(&client, &ns, "m2", "prod", Some("builder")).await;
    assert_eq!(
        sweep::sweep(&client, &ns, None).await.unwrap(),
        Swept::default()
    );
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["builder", "captf-runner"]
    );
}

#[tokio::test]
async fn a_cluster_default_account_is_kept() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-defaults").await;
    terraform_cluster(&client, &ns, "prod", Some("deployer")).await;
    machine(&client, &ns, "m", "prod", None).await;
    binding(&client, &ns, &["builder", "captf-runner", "deployer"]).await;

    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    assert_eq!(swept.pruned, ["builder"]);
    assert!(swept.deleted.is_empty(), "{swept:?}");
    // The machine runs as the default; the cluster itself as captf-runner.
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["captf-runner", "deployer"]
    );
}

#[tokio::test]
async fn a_missing_cluster_keeps_every_default() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-unresolved").await;
    terraform_cluster(&client, &ns, "a", Some("deployer")).await;
    terraform_cluster(&client, &ns, "b", Some("other-deployer")).await;
    machine(&client, &ns, "m", "missing", None).await;
    binding(
        &client,
        &ns,
        &["builder", "captf-runner", "deployer", "other-deployer"],
    )
    .await;

    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    assert_eq!(swept.pruned, ["builder"]);
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["captf-runner", "deployer", "other-deployer"]
    );

    // Once its cluster is found (with no defaults), only captf-runner is
    // in use.
    terraform_cluster(&client, &ns, "missing", None).await;
    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    assert_eq!(swept.pruned, ["deployer", "other-deployer"]);
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["captf-runner"]
    );
}

#[tokio::test]
async fn an_object_being_deleted_keeps_the_namespace() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-deleting").await;
    let mut held = TerraformMachine::new(
        "m",
        TerraformMachineSpec {
            workspace: workspace(None),
            ..Default::default()
        },
    );
    held.metadata.labels = cluster_labels("prod");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create(&client, &ns, &held).await;
    let machines = Api::<TerraformMachine>::namespaced(client.clone(), &ns);
    machines
        .delete("m", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        machines
            .get("m")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    create(&client, &ns, &rbac::service_account(&ns)).await;
    binding(&client, &ns, &["captf-runner"]).await;

    assert_eq!(
        sweep::sweep(&client, &ns, None).await.unwrap(),
        Swept::default()
    );
    assert!(exists::<ServiceAccount>(&client, &ns, "captf-runner").await);
    assert!(exists::<RoleBinding>(&client, &ns, "captf-runner").await);
}

#[tokio::test]
async fn an_unmanaged_runner_binding_is_never_pruned() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-unmanaged").await;
    machine(&client, &ns, "m", "prod", None).await;
    let theirs = user_binding(&ns, "captf-runner", &[], &["builder", "captf-runner"]);
    create(&client, &ns, &theirs).await;

    assert_eq!(
        sweep::sweep(&client, &ns, None).await.unwrap(),
        Swept::default()
    );
    assert_eq!(
        subjects(&client, &ns, "captf-runner").await,
        ["builder", "captf-runner"]
    );
}
