//! Objects stored before the webhooks were registered (created while they
//! were not, or by a version without a default): the manager still adds its
//! finalizer and reconciles them once the webhooks are in the path. Its own
//! binary, so its own control plane: a webhook configuration is
//! cluster-wide, and the other tests' objects must not go through it.

use captf::api::{ImagePullPolicy, TerraformMachine};
use captf::names::Kind;
use captf_testkit::scenario::*;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

#[tokio::test]
async fn a_machine_created_without_webhooks_is_reconciled_once_they_are_registered() {
    let mut env = setup(MANAGER, "late-webhooks", &[], &[]).await;
    // No manager and no webhooks while the objects are created: nothing
    // defaults them, and nothing adds a finalizer yet.
    env.manager.stop();
    let dp = DeleteParams::default();
    let _ = Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .delete("captf-validating-webhook-configuration", &dp)
        .await;
    let _ = Api::<MutatingWebhookConfiguration>::all(env.client.clone())
        .delete("captf-mutating-webhook-configuration", &dp)
        .await;
    env.cluster("c1", NOOP, None).await;
    let stored = env.machine("m1", "c1", None).await;
    assert_eq!(stored.spec.workspace.source.image_pull_policy, None);
    assert!(stored.metadata.finalizers.is_none());

    // The configurations go in first, pointing at a manager that is gone, so
    // that every write of the next manager goes through the webhooks: its
    // finalizer patch fails until they point at it.
    env.manager.register_webhooks(&env.client).await;
    env.restart_manager(&[]).await;
    env.manager.register_webhooks(&env.client).await;

    within(&env, 90, "the machine's finalizer", || async {
        let finalizers = env.finalizers::<TerraformMachine>("m1").await;
        finalizers.contains(&finalizer(Kind::Machine)).then_some(())
    })
    .await;
    let machine = env.api::<TerraformMachine>().get("m1").await.unwrap();
    assert_eq!(
        machine.spec.workspace.source.image_pull_policy,
        Some(ImagePullPolicy::IfNotPresent),
        "the finalizer patch went through the defaulting webhook"
    );
    within(&env, 240, "the machine applied", || async {
        env.machine_status("m1").await.filter(applied)
    })
    .await;
}
