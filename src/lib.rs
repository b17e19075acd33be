//! wharf as a library: the service catalogue that turns a validated
//! [`Config`] into a [`HostBuilder`] with every configured service mounted.
//!
//! The binary (`src/main.rs`, `src/cli/`) only parses flags and calls this;
//! integration tests call it too, so they run exactly what `wharf serve` runs.
//! A new service type is a new arm in [`build_host`] and a crate of its own.

use wharf_config::{Config, ServiceKind};
use wharf_host::{HostBuilder, Mount};
use wharf_proxy::ProxyService;

/// A configured service that this build cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: services.{name}: type \"{kind}\" is not served by this version of wharf yet")]
pub struct UnsupportedService {
    /// Where the config came from.
    pub origin: String,
    /// The service's table name.
    pub name: String,
    /// Its `type`.
    pub kind: &'static str,
}

/// Builds every service of `config` and mounts it on a host builder.
pub fn build_host(config: &Config) -> Result<HostBuilder, UnsupportedService> {
    let mut host = HostBuilder::new(config.server.clone());
    for service in &config.services {
        match &service.kind {
            ServiceKind::Proxy(proxy) => {
                let proxy_service = ProxyService::new(&service.name, proxy, host.metrics());
                host = host.mount(
                    service.name.clone(),
                    Mount::Exact(proxy.path.clone()),
                    &service.limits,
                    proxy_service.into_host_service(),
                );
            }
            ServiceKind::Route(_) => {
                return Err(UnsupportedService {
                    origin: config.origin.clone(),
                    name: service.name.clone(),
                    kind: service.type_name(),
                })
            }
        }
    }
    Ok(host)
}
