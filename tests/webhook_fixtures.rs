//! Every AdmissionReview fixture under webhooks/ through the real webhook
//! router: the request goes in as the API server would send it, and the
//! response must match the expected one (written by hand in
//! webhooks/generate.py, from CONTRACT.md). The cap on an object's JSON
//! values is tested here too, with bodies built in place (3 MB each).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use captf::server::webhook::router;
use captf::webhooks::handler::Webhooks;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// `body` sent to `hook` as the API server sends it.
async fn post(app: &axum::Router, hook: &str, body: impl Into<Body>) -> axum::response::Response {
    app.clone()
        .oneshot(
            Request::post(hook)
                .header("content-type", "application/json")
                .body(body.into())
                .unwrap(),
        )
        .await
        .unwrap()
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("webhooks");
    let mut found = Vec::new();
    for rule in std::fs::read_dir(&root).unwrap().flatten() {
        if !rule.path().is_dir() {
            continue;
        }
        for file in std::fs::read_dir(rule.path()).unwrap().flatten() {
            let path = file.path();
            if path.to_string_lossy().ends_with(".request.json") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The JSON patch of a response. Kubernetes sends `[]byte` as base64; kube
/// writes it as an array of byte values, which the API server's decoder
/// accepts too: both are read here.
fn decode_patch(response: &Value) -> Value {
    let bytes = match response.get("patch") {
        Some(Value::String(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| u8::try_from(v.as_u64().unwrap()).unwrap())
            .collect(),
        _ => return Value::Null,
    };
    serde_json::from_slice(&bytes).unwrap()
}

/// The parts of a response the contract fixes.
fn contract_view(review: &Value) -> Value {
    let r = &review["response"];
    let status = if r["allowed"] == Value::Bool(false) {
        serde_json::json!({
            "code": r["status"]["code"],
            "message": r["status"]["message"],
            "reason": r["status"]["reason"],
        })
    } else {
        Value::Null
    };
    serde_json::json!({
        "apiVersion": review["apiVersion"],
        "kind": review["kind"],
        "uid": r["uid"],
        "allowed": r["allowed"],
        "status": status,
        "warnings": r.get("warnings").cloned().unwrap_or(Value::Null),
        "patchType": r.get("patchType").cloned().unwrap_or(Value::Null),
        "patch": decode_patch(r),
    })
}

#[tokio::test]
async fn every_fixture_gets_its_expected_response() {
    let requests = fixtures();
    assert!(
        requests.len() >= 40,
        "only {} fixtures found",
        requests.len()
    );
    let app = router(Arc::new(Webhooks::offline()));
    let mut failures = Vec::new();
    for request_path in &requests {
        let name = request_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let hook = if name.contains(".mutate.") {
            "/mutate"
        } else {
            "/validate"
        };
        let response_path =
            request_path.with_file_name(name.replace(".request.json", ".response.json"));
        let body = std::fs::read(request_path).unwrap();
        let expected: Value =
            serde_json::from_slice(&std::fs::read(&response_path).unwrap()).unwrap();

        let response = post(&app, hook, body).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{}",
            request_path.display()
        );
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let actual: Value = serde_json::from_slice(&bytes).unwrap();
        let (want, got) = (contract_view(&expected), contract_view(&actual));
        if want != got {
            failures.push(format!(
                "{}\n  want {}\n  got  {}",
                request_path
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap()
                    .display(),
                want,
                got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ:\n{}",
        failures.len(),
        requests.len(),
        failures.join("\n")
    );
}

/// A TerraformCluster whose `spec.variables.list` is `list` (JSON text).
fn cluster_with_list(list: &str) -> String {
    format!(
        r#"{{"apiVersion":"infrastructure.cluster.x-k8s.io/v1alpha1","kind":"TerraformCluster","metadata":{{"name":"c","namespace":"default"}},"spec":{{"source":{{"image":"ghcr.io/x/module:v1"}},"identityRef":{{"name":"id"}},"variables":{{"list":{list}}}}}}}"#
    )
}

fn review_of(operation: &str, object: &str, old_object: &str) -> String {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"infrastructure.cluster.x-k8s.io","version":"v1alpha1","kind":"TerraformCluster"}},"resource":{{"group":"infrastructure.cluster.x-k8s.io","version":"v1alpha1","resource":"terraformclusters"}},"name":"c","namespace":"default","operation":"{operation}","userInfo":{{"username":"admin"}},"object":{object},"oldObject":{old_object},"dryRun":false}}}}"#
    )
}

