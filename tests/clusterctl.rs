//! CAPTF as a clusterctl provider: the release folder that
//! `hack/release-manifests.sh` writes is a local clusterctl repository, the
//! real clusterctl renders its components and its cluster template, and
//! both pass a server-side dry run against the real API server (the
//! template through CAPTF's webhooks).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use captf::server::flags::Flags;
use captf_testkit::clusterctl::{Clusterctl, PROVIDER, release};
use captf_testkit::controlplane::{self, ControlPlane};
use captf_testkit::manager::apply_crds;
use captf_testkit::scenario::setup;
use captf_testkit::upstream::{cert_manager_crds, documents, yaml_dir};
use clap::{CommandFactory, Parser};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// `terraform:v<version>`, as a user names the provider.
fn provider() -> String {
    format!("{PROVIDER}:{}", release())
}

/// `kubectl apply --server-side --dry-run=server` of `yaml` in `plane`;
/// its stdout, or its stderr as the error.
fn dry_run(plane: &ControlPlane, yaml: &str) -> Result<String, String> {
    let mut child = Command::new(controlplane::binary("kubectl"))
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=captf-test",
            "--dry-run=server",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.success() {
        true => Ok(stdout),
        false => Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))),
    }
}

/// The names of a `--list-variables` section (`  - NAME  (defaults to …)`).
fn listed(section: &str) -> Vec<String> {
    section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

/// The manager's flags as parsed from `args`.
fn flags(args: &[String]) -> String {
    let parsed = Flags::try_parse_from(
        std::iter::once("captf-manager".to_string()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("{args:?} do not parse: {e}"));
    format!("{parsed:?}")
}

fn manager_container(docs: &[Value]) -> &Value {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0]["name"], "manager", "clusterctl's rule");
    &containers[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_release_is_a_clusterctl_provider_whose_components_pass_a_dry_run() {
    let c = Clusterctl::with_release();
    let read = |file: &str| std::fs::read_to_string(c.release.join(file)).unwrap();

    // The metadata maps this release's series to the v1beta2 contract.
    let metadata: Value = serde_saphyr::from_str(&read("metadata.yaml")).unwrap();
    assert_eq!(
        metadata["apiVersion"],
        "clusterctl.cluster.x-k8s.io/v1alpha3"
    );
    assert_eq!(metadata["kind"], "Metadata");
    let mut version = captf::VERSION.split('.').map(|n| n.parse::<u64>().unwrap());
    let (major, minor) = (version.next().unwrap(), version.next().unwrap());
    assert!(
        metadata["releaseSeries"]
            .as_array()
            .unwrap()
            .contains(&json!({"major": major, "minor": minor, "contract": "v1beta2"})),
        "{metadata}"
    );

    // Its variables are the image and flags named as the manager's own
    // CAPTF_<FLAG> environment variables.
    let components = c.release.join("infrastructure-components.yaml");
    let variables = listed(&c.run(
        &[
            "generate",
            "yaml",
            "--from",
            components.to_str().unwrap(),
            "--list-variables",
        ],
        &[],
    ));
    let envs: BTreeSet<String> = Flags::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    assert!(
        variables.contains(&"CAPTF_IMAGE".to_string()),
        "{variables:?}"
    );
    for v in variables.iter().filter(|v| *v != "CAPTF_IMAGE") {
        assert!(envs.contains(v), "{v} is not a flag's variable");
    }
    assert!(variables.len() >= 10, "{variables:?}");

    // Rendered by clusterctl from the local repository, every variable
    // unset.
    let rendered = c.run(
        &["generate", "provider", "--infrastructure", &provider()],
        &[],
    );
    let docs = documents(&rendered).unwrap();
    let namespaces: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Namespace").collect();
    assert_eq!(namespaces.len(), 1, "exactly one Namespace");
    assert_eq!(namespaces[0]["metadata"]["name"], "captf-system");
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        assert_eq!(
            labels["cluster.x-k8s.io/provider"], "infrastructure-terraform",
            "{} {}",
            doc["kind"], doc["metadata"]["name"]
        );
        if doc["kind"] == "CustomResourceDefinition" {
            // clusterctl move finds the kinds to move by this label.
            assert_eq!(labels["clusterctl.cluster.x-k8s.io"], "", "{labels}");
            assert_eq!(labels["cluster.x-k8s.io/v1beta2"], "v1alpha1", "{labels}");
            let identity = doc["spec"]["names"]["kind"] == "TerraformClusterIdentity";
            assert_eq!(
                labels
                    .get("clusterctl.cluster.x-k8s.io/move-hierarchy")
                    .is_some(),
                identity,
                "{labels}"
            );
        }
    }
    assert_eq!(
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .count(),
        7
    );
    let manager = manager_container(&docs);
    assert_eq!(
        manager["image"],
        format!("ghcr.io/captf-io/captf-manager:{}", release())
    );
    // Every default is the manager's own: the rendered flags parse to what
    // the flags that are not variables give alone.
    let raw = documents(&read("infrastructure-components.yaml")).unwrap();
    let fixed: Vec<String> = strings(&manager_container(&raw)["args"])
        .into_iter()
        .filter(|a| !a.contains("${"))
        .collect();
    let rendered_args = strings(&manager["args"]);
    assert!(rendered_args.len() > fixed.len(), "{rendered_args:?}");
    assert_eq!(flags(&rendered_args), flags(&fixed));
    // The watch filter's variable renders as an empty value.
    let env = manager["env"].as_array().unwrap();
    let filter = env
        .iter()
        .find(|e| e["name"] == "CAPTF_WATCH_FILTER")
        .unwrap();
    assert!(
        filter["value"].as_str().unwrap_or_default().is_empty(),
        "{filter}"
    );
    // A variable set reaches the manager.
    let tuned = c.run(
        &["generate", "provider", "--infrastructure", &provider()],
        &[
            ("CAPTF_STATE_BACKUPS", "9"),
            ("CAPTF_WATCH_FILTER", "team-a"),
        ],
    );
    let tuned = documents(&tuned).unwrap();
    let tuned = manager_container(&tuned);
    assert!(strings(&tuned["args"]).contains(&"--state-backups=9".to_string()));
    assert!(
        tuned["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "CAPTF_WATCH_FILTER", "value": "team-a"}))
    );

    // The API server takes every object, the Issuer and Certificate
    // against cert-manager's own CRDs.
    let plane = controlplane::shared();
    let client = plane.client().await;
    apply_crds(&client, &cert_manager_crds()).await;
    // A dry run persists no Namespace for the objects in it.
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("captf-system".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let applied = dry_run(plane, &rendered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        applied.matches("(server dry run)").count(),
        docs.len(),
        "{applied}"
    );
}

#[tokio::test]
async fn the_cluster_template_renders_with_its_variables_and_passes_the_webhooks() {
    let env = setup(MANAGER, "template", &[], &[]).await;
    env.manager.register_webhooks(&env.client).await;
    let kubeadm = captf_testkit::capi::module_dir().join("bootstrap/kubeadm/config/crd/bases");
    apply_crds(&env.client, &yaml_dir(&kubeadm)).await;
    let c = Clusterctl::with_release();
    let base = ["generate", "cluster", "demo", "--target-namespace", &env.ns];
    let provider = provider();
    let from_repository = [
        &base[..],
        &["--infrastructure", &provider, "--list-variables"],
    ]
    .concat();
    let out = c.run(&from_repository, &[]);
    let (required, optional) = out.split_once("Optional Variables:").expect(&out);
    assert_eq!(
        listed(required),
        [
            "CLUSTER_MODULE_IMAGE",
            "IDENTITY_NAME",
            "KUBERNETES_VERSION",
            "MACHINE_MODULE_IMAGE"
        ],
        "{out}"
    );
    assert_eq!(
        listed(optional),
        [
            "CLUSTER_NAME",
            "DRIFT_ACTION",
            "NAMESPACE",
            "WORKER_MACHINE_COUNT"
        ],
        "{out}"
    );

    // `--from` the release folder's file, as the user does.
    let template = c.release.join("cluster-template.yaml");
    let render = |cluster_image: &str| {
        let args = [
            &base[..],
            &[
                "--from",
                template.to_str().unwrap(),
                "--kubernetes-version",
                "v1.36.3",
                "--worker-machine-count",
                "2",
            ],
        ]
        .concat();
        c.run(
            &args,
            &[
                ("CLUSTER_MODULE_IMAGE", cluster_image),
                (
                    "MACHINE_MODULE_IMAGE",
                    "captf.test/modules/capi-machine:dev",
                ),
                ("IDENTITY_NAME", &env.identity),
            ],
        )
    };
    let yaml = render("captf.test/modules/capi-cluster:dev");
    let docs = documents(&yaml).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Cluster",
            "TerraformCluster",
            "MachineDeployment",
            "TerraformMachineTemplate",
            "KubeadmConfigTemplate"
        ]
    );
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"], env.ns.as_str());
    }
    assert_eq!(docs[2]["spec"]["replicas"], 2);
    assert_eq!(
        docs[1]["spec"]["identityRef"]["name"],
        env.identity.as_str()
    );
    let plane = controlplane::shared();
    let applied = dry_run(plane, &yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(applied.matches("(server dry run)").count(), 5, "{applied}");

    // CAPTF's webhook judged the dry run: an image it refuses.
    let refused = dry_run(plane, &render("captf.test/Modules/capi-cluster:dev"))
        .expect_err("an uppercase repository");
    assert!(
        refused.contains("denied the request") && refused.contains("spec.source.image"),
        "{refused}"
    );
}
