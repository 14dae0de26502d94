//! The reconcilers end to end: the manager process, the local pod executor
//! in place of kubelet, real OpenTofu in the Jobs' pods, and the real API
//! server. Each test has its own namespace, manager (`--namespace`) and
//! executor.

use base64::Engine as _;
use std::time::Duration;

use captf::api::{TerraformCluster, TerraformClusterIdentity, TerraformMachine, WorkspaceSpec};
use captf::names::{self, Kind};
use captf_testkit::controlplane;
use captf_testkit::refusal::{self, Refusal};
use captf_testkit::scenario::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

#[tokio::test]
async fn a_cluster_and_its_machine_are_applied_and_their_state_adopted() {
    let env = setup(MANAGER, "apply", &[("API_TOKEN", "s3cr3t-t0ken")], &[]).await;
    env.cluster("c1", NOOP, vars(&[("greeting", json!("hi"))]))
        .await;
    let machine = env
        .machine("m1", "c1", vars(&[("size", json!("small"))]))
        .await;

    let m = within(&env, 240, "the machine applied", || async {
        env.machine_status("m1").await.filter(applied)
    })
    .await;
    let c = within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c1").await.filter(applied)
    })
    .await;

    for (status, kind, name) in [(&c, Kind::Cluster, "c1"), (&m, Kind::Machine, "m1")] {
        let run = status.last_run.as_ref().expect("a last run");
        assert!(
            run.job
                .starts_with(&format!("captf-{}-{name}-apply-a1-", kind.short())),
            "{}",
            run.job
        );
        let steps: Vec<&str> = run
            .steps
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(steps, ["init", "validate", "apply"], "{}", env.context());
        assert!(run.error.is_none());
        assert!(status.observed_state_serial.is_some_and(|s| s >= 1));
        assert_eq!(
            status
                .source
                .as_ref()
                .and_then(|s| s.runtime_version.as_deref()),
            Some("1.12.6")
        );
        assert_eq!(
            status.source.as_ref().and_then(|s| s.image.as_deref()),
            Some(NOOP)
        );
        assert!(status.active_job.is_none());
        let suffix = names::suffix(&env.ns, kind, name);
        assert_eq!(status.state_secret_suffix.as_deref(), Some(suffix.as_str()));

        // The state is adopted: it carries the applied inputs hash.
        let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
        let base = secrets.get(&names::state_secret(&suffix)).await.unwrap();
        assert!(
            base.annotations()
                .get("captf.io/inputs-hash")
                .is_some_and(|h| h.starts_with("h2:"))
        );
        // The per-run Secret is gone once bookkept; the run lease is free.
        assert!(
            secrets
                .get_opt(&names::run_secret(&run.job))
                .await
                .unwrap()
                .is_none()
        );
        let lease = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
            .get(&names::run_lease(&suffix))
            .await
            .unwrap();
        assert_eq!(
            lease
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty()),
            None
        );
    }
    // Each condition's change is an event series of its own, so each note
    // shows (one series would show only the first note, counted).
    within(&env, 30, "a ConditionChanged event per change", || async {
        let events = env
            .events_about("ConditionChanged", Kind::Cluster, "c1")
            .await;
        let shown = |prefix: &str| {
            events
                .iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.starts_with(prefix)))
        };
        [
            "IdentityAllowed: ",
            "StateReadable: ",
            "ApplyJobSucceeded: ",
        ]
        .into_iter()
        .all(shown)
        .then_some(())
    })
    .await;
    // Adopted: every state Secret is owned by the object (not as its
    // controller), which the finalizer keeps until the destroy ran.
    let cluster = env.api::<TerraformCluster>().get("c1").await.unwrap();
    for (object, kind, name) in [
        (cluster.meta(), Kind::Cluster, "c1"),
        (machine.meta(), Kind::Machine, "m1"),
    ] {
        let uid = object.uid.as_deref().unwrap();
        let chunks = env.state_secrets(&env.suffix(kind, name)).await;
        assert!(!chunks.is_empty());
        for chunk in chunks {
            let secret = env.secrets().get(&chunk).await.unwrap();
            let owner = secret
                .owner_references()
                .iter()
                .find(|o| o.uid == uid)
                .cloned();
            assert!(
                owner.is_some_and(|o| o.controller != Some(true)),
                "{chunk}: {:?}",
                secret.owner_references()
            );
        }
    }
    assert!(
        env.finalizers::<TerraformCluster>("c1")
            .await
            .contains(&finalizer(Kind::Cluster))
    );
    assert!(
        env.finalizers::<TerraformMachine>("m1")
            .await
            .contains(&finalizer(Kind::Machine))
    );
    // The durable inputs the destroy will run from.
    let inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Machine, "m1"))
        .await
        .unwrap();
    assert!(
        inputs
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == machine.meta().uid.as_ref())
    );
    let keys: Vec<&String> = inputs.data.iter().flatten().map(|(k, _)| k).collect();
    assert_eq!(keys, ["main.tf.json", "terraform.tfvars.json"]);
    let annotation = |key: &str| inputs.annotations().get(key).map(String::as_str);
    assert_eq!(annotation("captf.io/image"), Some(NOOP));
    assert!(annotation("captf.io/inputs-hash").is_some_and(|h| h.starts_with("h2:")));
    assert_eq!(annotation("captf.io/applied"), Some("true"));
    // The role inputs (ref §9.3), from the Machine, its bootstrap Secret and
    // the cluster's exports.
    let tfvars = |secret: &Secret| -> serde_json::Value {
        let data = secret.data.as_ref().unwrap();
        serde_json::from_slice(&data["terraform.tfvars.json"].0).unwrap()
    };
    let values = tfvars(&inputs);
    let bootstrap =
        base64::engine::general_purpose::STANDARD.encode(captf_testkit::owners::BOOTSTRAP_DATA);
    assert_eq!(values["machine_name"], json!("m1"));
    assert_eq!(values["bootstrap_data"], json!(bootstrap));
    assert_eq!(values["bootstrap_format"], json!("cloud-config"));
    assert_eq!(values["kubernetes_version"], json!("v1.36.3"));
    assert_eq!(values["control_plane"], json!(false));
    assert_eq!(values["failure_domain"], json!(null));
    assert_eq!(
        values["captf_cluster_outputs"],
        json!({"cluster": "c1", "greeting": "hi"})
    );
    assert_eq!(
        values["captf_cluster"],
        json!({"name": "c1", "namespace": env.ns})
    );
    let cluster_inputs = env
        .secrets()
        .get(&names::inputs_secret(Kind::Cluster, "c1"))
        .await
        .unwrap();
    let values = tfvars(&cluster_inputs);
    assert_eq!(values["control_plane_endpoint"], json!(null));
    assert_eq!(values["control_plane_initialized"], json!(false));
    assert_eq!(values["kubernetes_version"], json!(null));
    assert_eq!(values["cluster_network"], json!(null));
    assert!(values.get("captf_cluster_outputs").is_none());
    assert!(!env.manager.log().contains(&bootstrap));

    // Applied inputs leave nothing to do: no second Job.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let jobs = env.jobs().await;
    assert_eq!(
        jobs.len(),
        2,
        "{:?}",
        jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    for job in &jobs {
        assert!(job.annotations().contains_key("captf.io/bookkept"));
    }
    assert!(!env.events("JobCreated").await.is_empty());
    assert!(!env.events("StateAdopted").await.is_empty());
    // The credentials mirror the Jobs mounted.
    let mirror = Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .get(&names::credentials_mirror(&env.identity))
        .await
        .unwrap();
    assert_eq!(
        mirror.labels().get("captf.io/mirrored").map(String::as_str),
        Some("true")
    );
    // No secret in the manager's log.
    assert!(!env.manager.log().contains("s3cr3t-t0ken"));
}

