use std::process::ExitCode;

use clap::Parser;
use webhook_reconciler::cli::{Cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    let code = run(Cli::parse()).await;
    webhook_reconciler::telemetry::shutdown();
    code
}
