//! The command line: subcommands and the flags shared by all of them.

pub(crate) mod check;
pub(crate) mod serve;
pub(crate) mod testbed;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// wharf: an asynchronous service host and gateway.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
pub(crate) struct Cli {
    /// Log format on stderr (level from RUST_LOG, default "info").
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true)]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the host (the embedded default config when --config is absent).
    Serve(serve::ServeArgs),
    /// Validate a config file and report every problem with its line.
    Check {
        /// The TOML file to check.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the seeds' test backends (fast, slow, stream, bytes, echo, ...).
    Testbed {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
}

/// Installs the global tracing subscriber. `RUST_LOG` sets the filter.
pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
