//! The webhooks through the real API server: the manager runs as a local
//! process, the committed webhook configurations point at it on 127.0.0.1
//! with the development CA, and objects are created with kube-rs and kubectl
//! as a user would.

use std::process::Command;

use captf_testkit::controlplane::{self, binary};
use captf_testkit::manager::{Manager, install_crds};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const GROUP: &str = "infrastructure.cluster.x-k8s.io";
const IMAGE: &str = "ghcr.io/captf-io/modules/noop:v0.1.0";

/// One manager serves every test of this binary.
static MANAGER: OnceCell<std::sync::Mutex<Manager>> = OnceCell::const_new();

async fn setup() -> kube::Client {
    let plane = controlplane::shared();
    let client = plane.client().await;
    MANAGER
        .get_or_init(|| async {
            install_crds(&client).await;
            let mut manager =
                Manager::start(plane, env!("CARGO_BIN_EXE_captf-manager").as_ref(), &[]);
            manager.wait_ready().await;
            manager.register_webhooks(&client).await;
            std::sync::Mutex::new(manager)
        })
        .await;
    client
}

fn api(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let plural = format!("{}s", kind.to_lowercase());
    let gvk = GroupVersionKind::gvk(GROUP, "v1alpha1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// Creates the object; `Err` carries the API server's message.
async fn create(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
    spec: Value,
) -> Result<DynamicObject, String> {
    api(client, ns, kind)
        .create(&PostParams::default(), &object(kind, name, spec))
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) => format!("{} {}", status.code, status.message),
            other => other.to_string(),
        })
}

fn machine_spec(jobs: Value) -> Value {
    json!({"source": {"image": IMAGE}, "jobs": jobs})
}

#[tokio::test]
async fn lock_timeout_rule_in_every_jobs_policy() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-lock").await;
    let refused = [
        (
            json!({"lockTimeoutSeconds": 600, "activeDeadlineSeconds": 300}),
            "lockTimeoutSeconds 600, activeDeadlineSeconds 300",
        ),
        (
            json!({"lockTimeoutSeconds": 3600}),
            "lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default",
        ),
        (
            json!({"activeDeadlineSeconds": 200}),
            "lockTimeoutSeconds 300 by default, activeDeadlineSeconds 200",
        ),
    ];
    for (i, (jobs, got)) in refused.iter().enumerate() {
        let message = format!(
            "spec.jobs.lockTimeoutSeconds: must be less than activeDeadlineSeconds, so that waiting for the state lock cannot use up the Job's deadline (got {got})"
        );
        let err = create(
            &client,
            &ns,
            "TerraformMachine",
            &format!("m{i}"),
            machine_spec(jobs.clone()),
        )
        .await
        .expect_err("refused");
        assert!(err.starts_with("422 "), "{err}");
        assert!(err.contains(&message), "{err}");

        let cluster = json!({"source": {"image": IMAGE}, "identityRef": {"name": "creds"}, "defaults": {"jobs": jobs}});
        let err = create(&client, &ns, "TerraformCluster", &format!("c{i}"), cluster)
            .await
            .expect_err("refused");
        assert!(
            err.contains(&message.replace("spec.jobs.", "spec.defaults.jobs.")),
            "{err}"
        );

        for kind in ["TerraformMachineTemplate", "TerraformMachinePoolTemplate"] {
            let template = json!({"template": {"spec": machine_spec(jobs.clone())}});
            let err = create(&client, &ns, kind, &format!("t{i}"), template)
                .await
                .expect_err("refused");
            assert!(
                err.contains(&message.replace("spec.jobs.", "spec.template.spec.jobs.")),
                "{kind}: {err}"
            );
        }
        let template =
            json!({"template": {"spec": {"source": {"image": IMAGE}, "defaults": {"jobs": jobs}}}});
        let err = create(
            &client,
            &ns,
            "TerraformClusterTemplate",
            &format!("t{i}"),
            template,
        )
        .await
        .expect_err("refused");
        assert!(
            err.contains(&message.replace("spec.jobs.", "spec.template.spec.defaults.jobs.")),
            "{err}"
        );
    }
    let ok = json!({"lockTimeoutSeconds": 60, "activeDeadlineSeconds": 300});
    create(
        &client,
        &ns,
        "TerraformMachine",
        "ok",
        machine_spec(ok.clone()),
    )
    .await
    .unwrap();
    let cluster = json!({"source": {"image": IMAGE}, "identityRef": {"name": "creds"}, "defaults": {"jobs": ok.clone()}});
    create(&client, &ns, "TerraformCluster", "ok", cluster)
        .await
        .unwrap();
    let template = json!({"template": {"spec": machine_spec(ok)}});
    create(&client, &ns, "TerraformMachineTemplate", "ok", template)
        .await
        .unwrap();
}

