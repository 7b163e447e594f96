//! `mailcluster`: one binary for the mail pod, its administration, the operator and
//! the stress runner. Parsing lives in `args`, behaviour in `commands`.
#![forbid(unsafe_code)]

mod args;
mod commands;
mod failure;
mod logging;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::failure::Failure;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("mailcluster: error: {}", failure.message());
            failure.exit_code()
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    let config_arg = match &cli.command {
        Command::Version => {
            println!("mailcluster {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Command::Serve(args) => &args.config,
        Command::Migrate(config) | Command::User { config, .. } | Command::Domain { config, .. } => config,
    };
    let config = commands::load_config(config_arg)?;
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = logging::filter(cli.log_level.as_deref(), rust_log.as_deref(), &config.log.level)
        .map_err(Failure::usage)?;
    logging::init(filter, &config.log.format);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("mailcluster")
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        match &cli.command {
            Command::Serve(args) => commands::serve(args, config).await,
            Command::Migrate(_) => commands::migrate(&config).await,
            Command::User { command, .. } => commands::user(&config, command).await,
            Command::Domain { command, .. } => commands::domain(&config, command).await,
            Command::Version => Ok(()),
        }
    })
}
