//! `mailcluster`: one binary for the mail pod, its administration, the operator and
//! the stress runner. Parsing lives in `args`, behaviour in `commands`.
#![forbid(unsafe_code)]

mod args;
mod commands;
mod failure;
mod import;
mod logging;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::failure::Failure;

// glibc malloc was 8 % of the machine's CPU under IMAP FETCH load (perf profile of
// bench/imap.sh: bodies of tens of KB allocated and freed per command, per session,
// on every worker thread); mimalloc's thread-local free lists do that for less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("mailcluster: error: {}", failure.message());
            failure.exit_code()
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let config_arg = match cli.command {
        Command::Version => {
            println!("mailcluster {}", env!("CARGO_PKG_VERSION"));
            return Ok(ExitCode::SUCCESS);
        }
        // The stress runner talks to servers over the network; it reads no server
        // configuration and has its own exit codes.
        Command::Stress(args) => {
            let rust_log = std::env::var("RUST_LOG").ok();
            let filter = logging::filter(cli.log_level.as_deref(), rust_log.as_deref(), "warn")
                .map_err(Failure::usage)?;
            logging::init(filter, "auto");
            let code = runtime(0)?.block_on(commands::stress(*args))?;
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        Command::Crd { all: false } => {
            print!("{}", mailcluster_operator::crd_yaml());
            return Ok(ExitCode::SUCCESS);
        }
        Command::Crd { all: true } => {
            // Each file already starts its document with `---` after its comment.
            for (_, yaml) in mailcluster_operator::crd_files() {
                print!("{yaml}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Render { file } => {
            let yaml = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .map_err(|e| anyhow::anyhow!("cannot read stdin: {e}"))?
            } else {
                std::fs::read_to_string(&file)
                    .map_err(|e| Failure::usage(anyhow::anyhow!("cannot read {}: {e}", file.display())))?
            };
            let rendered = mailcluster_operator::render(&yaml).map_err(Failure::usage)?;
            print!("{rendered}");
            return Ok(ExitCode::SUCCESS);
        }
        // The operator reads no server configuration: its input is the cluster's
        // MailCluster resources.
        Command::Operator(args) => {
            let rust_log = std::env::var("RUST_LOG").ok();
            let filter = logging::filter(cli.log_level.as_deref(), rust_log.as_deref(), "info")
                .map_err(Failure::usage)?;
            logging::init(filter, "auto");
            let allowed_images =
                mailcluster_operator::image::ImageAllowlist::parse_list(&args.allowed_images)
                    .map_err(|e| Failure::usage(anyhow::anyhow!("--allowed-images: {e}")))?;
            let opts = mailcluster_operator::OperatorOptions {
                namespace: args.namespace,
                allowed_images,
                metrics_addr: args.metrics_addr,
                leader_election: !args.no_leader_election,
                dns_nameservers: args.dns_nameservers,
                ..Default::default()
            };
            runtime(0)?.block_on(mailcluster_operator::run(opts))?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Dkim { command } => {
            commands::dkim(&command)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Serve(ref args) => &args.config,
        Command::Migrate(ref args) => &args.config,
        Command::User { ref config, .. }
        | Command::Domain { ref config, .. }
        | Command::Alias { ref config, .. }
        | Command::Sieve { ref config, .. }
        | Command::Queue { ref config, .. } => config,
    };
    let config = commands::load_config(config_arg)?;
    let rust_log = std::env::var("RUST_LOG").ok();
    // The admin commands print their result for a person; the server's progress
    // lines ("store opened") only when asked for with --log-level or RUST_LOG.
    let admin = matches!(
        cli.command,
        Command::User { .. }
            | Command::Domain { .. }
            | Command::Alias { .. }
            | Command::Sieve { .. }
            | Command::Queue { .. }
    );
    let default_level = if admin { "warn" } else { config.log.level.as_str() };
    let filter = logging::filter(cli.log_level.as_deref(), rust_log.as_deref(), default_level)
        .map_err(Failure::usage)?;
    logging::init(filter, &config.log.format);

    runtime(config.worker_threads)?.block_on(async {
        match &cli.command {
            Command::Serve(args) => commands::serve(args, config).await,
            Command::Migrate(args) => commands::migrate(&config, &args.domains).await,
            Command::User { command, .. } => commands::user(&config, command).await,
            Command::Domain { command, .. } => commands::domain(&config, command).await,
            Command::Alias { command, .. } => commands::alias(&config, command).await,
            Command::Sieve { command, .. } => commands::sieve(&config, command).await,
            Command::Queue { command, .. } => commands::queue(&config, command).await,
            Command::Version
            | Command::Dkim { .. }
            | Command::Stress(_)
            | Command::Crd { .. }
            | Command::Render { .. }
            | Command::Operator(_) => Ok(()),
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The async runtime: `workers` threads, or 0 for tokio's default of one per CPU
/// this process may use.
fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, Failure> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        builder.worker_threads(workers);
    }
    builder
        .enable_all()
        .thread_name("mailcluster")
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}").into())
}
