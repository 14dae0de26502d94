use std::path::PathBuf;

use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{LocalObjectReference, PodSecurityContext};
use serde_json::json;

use super::*;
use crate::api::JobPolicy;
use crate::jobs::inputs::{self, InputsRequest};
use crate::jobs::policy::{self, resolve};

fn n(attempt: u32) -> NonZeroU32 {
    NonZeroU32::new(attempt).unwrap()
}

fn rendered(kind: Kind, name: &str, cluster: Option<&str>) -> RenderedInputs {
    let variables: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_value(json!({ "region": "eu-west-1", "size": 2 })).unwrap();
    inputs::render(&InputsRequest {
        kind,
        namespace: "team-a",
        name,
        cluster_name: cluster,
        image: "registry.example/modules/net:1.4.0",
        template: None,
        variables: Some(&variables),
        sensitive: &[],
        role: &[],
    })
    .unwrap()
}

/// What a case varies; the rest is one TerraformMachine of cluster
/// "prod" with an identity.
struct Case {
    kind: Kind,
    name: &'static str,
    cluster: Option<&'static str>,
    op: Op,
    attempt: u32,
    settings: JobSettings,
    identity: Option<&'static str>,
    force_unlock: Option<&'static str>,
    pull: Option<ImagePullPolicy>,
    restore: Option<(Vec<String>, u64)>,
    mode: ApplyMode<'static>,
    events: bool,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            kind: Kind::Machine,
            name: "worker-0",
            cluster: Some("prod"),
            op: Op::Apply,
            attempt: 1,
            settings: resolve(None, None),
            identity: Some("aws"),
            force_unlock: None,
            pull: None,
            restore: None,
            mode: ApplyMode::Direct,
            events: false,
        }
    }
}

fn build_case(case: &Case) -> BuiltJob {
    let inputs = rendered(case.kind, case.name, case.cluster);
    let attempt = n(case.attempt);
    let hash6 = hash6(&inputs.inputs_hash, case.op, attempt, 0);
    let restore = case
        .restore
        .as_ref()
        .map(|(chunks, resources)| RestoreRequest {
            chunk_secrets: chunks,
            resources: *resources,
            serial: 41,
        });
    build(&JobRequest {
        kind: case.kind,
        namespace: "team-a",
        name: case.name,
        uid: "6f1f1c1e-7a52-4c4e-9d83-2a7f0f6c1b11",
        cluster_name: case.cluster,
        op: case.op,
        attempt,
        hash6: &hash6,
        image: "registry.example/modules/net:1.4.0",
        image_pull_policy: case.pull,
        runner_image: "registry.example/captf/runner:0.1.0",
        settings: &case.settings,
        identity: case.identity,
        force_unlock: case.force_unlock,
        inputs: &inputs,
        restore,
        mode: case.mode,
        events: case.events,
    })
}

fn pod(built: &BuiltJob) -> &PodSpec {
    built
        .job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn source(built: &BuiltJob) -> &Container {
    &pod(built).containers[0]
}

fn args(built: &BuiltJob) -> &[String] {
    source(built).args.as_deref().unwrap()
}

mod args;
mod env;
mod golden;
mod naming;
mod shape;
