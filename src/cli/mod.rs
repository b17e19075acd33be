//! The command line: subcommands and the flags shared by all of them.

pub(crate) mod bench;
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
    /// Log format on stderr. Default: telemetry.log_format for `serve`, pretty otherwise. The
    /// level comes from RUST_LOG, else telemetry.log_level ("info").
    #[arg(long, value_enum, global = true)]
    pub(crate) log_format: Option<LogFormat>,
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
    /// The load lab: the seeds' experiments against any HTTP targets, side by side.
    Bench(bench::BenchArgs),
}
