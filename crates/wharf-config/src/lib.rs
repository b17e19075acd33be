//! wharf's configuration: the TOML file model, its units, its validation and the embedded
//! default.
//!
//! Loading is two steps. The raw model (`raw`) is what serde reads: unknown keys are errors
//! and every value keeps its span. Validation (`validate`) then parses units, fills defaults
//! and checks ranges, required keys and cross-key rules, producing a [`Config`] whose values
//! need no further checking, or a [`ConfigError`] listing every problem as
//! `file:line: key: why`.
//!
//! This crate only describes what to run; the host, limits and services crates act on it.
//! Command-line overrides (`--listen`) are applied by the binary to the validated [`Config`].
//!
//! ```
//! let config = wharf_config::Config::from_toml_str(
//!     r#"
//!     [services.orders]
//!     type = "route"
//!     path_prefix = "/orders"
//!     backends = ["http://127.0.0.1:7001"]
//!     "#,
//!     "wharf.toml",
//! )?;
//! assert_eq!(config.services[0].type_name(), "route");
//! assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
//! # Ok::<(), wharf_config::ConfigError>(())
//! ```

mod defaults;
mod error;
mod locate;
mod model;
mod raw;
mod redact;
mod units;
mod validate;

use std::path::Path;

pub use error::{ConfigError, Problem};
pub use model::{
    methods_taken, route_rank, DeliverConfig, LimitsConfig, LogFormat, NatsCredentials,
    ProxyConfig, QueueConfig, RouteConfig, ServerConfig, ServiceConfig, ServiceKind, Strategy,
    TelemetryConfig, TlsConfig,
};
pub use redact::redacted_url;
pub use units::{parse_duration, parse_size, UnitError};

/// The embedded default configuration, run by `wharf serve` without `--config`: the
/// `[server]` and `[telemetry]` defaults (pretty logs at info, no trace export) and one
/// caching proxy service `proxy` at `/proxy`. A commented TOML
/// document listing every key with its default, usable as a starting point for a config file.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// The `origin` of [`Config::embedded_default`].
pub const EMBEDDED_ORIGIN: &str = "<embedded default>";

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The `[server]` table (all defaults if absent).
    pub server: ServerConfig,
    /// The `[services.NAME]` tables, in file order. May be empty.
    pub services: Vec<ServiceConfig>,
    /// The `[telemetry]` table (all defaults if absent: pretty logs at info, no trace export).
    pub telemetry: TelemetryConfig,
    /// Where the config came from: the file name as given, or [`EMBEDDED_ORIGIN`].
    pub origin: String,
}

impl Config {
    /// Parses and validates TOML `text`; `origin` names it in error messages (a file name).
    ///
    /// # Errors
    ///
    /// A TOML syntax or type error, or an unknown key, gives one problem (the parse stops
    /// there); otherwise every validation problem in the file is reported.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw: raw::RawConfig = toml::from_str(text)
            .map_err(|err| ConfigError::new(vec![locate::problem_from_toml(&err, text, origin)]))?;
        validate::validate(raw, text, origin)
    }

    /// Reads, parses and validates the file at `path`; errors name the file as `path` is
    /// written.
    ///
    /// # Errors
    ///
    /// As [`Config::from_toml_str`], plus a file that cannot be read (or is not UTF-8).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|err| ConfigError::whole_file(&origin, format!("cannot read: {err}")))?;
        Config::from_toml_str(&text, &origin)
    }

    /// The embedded default ([`DEFAULT_TOML`]), validated.
    pub fn embedded_default() -> Config {
        Config::from_toml_str(DEFAULT_TOML, EMBEDDED_ORIGIN)
            .expect("the embedded default config is valid (a unit test checks it)")
    }

    /// The service called `name`, if any.
    pub fn service(&self, name: &str) -> Option<&ServiceConfig> {
        self.services.iter().find(|s| s.name == name)
    }
}

impl Default for ServerConfig {
    /// The `[server]` defaults: listen 127.0.0.1:8080, admin 127.0.0.1:9901, and so on.
    fn default() -> Self {
        Config::from_toml_str("", "<defaults>")
            .expect("an empty config is valid (a unit test checks it)")
            .server
    }
}

impl Default for TelemetryConfig {
    /// The `[telemetry]` defaults: pretty logs at `info`, no trace export.
    fn default() -> Self {
        Config::from_toml_str("", "<defaults>")
            .expect("an empty config is valid (a unit test checks it)")
            .telemetry
    }
}

#[cfg(test)]
mod tests;
