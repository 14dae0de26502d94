//! Deleting a namespace (issue: it must never orphan applied
//! infrastructure): the namespace controller deletes every Secret beside
//! the objects, but what a destroy needs is protected; an applied object
//! is destroyed from the manager's namespace, or, when that cannot be,
//! held, never cleaned up as if it had never been applied. Each test has
//! its own namespace, manager and executor.

use captf::api::{TerraformCluster, TerraformMachine};
use captf::names::{self, Kind};
use captf::state::{self, StateReadable};
use captf_testkit::scenario::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

fn held_on_namespace(env: &Env, status: &captf::api::WorkspaceStatus) -> bool {
    condition(status, "Deleting") == Some(("True", "DeletionHeld"))
        && condition_message(status, "Deleting")
            .is_some_and(|m| m.contains(&format!("namespace {} is being deleted", env.ns)))
}

async fn delete_namespace(env: &Env) {
    Api::<Namespace>::all(env.client.clone())
        .delete(&env.ns, &DeleteParams::default())
        .await
        .unwrap();
}

async fn namespace_gone(env: &Env) -> bool {
    Api::<Namespace>::all(env.client.clone())
        .get_opt(&env.ns)
        .await
        .unwrap()
        .is_none()
}

/// The state of `kind`/`name` reads whole, and at least one backup of it
/// is left.
async fn state_kept(env: &Env, kind: Kind, name: &str) {
    let suffix = names::suffix(&env.ns, kind, name);
    let snapshot = state::snapshot(&env.secrets(), &suffix).await.unwrap();
    assert!(
        matches!(snapshot.readable, StateReadable::Read(_)),
        "{kind:?} {name}: {:?}",
        snapshot.readable.reason()
    );
    assert!(
        !env.backup_secrets(&suffix).await.is_empty(),
        "{kind:?} {name}: no backup left"
    );
}

