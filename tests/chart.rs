//! The Helm chart: it lints, it renders, what it renders says the same as
//! config/ (RBAC and webhook rules), and the real API server accepts every
//! object it renders (server-side dry run).

use std::path::Path;

use captf_testkit::controlplane;
use captf_testkit::manager::install_crds;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn helm(args: &[&str]) -> String {
    captf_testkit::install::tool("helm", args)
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn config(path: &str) -> Vec<Value> {
    documents(&std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn rendered() -> Vec<Value> {
    rendered_with(&[])
}

fn rendered_with(extra: &[&str]) -> Vec<Value> {
    let chart = Path::new(ROOT).join("charts/captf");
    let mut args = vec![
        "template",
        "captf",
        chart.to_str().unwrap(),
        "--namespace",
        "captf-system",
        "--include-crds",
    ];
    args.extend(extra);
    documents(&helm(&args))
}

#[test]
fn chart_lints_and_says_what_config_says() {
    let chart = Path::new(ROOT).join("charts/captf");
    helm(&["lint", "--strict", chart.to_str().unwrap()]);
    let docs = rendered();

    let role = config("config/rbac/role.yaml");
    assert_eq!(
        find(&docs, "ClusterRole", "captf-manager-role")["rules"],
        find(&role, "ClusterRole", "captf-manager-role")["rules"]
    );
    let leader = config("config/rbac/leader_election_role.yaml");
    assert_eq!(
        find(&docs, "Role", "captf-leader-election-role")["rules"],
        find(&leader, "Role", "captf-leader-election-role")["rules"]
    );
    let runner = config("config/rbac/runner_clusterrole.yaml");
    assert_eq!(
        find(&docs, "ClusterRole", "captf-runner")["rules"],
        find(&runner, "ClusterRole", "captf-runner")["rules"]
    );

    let hooks = config("config/webhook/manifests.yaml");
    for (kind, name) in [
        (
            "ValidatingWebhookConfiguration",
            "captf-validating-webhook-configuration",
        ),
        (
            "MutatingWebhookConfiguration",
            "captf-mutating-webhook-configuration",
        ),
    ] {
        assert_eq!(
            find(&docs, kind, name)["webhooks"],
            find(&hooks, kind, name)["webhooks"],
            "{name}"
        );
        assert_eq!(
            find(&docs, kind, name)["metadata"]["annotations"],
            find(&hooks, kind, name)["metadata"]["annotations"],
            "{name}"
        );
    }
    let crds = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, 7);

    // Without cert-manager: the init container's role and its container,
    // as config/selfsigned has them.
    let self_signed = rendered_with(&["--set", "certManager.enabled=false"]);
    let role = config("config/selfsigned/role.yaml");
    assert_eq!(
        find(&self_signed, "ClusterRole", "captf-webhook-certs-role")["rules"],
        find(&role, "ClusterRole", "captf-webhook-certs-role")["rules"]
    );
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["name"] != "captf-webhook-certs-role")
    );
    let patch = config("config/selfsigned/manager_patch.yaml");
    let init = |docs: &[Value]| {
        let spec =
            &find(docs, "Deployment", "captf-controller-manager")["spec"]["template"]["spec"];
        let certs = spec["initContainers"][0].clone();
        (
            certs["name"].clone(),
            certs["args"].clone(),
            certs["volumeMounts"].clone(),
            certs["env"].clone(),
        )
    };
    assert_eq!(init(&self_signed), init(&patch));
}

#[tokio::test]
async fn the_api_server_accepts_everything_the_chart_renders() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let docs = rendered();
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::apply("chart-test").force()
    };
    let mut checked = 0;
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_string();
        // cert-manager is not installed on the test control plane.
        if doc["apiVersion"]
            .as_str()
            .unwrap()
            .starts_with("cert-manager.io/")
            || kind == "CustomResourceDefinition"
        {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let types = object.types.clone().unwrap();
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let (resource, caps) =
            kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, &kind))
                .await
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), "default", &resource)
            }
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let name = object.metadata.name.clone().unwrap();
        let mut object = object;
        // The dry run goes to a namespace that exists; the chart's own is
        // created by `helm install --create-namespace`.
        if caps.scope == kube::discovery::Scope::Namespaced {
            object.metadata.namespace = Some("default".into());
        }
        api.patch(&name, &dry_run, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} objects checked");
}
