//! `wharf check`: validate a config file and report every problem with its line.
//!
//! Loading does most of it: `wharf_config::Config::load` parses, fills defaults and checks
//! every rule, and its error already lists each problem as `file:line: key: why`, one per
//! line. Then the TLS files the config names are loaded and parsed by the very function
//! `serve` builds its TLS listener with ([`wharf_host::tls::acceptor`]), so that a config
//! `check` passes is one `serve` can start with.

use std::path::Path;

use wharf_config::{Config, Problem};
use wharf_host::tls::{self, TlsError, TlsFiles};

/// Validates the config at `path`; prints "FILE: ok (N services)" on success. Returns Err with
/// the ConfigError, or the TLS file problem as `file: key: "path": why`, on failure (main
/// prints it and exits 1).
pub(crate) fn run(path: &Path) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    if let Some(problem) = tls_problem(&config) {
        anyhow::bail!("{problem}");
    }
    let count = config.services.len();
    let noun = if count == 1 { "service" } else { "services" };
    println!("{}: ok ({count} {noun})", path.display());
    Ok(())
}

/// Loads `server.tls_cert` and `server.tls_key` as `serve` does; what is wrong with them, if
/// anything, blamed on the key that names the file at fault.
fn tls_problem(config: &Config) -> Option<Problem> {
    let files = config.server.tls.as_ref()?;
    let error = tls::acceptor(&TlsFiles {
        cert: files.cert.clone(),
        key: files.key.clone(),
    })
    .err()?;
    let quoted = |path: &Path| format!("{:?}", path.display().to_string());
    let (key, message) = match error {
        TlsError::Cert { path, message } => {
            ("server.tls_cert", format!("{}: {message}", quoted(&path)))
        }
        TlsError::Key { path, message } => {
            ("server.tls_key", format!("{}: {message}", quoted(&path)))
        }
        other => ("server", other.to_string()),
    };
    Some(Problem {
        file: config.origin.clone(),
        line: None,
        column: None,
        key: key.to_owned(),
        message,
    })
}
