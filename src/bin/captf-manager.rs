//! captf-manager: the webhooks, the reconcilers and the health and metrics
//! endpoints in one process.

use std::path::PathBuf;
use std::process::ExitCode;

use captf::server::{self, health::Readiness};
use clap::{Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LoggingFormat {
    Text,
    Json,
}

#[derive(Debug, Parser)]
#[command(name = "captf-manager", version, about)]
struct Flags {
    /// Path to a kubeconfig; in-cluster configuration or $KUBECONFIG when unset.
    #[arg(long, env = "CAPTF_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address of /healthz and /readyz.
    #[arg(long, env = "CAPTF_HEALTH_ADDR", default_value = ":9440")]
    health_addr: String,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "CAPTF_LOGGING_FORMAT", value_enum, default_value = "text")]
    logging_format: LoggingFormat,
}

fn init_logging(format: LoggingFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LoggingFormat::Text => builder.init(),
        LoggingFormat::Json => builder.json().init(),
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, Box<dyn std::error::Error>> {
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
    Ok(kube::Client::try_from(config)?)
}

async fn run(flags: Flags) -> Result<(), Box<dyn std::error::Error>> {
    let health_addr = server::parse_listen_addr(&flags.health_addr)
        .map_err(|e| format!("--health-addr: {e}"))?;
    let readiness = Readiness::new(&["apiserver"]);
    let listener = tokio::net::TcpListener::bind(health_addr).await?;
    info!(addr = %listener.local_addr()?, "serving /healthz and /readyz");

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let shutdown = {
        let readiness = readiness.clone();
        async move {
            tokio::select! {
                _ = sigterm.recv() => info!("SIGTERM received, shutting down"),
                _ = sigint.recv() => info!("SIGINT received, shutting down"),
            }
            readiness.start_shutdown();
        }
    };
    let health = tokio::spawn(
        axum::serve(listener, server::health::router(readiness.clone()))
            .with_graceful_shutdown(shutdown)
            .into_future(),
    );

    let client = client(flags.kubeconfig.as_ref()).await?;
    let version = client.apiserver_version().await?;
    info!(version = %version.git_version, "connected to the API server");
    readiness.mark_ready("apiserver");

    health.await??;
    info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    init_logging(flags.logging_format);
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
