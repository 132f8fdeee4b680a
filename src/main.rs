use std::process::ExitCode;

use clap::Parser;
use webhook_reconciler::cli::{Cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    run(Cli::parse()).await
}