#[tokio::test]
async fn both_security_contexts_are_hardened_in_every_jobs_policy() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-security").await;
    const ROOT: &str = "a Job does not run as root";
    const UNCONFINED: &str = "must not be Unconfined: use RuntimeDefault or Localhost";
    const SE_LINUX: &str = "must be unset or one of container_t, container_init_t, container_kvm_t, container_engine_t: other types, such as spc_t, may run unconfined (got \"spc_t\")";
    // (context, its field set loose, message after the field path)
    let refused = [
        (
            "securityContext",
            json!({"readOnlyRootFilesystem": false}),
            "readOnlyRootFilesystem: must not be false: a Job writes only to its volumes (got false)"
                .to_string(),
        ),
        (
            "securityContext",
            json!({"procMount": "Unmasked"}),
            "procMount: must not be Unmasked: /proc stays masked (got \"Unmasked\")".to_string(),
        ),
        (
            "securityContext",
            json!({"seccompProfile": {"type": "Unconfined"}}),
            format!("seccompProfile.type: {UNCONFINED} (got \"Unconfined\")"),
        ),
        (
            "podSecurityContext",
            json!({"seccompProfile": {"type": "Unconfined"}}),
            format!("seccompProfile.type: {UNCONFINED} (got \"Unconfined\")"),
        ),
        (
            "securityContext",
            json!({"appArmorProfile": {"type": "Unconfined"}}),
            format!("appArmorProfile.type: {UNCONFINED} (got \"Unconfined\")"),
        ),
        (
            "podSecurityContext",
            json!({"appArmorProfile": {"type": "Unconfined"}}),
            format!("appArmorProfile.type: {UNCONFINED} (got \"Unconfined\")"),
        ),
        (
            "securityContext",
            json!({"seLinuxOptions": {"type": "spc_t"}}),
            format!("seLinuxOptions.type: {SE_LINUX}"),
        ),
        (
            "podSecurityContext",
            json!({"seLinuxOptions": {"type": "spc_t"}}),
            format!("seLinuxOptions.type: {SE_LINUX}"),
        ),
        (
            "securityContext",
            json!({"runAsUser": 0}),
            format!("runAsUser: must not be 0: {ROOT} (got 0)"),
        ),
        (
            "podSecurityContext",
            json!({"runAsUser": 0}),
            format!("runAsUser: must not be 0: {ROOT} (got 0)"),
        ),
        (
            "securityContext",
            json!({"runAsNonRoot": false}),
            format!("runAsNonRoot: must not be false: {ROOT} (got false)"),
        ),
        (
            "podSecurityContext",
            json!({"runAsNonRoot": false}),
            format!("runAsNonRoot: must not be false: {ROOT} (got false)"),
        ),
        (
            "securityContext",
            json!({"windowsOptions": {"hostProcess": true}}),
            "windowsOptions.hostProcess: must not be true: a Job never runs as a host process (got true)"
                .to_string(),
        ),
        (
            "podSecurityContext",
            json!({"windowsOptions": {"hostProcess": true}}),
            "windowsOptions.hostProcess: must not be true: a Job never runs as a host process (got true)"
                .to_string(),
        ),
    ];
    for (i, (field, context, message)) in refused.iter().enumerate() {
        let mut jobs = json!({});
        jobs[*field] = context.clone();
        let err = create(
            &client,
            &ns,
            "TerraformMachine",
            &format!("m{i}"),
            machine_spec(jobs),
        )
        .await
        .expect_err(message);
        assert!(err.starts_with("422 "), "{err}");
        assert!(
            err.contains(&format!("spec.jobs.{field}.{message}")),
            "{err}"
        );
    }

    // Both contexts, in every jobs policy of every kind.
    let loose = json!({
        "securityContext": {"runAsUser": 0},
        "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
    });
    let expect = |err: &str, path: &str| {
        assert!(err.starts_with("422 "), "{err}");
        assert!(
            err.contains(&format!(
                "{path}.securityContext.runAsUser: must not be 0: {ROOT} (got 0)"
            )),
            "{path}: {err}"
        );
        assert!(
            err.contains(&format!(
                "{path}.podSecurityContext.seLinuxOptions.type: {SE_LINUX}"
            )),
            "{path}: {err}"
        );
    };
    let err = create(
        &client,
        &ns,
        "TerraformMachinePool",
        "p",
        machine_spec(loose.clone()),
    )
    .await
    .expect_err("refused");
    expect(&err, "spec.jobs");
    let cluster = json!({"source": {"image": IMAGE}, "identityRef": {"name": "creds"}, "defaults": {"jobs": loose}});
    let err = create(&client, &ns, "TerraformCluster", "c", cluster)
        .await
        .expect_err("refused");
    expect(&err, "spec.defaults.jobs");
    for kind in ["TerraformMachineTemplate", "TerraformMachinePoolTemplate"] {
        let template = json!({"template": {"spec": machine_spec(loose.clone())}});
        let err = create(&client, &ns, kind, "t", template)
            .await
            .expect_err("refused");
        expect(&err, "spec.template.spec.jobs");
    }
    let template =
        json!({"template": {"spec": {"source": {"image": IMAGE}, "defaults": {"jobs": loose}}}});
    let err = create(&client, &ns, "TerraformClusterTemplate", "t", template)
        .await
        .expect_err("refused");
    expect(&err, "spec.template.spec.defaults.jobs");

    // Hardened contexts pass.
    let hardened = json!({
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 1000, "readOnlyRootFilesystem": true,
            "procMount": "Default", "seccompProfile": {"type": "RuntimeDefault"},
            "appArmorProfile": {"type": "RuntimeDefault"}, "seLinuxOptions": {"type": "container_t"},
        },
        "podSecurityContext": {
            "runAsNonRoot": true, "runAsUser": 1000, "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"}, "appArmorProfile": {"type": "RuntimeDefault"},
            "seLinuxOptions": {"type": "container_t"},
        },
    });
    create(
        &client,
        &ns,
        "TerraformMachine",
        "ok",
        machine_spec(hardened.clone()),
    )
    .await
    .unwrap();
    let cluster = json!({"source": {"image": IMAGE}, "identityRef": {"name": "creds"}, "defaults": {"jobs": hardened}});
    create(&client, &ns, "TerraformCluster", "ok", cluster)
        .await
        .unwrap();
}

