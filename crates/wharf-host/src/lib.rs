//! The service host: listeners, sessions, dispatch to services by path, the
//! JSON error shape, and the admin endpoints.
//!
//! A service is any tower service from `Request<Incoming>` to
//! `Response<ResponseBody>` that never fails (errors are responses): the
//! built-in proxy is one, and a program embedding wharf registers its own the
//! same way with [`HostBuilder::mount`]. The host owns everything around the
//! call (connections, limits on request heads, shutdown); services own what
//! a call does. Services never know about each other.
//!
//! Main types: [`HostBuilder`] → [`Host`] (bound, not yet serving) →
//! [`Host::run`]; [`Mount`] says which requests reach a service;
//! [`error::json_error`] is the one error body every service uses.

pub mod admin;
pub mod body;
pub mod error;
mod registry;
mod server;
pub mod service;

pub use body::ResponseBody;
pub use registry::Mount;
pub use server::{Host, HostBuilder, HostError, RunSummary};
pub use service::{handler, HostService};
