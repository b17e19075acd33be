//! [`BenchError`]: why a benchmark could not be set up or finished.
//!
//! Failed *calls* are not errors of the run: they are counted per class in
//! [`ErrorCounts`](crate::ErrorCounts) and reported, never dropped and never taken for fast
//! responses. A `BenchError` means the run itself cannot go on (a URL that is not one, a
//! command that cannot start, a report that cannot be written).

use std::io;

/// Why a benchmark run could not be set up or completed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A target URL is not a usable `http://` URL (template).
    #[error("target {target}: {url:?} is not a usable URL: {why}")]
    Url {
        /// The target's name.
        target: String,
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The target's host name did not resolve.
    #[error("target {target}: cannot resolve {host}")]
    Resolve {
        /// The target's name.
        target: String,
        /// The host as written in the URL.
        host: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// The scenario needs something the target does not give (a fast URL, a command).
    #[error("target {target}: {what}")]
    Target {
        /// The target's name.
        target: String,
        /// What is missing or wrong.
        what: String,
    },
    /// Settings that cannot work together (no targets, zero calls, ...).
    #[error("{0}")]
    Settings(String),
    /// The command of a cold start could not be started or stopped.
    #[error("target {target}: command {command:?}")]
    Command {
        /// The target's name.
        target: String,
        /// The command as given.
        command: String,
        /// Why it could not be started or stopped.
        #[source]
        source: io::Error,
    },
    /// Something already answers at a cold-start URL before the command was started, so the
    /// time to the first response would not be the command's.
    #[error("target {target}: {addr} already accepts connections before the command started")]
    AlreadyListening {
        /// The target's name.
        target: String,
        /// The address that answered.
        addr: std::net::SocketAddr,
    },
    /// A report file could not be written.
    #[error("cannot write the report {path}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The load client's threads (or their runtimes) could not be started.
    #[error("cannot start the load client's threads")]
    ClientThreads(#[source] io::Error),
    /// The SVG plots could not be drawn.
    #[error("cannot draw a plot: {0}")]
    Plot(String),
}
