//! The rules that need the API server: an identity's creator must be able to
//! read its Secret, an identity in use stays, and a TerraformMachine goes
//! only with its Machine.

use super::*;

/// A client that impersonates `user` (the test admin may impersonate).
async fn impersonating(user: &str) -> kube::Client {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(controlplane::shared().kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_string());
    kube::Client::try_from(config).unwrap()
}

async fn apply_rbac(client: &kube::Client, value: Value) {
    let object: DynamicObject = serde_json::from_value(value).unwrap();
    let types = object.types.clone().unwrap();
    let (group, version) = types.api_version.split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .patch(
            object.metadata.name.as_deref().unwrap(),
            &PatchParams::apply("webhook-test").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap();
}

fn identity(name: &str, secret_namespace: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "TerraformClusterIdentity",
        "metadata": {"name": name},
        "spec": {"secretRef": {"name": "cloud-credentials", "namespace": secret_namespace}}
    }))
    .unwrap()
}

fn identities(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, "v1alpha1", "TerraformClusterIdentity");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "terraformclusteridentities"),
    )
}

#[tokio::test]
async fn an_identity_needs_a_creator_who_may_read_its_secret() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-sar").await;
    // Bob may create identities but may not read Secrets.
    apply_rbac(&client, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "identity-creator"},
        "rules": [{"apiGroups": [GROUP], "resources": ["terraformclusteridentities"], "verbs": ["create", "get", "update", "patch"]}]
    }))
    .await;
    apply_rbac(&client, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "identity-creator-bob"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "identity-creator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]
    }))
    .await;
    let bob = impersonating("bob").await;
    let err = identities(&bob)
        .create(&PostParams::default(), &identity("bobs", &ns))
        .await
        .expect_err("bob cannot read the Secret");
    let kube::Error::Api(status) = &err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 403, "{err}");
    assert!(
        status.message.contains(&format!(
            "spec.secretRef: the requesting user \"bob\" may not get this Secret, so may not hand it to an identity (got {ns}/cloud-credentials)"
        )),
        "{err}"
    );
    // The admin may read every Secret, so may create it.
    identities(&client)
        .create(
            &PostParams::default(),
            &identity(&format!("admins-{ns}"), &ns),
        )
        .await
        .expect("the admin may");
}

#[tokio::test]
async fn an_identity_in_use_cannot_be_deleted() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-inuse").await;
    let name = format!("used-{ns}");
    identities(&client)
        .create(&PostParams::default(), &identity(&name, &ns))
        .await
        .unwrap();
    create(
        &client,
        &ns,
        "TerraformCluster",
        "user",
        json!({"source": {"image": IMAGE}, "identityRef": {"name": name}}),
    )
    .await
    .unwrap();
    let err = identities(&client)
        .delete(&name, &Default::default())
        .await
        .expect_err("in use");
    assert!(
        err.to_string().contains(&format!(
            "cannot be deleted while TerraformCluster {ns}/user uses it"
        )),
        "{err}"
    );

    // A machine without its own ref uses its cluster's identity.
    create(
        &client,
        &ns,
        "TerraformMachine",
        "worker",
        json!({"source": {"image": IMAGE}}),
    )
    .await
    .unwrap();
    let clusters = api(&client, &ns, "TerraformCluster");
    let label = json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}}});
    clusters
        .patch("user", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    api(&client, &ns, "TerraformMachine")
        .patch("worker", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let other = json!({"spec": {"identityRef": {"name": "someone-else"}, "defaults": {"identityRef": {"name": name}}}});
    clusters
        .patch("user", &PatchParams::default(), &Patch::Merge(&other))
        .await
        .unwrap();
    let err = identities(&client)
        .delete(&name, &Default::default())
        .await
        .expect_err("used through defaults");
    assert!(
        err.to_string()
            .contains(&format!("TerraformMachine {ns}/worker uses it")),
        "{err}"
    );

    api(&client, &ns, "TerraformMachine")
        .delete("worker", &Default::default())
        .await
        .unwrap();
    clusters.delete("user", &Default::default()).await.unwrap();
    // Never applied (no credentials Secret): the manager's finalizers go at
    // once, and the identity is unused once both are gone.
    for kind in ["TerraformMachine", "TerraformCluster"] {
        let name = if kind == "TerraformCluster" {
            "user"
        } else {
            "worker"
        };
        let objects = api(&client, &ns, kind);
        captf_testkit::eventually(&format!("{kind} {name} gone"), || async {
            objects.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    // A namespace still holding its credentials mirror keeps it too.
    let mirrored = json!({"status": {"namespaces": [ns]}});
    identities(&client)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&mirrored))
        .await
        .unwrap();
    let err = identities(&client)
        .delete(&name, &Default::default())
        .await
        .expect_err("mirrored");
    assert!(
        err.to_string()
            .contains(&format!("namespaces hold its credentials mirror: {ns}")),
        "{err}"
    );
    identities(&client)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"namespaces": null}})),
        )
        .await
        .unwrap();
    identities(&client)
        .delete(&name, &Default::default())
        .await
        .expect("unused now");
}

