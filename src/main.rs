//! The `wharf` binary: parse the command line, start logging, dispatch to
//! a subcommand in `cli/`, print any error chain once and set the exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
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
            Command::Serve(args) => cli::serve::run(args).await,
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
