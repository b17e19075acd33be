//! The service host: listeners, sessions, dispatch to services by path,
//! the host's qualities around every service, and the admin endpoints.
//!
//! A service is a [`HostService`]: a function from `Request<RequestBody>` to
//! a future of `Response<ResponseBody>` that never fails (errors are
//! responses). The built-in proxy is one, and a program embedding wharf
//! mounts its own the same way with [`HostBuilder::mount`], getting the same
//! bulkhead, counters, tracing and lifecycle (`stack.rs`, `layers/`).
//! Services never know about each other.
//!
//! HTTP/1.1 is served by wharf's own connection code ([`h1`]), HTTP/2 by hyper.
//!
//! Main types: [`HostBuilder`] (optionally [`HostBuilder::warm_up`] and
//! [`HostBuilder::on_each_core`]) → [`Host`] (bound,
//! not yet serving) → [`Host::run`]; [`Mount`] says which requests reach a service;
//! [`error::json_error`] is the one error body every service uses;
//! [`call::CallContext`] is how a service reports its phases.

mod accept;
pub mod admin;
pub mod body;
mod busy_poll;
pub mod call;
mod connection;
mod cores;
mod dispatch;
pub mod error;
mod fd_budget;
mod fd_table;
pub mod h1;
mod keep_warm;
pub mod layers;
pub mod on_cores;
mod registry;
mod request_body;
mod server;
pub mod service;
pub mod services;
mod session;
mod stack;
mod steering;
pub mod tls;
pub mod warm_up;

pub use body::ResponseBody;
pub use call::{CallContext, Phase};
pub use fd_budget::SEALED_BODY_FDS;
pub use fd_table::{presize_fd_table, PRESIZE_CAP};
pub use on_cores::{core_work, CoreWork, CoreWorkReport};
pub use registry::{Admission, AllowedMethods, Mount, RequestFilter};
pub use request_body::RequestBody;
pub use server::{Host, HostBuilder, HostError, RunSummary};
pub use service::{handler, HostService};
pub use services::{Reloader, ServiceSet};
pub use warm_up::{WarmUp, WarmUpReport};
pub use wharf_metrics as metrics;
