//! `/healthz` and `/readyz`.
//!
//! Readiness is a set of named gates (for example "webhook" and "watches");
//! `/readyz` answers 200 only once every gate has been marked ready, and 503
//! again as soon as shutdown starts, so that a Service stops sending traffic
//! before the listeners close.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

/// The gate the webhook listener marks once it serves.
pub const GATE_WEBHOOK: &str = "webhook";
/// The gate marked once the watches have synced.
pub const GATE_WATCHES: &str = "watches";

#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Mutex<Gates>>,
}

#[derive(Debug)]
struct Gates {
    ready: BTreeMap<&'static str, bool>,
    shutting_down: bool,
}

impl Readiness {
    /// Readiness that waits for every one of `gates`.
    pub fn new(gates: &[&'static str]) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Gates {
                ready: gates.iter().map(|g| (*g, false)).collect(),
                shutting_down: false,
            })),
        }
    }

    /// Adds `gate`, not ready, unless it is there already.
    pub fn require(&self, gate: &'static str) {
        self.lock().ready.entry(gate).or_insert(false);
    }

    pub fn mark_ready(&self, gate: &'static str) {
        self.lock().ready.insert(gate, true);
    }

    pub fn start_shutdown(&self) {
        self.lock().shutting_down = true;
    }

    /// `Ok(())` when ready, else why not.
    pub fn check(&self) -> Result<(), String> {
        let gates = self.lock();
        if gates.shutting_down {
            return Err("shutting down".to_string());
        }
        let waiting: Vec<&str> = gates
            .ready
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(gate, _)| *gate)
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("waiting for: {}", waiting.join(", ")))
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gates> {
        // A panic while holding this lock cannot leave the flags half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The health router: `/healthz` answers while the process serves at all.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    match readiness.check() {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_gate_is_and_not_after_shutdown() {
        let r = Readiness::new(&["webhook", "watches"]);
        assert_eq!(r.check(), Err("waiting for: watches, webhook".to_string()));
        r.mark_ready("webhook");
        assert_eq!(r.check(), Err("waiting for: watches".to_string()));
        r.mark_ready("watches");
        assert_eq!(r.check(), Ok(()));
        r.start_shutdown();
        assert_eq!(r.check(), Err("shutting down".to_string()));
    }

    #[test]
    fn a_required_gate_waits_until_marked_and_requiring_again_keeps_it() {
        let r = Readiness::new(&["webhook"]);
        r.mark_ready("webhook");
        assert_eq!(r.check(), Ok(()));
        r.require("watches");
        assert_eq!(r.check(), Err("waiting for: watches".to_string()));
        r.mark_ready("watches");
        r.require("watches");
        assert_eq!(r.check(), Ok(()));
    }
}
