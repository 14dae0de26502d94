//! `/metrics` on `--diagnostics-address`.
//!
//! Over HTTPS, every scrape is authenticated by a TokenReview of its bearer
//! token and authorized by a SubjectAccessReview for `get` on the
//! non-resource URL `/metrics`, both asked of the API server each time:
//! nothing is cached, so a revoked token or binding takes effect at the next
//! scrape. With `--insecure-diagnostics` it is plain HTTP without either.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::server::ResolvesServerCert;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::server::tls::{self, ReloadingCert, TlsError};

/// Where the Go manager looks for the metrics certificate; there is no flag.
pub const METRICS_CERT_DIR: &str = "/tmp/k8s-metrics-server/serving-certs";

/// Who may read `/metrics`.
#[derive(Clone)]
pub enum Access {
    /// `--insecure-diagnostics`: anyone who can connect.
    Anyone,
    /// Whoever the API server authenticates and authorizes.
    Authorized(kube::Client),
}

#[derive(Clone)]
struct DiagnosticsState {
    metrics: Arc<Metrics>,
    access: Access,
}

pub fn router(metrics: Arc<Metrics>, access: Access) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(DiagnosticsState { metrics, access })
}

/// The certificate of the metrics listener: `tls.crt` and `tls.key` from
/// `cert_dir` when both are there (re-read on change), else a self-signed one.
pub fn resolver(cert_dir: &Path) -> Result<Arc<dyn ResolvesServerCert>, TlsError> {
    let (cert, key) = (cert_dir.join("tls.crt"), cert_dir.join("tls.key"));
    if cert.exists() && key.exists() {
        return Ok(Arc::new(ReloadingCert::load(cert, key)?));
    }
    info!(
        dir = %cert_dir.display(),
        "no metrics certificate mounted, serving a self-signed one"
    );
    tls::self_signed(&["localhost"])
}

async fn serve_metrics(State(state): State<DiagnosticsState>, headers: HeaderMap) -> Response {
    if let Access::Authorized(client) = &state.access
        && let Err(denied) = authorize(client, &headers).await
    {
        return denied.into_response();
    }
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            warn!("encoding the metrics: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed\n",
            )
                .into_response()
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Denied {
    Unauthenticated,
    Forbidden,
    /// The API server could not be asked.
    ReviewFailed,
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Denied::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "Unauthorized\n",
            )
                .into_response(),
            Denied::Forbidden => (StatusCode::FORBIDDEN, "Forbidden\n").into_response(),
            Denied::ReviewFailed => {
                (StatusCode::INTERNAL_SERVER_ERROR, "authorization failed\n").into_response()
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn authorize(client: &kube::Client, headers: &HeaderMap) -> Result<(), Denied> {
    let token = bearer_token(headers).ok_or(Denied::Unauthenticated)?;
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: None,
        },
        ..Default::default()
    };
    // Errors name the API server's reason, never the token.
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            warn!("TokenReview for a metrics scrape failed: {e}");
            Denied::ReviewFailed
        })?;
    let status = reviewed.status.unwrap_or_default();
    let user = match (status.authenticated, status.user) {
        (Some(true), Some(user)) => user,
        _ => {
            debug!(
                error = status.error.as_deref().unwrap_or(""),
                "metrics scrape with an invalid token"
            );
            return Err(Denied::Unauthenticated);
        }
    };
    let username = user.username.clone().unwrap_or_default();
    let access_review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let decided = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access_review)
        .await
        .map_err(|e| {
            warn!(user = %username, "SubjectAccessReview for a metrics scrape failed: {e}");
            Denied::ReviewFailed
        })?;
    if decided.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        debug!(user = %username, "metrics scrape forbidden");
        Err(Denied::Forbidden)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{HeaderValue, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    #[test]
    fn bearer_tokens() {
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            h
        };
        assert_eq!(bearer_token(&headers("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(&headers("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&headers("Basic abc")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&headers("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn insecure_metrics_answer_anyone_in_openmetrics_text() {
        let response = router(Arc::new(Metrics::new()), Access::Anyone)
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("captf_build_info{"));
    }

    #[test]
    fn without_mounted_files_the_certificate_is_self_signed() {
        let dir = tempfile::tempdir().unwrap();
        resolver(dir.path()).unwrap();
        // One file alone is not a pair: still self-signed, no error.
        std::fs::write(dir.path().join("tls.crt"), "x").unwrap();
        resolver(dir.path()).unwrap();
        // Both present but broken: refused, not silently replaced.
        std::fs::write(dir.path().join("tls.key"), "y").unwrap();
        assert!(resolver(dir.path()).is_err());
    }
}
