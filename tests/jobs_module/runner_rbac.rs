//! The runner's account and its RoleBinding, ensured per namespace.

use super::*;

fn subjects(binding: &RoleBinding) -> Vec<String> {
    binding
        .subjects
        .iter()
        .flatten()
        .map(|s| {
            format!(
                "{}/{}/{}",
                s.kind,
                s.namespace.as_deref().unwrap_or(""),
                s.name
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_rbac_is_ensured_per_namespace() {
    let client = client().await;
    let ns = namespace(&client, "runner-rbac").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);

    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let sa = accounts.get("captf-runner").await.unwrap();
    assert_eq!(sa.metadata.labels.unwrap()["captf.io/managed"], "true");
    let binding = bindings.get("captf-runner").await.unwrap();
    assert_eq!(
        binding.metadata.labels.as_ref().unwrap()["captf.io/managed"],
        "true"
    );
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "captf-runner");
    assert_eq!(
        subjects(&binding),
        [format!("ServiceAccount/{ns}/captf-runner")]
    );
    // Again: nothing changes.
    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let again = bindings.get("captf-runner").await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        binding.metadata.resource_version
    );

    // An override must exist and be opted in.
    match rbac::ensure(&client, &ns, "custom").await {
        Err(RbacError::NotOptedIn(RbacRefusal::Missing { name })) => assert_eq!(name, "custom"),
        other => panic!("{other:?}"),
    }
    let account = |name: &str, opted: bool| ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: opted.then(|| [("captf.io/runner".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account("custom", false))
        .await
        .unwrap();
    match rbac::ensure(&client, &ns, "custom").await {
        Err(e @ RbacError::NotOptedIn(RbacRefusal::NotLabelled { .. })) => {
            assert_eq!(e.reason(), "ServiceAccountNotOptedIn");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        subjects(&bindings.get("captf-runner").await.unwrap()).len(),
        1
    );

    // Opted-in overrides, added at the same time: none is lost.
    accounts
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "captf.io/runner": "true" } } })),
        )
        .await
        .unwrap();
    let mut names = vec!["custom".to_owned()];
    for i in 0..5 {
        let name = format!("runner-{i}");
        accounts
            .create(&PostParams::default(), &account(&name, true))
            .await
            .unwrap();
        names.push(name);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for name in names.clone() {
        let (client, ns) = (client.clone(), ns.clone());
        tasks.spawn(async move { rbac::ensure(&client, &ns, &name).await });
    }
    for result in tasks.join_all().await {
        result.unwrap();
    }
    let got: BTreeSet<String> = subjects(&bindings.get("captf-runner").await.unwrap())
        .into_iter()
        .collect();
    let want: BTreeSet<String> = std::iter::once("captf-runner".to_owned())
        .chain(names)
        .map(|n| format!("ServiceAccount/{ns}/{n}"))
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_pre_existing_runner_account_is_kept_as_it_is() {
    let client = client().await;
    let ns = namespace(&client, "runner-kept").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let mine = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("captf-runner".into()),
            labels: Some([("team".to_owned(), "infra".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = accounts
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    rbac::ensure(&client, &ns, "captf-runner").await.unwrap();
    let after = accounts.get("captf-runner").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(after.metadata.labels, mine.metadata.labels);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        subjects(&bindings.get("captf-runner").await.unwrap()),
        [format!("ServiceAccount/{ns}/captf-runner")]
    );
}
