//! Routes (seed 004's router/broker): a `route` service forwards the
//! requests it matches to its backends with the body streamed untouched in
//! both directions and a few headers rewritten.
//!
//! - [`matcher`]: method and header equality (the host matched the path).
//! - [`rewrite`]: request and response header rewrite, on the parsed heads
//!   and as the request head is written: no body copy, no re-serialisation,
//!   so a rewrite costs what a plain forward costs (seed 004's 40 % copy tax).
//! - [`backend`]: one backend: address, connection pool, passive health,
//!   calls outstanding.
//! - [`balance`]: the order in which backends are tried (failover,
//!   round_robin, least_outstanding).
//! - [`forward`]: the attempt loop with retry safety, timeouts and errors.
//!
//! Listeners, bulkheads and counters come from `wharf-host`.

pub mod backend;
pub mod balance;
mod body;
pub mod error;
pub mod forward;
pub mod matcher;
mod pool;
pub mod rewrite;

pub use error::RouteError;
pub use forward::RouteService;
