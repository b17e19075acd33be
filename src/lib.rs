//! wharf as a library: the service catalogue that turns a validated
//! [`wharf_config::Config`] into a [`wharf_host::HostBuilder`] with every
//! configured service mounted, live reload of that config, and the start-up warm-up's
//! twins of those services (`warm_up`).
//!
//! The binary (`src/main.rs`, `src/cli/`) only parses flags and calls this;
//! integration tests call it too, so they run exactly what `wharf serve` runs.

pub mod catalogue;
pub mod reload;
pub mod warm_up;

pub use catalogue::{assemble, build_host, BuildError, Catalogue};
pub use reload::{ConfigReloader, ServerOverrides};