#[tokio::test]
async fn a_failed_apply_is_recorded_and_retried_after_the_backoff() {
    let env = setup(MANAGER, "fail", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    env.machine("m", "c", vars(&[("fail", json!(true))])).await;
    let status = within(&env, 240, "the failed apply recorded", || async {
        env.machine_status("m")
            .await
            .filter(|s| condition(s, "ApplyJobSucceeded") == Some(("False", "ApplyFailed")))
    })
    .await;
    let run = status.last_run.expect("a last run");
    let error = run.error.expect("an error");
    assert_eq!(error.step.as_deref(), Some("apply"));
    assert!(
        error.summary.as_deref().is_some_and(|s| !s.is_empty()),
        "{error:?}"
    );
    let first = env
        .jobs()
        .await
        .into_iter()
        .find(|j| j.name_any() == run.job)
        .expect("the failed Job");
    let failed = failed_at(&first).expect("a Failed condition");
    // The retry waits one minute (ref §8.4: 1m after the first failure).
    let retry = within(&env, 180, "the retry Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-m-m-apply-a2-"))
    })
    .await;
    let created = retry.metadata.creation_timestamp.unwrap().0;
    let waited = created.duration_since(failed).as_secs();
    assert!(
        (59..=90).contains(&waited),
        "the retry came {waited}s after the failure"
    );
}

#[tokio::test]
async fn two_managers_racing_start_one_job() {
    let env = setup(MANAGER, "race", &[], &[]).await;
    let second = env.start_manager(&[]).await;
    env.cluster("c", NOOP, None).await;
    for i in 0..3 {
        env.machine(&format!("m{i}"), "c", None).await;
    }
    for i in 0..3 {
        within(&env, 240, "the machine applied", || async {
            env.machine_status(&format!("m{i}")).await.filter(applied)
        })
        .await;
    }
    within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let jobs: Vec<String> = env.jobs().await.iter().map(|j| j.name_any()).collect();
    assert_eq!(
        jobs.len(),
        4,
        "one Job per object: {jobs:?}\n--- second manager:\n{}",
        tail(&second.log())
    );
}

/// The objects of a namespace share its credentials mirror, so passes
/// started together race to write it: the loser reads it again, and no
/// object reports the mirror failed.
#[tokio::test]
async fn machines_created_at_once_share_the_credentials_mirror_without_a_failure() {
    let env = setup(MANAGER, "mirror", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    let names: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    futures::future::join_all(names.iter().map(|n| env.machine(n, "c", None))).await;
    let mirror = names::credentials_mirror(&env.identity);
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let machines = Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns);
    within(
        &env,
        180,
        "every machine a user of the mirror, mirrored",
        || async {
            let owners: Vec<String> = secrets
                .get_opt(&mirror)
                .await
                .unwrap()?
                .owner_references()
                .iter()
                .map(|o| o.name.clone())
                .collect();
            let listed = machines.list(&ListParams::default()).await.unwrap().items;
            let mirrored = listed.iter().all(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| condition(&s.workspace, "CredentialsMirrored"))
                    == Some(("True", "Mirrored"))
            });
            (mirrored && names.iter().all(|n| owners.contains(n))).then_some(())
        },
    )
    .await;
    let failed: Vec<String> = env
        .events("ConditionChanged")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .filter(|n| n.contains("MirrorFailed"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", env.context());
}

/// The cluster `c` applied once (machines wait for its exports until
/// then), then re-applying slowly: its second apply Job.
async fn reapplying_cluster(env: &Env) -> Job {
    env.cluster("c", NOOP, None).await;
    within(env, 180, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 25}}})),
        )
        .await
        .unwrap();
    within(env, 120, "the cluster's second Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-c-c-apply-") && !finished(j))
    })
    .await
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_some_and(|s| s.succeeded.unwrap_or(0) > 0 || s.failed.unwrap_or(0) > 0)
}

