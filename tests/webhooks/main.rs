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

mod lookups;

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
