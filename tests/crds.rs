//! The generated CRDs against the real API server: they install, every kind
//! accepts a minimal object, the schema rejects what ref §1 forbids, nothing is
//! defaulted, and the published OpenAPI (what `kubectl explain` reads) carries
//! the descriptions.

use std::collections::BTreeMap;
use std::path::Path;

use captf::api::{
    self, IdentityReference, Initialization, SecretReference, Source, TerraformCluster,
    TerraformClusterIdentity, TerraformClusterIdentitySpec, TerraformClusterSpec,
    TerraformClusterTemplate, TerraformClusterTemplateResource, TerraformClusterTemplateSpec,
    TerraformMachine, TerraformMachinePool, TerraformMachinePoolSpec, TerraformMachinePoolTemplate,
    TerraformMachinePoolTemplateResource, TerraformMachinePoolTemplateSpec, TerraformMachineSpec,
    TerraformMachineStatus, TerraformMachineTemplate, TerraformMachineTemplateResource,
    TerraformMachineTemplateSpec, WorkspaceSpec, WorkspaceStatus,
};
use captf_testkit::{controlplane, eventually};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};

/// Applies the seven CRDs as committed under config/crd/bases (server-side,
/// so every test may do it) and waits until the API server serves each.
async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("captf-crd-tests").force();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/crd");
    let files = api::crd_files();
    let bases = files.iter().filter(|(name, _)| name.starts_with("bases/"));
    for (file, _) in bases {
        let yaml = std::fs::read_to_string(dir.join(file)).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("applying {file}: {e}"));
        eventually(&format!("{name} to be established"), || async {
            let conditions = crds.get(&name).await.ok()?.status?.conditions?;
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
}

fn source(image: &str) -> Source {
    Source {
        image: image.into(),
        ..Default::default()
    }
}

fn workspace(image: &str) -> WorkspaceSpec {
    WorkspaceSpec {
        source: source(image),
        ..Default::default()
    }
}

/// Creates `object` and reads it back, asserting that its spec survived as sent.
async fn create_and_read<K>(api: &Api<K>, object: K) -> K
where
    K: Resource + kube::core::object::HasSpec + Clone + std::fmt::Debug,
    K: serde::Serialize + serde::de::DeserializeOwned,
    K::Spec: PartialEq + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
    let read = api.get(&name).await.unwrap();
    assert_eq!(read.spec(), object.spec(), "{name}");
    read
}

#[tokio::test]
async fn every_kind_accepts_a_minimal_object() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "crd-kinds").await;

    let clusters = Api::namespaced(client.clone(), &ns);
    let cluster_spec = TerraformClusterSpec {
        workspace: WorkspaceSpec {
            identity_ref: Some(IdentityReference {
                name: "creds".into(),
            }),
            ..workspace("registry.example/cluster:1.0")
        },
        ..Default::default()
    };
    create_and_read(&clusters, TerraformCluster::new("c", cluster_spec.clone())).await;

    let machines = Api::namespaced(client.clone(), &ns);
    let machine_spec = TerraformMachineSpec {
        workspace: workspace("registry.example/machine:1.0"),
        ..Default::default()
    };
    create_and_read(&machines, TerraformMachine::new("m", machine_spec.clone())).await;

    let pools = Api::namespaced(client.clone(), &ns);
    let pool_spec = TerraformMachinePoolSpec {
        workspace: workspace("registry.example/pool:1.0"),
        ..Default::default()
    };
    create_and_read(&pools, TerraformMachinePool::new("p", pool_spec.clone())).await;

    let cluster_templates = Api::namespaced(client.clone(), &ns);
    let template = TerraformClusterTemplateSpec {
        template: TerraformClusterTemplateResource {
            metadata: None,
            spec: cluster_spec,
        },
    };
    create_and_read(
        &cluster_templates,
        TerraformClusterTemplate::new("ct", template),
    )
    .await;

    let machine_templates = Api::namespaced(client.clone(), &ns);
    let template = TerraformMachineTemplateSpec {
        template: TerraformMachineTemplateResource {
            metadata: None,
            spec: machine_spec,
        },
    };
    create_and_read(
        &machine_templates,
        TerraformMachineTemplate::new("mt", template),
    )
    .await;

    let pool_templates = Api::namespaced(client.clone(), &ns);
    let template = TerraformMachinePoolTemplateSpec {
        template: TerraformMachinePoolTemplateResource {
            metadata: None,
            spec: pool_spec,
        },
    };
    create_and_read(
        &pool_templates,
        TerraformMachinePoolTemplate::new("pt", template),
    )
    .await;

    // Cluster-scoped: named after the test's namespace so runs never collide.
    let identities: Api<TerraformClusterIdentity> = Api::all(client.clone());
    let identity = TerraformClusterIdentity::new(
        &ns,
        TerraformClusterIdentitySpec {
            secret_ref: SecretReference {
                name: "cloud-credentials".into(),
                namespace: "captf-system".into(),
            },
            allowed_namespaces: None,
        },
    );
    let read = create_and_read(&identities, identity).await;
    assert!(read.meta().namespace.is_none());
    identities
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}