#[tokio::test]
async fn restore_state_annotation() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-restore").await;
    let machines = api(&client, &ns, "TerraformMachine");
    let with = |name: &str, value: &str| {
        let mut o = object(
            "TerraformMachine",
            name,
            json!({"source": {"image": IMAGE}}),
        );
        o.metadata.annotations =
            Some([("captf.io/restore-state".to_string(), value.to_string())].into());
        o
    };
    machines
        .create(&PostParams::default(), &with("seven", "7"))
        .await
        .expect("7 is accepted on create");
    for (i, bad) in ["07", "-1", "abc", "", "18446744073709551616"]
        .iter()
        .enumerate()
    {
        let err = machines
            .create(&PostParams::default(), &with(&format!("bad{i}"), bad))
            .await
            .expect_err(bad);
        assert!(
            err.to_string().contains("captf.io/restore-state"),
            "{bad}: {err}"
        );
    }

    // On update, the serial must be listed in status.stateBackups.
    let pools = api(&client, &ns, "TerraformMachinePool");
    pools
        .create(
            &PostParams::default(),
            &object(
                "TerraformMachinePool",
                "pool",
                json!({"source": {"image": IMAGE}}),
            ),
        )
        .await
        .unwrap();
    let status = json!({"status": {"stateBackups": [
        {"serial": 7, "takenAt": "2026-12-01T00:00:00Z", "bytes": 100},
        {"serial": 5, "takenAt": "2026-11-30T00:00:00Z", "bytes": 90}]}});
    pools
        .patch_status("pool", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let annotate =
        |value: &str| json!({"metadata": {"annotations": {"captf.io/restore-state": value}}});
    let err = pools
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&annotate("9")),
        )
        .await
        .expect_err("9 is not listed");
    assert!(
        err.to_string()
            .contains("must name a serial listed in status.stateBackups (listed: 7, 5)"),
        "{err}"
    );
    pools
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&annotate("5")),
        )
        .await
        .expect("5 is listed");
}

