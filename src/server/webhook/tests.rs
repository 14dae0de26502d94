use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use tower::ServiceExt;

use super::*;

type Value = serde_json::Value;

/// Denies objects named "forbidden"; the mutation adds a label. The objects
/// of a TerraformCluster are decoded with the body, as JSON values.
struct TestRules;

impl AdmissionHandler for TestRules {
    type Object = Value;
    type Decoder = PhantomData<Value>;

    fn decoder(&self, kind: &str, _field: Field, _body: usize) -> Option<Self::Decoder> {
        (kind == "TerraformCluster").then_some(PhantomData)
    }

    async fn validate(&self, request: &ReviewRequest<'_, Value>) -> AdmissionResponse {
        let response = request.allow();
        if request.name == "forbidden" {
            response.deny("metadata.name: must not be forbidden (got \"forbidden\")")
        } else {
            response
        }
    }

    async fn mutate(&self, request: &ReviewRequest<'_, Value>) -> AdmissionResponse {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}
        ]))
        .unwrap();
        request.allow().with_patch(patch).unwrap()
    }
}

/// Allows, once released: each request waits in the rules until the test
/// adds a permit to `release`; `entered` gets one per request waiting.
struct Held {
    entered: Semaphore,
    release: Semaphore,
}

impl AdmissionHandler for Held {
    type Object = Value;
    type Decoder = PhantomData<Value>;

    fn decoder(&self, _kind: &str, _field: Field, _body: usize) -> Option<Self::Decoder> {
        None
    }

    async fn validate(&self, request: &ReviewRequest<'_, Value>) -> AdmissionResponse {
        self.entered.add_permits(1);
        self.release.acquire().await.unwrap().forget();
        request.allow()
    }

    async fn mutate(&self, request: &ReviewRequest<'_, Value>) -> AdmissionResponse {
        self.validate(request).await
    }
}

fn review(uid: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": "TerraformCluster"},
            "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": "terraformclusters"},
            "name": name,
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "TerraformCluster",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {}
            },
            "oldObject": null,
            "dryRun": false
        }
    })
}

async fn call(path: &str, body: Body, length: Option<usize>) -> (StatusCode, Bytes) {
    let mut request =
        axum::http::Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(length) = length {
        request = request.header(header::CONTENT_LENGTH, length);
    }
    let response = router(Arc::new(TestRules))
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

fn response_of(body: &[u8]) -> AdmissionResponse {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).unwrap();
    assert_eq!(review.types.api_version, "admission.k8s.io/v1");
    assert_eq!(review.types.kind, "AdmissionReview");
    review.response.expect("a response")
}

#[tokio::test]
async fn validate_answers_with_the_request_uid_and_the_rules_verdict() {
    let body = review("uid-1", "fine").to_string();
    let (status, bytes) = call("/validate", body.into(), None).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&bytes);
    assert_eq!(response.uid, "uid-1");
    assert!(response.allowed);

    let body = review("uid-2", "forbidden").to_string();
    let (status, bytes) = call("/validate", body.into(), None).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&bytes);
    assert_eq!(response.uid, "uid-2");
    assert!(!response.allowed);
    assert!(
        response.result.message.contains("must not be forbidden"),
        "{:?}",
        response.result
    );
}

#[tokio::test]
async fn a_body_in_many_frames_is_read_whole() {
    let text = review("uid-frames", "forbidden").to_string();
    for (size, empty_first) in [(1, false), (7, true), (1000, false)] {
        // The text cut into frames of `size` bytes, maybe after an empty one.
        let empty = empty_first.then(Bytes::new);
        let frames: Vec<_> = empty
            .into_iter()
            .chain(text.as_bytes().chunks(size).map(Bytes::copy_from_slice))
            .map(Ok::<_, std::convert::Infallible>)
            .collect();
        let body = Body::from_stream(futures::stream::iter(frames));
        let (status, bytes) = call("/validate", body, Some(text.len())).await;
        assert_eq!(status, StatusCode::OK, "frames of {size} bytes");
        let response = response_of(&bytes);
        assert_eq!(response.uid, "uid-frames");
        assert!(
            response.result.message.contains("must not be forbidden"),
            "frames of {size} bytes: {:?}",
            response.result
        );
    }
}

#[tokio::test]
async fn mutate_returns_the_rules_patch() {
    let body = review("uid-3", "x").to_string();
    let (status, bytes) = call("/mutate", body.into(), None).await;
    assert_eq!(status, StatusCode::OK);
    let raw: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(raw["response"]["patchType"], "JSONPatch");
    let response = response_of(&bytes);
    assert_eq!(response.uid, "uid-3");
    let patch: serde_json::Value = serde_json::from_slice(&response.patch.unwrap()).unwrap();
    assert_eq!(patch[0]["path"], "/metadata/labels");
}

