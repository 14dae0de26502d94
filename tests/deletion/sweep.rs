//! The namespace sweep, and a manager killed mid-cleanup.

use super::*;

#[tokio::test]
async fn the_sweep_clears_an_empty_namespace_and_leaves_a_busy_one() {
    let env = setup(MANAGER, "del-sweep", &[], &[]).await;
    applied_pair(&env, None).await;
    let accounts = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns);
    let bindings = Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns);
    let managed = ListParams::default().labels("captf.io/managed=true");
    assert!(
        accounts
            .get_opt(names::RUNNER_RBAC)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        bindings
            .get_opt(names::RUNNER_RBAC)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        !env.leases().list(&managed).await.unwrap().items.is_empty(),
        "no managed Lease to sweep"
    );

    env.delete::<TerraformMachine>("m").await;
    env.delete::<TerraformCluster>("c").await;
    env.wait_gone::<TerraformMachine>(240, "m").await;
    env.wait_gone::<TerraformCluster>(300, "c").await;
    within(&env, 30, "the namespace swept", || async {
        let account = accounts.get_opt(names::RUNNER_RBAC).await.unwrap();
        let binding = bindings.get_opt(names::RUNNER_RBAC).await.unwrap();
        let leases = env.leases().list(&managed).await.unwrap().items;
        (account.is_none() && binding.is_none() && leases.is_empty()).then_some(())
    })
    .await;
    // The cluster was the mirror's last user.
    once(&env, "MirrorRemoved", Kind::Cluster, "c").await;
    assert_eq!(occurrences(&env.events("MirrorRemoved").await), 1);
    assert!(
        env.secrets()
            .get_opt(&names::credentials_mirror(&env.identity))
            .await
            .unwrap()
            .is_none()
    );
}

/// Refuses deleting the Secret `secret` of the test's namespace, probed by
/// a dry-run delete of it.
async fn keep_secret(env: &Env, secret: &str) -> Refusal<impl AsyncFn() -> bool + use<>> {
    let secrets = env.secrets();
    let name = secret.to_string();
    let probe = async move || {
        let dry_run = DeleteParams {
            dry_run: true,
            ..Default::default()
        };
        secrets.delete(&name, &dry_run).await.is_ok()
    };
    Refusal::install(
        &env.client,
        &env.ns,
        &["DELETE"],
        "secrets",
        &format!("oldObject.metadata.name != '{secret}'"),
        probe,
    )
    .await
}

#[tokio::test]
async fn a_manager_killed_mid_cleanup_finishes_it_after_a_restart() {
    let mut env = setup(MANAGER, "del-restart", &[], &[]).await;
    applied_pair(&env, None).await;
    let suffix = env.suffix(Kind::Machine, "m");
    let inputs = names::inputs_secret(Kind::Machine, "m");
    // Cleanup step 2 (the durable inputs) fails; step 1 (the state) ran.
    let keep = keep_secret(&env, &inputs).await;
    let jobs = JobsSeen::watch(&env);
    env.delete::<TerraformMachine>("m").await;
    let status = within(
        &env,
        240,
        "the destroy done and the cleanup stuck",
        || async {
            let status = env.machine_status("m").await?;
            let destroyed =
                condition(&status, "ApplyJobSucceeded") == Some(("True", "DestroySucceeded"));
            let state_gone = env.state_secrets(&suffix).await.is_empty();
            let inputs_kept = env.secrets().get_opt(&inputs).await.unwrap().is_some();
            (destroyed && state_gone && inputs_kept).then_some(status)
        },
    )
    .await;
    assert_eq!(
        steps(status.last_run.as_ref().unwrap()),
        ["init", "destroy"]
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        env.finalizers::<TerraformMachine>("m")
            .await
            .contains(&finalizer(Kind::Machine))
    );
    assert!(
        env.events_about("Destroyed", Kind::Machine, "m")
            .await
            .is_empty()
    );

    env.manager.stop();
    keep.remove().await;
    env.restart_manager(&[]).await;
    env.wait_gone::<TerraformMachine>(120, "m").await;
    let destroyed = jobs.destroys(Kind::Machine, "m");
    assert_eq!(destroyed.len(), 1, "{destroyed:?}");
    once(&env, "Destroyed", Kind::Machine, "m").await;
    once(&env, "FinalizerRemoved", Kind::Machine, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}
