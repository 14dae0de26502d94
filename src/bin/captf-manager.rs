//! captf-manager: the webhooks, the reconcilers and the health and metrics
//! endpoints in one process.

use std::process::ExitCode;

use captf::server::certs::{CertsArgs, CertsError};
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

/// Keeps allocations of 128 KiB and more (a state as it is read: up to
/// 64 MiB decompressed) in their own mappings, returned to the system when
/// freed. glibc otherwise raises that threshold to the largest block freed,
/// so later state reads come from the heap and leave it fragmented: at
/// 2,200 objects at rest the manager's RSS was 92 MiB, and is 84 with it
/// (`cargo bench --bench scale`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    // SAFETY: mallopt only sets a parameter of the allocator; it is called
    // before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn main() -> ExitCode {
    tune_allocator();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_or_else(
            |e| {
                eprintln!("starting the runtime: {e}");
                ExitCode::FAILURE
            },
            |runtime| runtime.block_on(run()),
        )
}

async fn run() -> ExitCode {
    let flags = Flags::from_args();
    match &flags.command {
        Some(Command::Crds) => {
            print!("{}", captf::api::crds_yaml());
            return ExitCode::SUCCESS;
        }
        Some(Command::Certs(args)) => {
            init_logging(flags.logging_format);
            return match certs(&flags, args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e}");
                    ExitCode::FAILURE
                }
            };
        }
        None => {}
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

/// `captf-manager certs`: the self-signed serving certificate, in step.
async fn certs(flags: &Flags, args: &CertsArgs) -> Result<(), CertsError> {
    let metrics = std::sync::Arc::new(captf::metrics::Metrics::new());
    let client = captf::server::kube_client(flags.kubeconfig.as_deref(), metrics).await?;
    captf::server::certs::run(
        client,
        args,
        &flags.webhook_cert_dir,
        &flags.webhook_cert_name,
        &flags.webhook_key_name,
    )
    .await
}