#[tokio::test]
async fn a_body_that_is_not_an_admission_review_is_a_bad_request() {
    let mut wrong_version = review("u", "n");
    wrong_version["apiVersion"] = "admission.k8s.io/v1beta1".into();
    let mut no_request = review("u", "n");
    no_request.as_object_mut().unwrap().remove("request");
    for body in [
        "{not json".to_string(),
        "[]".to_string(),
        serde_json::json!({"kind": "Pod", "apiVersion": "v1"}).to_string(),
        wrong_version.to_string(),
        no_request.to_string(),
    ] {
        let (status, bytes) = call("/validate", body.clone().into(), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(
            text.starts_with("not an admission.k8s.io/v1 AdmissionReview"),
            "{text}"
        );
    }
}

/// Decodes every object as a number: an object never decodes.
struct Numbers;

impl AdmissionHandler for Numbers {
    type Object = u64;
    type Decoder = PhantomData<u64>;

    fn decoder(&self, _kind: &str, _field: Field, _body: usize) -> Option<Self::Decoder> {
        Some(PhantomData)
    }

    async fn validate(&self, request: &ReviewRequest<'_, u64>) -> AdmissionResponse {
        request.allow()
    }

    async fn mutate(&self, request: &ReviewRequest<'_, u64>) -> AdmissionResponse {
        request.allow()
    }
}

fn text<O>(sent: &Option<Sent<'_, O>>) -> Option<String> {
    match sent {
        Some(Sent::Text(raw)) => Some(raw.get().to_owned()),
        _ => None,
    }
}

#[test]
fn the_objects_are_decoded_with_the_body_once_the_kind_is_known() {
    let mut update = review("u", "n");
    update["request"]["operation"] = "UPDATE".into();
    update["request"]["oldObject"] = update["request"]["object"].clone();
    let body = update.to_string();
    let request = review::parse(body.as_bytes(), &TestRules).unwrap();
    assert_eq!(request.uid, "u");
    assert_eq!(request.name, "n");
    assert_eq!(request.namespace.as_deref(), Some("default"));
    assert_eq!(request.operation, kube::core::admission::Operation::Update);
    assert_eq!(request.user_info.username.as_deref(), Some("admin"));
    for sent in [&request.object, &request.old_object] {
        let Some(Sent::Decoded(object)) = sent else {
            panic!("not decoded: {sent:?}");
        };
        assert_eq!(object, &update["request"]["object"]);
    }

    // A kind without a decoder keeps the text, as does an object sent
    // before the kind; null is no object.
    let mut other = review("u", "n");
    other["request"]["kind"]["kind"] = "Other".into();
    let body = other.to_string();
    let request = review::parse(body.as_bytes(), &TestRules).unwrap();
    let object = text(&request.object).expect("kept as text");
    assert_eq!(
        serde_json::from_str::<Value>(&object).unwrap(),
        other["request"]["object"]
    );
    assert!(request.old_object.is_none());

    let object = review("u", "n")["request"]["object"].to_string();
    let first = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"object":{object},"uid":"u","kind":{{"group":"g","version":"v","kind":"TerraformCluster"}},"operation":"CREATE","userInfo":{{}}}}}}"#
    );
    let request = review::parse(first.as_bytes(), &TestRules).unwrap();
    assert_eq!(text(&request.object), Some(object));
    assert_eq!((request.name.as_str(), request.dry_run), ("", false));
}

#[test]
fn an_object_that_does_not_decode_is_kept_as_text() {
    let body = review("u", "n").to_string();
    let request = review::parse(body.as_bytes(), &Numbers).unwrap();
    let object = text(&request.object).expect("kept as text");
    assert_eq!(
        serde_json::from_str::<Value>(&object).unwrap(),
        review("u", "n")["request"]["object"]
    );
}

#[test]
fn a_body_not_utf8_or_a_request_missing_a_field_or_repeating_one_is_not_a_review() {
    let e = review::parse(b"{\"apiVersion\":\"\xff\"}", &TestRules).unwrap_err();
    assert!(e.starts_with("the body is not UTF-8"), "{e}");

    let mut no_uid = review("u", "n");
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let e = review::parse(no_uid.to_string().as_bytes(), &TestRules).unwrap_err();
    assert!(e.contains("missing field `uid`"), "{e}");

    let body = review("u", "n").to_string();
    let twice = body.replacen(r#""dryRun":false"#, r#""dryRun":false,"object":null"#, 1);
    assert_ne!(twice, body);
    let e = review::parse(twice.as_bytes(), &TestRules).unwrap_err();
    assert!(e.contains("duplicate field `object`"), "{e}");
}

#[tokio::test]
async fn only_post_is_routed() {
    let response = router(Arc::new(TestRules))
        .oneshot(
            axum::http::Request::get("/validate")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

/// A body of `total` zero bytes in 64 KiB chunks that counts what was read.
struct Counting {
    left: usize,
    read: Arc<AtomicUsize>,
}

impl http_body::Body for Counting {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(64 * 1024);
        self.left -= n;
        self.read.fetch_add(n, Ordering::SeqCst);
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![b' '; n])))))
    }
}

