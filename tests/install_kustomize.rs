//! `kubectl apply -k config/default` (issue 21), as a user installs it with
//! the images of their registry set by an overlay: no cert-manager (the
//! manager's init container self-signs its serving certificate), the
//! manager running from its image in a pod, the webhook reached through its
//! Service, and Jobs running the runner of the manager's own image (read
//! from its pod: `kustomize edit set image` sets no environment) and the
//! module of the registry.

use std::path::{Component, Path, PathBuf};

use captf::api::{TerraformCluster, TerraformMachine};
use captf_testkit::install::{
    NAMESPACE, Prepared, Tenant, manager_pods, ready, run, webhook_refusal,
};
use captf_testkit::registry::TAG;
use captf_testkit::{Executor, scenario::images};

const DEFAULT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/default");

/// `to` from the folder `from`, both absolute.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    std::iter::repeat_n(Component::ParentDir, from.len() - common)
        .chain(to[common..].iter().copied())
        .collect()
}

#[tokio::test]
async fn kubectl_apply_k_config_default_brings_up_a_working_captf() {
    let prepared = Prepared::new().await;
    let (manager, module, plane, client) = (
        &prepared.manager,
        &prepared.module,
        prepared.plane,
        prepared.client.clone(),
    );

    // The user's overlay: config/default with their image. kustomize takes
    // a base only by a relative path.
    let overlay = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let base = relative(overlay.path(), Path::new(DEFAULT));
    let repository = prepared.manager_repository();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources:\n  - {}\nimages:\n  - name: ghcr.io/captf-io/captf-manager\n    newName: {repository}\n    newTag: {TAG}\n",
            base.display()
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    run(
        "kubectl",
        &["apply", "-k", &overlay.path().to_string_lossy()],
    );
    let _executor = Executor::start_contained(client.clone(), plane, images(), NAMESPACE).await;
    let pods = manager_pods(&client, 120, "a ready manager", |p| p.iter().any(ready)).await;
    eprintln!(
        "kubectl apply -k: a ready manager in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let statuses = pods[0].status.clone().unwrap_or_default();
    let ids: Vec<String> = statuses
        .init_container_statuses
        .iter()
        .chain(&statuses.container_statuses)
        .flatten()
        .map(|s| s.image_id.clone())
        .collect();
    assert_eq!(ids, [manager.by_digest(), manager.by_digest()]);

    let tenant = Tenant::new(&client, "kustomize").await;
    let refusal = webhook_refusal(&client, &tenant.ns).await;
    assert!(refusal.contains("spec.source.image"), "{refusal}");

    tenant.cluster("c", &module.reference).await;
    tenant.machine("m1", "c", &module.reference).await;
    tenant.applied::<TerraformCluster>("c", 240).await;
    tenant.applied::<TerraformMachine>("m1", 240).await;
    for pod in &tenant.job_pods().await {
        let status = pod.status.clone().unwrap_or_default();
        let runner = status.init_container_statuses.unwrap_or_default();
        assert_eq!(
            runner[0].image, manager.reference,
            "the manager's own image"
        );
        assert_eq!(runner[0].image_id, manager.by_digest());
    }
}