/// Status goes through its subresource, and the printer columns read it.
#[tokio::test]
async fn status_subresource_and_printer_columns() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "crd-status").await;
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), &ns);
    let spec = TerraformMachineSpec {
        workspace: workspace("registry.example/machine:1.0"),
        ..Default::default()
    };
    create_and_read(&machines, TerraformMachine::new("m", spec)).await;

    let status = TerraformMachineStatus {
        workspace: WorkspaceStatus {
            conditions: Some(vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "Provisioning".into(),
                message: "the first apply runs".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2025-01-02T03:04:05Z".parse().unwrap(),
                ),
                observed_generation: Some(1),
            }]),
            initialization: Some(Initialization {
                provisioned: Some(false),
            }),
            active_job: Some(api::ActiveJob {
                name: "captf-m-m-apply-a1-abcdef".into(),
                operation: captf::names::Op::Apply,
                attempt: 1,
                start_time: None,
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let patch = json!({ "status": status });
    machines
        .patch_status("m", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let read = machines.get("m").await.unwrap();
    assert_eq!(read.status, Some(status));

    // What `kubectl get` prints: the server renders the columns as a Table.
    let request = http::Request::get(format!(
        "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/{ns}/terraformmachines/m"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: Value = client.request(request).await.unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "Ready", "Provisioned", "Operation", "Age"]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "m");
    assert_eq!(cells[1], "False");
    assert_eq!(cells[2], false);
    assert_eq!(cells[3], "apply");
}

/// Creates a raw object and returns the API server's answer: the stored
/// object, or the text of its refusal.
async fn create_raw(api: &Api<DynamicObject>, object: Value) -> Result<Value, (u16, String)> {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    match api.create(&PostParams::default(), &object).await {
        Ok(created) => Ok(serde_json::to_value(created).unwrap()),
        Err(kube::Error::Api(status)) => Err((status.code, status.message)),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn object(kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": kind,
        "metadata": { "name": name },
        "spec": spec,
    })
}

fn dynamic<K: Resource<DynamicType = ()>>(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

/// An object the schema must refuse, and a valid twin that differs only in
/// the value under test, so that the refusal is due to that value.
struct Case<'a> {
    what: &'a str,
    api: &'a Api<DynamicObject>,
    kind: &'a str,
    invalid: Value,
    valid: Value,
    /// Text the refusal contains.
    expected: &'a str,
}

/// The limits, enums, patterns and CEL rule of ref §1, each at its boundary.
#[tokio::test]
async fn schema_rejects_what_the_reference_forbids() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "crd-invalid").await;
    let machines = dynamic::<TerraformMachine>(&client, &ns);
    let pools = dynamic::<TerraformMachinePool>(&client, &ns);
    let templates = dynamic::<TerraformMachineTemplate>(&client, &ns);
    let identities: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<TerraformClusterIdentity>(&()),
    );

    let image = |len: usize| format!("registry.example/{}", "a".repeat(len - 17));
    let variables = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("v{i}"), json!(i))).collect())
    };
    let machine_source = json!({ "image": "registry.example/m:1" });

    let cases = vec![
        Case {
            what: "an image longer than 512",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": { "image": image(513) } }),
            valid: json!({ "source": { "image": image(512) } }),
            expected: "spec.source.image: Too long",
        },
        Case {
            what: "an unknown imagePullPolicy",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": { "image": "registry.example/m:1", "imagePullPolicy": "Sometimes" } }),
            valid: json!({ "source": { "image": "registry.example/m:1", "imagePullPolicy": "Never" } }),
            expected: "spec.source.imagePullPolicy: Unsupported value",
        },
        Case {
            what: "a variablesFrom entry with both refs",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "variablesFrom": [
                { "configMapRef": { "name": "a" }, "secretRef": { "name": "b" } } ] }),
            valid: json!({ "source": machine_source, "variablesFrom": [{ "secretRef": { "name": "b" } }] }),
            expected: "exactly one of configMapRef and secretRef must be set",
        },
        Case {
            what: "a variablesFrom entry with neither ref",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "variablesFrom": [{ "optional": true }] }),
            valid: json!({ "source": machine_source, "variablesFrom": [
                { "configMapRef": { "name": "a" }, "optional": true } ] }),
            expected: "exactly one of configMapRef and secretRef must be set",
        },
        Case {
            what: "a variablesFrom name that is no DNS subdomain",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "variablesFrom": [{ "secretRef": { "name": "Vars_1" } }] }),
            valid: json!({ "source": machine_source, "variablesFrom": [{ "secretRef": { "name": "vars-1.x" } }] }),
            expected: "spec.variablesFrom[0].secretRef.name: Invalid value",
        },
        Case {
            what: "257 variables",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "variables": variables(257) }),
            valid: json!({ "source": machine_source, "variables": variables(256) }),
            expected: "spec.variables: Too many",
        },
        Case {
            what: "an empty variables object",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "variables": {} }),
            valid: json!({ "source": machine_source, "variables": { "a": { "nested": [1, "x"] } } }),
            expected: "spec.variables: Invalid value",
        },
        Case {
            what: "a lock timeout above 3600",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "source": machine_source, "jobs": { "lockTimeoutSeconds": 3601 } }),
            valid: json!({ "source": machine_source, "jobs": { "lockTimeoutSeconds": 3600 } }),
            expected: "spec.jobs.lockTimeoutSeconds: Invalid value",
        },
        Case {
            what: "a pool drift interval of 0",
            api: &pools,
            kind: "TerraformMachinePool",
            invalid: json!({ "source": machine_source, "drift": { "intervalSeconds": 0 } }),
            valid: json!({ "source": machine_source, "drift": { "intervalSeconds": 1 } }),
            expected: "spec.drift.intervalSeconds: Invalid value",
        },
        Case {
            what: "a membership refresh interval of 0",
            api: &pools,
            kind: "TerraformMachinePool",
            invalid: json!({ "source": machine_source, "membershipRefreshIntervalSeconds": 0 }),
            valid: json!({ "source": machine_source, "membershipRefreshIntervalSeconds": 15 }),
            expected: "spec.membershipRefreshIntervalSeconds: Invalid value",
        },
        Case {
            what: "a long image inside a template",
            api: &templates,
            kind: "TerraformMachineTemplate",
            invalid: json!({ "template": { "spec": { "source": { "image": image(513) } } } }),
            valid: json!({ "template": { "spec": { "source": { "image": image(512) } } } }),
            expected: "spec.template.spec.source.image: Too long",
        },
        Case {
            what: "a spec without source",
            api: &machines,
            kind: "TerraformMachine",
            invalid: json!({ "drift": { "intervalSeconds": 0 } }),
            valid: json!({ "drift": { "intervalSeconds": 0 }, "source": machine_source }),
            expected: "spec.source: Required value",
        },
        Case {
            what: "an identity Secret namespace that is no DNS label",
            api: &identities,
            kind: "TerraformClusterIdentity",
            invalid: json!({ "secretRef": { "name": "creds", "namespace": "Team.A" } }),
            valid: json!({ "secretRef": { "name": "creds", "namespace": "team-a" } }),
            expected: "spec.secretRef.namespace: Invalid value",
        },
    ];

    for (i, case) in cases.into_iter().enumerate() {
        let Case {
            what,
            api,
            kind,
            invalid,
            valid,
            expected,
        } = case;
        // Identities are cluster-scoped: their names carry the namespace.
        let name = format!("{ns}-{i}");
        let (code, message) = create_raw(api, object(kind, &name, invalid))
            .await
            .expect_err(what);
        assert_eq!(code, 422, "{what}: {message}");
        assert!(
            message.contains(expected),
            "{what}: {message:?} lacks {expected:?}"
        );
        create_raw(api, object(kind, &name, valid))
            .await
            .unwrap_or_else(|(code, message)| panic!("{what}, valid variant: {code} {message}"));
        if kind == "TerraformClusterIdentity" {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
    }
}

