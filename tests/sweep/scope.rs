//! The sweep's scope, and what an empty namespace's protection leaves.

use super::*;

/// The manager's watches of every namespace, listed.
async fn watched(client: &Client) -> (Arc<Watches>, Workloads) {
    let scope = Scope {
        client: client.clone(),
        namespace: None,
        away: None,
    };
    let view = watches::view(&scope, &watcher::Config::default());
    let workloads = view.workloads();
    // Polled, the kinds' own watches fill their stores.
    tokio::spawn(view.clusters.events.for_each(|_| async {}));
    tokio::spawn(view.machines.events.for_each(|_| async {}));
    tokio::spawn(view.pools.events.for_each(|_| async {}));
    view.watches.wait_synced().await;
    for ready in [
        workloads.0.wait_until_ready().boxed(),
        workloads.1.wait_until_ready().boxed(),
        workloads.2.wait_until_ready().boxed(),
    ] {
        ready.await.unwrap();
    }
    (view.watches, workloads)
}

/// The periodic sweep visits the namespaces where the watches show
/// something to sweep, within --namespace when it is set.
#[tokio::test]
async fn the_scope_limits_the_sweep_and_no_scope_finds_every_namespace() {
    let _guard = ALL_NAMESPACES.write().await;
    let (client, inside) = setup("sweep-scope-in").await;
    let outside = captf_testkit::namespace(&client, "sweep-scope-out").await;
    let pruned = captf_testkit::namespace(&client, "sweep-scope-prune").await;
    for ns in [&inside, &outside] {
        create(&client, ns, &rbac::service_account(ns)).await;
    }
    machine(&client, &pruned, "m", "prod", None).await;
    binding(&client, &pruned, &["builder", "captf-runner"]).await;

    let (watches, workloads) = watched(&client).await;
    let swept = sweep::sweep_due(&client, &watches, &workloads, Some(&inside), None).await;
    assert_eq!(swept, BTreeSet::from([inside.clone()]));
    assert!(!exists::<ServiceAccount>(&client, &inside, "captf-runner").await);
    assert!(exists::<ServiceAccount>(&client, &outside, "captf-runner").await);
    assert_eq!(
        subjects(&client, &pruned, "captf-runner").await,
        ["builder", "captf-runner"]
    );

    // Without a scope, every namespace holding a managed object is swept.
    let swept = sweep::sweep_due(&client, &watches, &workloads, None, None).await;
    assert!(
        swept.contains(&outside) && swept.contains(&pruned),
        "{swept:?}"
    );
    assert!(!exists::<ServiceAccount>(&client, &outside, "captf-runner").await);
    assert_eq!(
        subjects(&client, &pruned, "captf-runner").await,
        ["captf-runner"]
    );
}

/// In an empty namespace the sweep lets go of what CAPTF protected (the
/// protection finalizer); in a busy one it leaves it alone.
#[tokio::test]
async fn an_empty_namespace_loses_the_protection_of_what_is_left() {
    let _guard = ALL_NAMESPACES.read().await;
    let (client, ns) = setup("sweep-protected").await;
    let protected = |name: &str| {
        let mut meta = meta(name, &[]);
        captf::protection::protect(&mut meta);
        meta
    };
    let state = k8s_openapi::api::core::v1::Secret {
        metadata: protected("tfstate-default-0123456789abcdef-m"),
        ..Default::default()
    };
    create(&client, &ns, &state).await;
    let lock = Lease {
        metadata: protected("lock-tfstate-default-0123456789abcdef-m"),
        ..Default::default()
    };
    create(&client, &ns, &lock).await;
    let finalizers = |client: Client, ns: String| async move {
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
            .get("tfstate-default-0123456789abcdef-m")
            .await
            .unwrap();
        let lease = Api::<Lease>::namespaced(client, &ns)
            .get("lock-tfstate-default-0123456789abcdef-m")
            .await
            .unwrap();
        (
            secret.metadata.finalizers.unwrap_or_default(),
            lease.metadata.finalizers.unwrap_or_default(),
        )
    };

    // A machine still there: nothing is let go.
    machine(&client, &ns, "m", "prod", None).await;
    sweep::sweep(&client, &ns, None).await.unwrap();
    let (s, l) = finalizers(client.clone(), ns.clone()).await;
    assert_eq!((s.len(), l.len()), (1, 1), "{s:?} {l:?}");

    Api::<TerraformMachine>::namespaced(client.clone(), &ns)
        .delete("m", &DeleteParams::default())
        .await
        .unwrap();
    let swept = sweep::sweep(&client, &ns, None).await.unwrap();
    assert_eq!(
        swept.released,
        [
            deleted("Secret", "tfstate-default-0123456789abcdef-m"),
            deleted("Lease", "lock-tfstate-default-0123456789abcdef-m"),
        ]
    );
    let (s, l) = finalizers(client, ns).await;
    assert!(s.is_empty() && l.is_empty(), "{s:?} {l:?}");
}
