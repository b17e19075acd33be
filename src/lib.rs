//! wharf as a library: the service catalogue that turns a validated
//! [`wharf_config::Config`] into a [`wharf_host::HostBuilder`] with every
//! configured service mounted, and live reload of that config.
//!
//! The binary (`src/main.rs`, `src/cli/`) only parses flags and calls this;
//! integration tests call it too, so they run exactly what `wharf serve` runs.

pub mod catalogue;
pub mod reload;

pub use catalogue::{assemble, build_host, BuildError, Catalogue};
pub use reload::{ConfigReloader, ServerOverrides};