/// Ref §1.1: the schemas declare no defaults. What a client sends is what it
/// reads back; an explicit null is pruned like an absent field.
#[tokio::test]
async fn nothing_is_defaulted_and_nulls_are_pruned() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let ns = captf_testkit::namespace(&client, "crd-defaults").await;
    let machines = dynamic::<TerraformMachine>(&client, &ns);

    let minimal = json!({ "source": { "image": "registry.example/m:1" } });
    let created = create_raw(
        &machines,
        object("TerraformMachine", "bare", minimal.clone()),
    )
    .await
    .unwrap();
    assert_eq!(created["spec"], minimal);
    let read = machines.get("bare").await.unwrap();
    assert_eq!(read.data["spec"], minimal);
    assert!(read.data.get("status").is_none());
    // The typed view agrees: no jobs, and writing it back adds nothing.
    let typed: TerraformMachine =
        serde_json::from_value(serde_json::to_value(&read).unwrap()).unwrap();
    assert_eq!(typed.spec.workspace.jobs, None);
    assert_eq!(serde_json::to_value(&typed.spec).unwrap(), minimal);

    let with_nulls = json!({
        "source": { "image": "registry.example/m:1", "imagePullPolicy": null },
        "jobs": null,
        "drift": {},
    });
    let created = create_raw(&machines, object("TerraformMachine", "nulls", with_nulls))
        .await
        .unwrap();
    assert_eq!(
        created["spec"],
        json!({ "source": { "image": "registry.example/m:1" }, "drift": {} })
    );
}

