//! The set of mounted services, and the handle that swaps it while the
//! host runs (live reload) without touching connections or calls in
//! flight: a call keeps the service it was dispatched to.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::runtime::Handle;

use wharf_config::LimitsConfig;
use wharf_metrics::Metrics;

use crate::call::Inflight;
use crate::on_cores::{CoreWork, CoreWorkReport};
use crate::registry::{Mount, Mounted, Registry};
use crate::service::HostService;
use crate::stack::hosted;

/// Services with the host's qualities around them, by mount.
pub struct ServiceSet {
    registry: Registry,
    metrics: Arc<Metrics>,
    inflight: Arc<Inflight>,
}

impl ServiceSet {
    pub(crate) fn new(metrics: Arc<Metrics>, inflight: Arc<Inflight>) -> Self {
        Self {
            registry: Registry::default(),
            metrics,
            inflight,
        }
    }

    /// The host's counters, for services that add their own series.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Wraps `service` in the host's layers (its own bulkhead from
    /// `limits`, counters, tracing) and mounts it. Returns the wrapped
    /// service, which a reload may mount again unchanged with
    /// [`ServiceSet::mount_hosted`] (keeping its bulkhead and state).
    pub fn mount(
        &mut self,
        name: &str,
        mount: Mount,
        limits: &LimitsConfig,
        service: HostService,
    ) -> HostService {
        let wrapped = hosted(name, limits, &self.metrics, &self.inflight, service);
        self.mount_hosted(name, mount, wrapped.clone());
        wrapped
    }

    /// Mounts a service returned earlier by [`ServiceSet::mount`].
    pub fn mount_hosted(&mut self, name: &str, mount: Mount, hosted: HostService) {
        self.registry.insert(
            mount,
            Mounted {
                name: name.to_owned(),
                service: hosted,
            },
        );
    }

    pub(crate) fn into_registry(self) -> Registry {
        self.registry
    }
}

/// The registry calls are dispatched with, swappable at run time.
pub(crate) type SharedRegistry = Arc<RwLock<Arc<Registry>>>;

/// Swaps the services of a running host.
#[derive(Clone)]
pub struct Reloader {
    registry: SharedRegistry,
    metrics: Arc<Metrics>,
    inflight: Arc<Inflight>,
    /// Where work for every core runs (see [`crate::on_cores`]).
    homes: Arc<[Option<Handle>]>,
}

impl Reloader {
    pub(crate) fn new(
        registry: SharedRegistry,
        metrics: Arc<Metrics>,
        inflight: Arc<Inflight>,
        homes: Arc<[Option<Handle>]>,
    ) -> Self {
        Self {
            registry,
            metrics,
            inflight,
            homes,
        }
    }

    /// Runs `work` once on each of the running host's cores, as
    /// [`crate::HostBuilder::on_each_core`] does before the start: for the services a
    /// reload builds anew, before they are swapped in.
    pub async fn on_each_core(&self, work: &CoreWork, wait: Duration) -> CoreWorkReport {
        crate::on_cores::run(&self.homes, work, wait).await
    }

    /// An empty set sharing the host's counters and in-flight list.
    pub fn service_set(&self) -> ServiceSet {
        ServiceSet::new(self.metrics.clone(), self.inflight.clone())
    }

    /// Makes `set` answer every call dispatched from now on.
    pub fn replace(&self, set: ServiceSet) {
        let registry = Arc::new(set.into_registry());
        *self.registry.write().unwrap_or_else(|p| p.into_inner()) = registry;
    }
}
