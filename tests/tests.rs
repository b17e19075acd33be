//! wharf's integration tests: real servers on 127.0.0.1 ephemeral ports,
//! the testbed as origin, real HTTP. One target, so it is built once.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests dial the servers they started; clippy.toml's connect rules are for wharf's upstreams.
#![allow(clippy::disallowed_methods)]

mod bindings;
mod check;
mod cores;
mod faults;
mod host;
mod hostile;
mod lab_cli;
mod preconnect;
mod proxy_cache;
mod proxy_errors;
mod proxy_ssrf;
mod proxy_stream;
mod queue;
mod reload;
mod route;
mod shared_cache;
mod stock_example;
mod support;
mod telemetry;
mod warm_up;