fn description(schema: &Value) -> Option<&str> {
    schema["description"]
        .as_str()
        .filter(|d| !d.trim().is_empty())
}

/// Collects the JSON paths of the fields under `schema` that have no
/// description.
fn undescribed(path: &str, schema: &Value, missing: &mut Vec<String>) {
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            let path = format!("{path}.{name}");
            if description(property).is_none() {
                missing.push(path.clone());
            }
            undescribed(&path, property, missing);
        }
    }
    if schema["items"].is_object() {
        undescribed(&format!("{path}[]"), &schema["items"], missing);
    }
}

/// `kubectl explain` reads the OpenAPI v3 document the API server publishes
/// for the group; every field of every kind is described there.
#[tokio::test]
async fn published_openapi_describes_every_field() {
    let client = controlplane::shared().client().await;
    install_crds(&client).await;
    let kinds = [
        "TerraformCluster",
        "TerraformMachine",
        "TerraformMachinePool",
        "TerraformClusterTemplate",
        "TerraformMachineTemplate",
        "TerraformMachinePoolTemplate",
        "TerraformClusterIdentity",
    ];
    // The document is rebuilt asynchronously after a CRD is established.
    let schemas = eventually("the group's OpenAPI document", || async {
        let request =
            http::Request::get("/openapi/v3/apis/infrastructure.cluster.x-k8s.io/v1alpha1")
                .body(Vec::new())
                .unwrap();
        let document: Value = client.request(request).await.ok()?;
        let schemas = document["components"]["schemas"].as_object()?.clone();
        kinds
            .iter()
            .all(|kind| {
                schemas.contains_key(&format!("io.x-k8s.cluster.infrastructure.v1alpha1.{kind}"))
            })
            .then_some(schemas)
    })
    .await;

    let mut missing = Vec::new();
    for kind in kinds {
        let schema = &schemas[&format!("io.x-k8s.cluster.infrastructure.v1alpha1.{kind}")];
        for part in ["spec", "status"] {
            if let Some(part_schema) = schema["properties"].get(part) {
                assert!(description(part_schema).is_some(), "{kind}.{part}");
                undescribed(&format!("{kind}.{part}"), part_schema, &mut missing);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "published fields without a description: {missing:#?}"
    );

    let machine = &schemas["io.x-k8s.cluster.infrastructure.v1alpha1.TerraformMachine"];
    let lock =
        &machine["properties"]["spec"]["properties"]["jobs"]["properties"]["lockTimeoutSeconds"];
    assert!(description(lock).unwrap().contains("state lock"), "{lock}");
    let fields: BTreeMap<&str, &Value> = machine["properties"]["spec"]["properties"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    assert_eq!(
        fields.keys().copied().collect::<Vec<_>>(),
        [
            "drift",
            "identityRef",
            "jobs",
            "providerID",
            "remediation",
            "source",
            "variables",
            "variablesFrom"
        ]
    );
}
