//! wharf as a library: the service catalogue that turns a validated
//! [`Config`] into a [`HostBuilder`] with every configured service mounted.
//!
//! The binary (`src/main.rs`, `src/cli/`) only parses flags and calls this;
//! integration tests call it too, so they run exactly what `wharf serve` runs.
//! A new service type is a new arm in [`build_host`] and a crate of its own.

use wharf_config::{Config, ServiceKind};
use wharf_host::{HostBuilder, Mount};
use wharf_proxy::ProxyService;
use wharf_route::forward::RouteBuildError;
use wharf_route::RouteService;

/// A configured service that could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: services.{name}: {source}")]
pub struct BuildError {
    /// Where the config came from.
    pub origin: String,
    /// The service's table name.
    pub name: String,
    /// What went wrong.
    pub source: RouteBuildError,
}

/// Builds every service of `config` and mounts it on a host builder.
pub fn build_host(config: &Config) -> Result<HostBuilder, BuildError> {
    let mut host = HostBuilder::new(config.server.clone());
    for service in &config.services {
        let (mount, built) = match &service.kind {
            ServiceKind::Proxy(proxy) => (
                Mount::Exact(proxy.path.clone()),
                ProxyService::new(&service.name, proxy, host.metrics()).into_host_service(),
            ),
            ServiceKind::Route(route) => {
                let built =
                    RouteService::new(&service.name, route, host.metrics()).map_err(|source| {
                        BuildError {
                            origin: config.origin.clone(),
                            name: service.name.clone(),
                            source,
                        }
                    })?;
                (
                    Mount::Prefix(route.path_prefix.clone()),
                    built.into_host_service(),
                )
            }
        };
        host = host.mount(service.name.clone(), mount, &service.limits, built);
    }
    Ok(host)
}
