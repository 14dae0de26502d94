//! The manager process around the reconcilers: its flags, its listeners and
//! their TLS material (the webhooks, `/healthz` and `/readyz`, and
//! `/metrics`), leader election, and the runtime that wires them together
//! and shuts them down gracefully.

pub mod certs;
pub mod connections;
pub mod dev_certs;
pub mod diagnostics;
pub mod flags;
pub mod health;
pub mod leader;
pub mod listeners;
pub mod requests;
pub mod runtime;
pub mod tls;
pub mod webhook;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::error::{Categorized, Category};
use crate::metrics::Metrics;

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Flags(#[from] flags::FlagError),
    #[error("webhook certificate: {0}")]
    WebhookCert(#[source] tls::TlsError),
    #[error("metrics certificate: {0}")]
    MetricsCert(#[source] tls::TlsError),
    #[error("listening on {addr} for {listener}: {source}")]
    Bind {
        listener: &'static str,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("loading the kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    #[error("loading the in-cluster or default configuration: {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] io::Error),
    #[error("leader election lost: {0}")]
    LeaderElectionLost(leader::Lost),
}

impl Categorized for ServerError {
    fn category(&self) -> Category {
        match self {
            ServerError::Flags(e) => e.category(),
            ServerError::WebhookCert(e) | ServerError::MetricsCert(e) => e.category(),
            // The port may be free again soon (an old replica still stopping).
            ServerError::Bind { .. } => Category::Transient,
            ServerError::Kubeconfig(_) | ServerError::InferConfig(_) => Category::Invalid,
            ServerError::Client(_) | ServerError::Signals(_) => Category::Internal,
            // A restart makes the replica a candidate again.
            ServerError::LeaderElectionLost(_) => Category::Transient,
        }
    }
}

/// A client from `--kubeconfig`, else in-cluster or `$KUBECONFIG`.
pub async fn kube_client(
    kubeconfig: Option<&Path>,
    metrics: Arc<Metrics>,
) -> Result<kube::Client, ServerError> {
    let config = match kubeconfig {
        Some(path) => {
            kube::Config::from_custom_kubeconfig(
                Kubeconfig::read_from(path)?,
                &KubeConfigOptions::default(),
            )
            .await?
        }
        None => kube::Config::infer().await?,
    };
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ServerError::Client)?;
    Ok(builder
        .with_layer(&requests::CountRequests(metrics))
        .build())
}

/// Waits until the API server answers, retrying with backoff, and returns
/// its version.
pub async fn wait_for_api_server(client: &kube::Client) -> String {
    let mut backoff = Duration::from_millis(500);
    loop {
        match client.apiserver_version().await {
            Ok(version) => return version.git_version,
            Err(e) => {
                warn!("the API server does not answer yet, retrying in {backoff:?}: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed now,
/// so that a signal arriving during start-up is not lost.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, ServerError> {
    let mut term = signal(SignalKind::terminate()).map_err(ServerError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServerError::Signals)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM received, shutting down"),
            _ = int.recv() => info!("SIGINT received, shutting down"),
        }
    })
}

/// Parses a listen address the way the Go manager's flags spell them:
/// `:9440` means every interface, `127.0.0.1:9440` one of them.
pub fn parse_listen_addr(value: &str) -> Result<SocketAddr, String> {
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{value:?} is not host:port or :port ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        let table = [
            (":9440", Ok("0.0.0.0:9440")),
            ("127.0.0.1:8443", Ok("127.0.0.1:8443")),
            ("[::1]:1", Ok("[::1]:1")),
            ("9440", Err(())),
            (":http", Err(())),
        ];
        for (input, want) in table {
            let got = parse_listen_addr(input)
                .map(|a| a.to_string())
                .map_err(|_| ());
            assert_eq!(got, want.map(str::to_string), "{input}");
        }
    }
}
