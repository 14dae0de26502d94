//! captf-manager: the webhooks, the reconcilers and the health and metrics
//! endpoints in one process.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use captf::metrics::Metrics;
use captf::server::diagnostics::METRICS_CERT_DIR;
use captf::server::flags::{Command, Flags, LoggingFormat};
use captf::server::health::{GATE_WATCHES, GATE_WEBHOOK, Readiness};
use captf::server::listeners::Listeners;
use captf::server::{self, ServerError};
use captf::webhooks::handler::Webhooks;
use tracing::{error, info};

fn init_logging(format: LoggingFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LoggingFormat::Text => builder.init(),
        LoggingFormat::Json => builder.json().init(),
    }
}

async fn run(flags: Flags) -> Result<(), ServerError> {
    let mut shutdown = Box::pin(server::shutdown_signal()?);
    let flags = flags.resolve(std::env::var("CAPTF_MANAGER_IMAGE").ok())?;
    let client = server::kube_client(flags.kubeconfig.as_deref()).await?;
    let readiness = Readiness::new(&[GATE_WEBHOOK, GATE_WATCHES]);
    let metrics = Arc::new(Metrics::new());
    let handler = Arc::new(Webhooks::new(client.clone()));
    let listeners = Listeners::start(
        &flags,
        client.clone(),
        handler,
        metrics,
        readiness.clone(),
        Path::new(METRICS_CERT_DIR),
    )
    .await?;

    tokio::select! {
        () = &mut shutdown => {}
        version = server::wait_for_api_server(&client) => {
            info!(%version, "connected to the API server");
            // Nothing is watched yet: the reconcilers, which will mark this
            // gate once their reflectors have synced, do not exist. Until
            // they do, the API server answering is all there is to sync.
            readiness.mark_ready(GATE_WATCHES);
            shutdown.await;
        }
    }
    listeners.shutdown(&readiness, flags.shutdown_delay.0).await;
    info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::from_args();
    if flags.command == Some(Command::Crds) {
        print!("{}", captf::api::crds_yaml());
        return ExitCode::SUCCESS;
    }
    init_logging(flags.logging_format);
    for (name, value) in flags.describe() {
        info!("FLAG: --{name}={value:?}");
    }
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
