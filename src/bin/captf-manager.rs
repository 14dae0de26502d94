//! captf-manager: the webhooks, the reconcilers and the health and metrics
//! endpoints in one process.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use captf::controllers::{self, Concurrency, Settings, leader};
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
    let shutdown = Box::pin(server::shutdown_signal()?);
    let flags = flags.resolve(std::env::var("CAPTF_MANAGER_IMAGE").ok())?;
    let client = server::kube_client(flags.kubeconfig.as_deref()).await?;
    // A standby (leader election on, not leading) runs no watches: it is
    // ready once its webhooks serve, and the watches gate is added when it
    // starts to lead.
    let readiness = if flags.leader_elect {
        Readiness::new(&[GATE_WEBHOOK])
    } else {
        Readiness::new(&[GATE_WEBHOOK, GATE_WATCHES])
    };
    let timing = flags.leader_elect.then_some(leader::Timing {
        lease_duration: flags.leader_elect_lease_duration.0,
        renew_deadline: flags.leader_elect_renew_deadline.0,
        retry_period: flags.leader_elect_retry_period.0,
    });
    let metrics = Arc::new(Metrics::new());
    let settings = Settings {
        runner_image: flags.runner_image.clone(),
        cluster_operation_gate: flags.cluster_operation_gate,
        state_backups: flags.state_backups,
        namespace: Some(flags.namespace.clone()).filter(|n| !n.is_empty()),
        watch_filter: Some(flags.watch_filter.clone()).filter(|f| !f.is_empty()),
        sync_period: flags.sync_period.0,
        concurrency: Concurrency {
            cluster: flags.terraformcluster_concurrency,
            machine: flags.terraformmachine_concurrency,
            machine_pool: flags.terraformmachinepool_concurrency,
        },
    };
    let handler = Arc::new(Webhooks::new(client.clone()));
    let listeners = Listeners::start(
        &flags,
        client.clone(),
        handler,
        metrics.clone(),
        readiness.clone(),
        Path::new(METRICS_CERT_DIR),
    )
    .await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = async move {
        let mut rx = stop_rx;
        // An error means the sender is gone, which is a stop too.
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let stopped = futures::FutureExt::shared(Box::pin(stopped));
    let mut reconcilers = tokio::spawn({
        let client = client.clone();
        let readiness = readiness.clone();
        async move {
            let version = server::wait_for_api_server(&client).await;
            info!(%version, "connected to the API server");
            let run = {
                let (client, readiness, stopped) =
                    (client.clone(), readiness.clone(), stopped.clone());
                move || {
                    readiness.require(GATE_WATCHES);
                    controllers::run(client, metrics, settings, readiness, stopped)
                }
            };
            let Some(timing) = timing else {
                run().await;
                return Ok(());
            };
            // The manager's namespace: the pod's (downward API), else the
            // client's (in a pod, the service account's namespace).
            let namespace = std::env::var("POD_NAMESPACE")
                .unwrap_or_else(|_| client.default_namespace().to_string());
            leader::Elector::new(client, &namespace, leader::identity(), timing)
                .while_leading(stopped, run)
                .await
        }
    });
    // Leading lost ends the process at once, as client-go's elector does:
    // another replica may lead already. The Deployment restarts it.
    let lost = tokio::select! {
        () = shutdown => None,
        ended = &mut reconcilers => Some(ended),
    };
    // The reconcilers finish the passes they are in while the listeners
    // drain.
    let _ = stop_tx.send(true);
    listeners.shutdown(&readiness, flags.shutdown_delay.0).await;
    let ended = match lost {
        Some(ended) => ended,
        None => reconcilers.await,
    };
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(lost)) => return Err(ServerError::LeaderElectionLost(lost)),
        Err(e) => error!("the reconcilers stopped abnormally: {e}"),
    }
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
