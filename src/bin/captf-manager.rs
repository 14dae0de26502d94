//! captf-manager: the webhooks, the reconcilers and the health and metrics
//! endpoints in one process.

use std::process::ExitCode;

use captf::server::flags::{Command, Flags, LoggingFormat};
use captf::server::runtime::Runtime;
use futures::TryFutureExt;
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
    match Runtime::build(flags).and_then(Runtime::run).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
