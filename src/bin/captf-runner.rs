//! captf-runner: copied into every Job's pod by the init container.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "captf-runner", version, about = "Runs Terraform or OpenTofu steps inside a CAPTF Job")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Copy this binary to DEST (the init container's step).
    Copy { dest: PathBuf },
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
    }
}
