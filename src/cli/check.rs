//! `wharf check`: validate a config file and report every problem with its line.
//!
//! Loading is all of it: `wharf_config::Config::load` parses, fills defaults and checks every
//! rule, and its error already lists each problem as `file:line: key: why`, one per line.

use std::path::Path;

/// Validates the config at `path`; prints "FILE: ok (N services)" on success. Returns Err with
/// the ConfigError on failure (main prints it and exits 1).
pub(crate) fn run(path: &Path) -> anyhow::Result<()> {
    let config = wharf_config::Config::load(path)?;
    let count = config.services.len();
    let noun = if count == 1 { "service" } else { "services" };
    println!("{}: ok ({count} {noun})", path.display());
    Ok(())
}
