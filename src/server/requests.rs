//! Counts every request the manager's client makes to the API server
//! (`rest_client_requests_total`, the series client-go keeps), and those of
//! one reconcile pass ([`counting`]), so that what a pass costs the API
//! server can be read off `/metrics` and the debug log.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use tower::{Layer, Service};
use tracing::{Instrument, Span, span};

use crate::metrics::Metrics;

/// The requests of each pass being counted, by its span. The client's
/// requests go through a buffer task, which enters the span the request
/// was sent from, so the span is what ties a request to its pass.
static PASSES: LazyLock<Mutex<HashMap<span::Id, u32>>> = LazyLock::new(Default::default);

fn passes() -> std::sync::MutexGuard<'static, HashMap<span::Id, u32>> {
    PASSES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `pass` in `span`, counting the requests it makes; None when the
/// span is disabled (the log level leaves it out), which counts nothing.
pub async fn counting<F: Future>(span: Span, pass: F) -> (F::Output, Option<u32>) {
    let id = span.id();
    if let Some(id) = &id {
        passes().insert(id.clone(), 0);
    }
    let output = pass.instrument(span).await;
    let requests = id.and_then(|id| passes().remove(&id));
    (output, requests)
}

/// The layer that puts [`Counted`] around the client's HTTP stack.
#[derive(Clone)]
pub struct CountRequests(pub Arc<Metrics>);

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Some(id) = Span::current().id()
            && let Some(n) = passes().get_mut(&id)
        {
            *n += 1;
        }
        let method = request.method().clone();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = answer.as_ref().ok().map(|r| r.status().as_u16());
            metrics.api_request(&method, code);
            answer
        })
    }
}
