//! An API server that says no: a ValidatingAdmissionPolicy and its binding
//! refusing some requests on a core resource in one namespace, for tests of
//! what a refused create or delete leaves behind.

use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use crate::eventually;

/// A policy in force until [`Refusal::remove`]. `probe` answers whether a
/// request the policy refuses would be admitted now: the API server applies
/// policies asynchronously, so installing and removing wait on it.
pub struct Refusal<P> {
    client: kube::Client,
    name: String,
    probe: P,
}

impl<P: AsyncFn() -> bool> Refusal<P> {
    /// Refuses the `operations` (`"CREATE"`, `"DELETE"`, ...) on `resource`
    /// (core group, v1, e.g. `"secrets"`) in `namespace` wherever the CEL
    /// expression `allow` (over `object`, or `oldObject` for a delete) is
    /// false; returns once `probe` says such a request is refused.
    pub async fn install(
        client: &kube::Client,
        namespace: &str,
        operations: &[&str],
        resource: &str,
        allow: &str,
        probe: P,
    ) -> Self {
        // Policies are cluster-scoped: the name must not clash with another
        // test's.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "refuse-{namespace}-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let policy = ValidatingAdmissionPolicy {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(ValidatingAdmissionPolicySpec {
                failure_policy: Some("Fail".into()),
                match_constraints: Some(MatchResources {
                    resource_rules: Some(vec![NamedRuleWithOperations {
                        api_groups: Some(vec![String::new()]),
                        api_versions: Some(vec!["v1".into()]),
                        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
                        resources: Some(vec![resource.to_string()]),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                validations: Some(vec![Validation {
                    expression: allow.to_string(),
                    message: Some("refused by the test".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap_or_else(|e| panic!("creating the policy {name}: {e}"));
        let binding = ValidatingAdmissionPolicyBinding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: ValidatingAdmissionPolicyBindingSpec {
                policy_name: name.clone(),
                validation_actions: vec!["Deny".into()],
                match_resources: Some(MatchResources {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(
                            [(
                                "kubernetes.io/metadata.name".to_string(),
                                namespace.to_string(),
                            )]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("creating the binding {name}: {e}"));
        let refusal = Refusal {
            client: client.clone(),
            name,
            probe,
        };
        let what = format!("the policy {} in force", refusal.name);
        eventually(&what, || async { (!(refusal.probe)().await).then_some(()) }).await;
        refusal
    }

    /// Deletes the binding and the policy; returns once `probe` says the
    /// request is admitted again.
    pub async fn remove(self) {
        let params = DeleteParams::default();
        Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &params)
            .await
            .unwrap_or_else(|e| panic!("deleting the binding {}: {e}", self.name));
        Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .delete(&self.name, &params)
            .await
            .unwrap_or_else(|e| panic!("deleting the policy {}: {e}", self.name));
        let what = format!("the policy {} gone", self.name);
        eventually(&what, || async { (self.probe)().await.then_some(()) }).await;
    }
}

/// A probe for a refusal of Secret creates: whether a dry-run create of a
/// Secret named `name` through `secrets` is admitted.
pub fn creating_secret(secrets: Api<Secret>, name: &str) -> impl AsyncFn() -> bool + use<> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    async move || {
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        secrets.create(&dry_run, &secret).await.is_ok()
    }
}