/// 3 MB of JSON that would be 48 MB of `serde_json::Value`s: refused before
/// it is decoded, naming the object that holds it, by both webhooks.
#[tokio::test]
async fn an_object_past_the_values_cap_is_refused() {
    let app = router(Arc::new(Webhooks::offline()));
    let zeros = format!("[{}]", vec!["0"; 1_500_000].join(","));
    let (big, small) = (cluster_with_list(&zeros), cluster_with_list("[0]"));
    let cases = [
        ("/validate", review_of("CREATE", &big, "null"), "object"),
        ("/validate", review_of("UPDATE", &small, &big), "oldObject"),
        ("/mutate", review_of("CREATE", &big, "null"), "object"),
    ];
    for (hook, body, field) in cases {
        assert!(body.len() <= captf::server::webhook::BODY_LIMIT);
        let response = post(&app, hook, body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let review: Value = serde_json::from_slice(&bytes).unwrap();
        let r = &review["response"];
        assert_eq!(r["allowed"], false, "{hook} {field}: {r}");
        assert_eq!(r["status"]["code"], 422);
        assert_eq!(
            r["status"]["message"],
            format!(
                "{field}: must hold at most 65536 JSON values, a non-empty object counting as 17: the webhook bounds the memory of a request (got more than 65536)"
            )
        );
    }

    // The same list, short enough, is fine.
    let fine = cluster_with_list(&format!("[{}]", vec!["0"; 60_000].join(",")));
    let response = post(&app, "/validate", review_of("UPDATE", &fine, &fine)).await;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let review: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(review["response"]["allowed"], true, "{review}");
}

/// The pod's security context is judged as the main container's is (ref
/// Appendix B "Stricter WH"), and a value an object already held is not
/// judged again on UPDATE, so that the manager's finalizer patch passes.
#[tokio::test]
async fn the_pod_security_context_is_hardened_too() {
    let app = router(Arc::new(Webhooks::offline()));
    let cluster = |pod: &str, finalizers: &str| {
        format!(
            r#"{{"apiVersion":"infrastructure.cluster.x-k8s.io/v1alpha1","kind":"TerraformCluster","metadata":{{"name":"c","namespace":"default","finalizers":{finalizers}}},"spec":{{"source":{{"image":"ghcr.io/x/module:v1"}},"identityRef":{{"name":"id"}},"jobs":{{"podSecurityContext":{pod}}}}}}}"#
        )
    };
    let answer = |body: String| {
        let app = app.clone();
        async move {
            let response = post(&app, "/validate", body).await;
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let review: Value = serde_json::from_slice(&bytes).unwrap();
            review["response"].clone()
        }
    };
    let unconfined = r#"{"seccompProfile":{"type":"Unconfined"}}"#;
    let r = answer(review_of("CREATE", &cluster(unconfined, "[]"), "null")).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 422);
    assert_eq!(
        r["status"]["message"],
        "spec.jobs.podSecurityContext.seccompProfile.type: must not be Unconfined: use RuntimeDefault or Localhost (got \"Unconfined\")"
    );
    // Stored before the rule: the finalizer patch passes.
    let r = answer(review_of(
        "UPDATE",
        &cluster(unconfined, r#"["captf.io/finalizer"]"#),
        &cluster(unconfined, "[]"),
    ))
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    // A hardened context passes on CREATE.
    let hardened =
        r#"{"runAsNonRoot":true,"runAsUser":1000,"seccompProfile":{"type":"RuntimeDefault"}}"#;
    let r = answer(review_of("CREATE", &cluster(hardened, "[]"), "null")).await;
    assert_eq!(r["allowed"], true, "{r}");
}
