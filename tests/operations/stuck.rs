//! A Job that can never start (ref §8.1 step 7): created, but its per-run
//! Secret never was (a manager stopped between the two writes). After a
//! minute without a pod that ran, it is deleted (StuckJobDeleted) and the
//! object decides anew.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use captf::api::{IdentityReference, TerraformCluster};
use captf::keys::{ATTEMPT_LABEL, OP_LABEL};
use captf::names::{self, Hash6, Kind, Op};
use captf_testkit::scenario::*;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PodSpec, PodTemplateSpec, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::MANAGER;

#[tokio::test]
async fn a_job_whose_run_secret_never_came_is_deleted_after_a_minute() {
    let env = setup(MANAGER, "stuck", &[], &[]).await;
    // Nothing starts while the identity is missing.
    let mut workspace = noop(None);
    workspace.identity_ref = Some(IdentityReference {
        name: "missing".into(),
    });
    let cluster = env.create_cluster("c", workspace).await;
    within(&env, 60, "the finalizer", || async {
        (!env.finalizers::<TerraformCluster>("c").await.is_empty()).then_some(())
    })
    .await;

    // A Job of the object as the manager builds it, without its Secret.
    let name = names::job(
        Kind::Cluster,
        "c",
        Op::Apply,
        NonZeroU32::MIN,
        &Hash6::of(b"x"),
    );
    let mut labels: BTreeMap<String, String> =
        captf::jobs::owner_labels(Kind::Cluster, "c", Some("c"));
    labels.insert(OP_LABEL.into(), "apply".into());
    labels.insert(ATTEMPT_LABEL.into(), "1".into());
    let mut owner = cluster.controller_owner_ref(&()).unwrap();
    owner.block_owner_deletion = Some(true);
    let job = Job {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "source".into(),
                        image: Some(NOOP.into()),
                        command: Some(vec!["/captf/runtime".into(), "version".into()]),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "config".into(),
                            mount_path: "/captf/config".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "config".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(names::run_secret(&name)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    };
    let jobs = Api::<Job>::namespaced(env.client.clone(), &env.ns);
    let created = jobs.create(&PostParams::default(), &job).await.unwrap();
    let created_at = created.creation_timestamp().unwrap().0;

    let event = within(&env, 150, "StuckJobDeleted", || async {
        env.events_about("StuckJobDeleted", Kind::Cluster, "c")
            .await
            .into_iter()
            .next()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&names::run_secret(&name)), "{note}");
    let at = event.event_time.unwrap().0;
    let waited = std::time::Duration::try_from(at.duration_since(created_at)).unwrap();
    assert!(
        waited >= std::time::Duration::from_secs(60),
        "deleted after {waited:?}"
    );
    within(&env, 60, "the Job gone", || async {
        jobs.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;

    // With its identity, the object applies as if nothing had happened.
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"identityRef": {"name": env.identity}}})),
        )
        .await
        .unwrap();
    within(&env, 240, "the apply", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
}
