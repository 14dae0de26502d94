//! The three listeners of the manager and their shutdown order.
//!
//! Shutdown: `/readyz` turns 503 first and the listeners go on serving for
//! `--shutdown-delay`, so that the Service drops this replica before its
//! webhook stops; then the webhook and metrics listeners stop accepting and
//! drain their connections (for at most [`DRAIN_TIMEOUT`]); the health
//! listener stops last.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::server::ServerError;
use crate::server::connections::{self, Limits};
use crate::server::diagnostics::{self, Access};
use crate::server::flags::Flags;
use crate::server::health::{self, GATE_WEBHOOK, Readiness};
use crate::server::tls::{self, ReloadingCert};
use crate::server::webhook::{self, AdmissionHandler};

/// How long open connections may take to finish once a listener stops.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// The running listeners.
pub struct Listeners {
    /// Where each one listens (ports resolved when a flag asked for port 0).
    pub health_addr: SocketAddr,
    pub webhook_addr: SocketAddr,
    pub diagnostics_addr: Option<SocketAddr>,
    serving: Vec<(&'static str, JoinHandle<()>)>,
    health: JoinHandle<()>,
    stop_serving: watch::Sender<bool>,
    stop_health: watch::Sender<bool>,
}

impl Listeners {
    /// Starts the health, webhook and metrics listeners and marks the
    /// "webhook" gate once the webhook listener serves.
    pub async fn start<H: AdmissionHandler>(
        flags: &Flags,
        client: kube::Client,
        handler: Arc<H>,
        metrics: Arc<Metrics>,
        readiness: Readiness,
        metrics_cert_dir: &Path,
    ) -> Result<Self, ServerError> {
        let (stop_serving, stopped) = watch::channel(false);
        let (stop_health, health_stopped) = watch::channel(false);

        let (listener, health_addr) = bind("health", flags.health_addr()?).await?;
        let health = tokio::spawn(serve(
            "health",
            listener,
            None,
            health::router(readiness.clone()),
            health_stopped,
        ));
        info!(addr = %health_addr, "serving /healthz and /readyz");

        let mut serving = Vec::new();
        let cert_dir = &flags.webhook_cert_dir;
        let certs = ReloadingCert::load(
            cert_dir.join(&flags.webhook_cert_name),
            cert_dir.join(&flags.webhook_key_name),
        )
        .map_err(ServerError::WebhookCert)?;
        let config = tls::server_config(Arc::new(certs)).map_err(ServerError::WebhookCert)?;
        let (tcp, webhook_addr) = bind("webhook", flags.webhook_addr()).await?;
        serving.push((
            "webhook",
            tokio::spawn(serve(
                "webhook",
                tcp,
                Some(config),
                webhook::router(handler),
                stopped.clone(),
            )),
        ));
        info!(addr = %webhook_addr, "serving /validate and /mutate over HTTPS");
        // Bound with its certificate loaded: connections from now on are served.
        readiness.mark_ready(GATE_WEBHOOK);

        let diagnostics_addr = match flags.diagnostics_addr()? {
            None => {
                info!("metrics are off (--diagnostics-address=0)");
                None
            }
            Some(addr) if flags.insecure_diagnostics => {
                let (tcp, addr) = bind("diagnostics", addr).await?;
                let router = diagnostics::router(metrics, Access::Anyone);
                serving.push((
                    "diagnostics",
                    tokio::spawn(serve("diagnostics", tcp, None, router, stopped)),
                ));
                warn!(%addr, "serving /metrics over plain HTTP without authentication (--insecure-diagnostics)");
                Some(addr)
            }
            Some(addr) => {
                let resolver =
                    diagnostics::resolver(metrics_cert_dir).map_err(ServerError::MetricsCert)?;
                let config = tls::server_config(resolver).map_err(ServerError::MetricsCert)?;
                let (tcp, addr) = bind("diagnostics", addr).await?;
                let router = diagnostics::router(metrics, Access::authorized(client));
                serving.push((
                    "diagnostics",
                    tokio::spawn(serve("diagnostics", tcp, Some(config), router, stopped)),
                ));
                info!(%addr, "serving /metrics over HTTPS with TokenReview and SubjectAccessReview");
                Some(addr)
            }
        };

        Ok(Self {
            health_addr,
            webhook_addr,
            diagnostics_addr,
            serving,
            health,
            stop_serving,
            stop_health,
        })
    }

    /// Shuts down in order: not ready, wait `delay`, stop and drain the
    /// webhook and metrics listeners, stop the health listener.
    pub async fn shutdown(self, readiness: &Readiness, delay: Duration) {
        readiness.start_shutdown();
        info!("/readyz now answers 503; the listeners stop in {delay:?}");
        tokio::time::sleep(delay).await;
        // Receivers live in the tasks; a send error only means they are done.
        let _ = self.stop_serving.send(true);
        for (name, task) in self.serving {
            if let Err(e) = task.await {
                warn!(listener = name, "listener task ended abnormally: {e}");
            }
        }
        let _ = self.stop_health.send(true);
        if let Err(e) = self.health.await {
            warn!(listener = "health", "listener task ended abnormally: {e}");
        }
    }
}

async fn bind(
    listener: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), ServerError> {
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            listener,
            addr,
            source,
        })?;
    // The bound address names the port picked for port 0.
    let bound = tcp.local_addr().unwrap_or(addr);
    Ok((tcp, bound))
}

/// Serves `router` until `stop` turns true, then lets open connections
/// finish for at most [`DRAIN_TIMEOUT`].
pub async fn serve(
    name: &'static str,
    tcp: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    stop: watch::Receiver<bool>,
) {
    connections::serve(name, tcp, tls, router, stop, Limits::SERVING, DRAIN_TIMEOUT).await;
}
