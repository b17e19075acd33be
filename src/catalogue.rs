//! The service catalogue: which crate builds each configured service type,
//! where it is mounted, and which services a reload may keep as they are.

use wharf_config::{Config, ServiceConfig, ServiceKind};
use wharf_host::tls::TlsFiles;
use wharf_host::{HostBuilder, HostService, Mount, ServiceSet};
use wharf_proxy::ProxyService;
use wharf_queue::QueueService;
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

/// The services built from one config, kept so that a reload can reuse
/// the unchanged ones (a proxy keeps its cache, a route its pools and
/// health, both their bulkheads).
#[derive(Default)]
pub struct Catalogue {
    entries: Vec<Entry>,
}

struct Entry {
    config: ServiceConfig,
    hosted: HostService,
}

/// What a rebuild did, for logs and the reload reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Services built anew (new or changed).
    pub built: Vec<String>,
    /// Services kept as they were.
    pub kept: Vec<String>,
}

impl Catalogue {
    /// Builds (or, when `previous` has the same config, reuses) every
    /// service of `config` and mounts it in `set`.
    pub fn mount_all(
        config: &Config,
        set: &mut ServiceSet,
        previous: Option<&Catalogue>,
    ) -> Result<(Catalogue, Rebuilt), BuildError> {
        let mut entries = Vec::with_capacity(config.services.len());
        let mut rebuilt = Rebuilt::default();
        for service in &config.services {
            let mount = mount_of(service);
            let unchanged = previous.and_then(|previous| {
                previous
                    .entries
                    .iter()
                    .find(|entry| entry.config == *service)
            });
            let hosted = match unchanged {
                Some(entry) => {
                    set.mount_hosted(&service.name, mount, entry.hosted.clone());
                    rebuilt.kept.push(service.name.clone());
                    entry.hosted.clone()
                }
                None => {
                    let built = build(config, service, set)?;
                    rebuilt.built.push(service.name.clone());
                    set.mount(&service.name, mount, &service.limits, built)
                }
            };
            entries.push(Entry {
                config: service.clone(),
                hosted,
            });
        }
        Ok((Catalogue { entries }, rebuilt))
    }
}

/// Which requests reach a service.
fn mount_of(service: &ServiceConfig) -> Mount {
    match &service.kind {
        ServiceKind::Proxy(proxy) => Mount::Exact(proxy.path.clone()),
        ServiceKind::Route(route) => Mount::Prefix(route.path_prefix.clone()),
        ServiceKind::Queue(queue) => Mount::Exact(queue.path.clone()),
    }
}

/// Builds one service of its type. A new service type is a new arm here
/// and a crate of its own.
fn build(
    config: &Config,
    service: &ServiceConfig,
    set: &ServiceSet,
) -> Result<HostService, BuildError> {
    let metrics = set.metrics();
    match &service.kind {
        ServiceKind::Proxy(proxy) => {
            Ok(ProxyService::new(&service.name, proxy, metrics).into_host_service())
        }
        ServiceKind::Route(route) => RouteService::new(&service.name, route, metrics)
            .map(RouteService::into_host_service)
            .map_err(|source| BuildError {
                origin: config.origin.clone(),
                name: service.name.clone(),
                source,
            }),
        ServiceKind::Queue(queue) => {
            Ok(QueueService::new(&service.name, queue, metrics).into_host_service())
        }
    }
}

/// A host builder with every service of `config` mounted, and the
/// catalogue a reload starts from.
pub fn assemble(config: &Config) -> Result<(HostBuilder, Catalogue), BuildError> {
    let mut host = HostBuilder::new(config.server.clone());
    if let Some(tls) = &config.server.tls {
        host = host.tls(TlsFiles {
            cert: tls.cert.clone(),
            key: tls.key.clone(),
        });
    }
    if let Some(path) = &config.server.listen_unix {
        host = host.listen_unix(path.clone());
    }
    let (catalogue, _) = Catalogue::mount_all(config, host.services_mut(), None)?;
    Ok((host, catalogue))
}

/// A host builder with every service of `config` mounted.
pub fn build_host(config: &Config) -> Result<HostBuilder, BuildError> {
    assemble(config).map(|(host, _)| host)
}
