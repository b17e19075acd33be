//! The `wharf` binary: parse the command line, start logging, dispatch to
//! a subcommand in `cli/`, print any error chain once and set the exit code.

mod cli;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let exec_started = Instant::now();
    let cli = Cli::parse();
    cli::init_logging(cli.log_format);
    // All worker threads start now (no ramp-up under a burst, seed 002).
    // Blocking-pool threads (name resolution) are kept for a day instead of
    // tokio's 10 s, so a call after an idle gap finds one ready (seed 001).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("wharf: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => cli::serve::run(args, exec_started).await,
            Command::Check { config } => cli::check::run(&config),
            Command::Testbed { listen } => cli::testbed::run(listen).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wharf: {error:#}");
            ExitCode::FAILURE
        }
    }
}
