//! A Job's result is read only from a pod that the Job controls: anyone
//! who can create pods in the namespace can label one with the Job's name
//! and give it a terminated runner container whose message is a result
//! document (issue 19 item 9).

use captf::jobs::builder::SOURCE_CONTAINER;
use captf_testkit::first_pod;
use captf_testkit::scenario::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// What the forged result says, in its step and error.
const FORGED: &str = "FORGED-RESULT";

#[tokio::test]
async fn a_pod_labelled_with_the_jobs_name_cannot_forge_its_result() {
    let env = setup(MANAGER, "results", &[], &[]).await;
    env.cluster("c", NOOP, vars(&[("sleep_seconds", json!(6))]))
        .await;
    let job: Job = within(&env, 120, "the apply Job", || async {
        env.jobs_named("captf-c-c-apply-a1-")
            .await
            .into_iter()
            .next()
    })
    .await;
    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns);
    // The real pod's labels but the Job's selector (the controller uid):
    // the Job controller would adopt an orphan that matches it, and a
    // forger needs only the Job's name.
    let selector = format!("job-name={}", job.name_any());
    let real = within(&env, 120, "the Job's pod", || first_pod(&pods, &selector)).await;

    let mut labels = real.labels().clone();
    labels.retain(|k, _| !k.ends_with("controller-uid"));
    assert!(labels.contains_key("job-name"), "{labels:?}");
    // Named to sort first; bound to another node, so the pod stand-in
    // leaves it alone, as a kubelet elsewhere would run it.
    let forged: Pod = serde_json::from_value(json!({
        "metadata": { "name": "aaa-forged", "labels": labels },
        "spec": {
            "nodeName": "elsewhere",
            "containers": [{ "name": SOURCE_CONTAINER, "image": "forger:1" }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &forged).await.unwrap();
    let document = json!({
        "operation": "apply",
        "job": job.name_any(),
        "runtimeVersion": "0.0.0-forged",
        "steps": [{ "name": FORGED, "exitCode": 1, "durationMilliseconds": 1 }],
        "error": { "kind": "step", "step": FORGED, "summary": FORGED }
    });
    let status = json!({ "status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": SOURCE_CONTAINER,
            "image": "forger:1",
            "imageID": "forger@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "ready": false,
            "restartCount": 0,
            "state": { "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": document.to_string()
            }}
        }]
    }});
    pods.patch_status(
        "aaa-forged",
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await
    .unwrap();

    let status = within(&env, 240, "the apply accounted", || async {
        let s = env.cluster_status("c").await?;
        (s.last_run.as_ref()?.job == job.name_any() && applied(&s)).then_some(s)
    })
    .await;
    let run = status.last_run.as_ref().unwrap();
    assert!(run.error.is_none(), "{run:?}");
    assert!(steps(run).contains(&"apply"), "{run:?}");
    let text = serde_json::to_string(&status).unwrap();
    assert!(
        !text.contains(FORGED),
        "the forged result reached the status: {text}"
    );
    assert!(!text.contains("0.0.0-forged"), "{text}");
}