#[tokio::test]
async fn a_machine_waits_while_its_cluster_holds_the_write_lease() {
    let env = setup(MANAGER, "gate", &[], &[]).await;
    let cluster_job = reapplying_cluster(&env).await;
    env.machine("m", "c", None).await;
    let status = within(&env, 60, "the machine waiting", || async {
        env.machine_status("m").await.filter(|s| {
            condition(s, "ApplyJobSucceeded") == Some(("Unknown", "WaitingForClusterOperation"))
        })
    })
    .await;
    assert!(status.active_job.is_none());
    let jobs = env.jobs().await;
    assert!(
        jobs.iter().all(|j| !j.name_any().starts_with("captf-m-")),
        "a machine Job started while the cluster applies"
    );
    let cluster_done = within(&env, 180, "the cluster's re-apply done", || async {
        env.cluster_status("c").await.filter(|s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.job == cluster_job.name_any())
        })
    })
    .await;
    let machine_job = within(&env, 120, "the machine's Job", || async {
        env.jobs()
            .await
            .into_iter()
            .find(|j| j.name_any().starts_with("captf-m-m-apply-"))
    })
    .await;
    assert!(
        cluster_done
            .last_run
            .is_some_and(|r| r.job == cluster_job.name_any())
    );
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    assert!(!env.events("WaitingForClusterOperation").await.is_empty());
    drop(machine_job);
}

#[tokio::test]
async fn with_the_gate_off_a_machine_does_not_wait_for_its_cluster() {
    let env = setup(MANAGER, "nogate", &[], &["--cluster-operation-gate=false"]).await;
    reapplying_cluster(&env).await;
    env.machine("m", "c", None).await;
    within(
        &env,
        60,
        "the machine's Job while the cluster's runs",
        || async {
            let status = env.cluster_status("c").await?;
            let machine_job = env
                .jobs()
                .await
                .into_iter()
                .any(|j| j.name_any().starts_with("captf-m-m-apply-"));
            (machine_job && status.active_job.is_some()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn credentials_and_image_environment_never_steer_tofu() {
    let poison = [
        ("TF_WORKSPACE", "poisoned"),
        ("TF_VAR_greeting", "poisoned"),
        ("TF_CLI_ARGS", "-no-such-flag"),
        ("KUBE_CONFIG_PATH", "/nonexistent"),
        ("SAFE_VALUE", "kept"),
    ];
    let env = setup(MANAGER, "env", &poison, &[]).await;
    env.cluster("c", POISONED, vars(&[("dump_env", json!(true))]))
        .await;
    let status = within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let job = status.last_run.unwrap().job;
    let pod = within(&env, 30, "the Job's pod", || async {
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns)
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
            .await
            .ok()?;
        pods.items.into_iter().next().map(|p| p.name_any())
    })
    .await;
    let seen = std::fs::read_to_string(
        env.executor
            .pod_dir(&env.ns, &pod)
            .join("captf/work/root/seen-env"),
    )
    .expect("the module's environment dump");
    for name in [
        "TF_WORKSPACE",
        "TF_VAR_greeting",
        "TF_VAR_message",
        "TF_CLI_ARGS",
        "KUBE_CONFIG_PATH",
    ] {
        assert!(
            !seen.lines().any(|l| l.starts_with(&format!("{name}="))),
            "{name} reached tofu:\n{seen}"
        );
    }
    assert!(!seen.contains("poisoned"));
    assert!(seen.lines().any(|l| l == "SAFE_VALUE=kept"), "{seen}");
    assert!(
        seen.lines()
            .any(|l| l.starts_with("TF_DATA_DIR=") && l.ends_with("/captf/work/.terraform")),
        "{seen}"
    );
}

#[tokio::test]
async fn the_runner_account_cannot_read_secrets_of_another_namespace() {
    let env = setup(MANAGER, "rbac", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let other = captf_testkit::namespace(&env.client, "rbac-other").await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("private".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &other)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let sa = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns);
    let token = sa
        .create_token_request(
            names::RUNNER_RBAC,
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(600),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("a token");
    let runner = client_with_token(&token).await;
    let own = Api::<Secret>::namespaced(runner.clone(), &env.ns)
        .list(&ListParams::default())
        .await;
    assert!(
        own.is_ok(),
        "the runner reads its own namespace's Secrets: {own:?}"
    );
    match Api::<Secret>::namespaced(runner, &other)
        .get("private")
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403),
        other => panic!("expected 403, got {other:?}"),
    }
}

/// A client of the test control plane that authenticates with `token`.
async fn client_with_token(token: &str) -> kube::Client {
    use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
    let mut kubeconfig = Kubeconfig::read_from(controlplane::shared().kubeconfig()).unwrap();
    for user in &mut kubeconfig.auth_infos {
        user.auth_info = Some(AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        });
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn state_readable_gauges_counter_and_events() {
    // The identity allows another namespace only, so no Job ever starts and
    // the hand-written states stay as written.
    let env = setup(MANAGER, "stateread", &[], &[]).await;
    let api = Api::<TerraformClusterIdentity>::all(env.client.clone());
    api.patch(
        &env.identity,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"allowedNamespaces": {"list": ["elsewhere"]}}})),
    )
    .await
    .unwrap();
    let big = big_state(940 * 1024);
    assert!(big.len() > 921_600);
    put_state(&env, Kind::Machine, "big", &big).await;
    put_state(&env, Kind::Machine, "bad", b"\x1f\x8b\x08\x00garbage").await;
    env.cluster("c", NOOP, None).await;
    env.machine("big", "c", None).await;
    env.machine("bad", "c", None).await;

    let big_status = within(&env, 60, "the big state read", || async {
        env.machine_status("big")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("True", "StateRead")))
    })
    .await;
    assert_eq!(big_status.observed_state_serial, Some(7));
    assert_eq!(
        condition(&big_status, "IdentityAllowed"),
        Some(("False", "NamespaceNotAllowed"))
    );
    within(&env, 60, "the corrupt state reported", || async {
        env.machine_status("bad")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("False", "StateCorrupt")))
    })
    .await;
    let near = within(&env, 30, "the near-limit Warning", || async {
        let e = env.events("StateNearSecretLimit").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(near.len(), 1, "once per serial");
    assert_eq!(near[0].type_.as_deref(), Some("Warning"));
    let unreadable = env.events("StateUnreadable").await;
    assert_eq!(unreadable.len(), 1);
    assert!(env.jobs().await.is_empty(), "no Job may start");

    let metrics = env.manager.metrics().await;
    let line = |prefix: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(prefix)
                    && l.contains(&format!("namespace=\"{}\"", env.ns))
                    && l.contains("name=\"big\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    assert_eq!(
        line("captf_state_bytes{"),
        Some(big.len() as f64),
        "{metrics}"
    );
    assert_eq!(line("captf_state_resources{"), Some(0.0));
    let corrupt = metrics
        .lines()
        .find(|l| {
            l.starts_with("captf_state_read_errors_total{")
                && l.contains("reason=\"corrupt\"")
                && l.contains("kind=\"TerraformMachine\"")
        })
        .unwrap_or_else(|| panic!("no corrupt counter:\n{metrics}"));
    assert!(corrupt.ends_with(" 1"), "{corrupt}");
    // Every pass is counted as controller-runtime counts reconciles.
    let passes = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"controller_runtime_reconcile_total{controller="terraformmachine",result="success"} "#,
            )
        })
        .and_then(|n| n.parse::<f64>().ok());
    assert!(passes.is_some_and(|n| n >= 2.0), "{metrics}");

    // Another pass over the same corrupt state counts nothing new.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.events("StateUnreadable").await.len(), 1);
}

