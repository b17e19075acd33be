//! `--json`: the [`Report`] as JSON, for machines.
//!
//! The document is the serde form of [`Report`]: `scenario`, `settings`, `rounds`,
//! `started_unix_ms`, `client`, `targets` (each with `classes`, `metrics`, `client`,
//! `timelines`) and `notes`. Times are milliseconds (`latency_ms`, names ending in `_ms`);
//! figures that could not be measured are `null`. Fields are only ever added.

use crate::report::Report;

/// The report as pretty-printed JSON.
pub fn render(report: &Report) -> String {
    // Plain data (strings, numbers, options, vectors): serialising it cannot fail.
    serde_json::to_string_pretty(report).unwrap_or_else(|e| {
        format!("{{\"error\":\"cannot serialise the report\",\"message\":\"{e}\"}}")
    })
}
