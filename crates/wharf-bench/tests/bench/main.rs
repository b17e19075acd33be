//! Integration tests: every scenario against a testbed on `127.0.0.1:0` (or a closed port),
//! through the crate's API, with small, bounded settings (a few seconds each at most).
#![allow(clippy::unwrap_used)] // helpers are not covered by allow-unwrap-in-tests (clippy#11119)

mod support;

mod errors;
mod processes;
mod reports;
mod scenarios;