#[tokio::test]
async fn an_override_account_runs_jobs_only_once_opted_in() {
    let env = setup(MANAGER, "optin", &[], &[]).await;
    let accounts = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns);
    let custom = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("custom".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &custom)
        .await
        .unwrap();
    env.cluster("c", NOOP, None).await;
    let jobs = captf::api::JobPolicy {
        service_account_name: Some("custom".into()),
        ..Default::default()
    };
    env.create_machine(
        "m",
        "c",
        WorkspaceSpec {
            jobs: Some(jobs),
            ..noop(None)
        },
    )
    .await;
    within(&env, 60, "the refusal", || async {
        env.machine_status("m").await.filter(|s| {
            condition(s, "RunnerRBACReady") == Some(("False", "ServiceAccountNotOptedIn"))
        })
    })
    .await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().starts_with("captf-m-")),
        "no Job without the opt-in"
    );

    accounts
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"captf.io/runner": "true"}}})),
        )
        .await
        .unwrap();
    // The account is not watched: a change of the object starts the next pass.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let job = env
        .jobs()
        .await
        .into_iter()
        .find(|j| j.name_any().starts_with("captf-m-m-apply-"))
        .unwrap();
    let sa = job
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .service_account_name;
    assert_eq!(sa.as_deref(), Some("custom"));
    let binding =
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.client.clone(), &env.ns)
            .get(names::RUNNER_RBAC)
            .await
            .unwrap();
    let subjects: Vec<String> = binding
        .subjects
        .into_iter()
        .flatten()
        .map(|s| s.name)
        .collect();
    assert!(
        subjects.contains(&"custom".to_string()) && subjects.contains(&"captf-runner".to_string()),
        "{subjects:?}"
    );
}

// ---- Stale state locks (book: state-lock-and-stale-locks.md) ----

/// The state lock Lease of a machine: its holder identity, and the `Who`
/// and `Operation` of its lock info.
async fn lock_holder(env: &Env, machine: &str) -> Option<(String, String, String)> {
    let suffix = names::suffix(&env.ns, Kind::Machine, machine);
    let lease = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
        .get_opt(&names::state_lock_lease(&suffix))
        .await
        .ok()??;
    let holder = lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())?;
    let info: serde_json::Value =
        serde_json::from_str(lease.annotations().get("app.terraform.io/lock-info")?).ok()?;
    Some((
        holder,
        info["Who"].as_str()?.to_string(),
        info["Operation"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Waits until the machine's apply holds the state lock; returns its
/// `Who`. The apply's lock, not init's: init takes the lock briefly too,
/// and a runner killed after init let go leaves no lock behind.
async fn apply_lock_holder(env: &Env, machine: &str) -> String {
    within(env, 240, "the apply holding the state lock", || async {
        lock_holder(env, machine)
            .await
            .filter(|(_, _, operation)| operation == "OperationTypeApply")
            .map(|(_, who, _)| who)
    })
    .await
}

async fn machine_jobs(env: &Env, machine: &str) -> Vec<Job> {
    let prefix = format!("captf-m-{machine}-");
    env.jobs()
        .await
        .into_iter()
        .filter(|j| j.name_any().starts_with(&prefix))
        .collect()
}

/// Starts a slow machine apply and kills its runner mid-apply (reported
/// OOMKilled), so that the runner's pod ends while its lock is held.
/// Returns the pod's name.
async fn kill_mid_apply(env: &Env, machine: &str) -> String {
    env.cluster("c", NOOP, None).await;
    env.machine(machine, "c", vars(&[("sleep_seconds", json!(60))]))
        .await;
    let who = apply_lock_holder(env, machine).await;
    let pod = who.rsplit('@').next().unwrap().to_string();
    assert!(
        names::is_own_runner_pod(Kind::Machine, machine, &pod),
        "{who}"
    );
    // The retry need not be slow.
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 0}}})),
        )
        .await
        .unwrap();
    assert!(
        env.executor.kill_oom(&env.ns, &pod),
        "the runner of {pod} was not running"
    );
    within(env, 60, "the killed Job failed", || async {
        machine_jobs(env, machine)
            .await
            .into_iter()
            .find(job_failed)
    })
    .await;
    assert!(
        lock_holder(env, machine).await.is_some(),
        "the killed runner's lock is still held"
    );
    pod
}

