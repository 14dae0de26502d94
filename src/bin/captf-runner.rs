//! captf-runner: copied into every Job's pod by the init container, then the
//! main container's entry point (ref §6.2). Usage errors exit 2.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "captf-runner",
    version,
    about = "Runs Terraform or OpenTofu steps inside a CAPTF Job"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Copy this binary to DEST (the init container's step).
    Copy { dest: PathBuf },
    /// Run an operation's steps (the main container's step).
    Run(Box<captf::runner::RunArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Copy { dest } => match captf::runner::copy_self(&dest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("captf-runner copy {}: {e}", dest.display());
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => {
            if let Err(message) = args.check() {
                Cli::command()
                    .error(clap::error::ErrorKind::ArgumentConflict, message)
                    .exit();
            }
            // One thread: the runner waits on one child at a time.
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("captf-runner: starting the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            ExitCode::from(runtime.block_on(captf::runner::run(&args)))
        }
    }
}
