//! `/metrics` on `--diagnostics-address`.
//!
//! Over HTTPS, a scrape is authenticated by a TokenReview of its bearer
//! token and authorized by a SubjectAccessReview for `get` on the
//! non-resource URL `/metrics`. The verdict for a token is kept for
//! [`VERDICT_TTL`] (a revoked token or binding takes effect within that),
//! for at most [`MAX_VERDICTS`] tokens, keyed by the token's SHA-256 so the
//! token itself is not kept. At most [`MAX_REVIEWING`] scrapes ask the API
//! server at once; past that a scrape gets 429, so that a flood of made-up
//! tokens costs the API server a bounded rate of reviews.
//! With `--insecure-diagnostics` it is plain HTTP without either.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::server::ResolvesServerCert;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::server::tls::{self, ReloadingCert, TlsError};

/// Where the Go manager looks for the metrics certificate; there is no flag.
pub const METRICS_CERT_DIR: &str = "/tmp/k8s-metrics-server/serving-certs";

/// How long a token's verdict is kept.
pub const VERDICT_TTL: Duration = Duration::from_secs(10);
/// The most tokens whose verdicts are kept.
pub const MAX_VERDICTS: usize = 64;
/// The most scrapes asking the API server at once.
pub const MAX_REVIEWING: usize = 4;

/// Who may read `/metrics`.
#[derive(Clone)]
pub enum Access {
    /// `--insecure-diagnostics`: anyone who can connect.
    Anyone,
    /// Whoever the API server authenticates and authorizes.
    Authorized(Arc<Reviews>),
}

impl Access {
    pub fn authorized(client: kube::Client) -> Self {
        Access::Authorized(Arc::new(Reviews {
            client,
            verdicts: Mutex::new(Verdicts::default()),
            reviewing: Semaphore::new(MAX_REVIEWING),
        }))
    }
}

/// The API server's verdicts on scrapers' tokens.
pub struct Reviews {
    client: kube::Client,
    verdicts: Mutex<Verdicts>,
    reviewing: Semaphore,
}

impl Reviews {
    async fn authorize(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let token = bearer_token(headers).ok_or(Denied::Unauthenticated)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(verdict) = self.verdicts().get(&digest, Instant::now()) {
            return verdict;
        }
        let Ok(_asking) = self.reviewing.try_acquire() else {
            return Err(Denied::Busy);
        };
        let verdict = authorize(&self.client, token).await;
        if !matches!(verdict, Err(Denied::ReviewFailed)) {
            self.verdicts().put(digest, verdict.clone(), Instant::now());
        }
        verdict
    }

    fn verdicts(&self) -> std::sync::MutexGuard<'_, Verdicts> {
        self.verdicts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Recent verdicts by token digest, at most [`MAX_VERDICTS`].
#[derive(Default)]
struct Verdicts(HashMap<[u8; 32], (Result<(), Denied>, Instant)>);

impl Verdicts {
    fn get(&self, digest: &[u8; 32], now: Instant) -> Option<Result<(), Denied>> {
        let (verdict, at) = self.0.get(digest)?;
        (now.saturating_duration_since(*at) < VERDICT_TTL).then(|| verdict.clone())
    }

    fn put(&mut self, digest: [u8; 32], verdict: Result<(), Denied>, now: Instant) {
        if self.0.len() >= MAX_VERDICTS && !self.0.contains_key(&digest) {
            self.0
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < VERDICT_TTL);
            if self.0.len() >= MAX_VERDICTS
                && let Some(oldest) = self
                    .0
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(d, _)| *d)
            {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(digest, (verdict, now));
    }
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
    if let Access::Authorized(reviews) = &state.access
        && let Err(denied) = reviews.authorize(&headers).await
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

#[derive(Clone, Debug, PartialEq, Eq)]
enum Denied {
    Unauthenticated,
    Forbidden,
    /// The API server could not be asked.
    ReviewFailed,
    /// [`MAX_REVIEWING`] scrapes are asking already.
    Busy,
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
            Denied::Busy => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
                "too many scrapes being authorized; try again\n",
            )
                .into_response(),
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

/// Asks the API server about `token`: TokenReview, then SubjectAccessReview.
async fn authorize(client: &kube::Client, token: &str) -> Result<(), Denied> {
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
    use axum::http::Request;
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

    fn digest(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn verdicts_are_kept_for_their_time_and_within_their_number() {
        let start = Instant::now();
        let mut verdicts = Verdicts::default();
        verdicts.put(digest(0), Ok(()), start);
        verdicts.put(digest(1), Err(Denied::Forbidden), start);
        assert_eq!(
            verdicts.get(&digest(0), start + VERDICT_TTL / 2),
            Some(Ok(()))
        );
        assert_eq!(
            verdicts.get(&digest(1), start),
            Some(Err(Denied::Forbidden))
        );
        assert_eq!(verdicts.get(&digest(0), start + VERDICT_TTL), None);
        assert_eq!(verdicts.get(&digest(2), start), None);

        // Full of fresh verdicts: the oldest goes, the newest stay.
        for n in 0..=u8::try_from(MAX_VERDICTS).unwrap() {
            let at = start + Duration::from_millis(u64::from(n));
            verdicts.put(digest(n), Ok(()), at);
        }
        assert_eq!(verdicts.0.len(), MAX_VERDICTS);
        let now = start + Duration::from_millis(100);
        assert_eq!(verdicts.get(&digest(0), now), None);
        assert_eq!(verdicts.get(&digest(1), now), Some(Ok(())));
        let last = u8::try_from(MAX_VERDICTS).unwrap();
        assert_eq!(verdicts.get(&digest(last), now), Some(Ok(())));

        // Full, with expired ones: those go first, all of them.
        let later = start + VERDICT_TTL * 2;
        verdicts.put(digest(200), Ok(()), later);
        assert_eq!(verdicts.0.len(), 1);
    }

    #[tokio::test]
    async fn past_the_reviews_in_flight_a_scrape_gets_429_without_asking() {
        // Nothing listens there: a scrape that asked would fail, not 429.
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let Access::Authorized(reviews) =
            Access::authorized(kube::Client::try_from(config).unwrap())
        else {
            unreachable!()
        };
        let _all = reviews
            .reviewing
            .try_acquire_many(u32::try_from(MAX_REVIEWING).unwrap())
            .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer some-token"),
        );
        assert_eq!(reviews.authorize(&headers).await, Err(Denied::Busy));
        // A token whose verdict is known needs no review.
        let digest: [u8; 32] = Sha256::digest(b"some-token").into();
        reviews.verdicts().put(digest, Ok(()), Instant::now());
        assert_eq!(reviews.authorize(&headers).await, Ok(()));
    }
}
