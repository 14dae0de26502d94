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
//! - the body is parsed once: the handler's decoder for the request's kind
//!   reads `object` and `oldObject` during the envelope's parse
//!   ([`review`]); the bounds on what decoding may build are the handler's
//!   (see [`crate::webhooks::decode`]).
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
use kube::core::TypeMeta;
use kube::core::admission::{AdmissionResponse, META_API_VERSION_V1, META_KIND};
use serde::de::DeserializeSeed;
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

/// The webhook rules, as the server calls them. One value serves every
/// request, concurrently.
///
/// Implement it with `async fn`s; each must answer, never fail: a request the
/// rules cannot judge is denied with a reason. The server copies the
/// request's UID into the response, so a response built with
/// `request.allow()`, `.deny(reason)` or `.with_patch(patch)` is all a rule
/// returns.
pub trait AdmissionHandler: Send + Sync + 'static {
    /// What an object of a request is decoded into.
    type Object: Send + Sync;
    /// Decodes one object, during the parse of the body.
    type Decoder: for<'de> DeserializeSeed<'de, Value = Self::Object>;

    /// The decoder for the `field` object of a request of `kind` in a body
    /// of `body` bytes; `None` keeps it as JSON text ([`Sent::Text`]).
    fn decoder(&self, kind: &str, field: Field, body: usize) -> Option<Self::Decoder>;

    /// `POST /validate`: allow or deny, with warnings if any.
    fn validate(
        &self,
        request: &ReviewRequest<'_, Self::Object>,
    ) -> impl Future<Output = AdmissionResponse> + Send;

    /// `POST /mutate`: allow, with a JSON patch when defaults apply.
    fn mutate(
        &self,
        request: &ReviewRequest<'_, Self::Object>,
    ) -> impl Future<Output = AdmissionResponse> + Send;
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
    let request = match review::parse(&body, shared.handler.as_ref()) {
        Ok(request) => request,
        Err(e) => return refuse(hook, Rejection::NotAReview(e)),
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
    // A body that comes in one frame, as most do, is kept as it came;
    // the frames of a longer one are copied together.
    let mut first: Option<Bytes> = None;
    let mut buffer = BytesMut::new();
    let mut held = take(budget, 0)?;
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Rejection::Unreadable(e.to_string()))?;
        // Trailers carry nothing a review needs.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let kept = first.as_ref().map_or(buffer.len(), Bytes::len);
        let length = kept + data.len();
        if length > BODY_LIMIT {
            return Err(Rejection::TooLarge);
        }
        if first.is_none() && buffer.is_empty() {
            held.merge(take(budget, data.len())?);
            first = Some(data);
            continue;
        }
        buffer.reserve(declared.unwrap_or(length).max(length) - buffer.len());
        let more = buffer.capacity().saturating_sub(held.num_permits());
        if more > 0 {
            held.merge(take(budget, more)?);
        }
        if let Some(first) = first.take() {
            buffer.extend_from_slice(&first);
        }
        buffer.extend_from_slice(&data);
    }
    Ok((first.unwrap_or_else(|| buffer.freeze()), held))
}

fn take(budget: &Semaphore, bytes: usize) -> Result<SemaphorePermit<'_>, Rejection> {
    let bytes = u32::try_from(bytes).map_err(|_| Rejection::TooLarge)?;
    budget.try_acquire_many(bytes).map_err(|_| Rejection::Busy)
}

mod review;

pub use review::{Field, ReviewRequest, Sent};

#[cfg(test)]
mod tests;