/// After the kill, the next Job force-unlocks and applies.
async fn next_job_force_unlocks(env: &Env, machine: &str) {
    let status = within(env, 240, "the retry applied", || async {
        env.machine_status(machine).await.filter(applied)
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(
        run.job.starts_with(&format!("captf-m-{machine}-apply-a2-")),
        "{}",
        run.job
    );
    let steps: Vec<&str> = run
        .steps
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(steps, ["init", "force-unlock", "validate", "apply"]);
    let events = env.events("ForceUnlocked").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        events[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&run.job)),
        "{:?}",
        events[0].note
    );
    assert_eq!(lock_holder(env, machine).await, None);
    let metrics = env.manager.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "captf_lock_force_unlocks_total{kind=\"TerraformMachine\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("force_unlock"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn an_oom_killed_runner_leaves_a_stale_lock_that_the_next_job_force_unlocks() {
    let env = setup(MANAGER, "oomlock", &[], &[]).await;
    kill_mid_apply(&env, "m").await;
    next_job_force_unlocks(&env, "m").await;
}

#[tokio::test]
async fn a_runner_pod_deleted_outright_leaves_a_stale_lock_that_the_next_job_force_unlocks() {
    let env = setup(MANAGER, "gonelock", &[], &[]).await;
    let pod = kill_mid_apply(&env, "m").await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns);
    pods.delete(
        &pod,
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    within(&env, 30, "the pod gone", || async {
        pods.get_opt(&pod).await.unwrap().is_none().then_some(())
    })
    .await;
    next_job_force_unlocks(&env, "m").await;
}

#[tokio::test]
async fn a_terminating_runner_pod_keeps_its_lock_until_it_is_gone() {
    let env = setup(MANAGER, "termlock", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    let jobs = captf::api::JobPolicy {
        lock_timeout_seconds: Some(3),
        ..Default::default()
    };
    env.create_machine(
        "m",
        "c",
        WorkspaceSpec {
            jobs: Some(jobs),
            ..noop(vars(&[("sleep_seconds", json!(60))]))
        },
    )
    .await;
    let who = apply_lock_holder(&env, "m").await;
    let pod = who.rsplit('@').next().unwrap().to_string();
    Api::<TerraformMachine>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"sleep_seconds": 0}}})),
        )
        .await
        .unwrap();
    // The runner dies hard and its pod stays terminating. The deletion goes
    // first: a pod whose runner ended before it was deleted has exited, and
    // its lock is rightly stale. The kill follows at once, before the
    // executor passes the deletion's SIGTERM on (a runtime stopped that way
    // would release its lock).
    env.executor.hold_terminating(&env.ns, &pod, true);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns);
    pods.delete(&pod, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    assert!(env.executor.kill_oom(&env.ns, &pod));
    // The retry (after the 1m backoff) must not force-unlock: it waits 3 s
    // for the lock and fails.
    let retry = within(&env, 180, "the retry failed on the lock", || async {
        let status = env.machine_status("m").await?;
        let run = status.last_run?;
        (run.job.contains("-apply-a2-") && run.error.is_some()).then_some(run)
    })
    .await;
    assert!(
        !retry
            .steps
            .iter()
            .flatten()
            .any(|s| s.name == "force-unlock"),
        "{retry:?}"
    );
    assert!(env.events("ForceUnlocked").await.is_empty());
    assert!(
        pods.get_opt(&pod)
            .await
            .unwrap()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    );
    assert!(lock_holder(&env, "m").await.is_some());
    // Once the pod is gone the lock is stale, and the next Job frees it.
    env.executor.hold_terminating(&env.ns, &pod, false);
    within(&env, 60, "the pod gone", || async {
        pods.get_opt(&pod).await.unwrap().is_none().then_some(())
    })
    .await;
    let status = within(&env, 300, "the third attempt applied", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(run.job.contains("-apply-a3-"), "{}", run.job);
    assert!(run.steps.iter().flatten().any(|s| s.name == "force-unlock"));
    assert_eq!(env.events("ForceUnlocked").await.len(), 1);
}

#[tokio::test]
async fn foreign_locks_are_reported_and_never_unlocked() {
    let env = setup(MANAGER, "foreignlock", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    // Each machine's lock is held by something that is not one of its own
    // runner pods.
    let holders = [
        ("alice", "alice@laptop"),
        // A pod of the object "foo-apply", whose name begins like foo's.
        ("foo", "runner@captf-m-foo-apply-apply-a1-abc123-x7k2p"),
        // This object's prefix, but not the whole pattern (no pod suffix).
        ("bar", "runner@captf-m-bar-apply-a1-abc123"),
        // No @ at all.
        ("baz", "captf-m-baz-apply-a1-abc123-x7k2p"),
    ];
    let mut leases = Vec::new();
    for (machine, who) in holders {
        leases.push(put_lock(&env, machine, who).await);
        let jobs = captf::api::JobPolicy {
            lock_timeout_seconds: Some(2),
            ..Default::default()
        };
        env.create_machine(
            machine,
            "c",
            WorkspaceSpec {
                jobs: Some(jobs),
                ..noop(None)
            },
        )
        .await;
    }
    for ((machine, who), lease) in holders.iter().zip(&leases) {
        // Jobs keep starting; each waits for the lock and fails.
        let status = within(
            &env,
            240,
            "a Job failed on the lock, reported StateLocked",
            || async {
                env.machine_status(machine).await.filter(|s| {
                    condition(s, "StateReadable") == Some(("False", "StateLocked"))
                        && condition(s, "ApplyJobSucceeded") == Some(("False", "ApplyFailed"))
                })
            },
        )
        .await;
        let message = &status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "StateReadable")
            .unwrap()
            .message;
        assert!(
            message.contains(who)
                && message.contains("OperationTypeApply")
                && message.contains("2026-12-02T10:00:00"),
            "{message}"
        );
        let steps: Vec<&str> = status
            .last_run
            .as_ref()
            .unwrap()
            .steps
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert!(!steps.contains(&"force-unlock"), "{machine}: {steps:?}");
        // The Lease is exactly as written: never unlocked.
        let now = Api::<Lease>::namespaced(env.client.clone(), &env.ns)
            .get(&lease.name_any())
            .await
            .unwrap();
        assert_eq!(
            now.metadata.resource_version, lease.metadata.resource_version,
            "{machine}'s lock was touched"
        );
    }
    assert!(env.events("ForceUnlocked").await.is_empty());
    let locked = env.events("StateLocked").await;
    assert_eq!(
        locked.len(),
        holders.len(),
        "one StateLocked event per object"
    );
}

// ---- State backups (book: terraform-state.md "State backups") ----

async fn set_greeting(env: &Env, cluster: &str, greeting: &str) {
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": {"greeting": greeting}}})),
        )
        .await
        .unwrap();
}