#[tokio::test]
async fn defaulting_writes_exactly_the_contract_defaults_once() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-defaults").await;
    let machine = create(
        &client,
        &ns,
        "TerraformMachine",
        "m",
        json!({
            "source": {"image": IMAGE},
            "variablesFrom": [{"configMapRef": {"name": "vars"}}]
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        machine.data["spec"],
        json!({
            "source": {"image": IMAGE, "imagePullPolicy": "IfNotPresent"},
            "variablesFrom": [{"configMapRef": {"name": "vars"}, "optional": false, "format": "String"}]
        }),
        "a machine without spec.jobs keeps none"
    );
    let cluster = create(
        &client,
        &ns,
        "TerraformCluster",
        "c",
        json!({
            "source": {"image": IMAGE}, "identityRef": {"name": "creds"}
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        cluster.data["spec"],
        json!({
            "source": {"image": IMAGE, "imagePullPolicy": "IfNotPresent"},
            "identityRef": {"name": "creds"},
            "applyPolicy": "Automatic",
            "drift": {"action": "Report"}
        })
    );
    // Running the webhook again (an update that changes nothing) changes nothing.
    let clusters = api(&client, &ns, "TerraformCluster");
    let before = clusters.get("c").await.unwrap();
    let after = clusters
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(before.data["spec"], after.data["spec"]);
}

#[tokio::test]
async fn reserved_env_names_are_accepted_with_a_warning_kubectl_prints() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-env").await;
    let manifest = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "TerraformMachine",
        "metadata": {"name": "env", "namespace": ns},
        "spec": {"source": {"image": IMAGE}, "jobs": {"env": [
            {"name": "TF_LOG", "value": "DEBUG"}, {"name": "KUBE_CONFIG", "value": "/x"}, {"name": "REGION", "value": "eu"}
        ]}}
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("machine.json");
    std::fs::write(&file, manifest.to_string()).unwrap();
    let out = Command::new(binary("kubectl"))
        .arg(format!(
            "--kubeconfig={}",
            controlplane::shared().kubeconfig().display()
        ))
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "Warning: spec.jobs.env[0].name: \"TF_LOG\" begins with TF_ or KUBE_ and is dropped"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("Warning: spec.jobs.env[1].name: \"KUBE_CONFIG\""),
        "{stderr}"
    );
    assert!(!stderr.contains("REGION"), "{stderr}");
}

#[tokio::test]
async fn template_spec_is_immutable_except_for_dry_runs() {
    let client = setup().await;
    let ns = captf_testkit::namespace(&client, "wh-template").await;
    create(
        &client,
        &ns,
        "TerraformMachineTemplate",
        "t",
        json!({"template": {"spec": {"source": {"image": IMAGE}}}}),
    )
    .await
    .unwrap();
    let templates = api(&client, &ns, "TerraformMachineTemplate");
    let change = json!({"spec": {"template": {"spec": {"source": {"image": "ghcr.io/captf-io/modules/noop:v0.2.0"}}}}});
    let err = templates
        .patch("t", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .expect_err("a changed template spec is refused");
    assert!(
        err.to_string()
            .contains("spec.template.spec: is immutable after creation"),
        "{err}"
    );
    // The ClusterClass controller's server-side dry run of the same change passes.
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    templates
        .patch("t", &dry_run, &Patch::Merge(&change))
        .await
        .expect("a dry run is accepted");
    let stored = templates.get("t").await.unwrap();
    assert_eq!(
        stored.data["spec"]["template"]["spec"]["source"]["image"], IMAGE,
        "a dry run stores nothing"
    );
    // Metadata stays mutable.
    let labels = json!({"spec": {"template": {"metadata": {"labels": {"team": "b"}}}}});
    templates
        .patch("t", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("metadata is mutable");
}

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
