//! The admission webhooks as the API server calls them: the body goes
//! through the real router (`captf::server::webhook::router`) over the
//! offline handler (`Webhooks::offline()`, the rules that need no API
//! server), so the body reading, the envelope parse, the decoding with its
//! value cap, the rules and the response encoding all run; no network.
//!
//! Input: the first byte picks the hook (odd: `/mutate`, even: `/validate`;
//! the seeds start with `m` or `v`), the rest is the request body.
//!
//! Properties, beyond "no panic, no OOM, no hang":
//! - the answer is 200 with an AdmissionReview, or 400 with a reason;
//! - the response carries the request's UID; a denial has a code and a message;
//! - a `/mutate` patch applies to the object as it was sent, and mutating the
//!   patched object gives no patch (defaults.rs: "applying the webhook to its
//!   own output gives an empty patch").

#![no_main]

use std::sync::OnceLock;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use captf::server::webhook::router;
use captf::webhooks::handler::Webhooks;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

struct App {
    runtime: tokio::runtime::Runtime,
    router: Router,
}

fn app() -> &'static App {
    static APP: OnceLock<App> = OnceLock::new();
    APP.get_or_init(|| App {
        runtime: tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime"),
        router: router(std::sync::Arc::new(Webhooks::offline())),
    })
}

fn post(hook: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
    let app = app();
    app.runtime.block_on(async {
        let response = app
            .router
            .clone()
            .oneshot(
                Request::post(hook)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .expect("a request"),
            )
            .await
            .expect("the router is infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a buffered body")
            .to_bytes();
        (status, bytes)
    })
}

/// The JSON patch of a response: kube writes `Vec<u8>` as an array of byte
/// values, the API server's encoding is base64; both are read.
fn patch_of(response: &Value) -> Option<Vec<u8>> {
    match response.get("patch")? {
        Value::String(b64) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("a base64 patch"),
        ),
        Value::Array(bytes) => Some(
            bytes
                .iter()
                .map(|b| u8::try_from(b.as_u64().expect("a byte")).expect("a byte"))
                .collect(),
        ),
        Value::Null => None,
        other => panic!("a patch that is neither bytes nor base64: {other}"),
    }
}

/// Checks one answer; returns the response object of a 200.
fn check(status: StatusCode, body: &[u8], sent: Option<&Value>) -> Option<Value> {
    match status {
        StatusCode::OK => {}
        StatusCode::BAD_REQUEST => {
            let text = std::str::from_utf8(body).expect("a plain-text reason");
            assert!(!text.trim().is_empty(), "a 400 without a reason");
            return None;
        }
        other => panic!(
            "unexpected status {other}: {}",
            String::from_utf8_lossy(body)
        ),
    }
    let review: Value = serde_json::from_slice(body).expect("a 200 carries JSON");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
    assert_eq!(review["kind"], "AdmissionReview", "{review}");
    let response = review["response"].clone();
    assert!(response.is_object(), "{review}");
    if let Some(uid) = sent.and_then(|s| s.pointer("/request/uid")) {
        assert_eq!(&response["uid"], uid, "the response answers another UID");
    }
    match response["allowed"] {
        Value::Bool(true) => {}
        Value::Bool(false) => {
            let code = response["status"]["code"].as_u64().unwrap_or(0);
            assert!(
                (400..600).contains(&code),
                "a denial with code {code}: {response}"
            );
            let message = response["status"]["message"].as_str().unwrap_or("");
            assert!(
                !message.is_empty(),
                "a denial without a message: {response}"
            );
            assert!(
                patch_of(&response).is_none(),
                "a denial with a patch: {response}"
            );
        }
        _ => panic!("no allowed: {response}"),
    }
    Some(response)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let hook = if selector & 1 == 1 {
        "/mutate"
    } else {
        "/validate"
    };
    let (status, answer) = post(hook, body.to_vec());
    // The request as JSON, when serde_json reads it (it may not: the router
    // refuses what it does not read too, with a 400).
    let sent: Option<Value> = serde_json::from_slice(body).ok();
    let Some(response) = check(status, &answer, sent.as_ref()) else {
        return;
    };
    if hook != "/mutate" {
        return;
    }
    let Some(patch) = patch_of(&response) else {
        return;
    };
    let patch: json_patch::Patch =
        serde_json::from_slice(&patch).expect("the patch is a JSON patch");
    assert!(!patch.0.is_empty(), "an empty patch is sent as none");
    // A 200 with a patch means the body was read as a review with an
    // object; serde_json::Value reads it too unless a number is out of
    // f64's range, and then there is nothing to compare.
    let Some(mut sent) = sent else {
        return;
    };
    let Some(object) = sent.pointer_mut("/request/object") else {
        panic!("a patch for a request without an object");
    };
    if let Err(e) = json_patch::patch(object, &patch) {
        panic!("the defaults patch does not apply to the object sent: {e}; patch {patch:?}");
    }
    let again = serde_json::to_vec(&sent).expect("a JSON value encodes");
    let (status, answer) = post("/mutate", again);
    let response = check(status, &answer, Some(&sent))
        .unwrap_or_else(|| panic!("the patched object was refused: {status}"));
    assert_eq!(
        response["allowed"], true,
        "the patched object was denied: {response}"
    );
    if let Some(second) = patch_of(&response) {
        panic!(
            "defaulting is not idempotent: the patched object gets another patch {}",
            String::from_utf8_lossy(&second)
        );
    }
});
