//! The seeds' backends, for tests, demos and benchmarks (SPEC §6): `wharf testbed`.
//!
//! A small, fast HTTP/1.1 and h2c origin with the endpoints the seeds and wharf's own tests
//! need: `/fast`, `/slow`, `/stream`, `/bytes/N`, `/stock/CODE`, `/echo`, `/status/CODE`,
//! `/truncate`, `/hits`, plus `/headers`, `/redirect`, `/delay-headers` and `/stall` for the
//! proxy's cache and timeout tests. `GET /` lists them with their parameters.
//!
//! Benchmarks use it as the floor (the origin called directly), so the hot paths do no heavy
//! work: static bodies, pattern bodies sliced from one static buffer ([`pattern_byte`]), one
//! read lock and an atomic add per request for [`TestbedHandle::hits`].
//!
//! - [`spawn`] binds and serves in a task, returning a [`TestbedHandle`] (tests);
//! - [`serve`] runs on a bound listener until a shutdown future resolves (the CLI);
//! - [`pattern_byte`], [`expected_body`] and [`stock_price`] say what the bodies contain.
//!
//! Bad parameters get 400 `{"error":"bad_request","message":...}` naming the parameter; an
//! unknown path gets 404 `not_found`. Only `/hits` checks the method.
//!
//! ```no_run
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
//! wharf_testbed::serve(listener, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await
//! # }
//! ```

mod body;
mod data;
mod echo;
mod error;
mod hits;
mod pattern;
mod query;
mod respond;
mod routes;
mod server;
mod stock;

pub use pattern::{expected_body, pattern_byte};
pub use server::{bind, serve, spawn, TestbedHandle, LISTEN_BACKLOG, SHUTDOWN_GRACE};
pub use stock::stock_price;
