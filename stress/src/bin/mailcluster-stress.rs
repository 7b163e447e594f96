//! Stand-alone stress runner (the same command as `mailcluster stress`), used for
//! benchmarks without building the whole CLI.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(name = "mailcluster-stress", version, about = "Mailcluster load scenarios and SLO verdicts")]
struct Cli {
    #[command(flatten)]
    args: mailcluster_stress::StressArgs,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = mailcluster_stress::run(cli.args).await;
    std::process::exit(code);
}
