//! The admission webhooks' HTTP side: `POST /validate` and `POST /mutate`.
//!
//! This module reads the AdmissionReview, hands its request to an
//! [`AdmissionHandler`] and answers with the handler's response under the
//! request's UID, as kube's `admission_controller` example does. The rules
//! themselves live with the handler. Bodies are limited to 3 MiB and are
//! never buffered past that limit; a body that is not an `admission.k8s.io/v1`
//! AdmissionReview gets HTTP 400 with a plain-text reason.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::core::DynamicObject;
use kube::core::TypeMeta;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
};
use tracing::debug;

/// The largest request body accepted (CONTRACT). etcd keeps objects under
/// 1.5 MiB by default, so an UPDATE carrying an object and its old version fits.
pub const BODY_LIMIT: usize = 3 * 1024 * 1024;

/// The webhook rules, as the server calls them. One value serves every
/// request, concurrently.
///
/// Implement it with `async fn`s; each must answer, never fail: a request the
/// rules cannot judge is denied with a reason. The server copies the
/// request's UID into the response, so a response built with
/// `AdmissionResponse::from(request)` (allow), `.deny(reason)` or
/// `.with_patch(patch)` is all a rule returns.
pub trait AdmissionHandler: Send + Sync + 'static {
    /// `POST /validate`: allow or deny, with warnings if any.
    fn validate(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> impl Future<Output = AdmissionResponse> + Send;

    /// `POST /mutate`: allow, with a JSON patch when defaults apply.
    fn mutate(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> impl Future<Output = AdmissionResponse> + Send;
}

/// The `/validate` and `/mutate` routes over `handler`.
pub fn router<H: AdmissionHandler>(handler: Arc<H>) -> Router {
    Router::new()
        .route("/validate", post(validate::<H>))
        .route("/mutate", post(mutate::<H>))
        .with_state(handler)
}

#[derive(Clone, Copy, Debug)]
enum Hook {
    Validate,
    Mutate,
}

async fn validate<H: AdmissionHandler>(
    State(handler): State<Arc<H>>,
    request: Request,
) -> Response {
    admit(Hook::Validate, &*handler, request).await
}

async fn mutate<H: AdmissionHandler>(State(handler): State<Arc<H>>, request: Request) -> Response {
    admit(Hook::Mutate, &*handler, request).await
}

async fn admit<H: AdmissionHandler>(hook: Hook, handler: &H, request: Request) -> Response {
    let request = match read_review(request).await {
        Ok(request) => request,
        Err(rejection) => {
            debug!(?hook, "refused a webhook request: {}", rejection.message());
            return rejection.into_response();
        }
    };
    let started = Instant::now();
    let mut response = match hook {
        Hook::Validate => handler.validate(&request).await,
        Hook::Mutate => handler.mutate(&request).await,
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

/// Why a body was not handed to the rules.
#[derive(Debug)]
enum Rejection {
    TooLarge,
    Unreadable(String),
    NotAReview(String),
}

impl Rejection {
    fn message(&self) -> String {
        match self {
            Rejection::TooLarge => format!("request body larger than {BODY_LIMIT} bytes"),
            Rejection::Unreadable(e) => format!("reading the request body: {e}"),
            Rejection::NotAReview(e) => format!("not an admission.k8s.io/v1 AdmissionReview: {e}"),
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let status = match self {
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unreadable(_) | Rejection::NotAReview(_) => StatusCode::BAD_REQUEST,
        };
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.message() + "\n",
        )
            .into_response()
    }
}

async fn read_review(request: Request) -> Result<AdmissionRequest<DynamicObject>, Rejection> {
    // A declared length over the limit is refused before reading a byte.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > BODY_LIMIT as u64) {
        return Err(Rejection::TooLarge);
    }
    let bytes = read_limited(request.into_body()).await?;
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&bytes).map_err(|e| Rejection::NotAReview(e.to_string()))?;
    if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
        return Err(Rejection::NotAReview(format!(
            "got kind {:?} of {:?}",
            clip(&review.types.kind),
            clip(&review.types.api_version)
        )));
    }
    review
        .try_into()
        .map_err(|_| Rejection::NotAReview("it has no request".into()))
}

/// Reads at most [`BODY_LIMIT`] bytes: a longer body stops being read as soon
/// as it passes the limit, whatever its declared length.
async fn read_limited(body: Body) -> Result<axum::body::Bytes, Rejection> {
    match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(Rejection::TooLarge),
        Err(e) => Err(Rejection::Unreadable(e.to_string())),
    }
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

    use axum::body::Bytes;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// Denies objects named "forbidden"; the mutation adds a label.
    struct TestRules;

    impl AdmissionHandler for TestRules {
        async fn validate(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
            let response = AdmissionResponse::from(request);
            if request.name == "forbidden" {
                response.deny("metadata.name: must not be forbidden (got \"forbidden\")")
            } else {
                response
            }
        }

        async fn mutate(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
            let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                {"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}
            ]))
            .unwrap();
            AdmissionResponse::from(request).with_patch(patch).unwrap()
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
}
