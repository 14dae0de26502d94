//! Runner progress events (ref §4 "Runner events", `--runner-events`): on
//! the object, with the Job as the related object, in the order of the
//! run; and a run whose events the API refuses still succeeds.

use captf::names::Kind;
use captf_testkit::controlplane;
use captf_testkit::scenario::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};
use kube::config::{AuthInfo, Config, KubeConfigOptions, Kubeconfig};
use serde_json::json;

use super::{MANAGER, runner_events};

/// The runner's events about the cluster `c`, in the order it sent them.
async fn about_c(env: &Env) -> Vec<Event> {
    runner_events(env)
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("c"))
        .collect()
}

#[tokio::test]
async fn an_apply_reports_its_progress_on_the_object() {
    let env = setup(MANAGER, "runner-events", &[], &[]).await;
    env.cluster("c", NOOP, None).await;
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    let events = within(&env, 60, "the runner's events", || async {
        let events = about_c(&env).await;
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("RunFinished"))
            .then_some(events)
    })
    .await;
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e.reason.clone().unwrap_or_default(),
                e.note.clone().unwrap_or_default(),
            )
        })
        .collect();
    let reasons: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "RunStarted",
            "StepStarted",
            "StepSucceeded",
            "StepStarted",
            "StepSucceeded",
            "StepStarted",
            "StepSucceeded",
            "ResourcesChanged",
            "RunFinished",
        ],
        "{seen:?}"
    );
    assert!(
        seen[1].1 == "step init" && seen[5].1 == "step apply",
        "{seen:?}"
    );
    assert!(seen[7].1.contains("added"), "{seen:?}");
    assert!(seen[8].1.starts_with("apply succeeded in "), "{seen:?}");
    let job = env.jobs_named("captf-c-c-apply-a1-").await;
    for e in &events {
        let regarding = e.regarding.as_ref().unwrap();
        assert_eq!(
            (regarding.kind.as_deref(), regarding.name.as_deref()),
            (Some("TerraformCluster"), Some("c"))
        );
        let related = e.related.as_ref().unwrap();
        assert_eq!(related.name, job[0].metadata.name);
    }
    // The manager's own events stay its own.
    assert!(
        !env.events_about("JobCreated", Kind::Cluster, "c")
            .await
            .is_empty()
    );
}

/// A client of the ServiceAccount `probe`, bound to the runner's
/// ClusterRole like a runner's account.
async fn as_service_account(env: &Env) -> Option<kube::Client> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns)
        .create_token_request("probe", &PostParams::default(), &request)
        .await
        .ok()?
        .status?
        .token?;
    let kubeconfig = Kubeconfig::read_from(controlplane::shared().kubeconfig()).ok()?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .ok()?;
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    kube::Client::try_from(config).ok()
}

#[tokio::test]
async fn a_run_whose_events_are_refused_still_succeeds() {
    let env = setup(MANAGER, "events-refused", &[], &[]).await;
    // The API refuses every event a ServiceAccount (the runner) creates in
    // the namespace; the manager's own identity is not one.
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": format!("no-runner-events-{}", env.ns)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["events.k8s.io", ""],
                "apiVersions": ["*"],
                "operations": ["CREATE"],
                "resources": ["events"]
            }]},
            "validations": [{
                "expression": "!request.userInfo.username.startsWith('system:serviceaccount:')",
                "message": "no events from ServiceAccounts here"
            }]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("no-runner-events-{}", env.ns)},
        "spec": {
            "policyName": format!("no-runner-events-{}", env.ns),
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": env.ns
            }}}
        }
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let bound: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "captf-runner"},
        "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": env.ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &bound)
        .await
        .unwrap();
    // The cluster comes once the policy is in force.
    let refused = within(&env, 60, "the policy in force", || async {
        let probe = captf::runner::events::event(
            &env.ns,
            &"TerraformCluster/probe/u-0".parse().unwrap(),
            "probe",
            "probe",
            (captf::runner::events::Type::Normal, "Probe", "probe"),
            1,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let runner_client = as_service_account(&env).await?;
        match Api::<Event>::namespaced(runner_client, &env.ns)
            .create(&PostParams::default(), &probe)
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains("no events") => Some(e.message),
            _ => None,
        }
    })
    .await;
    assert!(refused.contains("no events"), "{refused}");
    env.cluster("c", NOOP, None).await;
    let s = within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    assert_eq!(
        condition(&s, "ApplyJobSucceeded"),
        Some(("True", "ApplySucceeded"))
    );
    assert!(about_c(&env).await.is_empty());
}
