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

/// jemalloc, in one arena, handing pages back to the system a second after
/// they fall free (a background thread does it, so it happens at rest too).
/// glibc's malloc spent a third of the manager's CPU while Jobs ran, much
/// of it consolidating its bins for rustls' record buffers. Measured in one
/// session (`cargo bench --bench jobs -- --machines 150 --pods 16
/// --handoffs 1` and `cargo bench --bench scale -- --objects 2000
/// --sync-period 30 --resyncs 2`): manager CPU per Job 25.0-27.8 ms with
/// glibc, 20.5-22.5 with this; at rest over 2,200 objects 68 MiB with
/// glibc, 62-64 with this. jemalloc's defaults (an arena per thread and
/// core, ten seconds of decay) held 81 MiB; with no decay at all, 62 MiB
/// but 26.3 ms per Job.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this string when it starts; the
/// `_RJEM_MALLOC_CONF` environment variable still overrides them.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &u8 =
    &b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,background_thread:true\0"[0];

fn main() -> ExitCode {
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
