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
            telemetry::warn_of_ignored_proxy_variables();
            on_a_worker(
                runtime,
                cli::serve::run(loaded, telemetry_init, exec_started),
            )
        }
        Command::Check { config } => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            cli::check::run(&config)
        }
        Command::Testbed { listen } => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            report_fd_table(&fd_table);
            on_a_worker(runtime, cli::testbed::run(listen))
        }
        Command::Bench(args) => {
            let _telemetry = telemetry::init(&TelemetryConfig::default(), cli.log_format)?;
            report_fd_table(&fd_table);
            on_a_worker(runtime, cli::bench::run(args))
        }
    }
}

/// Runs `job` as a task on one of the runtime's workers and waits for it on this thread.
///
/// A future driven by `block_on` runs on this thread, which is not a worker: the workers
/// poll the sockets, so each readiness event it waits for is a worker waking this thread
/// through a futex. Every async subcommand runs through here: for `bench`'s single calls
/// (the idle and first-call timings), the testbed's accept loop and `serve`'s own accept
/// loop (the Unix listener, and TCP when the first core could not start) that was one
/// thread hand-over inside every timed call or new connection; on a worker the task runs
/// where its sockets' events are read.
fn on_a_worker(
    runtime: &Runtime,
    job: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    match runtime.block_on(runtime.spawn(job)) {
        Ok(outcome) => outcome,
        // A panic in the job stays a panic, as it was under `block_on`.
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(anyhow::anyhow!("the task was cancelled: {error}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-worker")
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_job_runs_on_a_worker_not_on_the_calling_thread() {
        let caller = std::thread::current().id();
        let outcome = on_a_worker(&runtime(), async move {
            let here = std::thread::current();
            anyhow::ensure!(here.id() != caller, "the job ran on the calling thread");
            anyhow::ensure!(
                here.name() == Some("test-worker"),
                "the job ran on {:?}, not a worker",
                here.name()
            );
            Ok(())
        });
        assert!(outcome.is_ok(), "{outcome:?}");
    }

    #[test]
    fn a_job_error_and_a_job_panic_reach_the_caller() {
        let runtime = runtime();
        let error = on_a_worker(&runtime, async { Err(anyhow::anyhow!("no such port")) });
        assert_eq!(error.unwrap_err().to_string(), "no such port");
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            on_a_worker(&runtime, async { panic!("the job broke") })
        }));
        let payload = panic.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the job broke"));
    }
}