async fn backup_serials(env: &Env, cluster: &str) -> Vec<i64> {
    env.cluster_status(cluster)
        .await
        .and_then(|s| s.state_backups)
        .unwrap_or_default()
        .iter()
        .map(|b| b.serial)
        .collect()
}

#[tokio::test]
async fn each_new_serial_is_backed_up_and_state_backups_zero_takes_none() {
    let mut env = setup(MANAGER, "backups", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let first = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    set_greeting(&env, "c", "two").await;
    let second = applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "three").await;
    let third = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;
    assert!(first < second && second < third);
    let serials = backup_serials(&env, "c").await;
    assert_eq!(
        serials,
        [third as i64, second as i64, first as i64],
        "newest first"
    );
    assert!(!env.events("StateBackedUp").await.is_empty());

    // With --state-backups=0 no new backup is taken and the old ones stay.
    env.restart_manager(&["--state-backups=0"]).await;
    set_greeting(&env, "c", "four").await;
    let status = within(&env, 240, "the fourth apply", || async {
        env.cluster_status("c").await.filter(|s| {
            applied(s)
                && s.last_run
                    .as_ref()
                    .is_some_and(|r| r.job.contains("-apply-a4-"))
                && s.observed_state_serial > Some(third as i64)
        })
    })
    .await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let fourth = status.observed_state_serial.unwrap() as u64;
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    assert!(
        secrets
            .get_opt(&names::backup_secret(&suffix, fourth))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        backup_serials(&env, "c").await,
        [third as i64, second as i64, first as i64]
    );

    // The fourth serial has no backup: a restore would lose it, so none runs.
    ask_restore(&env, "c", second.to_string()).await;
    let status = within(&env, 60, "the restore refused", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "CurrentStateNotBackedUp"))
        })
    })
    .await;
    let message = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "RestoreJobSucceeded")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(&format!("serial {fourth}")), "{message}");
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().contains("-restore-"))
    );
}

#[tokio::test]
async fn state_backups_two_prunes_to_the_newest_two() {
    let env = setup(MANAGER, "prune", &[], &["--state-backups=2"]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let first = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    // A whole set with a high serial, labelled as the object's backup but
    // not owned by it: never listed, never pruned, never restored.
    let forged = forged_backup(&secrets, &names::backup_secret(&suffix, first), 900).await;
    set_greeting(&env, "c", "two").await;
    let second = applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "three").await;
    let third = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;
    let serials = within(&env, 30, "the oldest pruned", || async {
        let s = backup_serials(&env, "c").await;
        (s.len() == 2).then_some(s)
    })
    .await;
    assert_eq!(serials, [third as i64, second as i64]);
    assert!(
        secrets
            .get_opt(&names::backup_secret(&suffix, first))
            .await
            .unwrap()
            .is_none()
    );
    assert!(secrets.get_opt(&forged).await.unwrap().is_some());
    ask_restore(&env, "c", "900").await;
    within(&env, 60, "RestoreBackupNotFound", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "RestoreBackupNotFound"))
        })
    })
    .await;
}

/// Asks for a restore of `serial` (any value: the annotation is free text).
async fn ask_restore(env: &Env, cluster: &str, serial: impl ToString) {
    let annotation =
        json!({"metadata": {"annotations": {"captf.io/restore-state": serial.to_string()}}});
    Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns)
        .patch(cluster, &PatchParams::default(), &Patch::Merge(annotation))
        .await
        .unwrap();
}

