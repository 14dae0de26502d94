//! The admission webhooks' HTTP side: `POST /validate` and `POST /mutate`.
//!
//! This module reads the AdmissionReview, hands its request to an
//! [`AdmissionHandler`] and answers with the handler's response under the
//! request's UID. The rules themselves live with the handler. What one
//! request may cost is bounded here:
//!
//! - bodies are limited to [`BODY_LIMIT`] and never buffered past it, and
//!   the bodies being read hold at most [`BODY_BUDGET`] bytes together,
//!   counted as they arrive: a client that sends its body slowly holds
//!   only the bytes it sent (and the connection's request timeout ends it);
//! - at most [`MAX_IN_FLIGHT`] requests are judged at once, once their
//!   bodies are read. Past either bound a request gets HTTP 429 with
//!   `Retry-After: 1` at once;
//! - the envelope is parsed once, borrowing from the body: `object` and
//!   `oldObject` stay JSON text ([`RawValue`]) until a rule decodes the typed
//!   object it needs (see [`crate::webhooks::decode`]).
//!
//! A body that is not an `admission.k8s.io/v1` AdmissionReview gets HTTP 400
//! with a plain-text reason.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::BytesMut;
use http_body_util::BodyExt;
use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation};
use kube::core::{GroupVersionKind, Status, TypeMeta};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::debug;

/// The largest request body accepted (CONTRACT). etcd keeps objects under
/// 1.5 MiB by default, so an UPDATE carrying an object and its old version fits.
pub const BODY_LIMIT: usize = 3 * 1024 * 1024;

/// The most requests being judged at once, their bodies read. With the
/// per-object cap on JSON values ([`crate::webhooks::decode::MAX_VALUES`])
/// it bounds the memory of decoding; the rules take microseconds, so 16
/// only fill up under a flood.
pub const MAX_IN_FLIGHT: usize = 16;

/// The most bytes of request bodies held at once while they are read (the
/// buffers' capacity), across requests: sixteen bodies at [`BODY_LIMIT`].
pub const BODY_BUDGET: usize = MAX_IN_FLIGHT * BODY_LIMIT;

/// An AdmissionReview's request as the rules read it. `object` and
/// `oldObject` are the JSON text of the objects, borrowed from the request
/// body: a rule decodes the typed object it needs from it, once.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
    /// Absent (or null) on DELETE.
    #[serde(borrow)]
    pub object: Option<&'a RawValue>,
    /// Present on UPDATE and DELETE.
    #[serde(borrow)]
    pub old_object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: bool,
}

impl ReviewRequest<'_> {
    /// A response that allows this request; `.deny(reason)` or
    /// `.with_patch(patch)` turn it into the others.
    pub fn allow(&self) -> AdmissionResponse {
        // kube builds a response from its own request type or as `invalid`;
        // with the failure cleared, the latter is the value the former gives.
        let mut response = AdmissionResponse::invalid("");
        response.uid = self.uid.clone();
        response.allowed = true;
        response.result = Status::default();
        response
    }
}

/// The envelope around the request; the response part of a review is
/// ignored, as the API server never sends one.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    api_version: String,
    kind: String,
    #[serde(borrow)]
    request: Option<ReviewRequest<'a>>,
}

/// The webhook rules, as the server calls them. One value serves every
/// request, concurrently.
///
/// Implement it with `async fn`s; each must answer, never fail: a request the
/// rules cannot judge is denied with a reason. The server copies the
/// request's UID into the response, so a response built with
/// `request.allow()`, `.deny(reason)` or `.with_patch(patch)` is all a rule
/// returns.
pub trait AdmissionHandler: Send + Sync + 'static {
    /// `POST /validate`: allow or deny, with warnings if any.
    fn validate(
        &self,
        request: &ReviewRequest<'_>,
    ) -> impl Future<Output = AdmissionResponse> + Send;

    /// `POST /mutate`: allow, with a JSON patch when defaults apply.
    fn mutate(&self, request: &ReviewRequest<'_>)
    -> impl Future<Output = AdmissionResponse> + Send;
}

/// What the routes share: the rules, the in-flight permits and the bytes
/// of bodies being read.
struct Shared<H> {
    handler: Arc<H>,
    in_flight: Semaphore,
    bodies: Semaphore,
}

/// The `/validate` and `/mutate` routes over `handler`.
pub fn router<H: AdmissionHandler>(handler: Arc<H>) -> Router {
    let shared = Arc::new(Shared {
        handler,
        in_flight: Semaphore::new(MAX_IN_FLIGHT),
        bodies: Semaphore::new(BODY_BUDGET),
    });
    Router::new()
        .route("/validate", post(validate::<H>))
        .route("/mutate", post(mutate::<H>))
        .with_state(shared)
}

#[derive(Clone, Copy, Debug)]
enum Hook {
    Validate,
    Mutate,
}

async fn validate<H: AdmissionHandler>(
    State(shared): State<Arc<Shared<H>>>,
    request: Request,
) -> Response {
    admit(Hook::Validate, &shared, request).await
}

async fn mutate<H: AdmissionHandler>(
    State(shared): State<Arc<Shared<H>>>,
    request: Request,
) -> Response {
    admit(Hook::Mutate, &shared, request).await
}