#[tokio::test]
async fn a_large_body_is_refused_without_reading_it_whole() {
    const TEN_MIB: usize = 10 * 1024 * 1024;
    // Undeclared length (chunked): reading stops right past the limit.
    let read = Arc::new(AtomicUsize::new(0));
    let body = Body::new(Counting {
        left: TEN_MIB,
        read: read.clone(),
    });
    let (status, _) = call("/validate", body, None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let consumed = read.load(Ordering::SeqCst);
    assert!(consumed <= BODY_LIMIT + 64 * 1024, "read {consumed} bytes");

    // Declared length: refused before reading anything.
    let read = Arc::new(AtomicUsize::new(0));
    let body = Body::new(Counting {
        left: TEN_MIB,
        read: read.clone(),
    });
    let (status, bytes) = call("/mutate", body, Some(TEN_MIB)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(read.load(Ordering::SeqCst), 0);
    assert!(String::from_utf8_lossy(&bytes).contains("larger than"));

    // Right at the limit is fine (as JSON it is not a review, hence 400).
    let read = Arc::new(AtomicUsize::new(0));
    let body = Body::new(Counting {
        left: BODY_LIMIT,
        read,
    });
    let (status, _) = call("/validate", body, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn past_the_in_flight_limit_a_request_gets_429_at_once() {
    let held = Arc::new(Held {
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let app = router(held.clone());
    let post = |path: &str, body: Body| {
        axum::http::Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    };
    let waiting: Vec<_> = (0..MAX_IN_FLIGHT)
        .map(|i| {
            let request = post(
                "/validate",
                review(&format!("u{i}"), "x").to_string().into(),
            );
            tokio::spawn(app.clone().oneshot(request))
        })
        .collect();
    let all_in = u32::try_from(MAX_IN_FLIGHT).unwrap();
    held.entered.acquire_many(all_in).await.unwrap().forget();

    // One more: refused without waiting.
    let body = review("one-more", "x").to_string().into();
    let response = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        app.clone().oneshot(post("/mutate", body)),
    )
    .await
    .expect("answered at once")
    .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&text).contains("being read or judged"),
        "{text:?}"
    );

    held.release.add_permits(MAX_IN_FLIGHT);
    for request in waiting {
        assert_eq!(request.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    // The permits came back.
    held.release.add_permits(1);
    let response = app
        .oneshot(post("/mutate", review("u", "x").to_string().into()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// A body that sends `sent` bytes, then nothing more, ever.
struct Stalled {
    sent: usize,
    /// Gets a permit once the body stalls: its bytes have been taken.
    stalled: Arc<Semaphore>,
    told: bool,
}

impl Stalled {
    fn body(sent: usize, stalled: &Arc<Semaphore>) -> Body {
        Body::new(Stalled {
            sent,
            stalled: stalled.clone(),
            told: false,
        })
    }
}

impl http_body::Body for Stalled {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.sent == 0 {
            if !std::mem::replace(&mut self.told, true) {
                self.stalled.add_permits(1);
            }
            return Poll::Pending;
        }
        let n = std::mem::take(&mut self.sent);
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![b' '; n])))))
    }
}

#[tokio::test]
async fn stalled_bodies_hold_only_the_bytes_they_sent() {
    let app = router(Arc::new(TestRules));
    let post = |body: Body| {
        axum::http::Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    };
    let answered = |app: Router| async move {
        let body = review("after", "x").to_string().into();
        let response =
            tokio::time::timeout(std::time::Duration::from_secs(1), app.oneshot(post(body)))
                .await
                .expect("answered at once")
                .unwrap();
        response.status()
    };
    let stalled = Arc::new(Semaphore::new(0));
    // More stalled bodies than requests may be judged at once.
    let slow: Vec<_> = (0..MAX_IN_FLIGHT * 2)
        .map(|_| tokio::spawn(app.clone().oneshot(post(Stalled::body(10, &stalled)))))
        .collect();
    let all = u32::try_from(MAX_IN_FLIGHT * 2).unwrap();
    stalled.acquire_many(all).await.unwrap().forget();
    assert_eq!(answered(app.clone()).await, StatusCode::OK);
    for request in slow {
        request.abort();
        let _ = request.await;
    }

    // Bodies that sent the whole budget between them: one more is refused.
    let full: Vec<_> = (0..MAX_IN_FLIGHT)
        .map(|_| {
            let body = Stalled::body(BODY_LIMIT, &stalled);
            tokio::spawn(app.clone().oneshot(post(body)))
        })
        .collect();
    let all = u32::try_from(MAX_IN_FLIGHT).unwrap();
    stalled.acquire_many(all).await.unwrap().forget();
    assert_eq!(answered(app.clone()).await, StatusCode::TOO_MANY_REQUESTS);
    // Their bytes come back when they end.
    for request in full {
        request.abort();
        let _ = request.await;
    }
    assert_eq!(answered(app).await, StatusCode::OK);
}