async fn abandon<K: captf::controllers::workload::Workload>(env: &Env, name: &str) {
    let uid = env.api::<K>().get(name).await.unwrap().uid().unwrap();
    env.api::<K>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"captf.io/abandon-infrastructure": uid}}}),
            ),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_destroys_applied_objects_from_the_managers_namespace() {
    let mut env = setup(
        MANAGER,
        "ns-delete",
        &[("API_TOKEN", "t0ken-away")],
        &["--sync-period=3s"],
    )
    .await;
    env.run_away_pods().await;
    let marks = tempfile::tempdir().unwrap();
    let mark = |name: &str| marks.path().join(name);
    let marker = |name: &str| vars(&[("destroy_marker", json!(mark(name).to_str().unwrap()))]);
    env.cluster("c", NOOP, marker("c")).await;
    env.machine("m1", "c", marker("m1")).await;
    env.machine("m2", "c", marker("m2")).await;
    for m in ["m1", "m2"] {
        applied_and_backed_up::<TerraformMachine>(&env, m, 1).await;
    }
    applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let home = JobsSeen::watch(&env);
    let away = JobsSeen::watch_in(&env, &env.away.clone());

    delete_namespace(&env).await;
    // A manager restarted in the middle, once the first destroy started,
    // comes to the same end.
    within(&env, 60, "a machine's destroy started", || async {
        (!away.destroys(Kind::Machine, "m1").is_empty()
            || !away.destroys(Kind::Machine, "m2").is_empty())
        .then_some(())
    })
    .await;
    env.restart_manager(&["--sync-period=3s"]).await;
    within(&env, 240, "the namespace gone", || async {
        namespace_gone(&env).await.then_some(())
    })
    .await;
    // Each object was destroyed (its module's destroy-time provisioner
    // ran), from the manager's namespace, before its finalizer went.
    for (kind, name) in [
        (Kind::Machine, "m1"),
        (Kind::Machine, "m2"),
        (Kind::Cluster, "c"),
    ] {
        // With the identity's credentials, copied beside the Job.
        assert_eq!(
            std::fs::read_to_string(mark(name)).ok().as_deref(),
            Some("t0ken-away"),
            "{name} was not destroyed with its credentials"
        );
        assert!(!away.destroys(kind, name).is_empty(), "{kind:?} {name}");
        assert!(home.destroys(kind, name).is_empty(), "{kind:?} {name}");
    }
    // The machines went before the cluster.
    let first = |kind, name| away.destroys(kind, name)[0].1;
    assert!(first(Kind::Cluster, "c") >= first(Kind::Machine, "m1"));
    assert!(first(Kind::Cluster, "c") >= first(Kind::Machine, "m2"));
    let log = env.manager.log();
    assert!(!log.contains("deleted (never applied)"), "{log}");
    assert!(!log.contains("deleted (abandoned)"), "{log}");
    // Nothing is left in the manager's namespace: the Jobs (with their
    // pods and Secrets) and the namespace's runner account are swept.
    let away_ns = env.away.clone();
    within(&env, 60, "the manager's namespace swept", || async {
        let jobs = Api::<Job>::namespaced(env.client.clone(), &away_ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let accounts = Api::<ServiceAccount>::namespaced(env.client.clone(), &away_ns)
            .get_opt(&names::away_runner(&env.ns))
            .await
            .unwrap();
        let secrets = Api::<Secret>::namespaced(env.client.clone(), &away_ns)
            .list(&ListParams::default().labels("captf.io/managed=true"))
            .await
            .unwrap();
        (jobs.items.is_empty() && accounts.is_none() && secrets.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_runner_binding_a_deleted_namespace_holds_applied_objects_until_abandoned() {
    let mut env = setup(MANAGER, "ns-held", &[], &["--sync-period=3s"]).await;
    env.cluster("c", NOOP, None).await;
    env.machine("m1", "c", None).await;
    env.machine("m2", "c", None).await;
    for m in ["m1", "m2"] {
        applied_and_backed_up::<TerraformMachine>(&env, m, 1).await;
    }
    applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let jobs = JobsSeen::watch(&env);
    let away = JobsSeen::watch_in(&env, &env.away.clone());
    // As a binding made before it was protected, which the namespace
    // deletion takes: no destroy can run from the manager's namespace.
    let bindings = Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns);
    let binding = bindings.get("captf-runner").await.unwrap();
    assert!(
        binding
            .finalizers()
            .iter()
            .any(|f| f == "captf.io/protection")
    );
    bindings
        .patch(
            "captf-runner",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    // Gone before the namespace deletion, which would take it only a
    // moment after the objects' first deleting pass.
    bindings
        .delete("captf-runner", &DeleteParams::default())
        .await
        .unwrap();

    delete_namespace(&env).await;
    for m in ["m1", "m2"] {
        within(&env, 60, "the machine held on the namespace", || async {
            env.machine_status(m).await.filter(|s| {
                held_on_namespace(&env, s)
                    && condition_message(s, "Deleting")
                        .is_some_and(|m| m.contains("RoleBinding captf-runner is gone"))
            })
        })
        .await;
    }
    let c = within(&env, 30, "the cluster waiting for its machines", || async {
        env.cluster_status("c")
            .await
            .filter(|s| condition(s, "DeletionBlocked") == Some(("True", "DependentsExist")))
    })
    .await;
    assert_eq!(condition(&c, "Deleting").map(|(s, _)| s), Some("True"));
    // The namespace controller has had its go at the Secrets: the
    // identity's own, which nothing protects, is gone.
    within(&env, 60, "the unprotected creds Secret deleted", || async {
        env.secrets()
            .get_opt("creds")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    for (kind, name) in [
        (Kind::Machine, "m1"),
        (Kind::Machine, "m2"),
        (Kind::Cluster, "c"),
    ] {
        state_kept(&env, kind, name).await;
    }

    // A restarted manager comes to the same holds.
    env.restart_manager(&["--sync-period=3s"]).await;
    for m in ["m1", "m2"] {
        env.more_passes(Kind::Machine, m, 1).await;
    }
    for m in ["m1", "m2"] {
        let s = env.machine_status(m).await.unwrap();
        assert!(held_on_namespace(&env, &s), "{m}: {}", env.context());
        assert!(!env.finalizers::<TerraformMachine>(m).await.is_empty());
        state_kept(&env, Kind::Machine, m).await;
    }

    for m in ["m1", "m2"] {
        abandon::<TerraformMachine>(&env, m).await;
    }
    within(&env, 60, "the cluster held on the namespace", || async {
        env.cluster_status("c")
            .await
            .filter(|s| held_on_namespace(&env, s))
    })
    .await;
    state_kept(&env, Kind::Cluster, "c").await;
    abandon::<TerraformCluster>(&env, "c").await;
    within(&env, 120, "the namespace gone", || async {
        namespace_gone(&env).await.then_some(())
    })
    .await;
    // No finalizer went without a destroy or an abandon, and no destroy
    // was even tried.
    let log = env.manager.log();
    assert!(!log.contains("deleted (never applied)"), "{log}");
    assert!(!log.contains("deleted (destroyed)"));
    for kind in [Kind::Machine, Kind::Cluster] {
        for name in ["m1", "m2", "c"] {
            assert!(jobs.destroys(kind, name).is_empty(), "{kind:?} {name}");
            assert!(away.destroys(kind, name).is_empty(), "{kind:?} {name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_never_applied_objects_goes_at_once() {
    let env = setup(MANAGER, "ns-never", &[], &["--sync-period=3s"]).await;
    // The identity does not allow the namespace: nothing is ever applied.
    env.identity_allowing("ns-never-elsewhere", "elsewhere")
        .await;
    let workspace = |identity: &str| captf::api::WorkspaceSpec {
        identity_ref: Some(captf::api::IdentityReference {
            name: identity.into(),
        }),
        ..noop(None)
    };
    env.create_cluster("c", workspace("ns-never-elsewhere"))
        .await;
    for m in ["m1", "m2"] {
        env.create_machine(m, "c", workspace("ns-never-elsewhere"))
            .await;
    }
    within(&env, 30, "the finalizers added", || async {
        let c = env.finalizers::<TerraformCluster>("c").await;
        let m = env.finalizers::<TerraformMachine>("m2").await;
        (!c.is_empty() && !m.is_empty()).then_some(())
    })
    .await;
    delete_namespace(&env).await;
    within(&env, 60, "the namespace gone", || async {
        namespace_gone(&env).await.then_some(())
    })
    .await;
    assert!(env.manager.log().contains("deleted (never applied)"));
}

/// What a namespace deletion would take is protected from a plain delete
/// too, and let go once its object is cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_and_its_backups_are_protected_until_cleanup() {
    let env = setup(MANAGER, "ns-protect", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let mut protected = vec![
        names::state_secret(&suffix),
        names::inputs_secret(Kind::Cluster, "c"),
        format!("captf-creds-{}", env.identity),
    ];
    protected.extend(env.backup_secrets(&suffix).await);
    for name in &protected {
        let secret = env.secrets().get(name).await.unwrap();
        assert!(
            secret
                .finalizers()
                .iter()
                .any(|f| f == "captf.io/protection"),
            "{name}: {:?}",
            secret.finalizers()
        );
    }
    let lock = env
        .leases()
        .get(&names::state_lock_lease(&suffix))
        .await
        .unwrap();
    assert!(lock.finalizers().iter().any(|f| f == "captf.io/protection"));

    // Deleted by hand, the state stays readable.
    env.secrets()
        .delete(&names::state_secret(&suffix), &DeleteParams::default())
        .await
        .unwrap();
    let base = env
        .secrets()
        .get(&names::state_secret(&suffix))
        .await
        .unwrap();
    assert!(base.meta().deletion_timestamp.is_some());
    let snapshot = state::snapshot(&env.secrets(), &suffix).await.unwrap();
    assert!(matches!(snapshot.readable, StateReadable::Read(_)));

    // The object's deletion destroys and cleans up; nothing is left behind.
    env.delete::<TerraformCluster>("c").await;
    env.wait_gone::<TerraformCluster>(240, "c").await;
    within(&env, 60, "every protected object gone", || async {
        for name in &protected {
            if env.secrets().get_opt(name).await.unwrap().is_some() {
                return None;
            }
        }
        env.leases()
            .get_opt(&names::state_lock_lease(&suffix))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// The bounded version of `cargo bench --bench namespace_deletion`: a
/// namespace of a hundred never-applied machines goes (each finalizer
/// removal asks for a sweep; the asks of a moment sweep the namespace
/// once). The time is a liveness bound, not a figure: the bench measures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_a_hundred_never_applied_machines_goes() {
    let env = setup(MANAGER, "ns-many", &[], &[]).await;
    env.identity_allowing("ns-many-elsewhere", "elsewhere")
        .await;
    many_machines(&env.client, &env.ns, 100, "ns-many-elsewhere").await;
    within(&env, 120, "every machine finalized", || async {
        let listed = env
            .api::<TerraformMachine>()
            .list(&Default::default())
            .await
            .ok()?;
        listed
            .items
            .iter()
            .all(|m| !m.finalizers().is_empty())
            .then_some(())
    })
    .await;
    delete_namespace(&env).await;
    within(&env, 120, "the namespace gone", || async {
        namespace_gone(&env).await.then_some(())
    })
    .await;
    let log = env.manager.log();
    assert_eq!(log.matches("deleted (never applied)").count(), 100);
    // A sweep per moment, not per object.
    let sweeps = log.matches("namespace sweep").count();
    assert!(sweeps < 50, "{sweeps} sweeps for 100 removals");
}
