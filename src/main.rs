//! The `wharf` binary: parse the command line, start telemetry, dispatch to
//! a subcommand in `cli/`, print any error chain once and set the exit code.

mod cli;
mod telemetry;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::runtime::Runtime;
use wharf_config::TelemetryConfig;

use crate::cli::{Cli, Command};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let exec_started = Instant::now();
    let cli = Cli::parse();
    // Before the runtime's threads exist: see wharf_host::presize_fd_table.
    let fd_table = wharf_host::presize_fd_table();
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
    match run(cli, &runtime, exec_started, fd_table) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wharf: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts telemetry and runs the subcommand. `serve` loads its config first, since its
/// `[telemetry]` table says how to log and where to export traces; `check` and `testbed`
/// log with the defaults. The telemetry guard drops at the end of each arm: after
/// `block_on`, on this (non-worker) thread, with the runtime alive to send the last spans.
fn run(
    cli: Cli,
    runtime: &Runtime,
    exec_started: Instant,
    fd_table: std::io::Result<u64>,
) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let loaded = cli::serve::load(&args)?;
            let started = Instant::now();
            let _telemetry = {
                // The trace export task is spawned on the runtime.
                let _runtime = runtime.enter();
                telemetry::init(&loaded.config.telemetry, cli.log_format)?
            };
            let telemetry_init = started.elapsed();
            report_fd_table(&fd_table);
            runtime.block_on(cli::serve::run(loaded, telemetry_init, exec_started))
        }
        Command::Check { config } => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            cli::check::run(&config)
        }
        Command::Testbed { listen } => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            report_fd_table(&fd_table);
            runtime.block_on(cli::testbed::run(listen))
        }
        Command::Bench(args) => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            report_fd_table(&fd_table);
            runtime.block_on(cli::bench::run(args))
        }
    }
}

/// Logs how the descriptor table was sized at start. A failure is a warning, not an error:
/// the table then grows on demand, each doubling a short stall for every thread.
fn report_fd_table(fd_table: &std::io::Result<u64>) {
    match fd_table {
        Ok(size) => tracing::debug!(descriptors = size, "descriptor table sized at start"),
        Err(error) => tracing::warn!(
            error = %error,
            "cannot size the descriptor table at start; it grows as connections open, \
             each doubling a stall of a few milliseconds"
        ),
    }
}