/// Just enough of Cluster API's Cluster and Machine for the delete rule.
async fn install_capi_crds(client: &kube::Client) {
    for (kind, plural) in [("Cluster", "clusters"), ("Machine", "machines")] {
        apply_rbac(client, json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cluster.x-k8s.io")},
            "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1beta2", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .await;
    }
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine");
    for _ in 0..100 {
        if kube::discovery::pinned_kind(client, &gvk).await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the Cluster API CRDs never served");
}

fn capi(client: &kube::Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

#[tokio::test]
async fn a_terraform_machine_goes_only_with_its_machine() {
    let client = setup().await;
    install_capi_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "wh-mdel").await;
    let clusters = capi(&client, &ns, "Cluster", "clusters");
    let machines = capi(&client, &ns, "Machine", "machines");
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1"}, "spec": {"paused": false}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let owner = |name: &str, infra: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "finalizers": ["test.captf.io/hold"]},
            "spec": {"clusterName": "c1", "infrastructureRef": {"apiGroup": GROUP, "kind": "TerraformMachine", "name": infra}}
        }))
        .unwrap()
    };
    let owned = |name: &str, machine: &DynamicObject| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "TerraformMachine",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": machine.metadata.name, "uid": machine.metadata.uid}]},
            "spec": {"source": {"image": IMAGE}}
        }))
        .unwrap()
    };
    let tms = api(&client, &ns, "TerraformMachine");

    let m1 = machines
        .create(&PostParams::default(), &owner("m1", "tm1"))
        .await
        .unwrap();
    tms.create(&PostParams::default(), &owned("tm1", &m1))
        .await
        .unwrap();
    let err = tms
        .delete("tm1", &Default::default())
        .await
        .expect_err("its Machine lives");
    assert!(
        err.to_string().contains(
            "a TerraformMachine is deleted with its Machine: delete Machine \"m1\" instead"
        ),
        "{err}"
    );

    // Once the Machine is deleting, its TerraformMachine may go.
    machines.delete("m1", &Default::default()).await.unwrap();
    tms.delete("tm1", &Default::default())
        .await
        .expect("the Machine is deleting");

    // A Machine whose infrastructureRef names another object does not hold it.
    let m2 = machines
        .create(&PostParams::default(), &owner("m2", "someone-else"))
        .await
        .unwrap();
    tms.create(&PostParams::default(), &owned("tm2", &m2))
        .await
        .unwrap();
    tms.delete("tm2", &Default::default())
        .await
        .expect("the owner check fails, so it does not block");

    // clusterctl move: delete-for-move is honored only while the Cluster is paused.
    let m3 = machines
        .create(&PostParams::default(), &owner("m3", "tm3"))
        .await
        .unwrap();
    let mut tm3 = owned("tm3", &m3);
    tm3.metadata.annotations = Some(
        [(
            "clusterctl.cluster.x-k8s.io/delete-for-move".to_string(),
            String::new(),
        )]
        .into(),
    );
    tms.create(&PostParams::default(), &tm3).await.unwrap();
    tms.delete("tm3", &Default::default())
        .await
        .expect_err("the Cluster is not paused");
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    tms.delete("tm3", &Default::default())
        .await
        .expect("moving a paused Cluster");

    // Without a Machine owner there is nothing to wait for.
    create(
        &client,
        &ns,
        "TerraformMachine",
        "orphan",
        json!({"source": {"image": IMAGE}}),
    )
    .await
    .unwrap();
    tms.delete("orphan", &Default::default())
        .await
        .expect("no owner");
}