/// A copy of the single-Secret backup `of`, as the set of `serial`, whole
/// and consistent, without the owner reference; its name.
async fn forged_backup(secrets: &Api<Secret>, of: &str, serial: u64) -> String {
    let real = secrets.get(of).await.unwrap();
    let mut annotations = real.metadata.annotations.clone().unwrap_or_default();
    let digest = annotations["captf.io/state-backup-digest"].clone();
    annotations.insert("captf.io/state-backup-serial".into(), serial.to_string());
    annotations.insert(
        "captf.io/state-backup-set".into(),
        format!("{serial}-{}", &digest[..12]),
    );
    let suffix = real.labels()["captf.io/state-backup-suffix"].clone();
    let name = names::backup_secret(&suffix, serial);
    let forged = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: real.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        data: real.data.clone(),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &forged)
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn a_corrupt_state_is_never_backed_up() {
    let env = setup(MANAGER, "nobackup", &[], &[]).await;
    Api::<TerraformClusterIdentity>::all(env.client.clone())
        .patch(
            &env.identity,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedNamespaces": {"list": ["elsewhere"]}}})),
        )
        .await
        .unwrap();
    put_state(&env, Kind::Machine, "bad", b"\x1f\x8b\x08\x00garbage").await;
    env.cluster("c", NOOP, None).await;
    env.machine("bad", "c", None).await;
    within(&env, 60, "the corrupt state reported", || async {
        env.machine_status("bad")
            .await
            .filter(|s| condition(s, "StateReadable") == Some(("False", "StateCorrupt")))
    })
    .await;
    // The counters move after the status write: wait for them.
    let skipped = within(&env, 30, "the skipped backup counted", || async {
        let metrics = env.manager.metrics().await;
        metrics
            .lines()
            .find(|l| {
                l.starts_with("captf_state_backups_total{")
                    && l.contains("result=\"skipped\"")
                    && l.contains("TerraformMachine")
            })
            .map(str::to_owned)
    })
    .await;
    assert!(skipped.ends_with(" 1"), "{skipped}");
    let backups = Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default().labels("captf.io/state-backup=true"))
        .await
        .unwrap();
    assert!(backups.items.is_empty());
}

/// The value of `captf_state_backups_total` for TerraformClusters and
/// `result`, 0 before the first count.
fn cluster_backups(metrics: &str, result: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("captf_state_backups_total{")
                && l.contains("kind=\"TerraformCluster\"")
                && l.contains(&format!("result=\"{result}\""))
        })
        .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// The serial of the state Secret of `suffix`, read without the manager's
/// reader: gunzip and the document's `serial`.
async fn state_serial(env: &Env, suffix: &str) -> (i64, Vec<u8>) {
    use std::io::Read;
    let secret = env
        .secrets()
        .get(&names::state_secret(suffix))
        .await
        .unwrap();
    let tfstate = secret.data.unwrap()["tfstate"].0.clone();
    let mut document = String::new();
    flate2::read::GzDecoder::new(tfstate.as_slice())
        .read_to_string(&mut document)
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    (doc["serial"].as_i64().unwrap(), tfstate)
}

/// A Job whose per-run Secret is refused is deleted at once and its run
/// lease released: left, its pod would wait for the Secret until the
/// deadline, and no later pass creates the Secret for an active Job. The
/// next start waits 10 s, so the Job's own events do not spin the pass.
#[tokio::test]
async fn a_job_whose_run_secret_is_refused_is_undone_and_started_again() {
    let env = setup(MANAGER, "runsecret", &[], &[]).await;
    let probe = refusal::creating_secret(env.secrets(), "captf-run-probe");
    let refusal = Refusal::install(
        &env.client,
        &env.ns,
        &["CREATE"],
        "secrets",
        "!object.metadata.name.startsWith('captf-run-')",
        probe,
    )
    .await;
    env.cluster("c", NOOP, None).await;
    let refused = |log: &str| {
        log.lines()
            .filter(|l| l.contains("reconcile failed") && l.contains("\"captf-run-"))
            .count()
    };
    within(&env, 60, "a start refused", || async {
        (refused(&env.manager.log()) > 0).then_some(())
    })
    .await;
    let first = refused(&env.manager.log());
    tokio::time::sleep(Duration::from_secs(15)).await;
    let tries = refused(&env.manager.log()) - first;
    assert!(tries <= 3, "{tries} starts in 15 s");
    let left: Vec<String> = env
        .jobs()
        .await
        .iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .map(|j| j.name_any())
        .collect();
    assert_eq!(left, Vec::<String>::new(), "{}", env.context());
    let lease = names::run_lease(&env.suffix(Kind::Cluster, "c"));
    let held = env
        .leases()
        .get_opt(&lease)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity);
    assert_eq!(held, None, "the run lease is still held");

    // Once Secrets may be created, a start goes through and applies.
    refusal.remove().await;
    within(&env, 120, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
}

