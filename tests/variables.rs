//! `spec.variablesFrom` end to end (ref §1.2 VariablesSource): the manager
//! reads labeled ConfigMaps and Secrets, waits while a source is missing,
//! is woken by the source itself (the sync period here is the default ten
//! minutes), and the merged values reach the module through real OpenTofu.

use std::io::Read;

use captf::api::{IdentityReference, VariablesSource, VariablesSourceReference};
use captf::jobs::inputs::{MAIN_TF_JSON, TFVARS_JSON};
use captf::names::{self, Kind};
use captf_testkit::scenario::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

fn config_map(name: &str) -> VariablesSource {
    VariablesSource {
        config_map_ref: Some(VariablesSourceReference { name: name.into() }),
        ..Default::default()
    }
}

/// Waits until DependenciesReady of cluster `c` is False/VariablesSourceNotFound
/// naming `source`.
async fn waiting_for(env: &Env, source: &str) {
    let status = within(env, 30, &format!("waiting for {source}"), || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "DependenciesReady") == Some(("False", "VariablesSourceNotFound"))
                && condition_message(s, "DependenciesReady").is_some_and(|m| m.contains(source))
        })
    })
    .await;
    assert_eq!(condition(&status, "Ready").map(|(s, _)| s), Some("False"));
    assert!(
        env.jobs().await.is_empty(),
        "a Job started without its variables"
    );
}

/// The `input` of the noop module's `terraform_data.noop`, read from the
/// state Secret: what the module received.
async fn module_input(env: &Env) -> Value {
    let suffix = env.suffix(Kind::Cluster, "c");
    let secret = env
        .secrets()
        .get(&names::state_secret(&suffix))
        .await
        .unwrap();
    let mut document = String::new();
    flate2::read::GzDecoder::new(secret.data.unwrap()["tfstate"].0.as_slice())
        .read_to_string(&mut document)
        .unwrap();
    let state: Value = serde_json::from_str(&document).unwrap();
    state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == "terraform_data" && r["name"] == "noop")
        .map(|r| r["instances"][0]["attributes"]["input"]["value"].clone())
        .expect("terraform_data.noop in the state")
}

#[tokio::test]
async fn sources_are_waited_for_merged_and_reach_the_module() {
    let env = setup(MANAGER, "vars-from", &[], &[]).await;
    let maps = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns);
    let mut workspace = noop(vars(&[("message", json!("inline"))]));
    workspace.identity_ref = Some(IdentityReference {
        name: env.identity.clone(),
    });
    workspace.variables_from = Some(vec![
        config_map("plain"),
        VariablesSource {
            secret_ref: Some(VariablesSourceReference {
                name: "secret".into(),
            }),
            ..Default::default()
        },
        VariablesSource {
            optional: Some(true),
            ..config_map("absent")
        },
    ]);
    // Unlabeled, a source counts as missing: the first pass already sees it.
    let plain = ConfigMap {
        metadata: ObjectMeta {
            name: Some("plain".into()),
            ..Default::default()
        },
        data: Some(
            [
                ("greeting".to_string(), "hi from a ConfigMap".to_string()),
                ("message".to_string(), "from a ConfigMap".to_string()),
                ("size".to_string(), "medium".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    maps.create(&PostParams::default(), &plain).await.unwrap();
    env.create_cluster("c", workspace).await;
    waiting_for(&env, "ConfigMap plain").await;
    let labeled = json!({"metadata": {"labels": {"captf.io/variables": "true"}}});
    maps.patch("plain", &PatchParams::default(), &Patch::Merge(&labeled))
        .await
        .unwrap();
    waiting_for(&env, "Secret secret").await;

    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("secret".into()),
            labels: Some([("captf.io/variables".to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        string_data: Some([("size".to_string(), "large-and-secret".to_string())].into()),
        ..Default::default()
    };
    env.secrets()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let status = within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    assert_eq!(
        condition(&status, "DependenciesReady"),
        Some(("True", "DependenciesReady"))
    );

    // Later sources win, inline variables win over all.
    let input = module_input(&env).await;
    assert_eq!(input["greeting"], "hi from a ConfigMap");
    assert_eq!(input["size"], "large-and-secret");
    assert_eq!(input["message"], "inline");
    // Only the variable whose value came from the Secret is sensitive.
    let inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Cluster, "c"))
        .await
        .unwrap()
        .data
        .unwrap();
    let root: Value = serde_json::from_slice(&inputs[MAIN_TF_JSON].0).unwrap();
    assert_eq!(root["variable"]["size"], json!({"sensitive": true}));
    assert_eq!(root["variable"]["greeting"], json!({}));
    assert_eq!(root["variable"]["message"], json!({}));
    let values: Value = serde_json::from_slice(&inputs[TFVARS_JSON].0).unwrap();
    assert_eq!(values["size"], "large-and-secret");

    // A change of a source re-applies the cluster: the source wakes it.
    let first = status.last_run.unwrap().job;
    let changed = json!({"data": {"greeting": "changed"}});
    maps.patch("plain", &PatchParams::default(), &Patch::Merge(&changed))
        .await
        .unwrap();
    within(&env, 240, "the cluster applied again", || async {
        env.cluster_status("c")
            .await
            .filter(|s| applied(s) && s.last_run.as_ref().is_some_and(|r| r.job != first))
    })
    .await;
    assert_eq!(module_input(&env).await["greeting"], "changed");

    // The Secret's value is in no status, event or manager log line.
    let events = Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let status = env.cluster_status("c").await.unwrap();
    for (what, text) in [
        ("the status", serde_json::to_string(&status).unwrap()),
        ("the events", serde_json::to_string(&events.items).unwrap()),
        ("the manager's log", env.manager.log()),
    ] {
        assert!(!text.contains("large-and-secret"), "{what} shows the value");
    }
}

#[tokio::test]
async fn a_machine_reads_its_sources_only_until_it_is_applied() {
    let env = setup(MANAGER, "vars-machine", &[], &[]).await;
    let maps = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns);
    let source = ConfigMap {
        metadata: ObjectMeta {
            name: Some("sizes".into()),
            labels: Some([("captf.io/variables".to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        data: Some([("size".to_string(), "xl".to_string())].into()),
        ..Default::default()
    };
    maps.create(&PostParams::default(), &source).await.unwrap();
    env.cluster("c", NOOP, None).await;
    let mut workspace = noop(None);
    workspace.variables_from = Some(vec![config_map("sizes")]);
    env.create_machine("m", "c", workspace).await;
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Machine, "m"))
        .await
        .unwrap()
        .data
        .unwrap();
    let values: Value = serde_json::from_slice(&inputs[TFVARS_JSON].0).unwrap();
    assert_eq!(values["size"], "xl");

    // Gone after the apply: the machine neither waits nor turns unready.
    maps.delete("sizes", &Default::default()).await.unwrap();
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(8);
    while tokio::time::Instant::now() < until {
        let status = env.machine_status("m").await.unwrap();
        assert_eq!(
            condition(&status, "DependenciesReady"),
            Some(("True", "DependenciesReady")),
            "{}",
            env.context()
        );
        assert_eq!(condition(&status, "Ready"), Some(("True", "Ready")));
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
