//! The service catalogue: which crate builds each configured service type,
//! where it is mounted, which services a reload may keep as they are, and the
//! connections the services keep open ahead of calls (`preconnect`).

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use wharf_config::{Config, ServiceConfig, ServiceKind};
use wharf_host::tls::TlsFiles;
use wharf_host::{
    core_work, CoreWork, CoreWorkReport, HostBuilder, HostService, Mount, ServiceSet,
};
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
    /// The connections the service opens ahead on each core (`preconnect`,
    /// `preconnect_origins`), if any.
    preconnect: Option<CoreWork>,
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
            let (hosted, preconnect) = match unchanged {
                Some(entry) => {
                    set.mount_hosted(&service.name, mount, entry.hosted.clone());
                    rebuilt.kept.push(service.name.clone());
                    (entry.hosted.clone(), entry.preconnect.clone())
                }
                None => {
                    let (built, preconnect) = build(config, service, set)?;
                    rebuilt.built.push(service.name.clone());
                    let hosted = set.mount(&service.name, mount, &service.limits, built);
                    (hosted, preconnect)
                }
            };
            entries.push(Entry {
                config: service.clone(),
                hosted,
                preconnect,
            });
        }
        Ok((Catalogue { entries }, rebuilt))
    }

    /// The connections the services named by `wanted` open ahead, as one piece of work for
    /// each core (see [`HostBuilder::on_each_core`]): the services side by side, each line
    /// of what went wrong prefixed with `services.NAME`. `None` when none of them
    /// preconnects.
    pub fn preconnect_work(&self, wanted: impl Fn(&str) -> bool) -> Option<CoreWork> {
        let works: Vec<(String, CoreWork)> = self
            .entries
            .iter()
            .filter(|entry| wanted(&entry.config.name))
            .filter_map(|entry| Some((entry.config.name.clone(), entry.preconnect.clone()?)))
            .collect();
        if works.is_empty() {
            return None;
        }
        Some(core_work(Arc::new(works), |works| async move {
            let each = works.iter().map(|(name, work)| async move {
                let failed = work().await;
                failed
                    .into_iter()
                    .map(|line| format!("services.{name}: {line}"))
                    .collect::<Vec<_>>()
            });
            futures_util::future::join_all(each)
                .await
                .into_iter()
                .flatten()
                .collect()
        }))
    }
}

/// The longest a start or a reload waits for the services' `preconnect`: a loopback or LAN
/// connect takes well under a millisecond and a TLS handshake across a region tens of them,
/// while an upstream that drops SYNs would hold the start until `connect_timeout` (seed
/// 003's slow start). Connects not done by then go on in the background.
pub const PRECONNECT_WAIT: Duration = Duration::from_millis(200);

/// Logs how the services' `preconnect` went: an upstream not reached is a warning (its first
/// calls connect themselves, as without it), never a reason to refuse a start or a reload.
pub fn log_preconnect(report: &CoreWorkReport) {
    if !report.failed.is_empty() {
        warn!(
            failed = ?report.failed,
            "preconnect: upstreams not reached; their first calls connect themselves"
        );
    }
    if report.finished < report.cores {
        info!(
            cores = report.cores,
            finished = report.finished,
            waited_ms = report.elapsed.as_secs_f64() * 1e3,
            "preconnect: still connecting, the rest goes on in the background"
        );
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

/// Builds one service of its type, with the connections it opens ahead if any. A new
/// service type is a new arm here and a crate of its own.
fn build(
    config: &Config,
    service: &ServiceConfig,
    set: &ServiceSet,
) -> Result<(HostService, Option<CoreWork>), BuildError> {
    let metrics = set.metrics();
    match &service.kind {
        ServiceKind::Proxy(proxy) => {
            let proxy = ProxyService::new(&service.name, proxy, metrics);
            let preconnect = proxy.preconnect_work();
            Ok((proxy.into_host_service(), preconnect))
        }
        ServiceKind::Route(route) => RouteService::new(&service.name, route, metrics)
            .map(|route| {
                let preconnect = route.preconnect_work();
                (route.into_host_service(), preconnect)
            })
            .map_err(|source| BuildError {
                origin: config.origin.clone(),
                name: service.name.clone(),
                source,
            }),
        ServiceKind::Queue(queue) => Ok((
            QueueService::new(&service.name, queue, metrics).into_host_service(),
            None,
        )),
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