#[tokio::test]
async fn a_refused_backup_copy_is_retried_on_the_next_reconcile() {
    let env = setup(MANAGER, "backup-retry", &[], &["--sync-period=10s"]).await;
    let probe = refusal::creating_secret(env.secrets(), "captf-state-backup-probe");
    let refusal = Refusal::install(
        &env.client,
        &env.ns,
        &["CREATE"],
        "secrets",
        "!object.metadata.name.startsWith('captf-state-backup-')",
        probe,
    )
    .await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let suffix = env.suffix(Kind::Cluster, "c");
    let (serial, tfstate) = state_serial(&env, &suffix).await;
    assert!(serial >= 1);

    // Two passes and more: every copy is refused, nothing of it stays, and
    // the serial stays unobserved.
    let until = tokio::time::Instant::now() + Duration::from_secs(25);
    while tokio::time::Instant::now() < until {
        let names: Vec<String> = env
            .secrets()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.name_any())
            .filter(|n| n.starts_with("captf-state-backup-"))
            .collect();
        assert_eq!(names, Vec::<String>::new(), "no partial set");
        let status = env.cluster_status("c").await.unwrap();
        assert!(applied(&status), "{}", env.context());
        let listed = status.state_backups.unwrap_or_default();
        assert!(listed.is_empty(), "no backup listed: {listed:?}");
        assert_ne!(status.observed_state_serial, Some(serial));
        assert!(
            env.events_about("StateBackedUp", Kind::Cluster, "c")
                .await
                .is_empty()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let metrics = env.manager.metrics().await;
    let skipped = cluster_backups(&metrics, "skipped");
    assert!(skipped >= 2.0, "{metrics}");
    assert_eq!(cluster_backups(&metrics, "taken"), 0.0, "{metrics}");
    println!("refused copies counted as skipped: {skipped}");

    // Once creates go through, a later pass takes the backup.
    refusal.remove().await;
    let status = within(&env, 60, "the backup taken", || async {
        env.cluster_status("c")
            .await
            .filter(|s| s.observed_state_serial == Some(serial))
    })
    .await;
    let backups = status.state_backups.unwrap();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(backups[0].serial, serial);
    let backup = env
        .secrets()
        .get(&names::backup_secret(&suffix, serial as u64))
        .await
        .unwrap();
    assert_eq!(backup.data.unwrap()["tfstate"].0, tfstate);
    assert_eq!(
        env.events_about("StateBackedUp", Kind::Cluster, "c")
            .await
            .len(),
        1
    );
    let metrics = env.manager.metrics().await;
    assert_eq!(cluster_backups(&metrics, "taken"), 1.0, "{metrics}");
}

// ---- Restore (book: terraform-state.md "Restore") ----

#[tokio::test]
async fn a_state_secret_deleted_by_hand_is_restored_from_a_backup() {
    let env = setup(MANAGER, "restore", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let serial = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let before = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    let clusters = Api::<TerraformCluster>::namespaced(env.client.clone(), &env.ns);
    // Two more serials, the last from the first inputs again: the oldest
    // backup is restored over newer ones.
    set_greeting(&env, "c", "two").await;
    applied_and_backed_up::<TerraformCluster>(&env, "c", 2).await;
    set_greeting(&env, "c", "one").await;
    let newest = applied_and_backed_up::<TerraformCluster>(&env, "c", 3).await;

    // A serial without a backup: no Job, RestoreBackupNotFound.
    ask_restore(&env, "c", "999").await;
    within(&env, 60, "RestoreBackupNotFound", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("False", "RestoreBackupNotFound"))
        })
    })
    .await;
    assert!(
        env.jobs()
            .await
            .iter()
            .all(|j| !j.name_any().contains("-restore-"))
    );

    // The state Secret is deleted by hand, and the backup restored.
    env.lose_secret(&names::state_secret(&suffix)).await;
    ask_restore(&env, "c", serial.to_string()).await;
    let status = within(&env, 240, "the restore", || async {
        env.cluster_status("c").await.filter(|s| {
            condition(s, "RestoreJobSucceeded") == Some(("True", "StateRestored"))
                && condition(s, "StateReadable") == Some(("True", "StateRead"))
        })
    })
    .await;
    let run = status.last_run.unwrap();
    assert!(run.job.starts_with("captf-c-c-restore-a1-"), "{}", run.job);
    let steps: Vec<&str> = run
        .steps
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(steps, ["init", "state-push", "state-list"]);
    within(&env, 30, "the annotation removed", || async {
        let c = clusters.get("c").await.ok()?;
        (!c.annotations().contains_key("captf.io/restore-state")).then_some(())
    })
    .await;
    assert_eq!(env.events("StateRestored").await.len(), 1);
    // Pushed above every serial the object had, so that no serial (and no
    // backup name) stands for two states; and that state is backed up.
    let (restored, _) = state_serial(&env, &suffix).await;
    assert!(restored > newest as i64, "{restored} after {newest}");
    within(&env, 60, "the restored state backed up", || async {
        let serials = backup_serials(&env, "c").await;
        (serials.first() == Some(&restored)).then_some(())
    })
    .await;
    let after = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    assert_eq!(
        after.annotations().get("captf.io/inputs-hash"),
        before.annotations().get("captf.io/inputs-hash")
    );

    // Unchanged inputs over the restored state: nothing to apply.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let applies: Vec<String> = env
        .jobs()
        .await
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.contains("-apply-"))
        .collect();
    assert_eq!(applies.len(), 3, "{applies:?}");
}

/// A backup taken before inputs hashes were recorded (or whose chunk 0
/// lost the annotation) is still adopted once restored: every chunk gets
/// the object's owner reference in the pass that records the restore,
/// before anything else runs over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_without_an_inputs_hash_is_adopted() {
    let env = setup(MANAGER, "restore-nohash", &[], &[]).await;
    let cluster = env
        .cluster("c", NOOP, vars(&[("greeting", json!("one"))]))
        .await;
    let serial = applied_and_backed_up::<TerraformCluster>(&env, "c", 1).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let backup = names::backup_secret(&suffix, serial);
    secrets
        .patch(
            &backup,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"captf.io/inputs-hash": null}}})),
        )
        .await
        .unwrap();
    env.lose_secret(&names::state_secret(&suffix)).await;
    ask_restore(&env, "c", serial.to_string()).await;
    within(&env, 240, "the restore", || async {
        env.cluster_status("c")
            .await
            .filter(|s| condition(s, "RestoreJobSucceeded") == Some(("True", "StateRestored")))
    })
    .await;
    let uid = cluster.uid().unwrap();
    let state = secrets.get(&names::state_secret(&suffix)).await.unwrap();
    assert!(
        state.owner_references().iter().any(|o| o.uid == uid),
        "the restored state is owned by the cluster: {:?}",
        state.owner_references()
    );
    assert!(
        !state.annotations().contains_key("captf.io/inputs-hash"),
        "no inputs hash is claimed for the restored state"
    );
}