async fn admit<H: AdmissionHandler>(hook: Hook, shared: &Shared<H>, request: Request) -> Response {
    let (body, _bytes) = match read_body(request, &shared.bodies).await {
        Ok(body) => body,
        Err(rejection) => return refuse(hook, rejection),
    };
    let Ok(_judging) = shared.in_flight.try_acquire() else {
        return refuse(hook, Rejection::Busy);
    };
    let request = match parse_review(&body) {
        Ok(request) => request,
        Err(rejection) => return refuse(hook, rejection),
    };
    let started = Instant::now();
    let mut response = match hook {
        Hook::Validate => shared.handler.validate(&request).await,
        Hook::Mutate => shared.handler.mutate(&request).await,
    };
    // The API server matches the answer to its request by UID and version.
    response.uid = request.uid.clone();
    response.types = TypeMeta {
        api_version: META_API_VERSION_V1.into(),
        kind: META_KIND.into(),
    };
    // Names only: objects may hold secrets.
    debug!(
        ?hook,
        uid = %request.uid,
        kind = %request.kind.kind,
        operation = ?request.operation,
        namespace = request.namespace.as_deref().unwrap_or(""),
        name = %request.name,
        allowed = response.allowed,
        micros = started.elapsed().as_micros() as u64,
        "admission request answered"
    );
    Json(response.into_review()).into_response()
}

fn refuse(hook: Hook, rejection: Rejection) -> Response {
    debug!(?hook, "refused a webhook request: {}", rejection.message());
    rejection.into_response()
}

/// Why a body was not handed to the rules.
#[derive(Debug)]
enum Rejection {
    Busy,
    TooLarge,
    Unreadable(String),
    NotAReview(String),
}

impl Rejection {
    fn message(&self) -> String {
        match self {
            Rejection::Busy => {
                "too many admission requests are being read or judged; try again".into()
            }
            Rejection::TooLarge => format!("request body larger than {BODY_LIMIT} bytes"),
            Rejection::Unreadable(e) => format!("reading the request body: {e}"),
            Rejection::NotAReview(e) => format!("not an admission.k8s.io/v1 AdmissionReview: {e}"),
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let status = match self {
            Rejection::Busy => StatusCode::TOO_MANY_REQUESTS,
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unreadable(_) | Rejection::NotAReview(_) => StatusCode::BAD_REQUEST,
        };
        let mut response = (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.message() + "\n",
        )
            .into_response();
        if matches!(self, Rejection::Busy) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Reads at most [`BODY_LIMIT`] bytes: a longer body stops being read as
/// soon as it passes the limit, whatever its declared length. The bytes
/// held come out of `budget` as they arrive, and go back with the permit.
async fn read_body(
    request: Request,
    budget: &Semaphore,
) -> Result<(Bytes, SemaphorePermit<'_>), Rejection> {
    // A declared length over the limit is refused before reading a byte.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > BODY_LIMIT) {
        return Err(Rejection::TooLarge);
    }
    let mut buffer = BytesMut::new();
    let mut held = take(budget, 0)?;
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Rejection::Unreadable(e.to_string()))?;
        // Trailers carry nothing a review needs.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let length = buffer.len() + data.len();
        if length > BODY_LIMIT {
            return Err(Rejection::TooLarge);
        }
        buffer.reserve(declared.unwrap_or(length).max(length) - buffer.len());
        let more = buffer.capacity().saturating_sub(held.num_permits());
        if more > 0 {
            held.merge(take(budget, more)?);
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer.freeze(), held))
}

fn take(budget: &Semaphore, bytes: usize) -> Result<SemaphorePermit<'_>, Rejection> {
    let bytes = u32::try_from(bytes).map_err(|_| Rejection::TooLarge)?;
    budget.try_acquire_many(bytes).map_err(|_| Rejection::Busy)
}

/// The review's request, borrowing the objects' text from `body`.
fn parse_review(body: &[u8]) -> Result<ReviewRequest<'_>, Rejection> {
    let review: Envelope<'_> =
        serde_json::from_slice(body).map_err(|e| Rejection::NotAReview(e.to_string()))?;
    if review.api_version != META_API_VERSION_V1 || review.kind != META_KIND {
        return Err(Rejection::NotAReview(format!(
            "got kind {:?} of {:?}",
            clip(&review.kind),
            clip(&review.api_version)
        )));
    }
    review
        .request
        .ok_or_else(|| Rejection::NotAReview("it has no request".into()))
}

/// A client's string, cut short for an error message.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use axum::body::Body;
    use kube::core::DynamicObject;
    use kube::core::admission::AdmissionReview;
    use tower::ServiceExt;

    use super::*;

    /// Denies objects named "forbidden"; the mutation adds a label.
    struct TestRules;

    impl AdmissionHandler for TestRules {
        async fn validate(&self, request: &ReviewRequest<'_>) -> AdmissionResponse {
            let response = request.allow();
            if request.name == "forbidden" {
                response.deny("metadata.name: must not be forbidden (got \"forbidden\")")
            } else {
                response
            }
        }

        async fn mutate(&self, request: &ReviewRequest<'_>) -> AdmissionResponse {
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
        async fn validate(&self, request: &ReviewRequest<'_>) -> AdmissionResponse {
            self.entered.add_permits(1);
            self.release.acquire().await.unwrap().forget();
            request.allow()
        }

        async fn mutate(&self, request: &ReviewRequest<'_>) -> AdmissionResponse {
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
}
