//! The performance counter catalogue (SPEC §5) and its Prometheus text
//! exposition for `GET {admin}/metrics`.
//!
//! Seed 004 read WCF's counters (Calls Outstanding, PercentOfMaxCalls, …)
//! to see throttles at work; these are the same counters under stable
//! names. Every metric is registered, and every per-service series created,
//! at start, so a scrape shows them at zero before the first call.
//!
//! Hot paths hold pre-resolved handles ([`ServiceMetrics`], [`CacheMetrics`],
//! [`UpstreamMetrics`]): an increment is an atomic add, not a map lookup.
//! Values that live elsewhere (bulkhead counts, cache bytes) are sampled at
//! scrape time by the samplers given to [`Metrics::add_sampler`].
//!
//! Scale-out counters (SPEC §8) have their own modules: [`shared`] for a
//! proxy's Redis tier, [`queue`] for a JetStream-backed `queue` service.

mod classic;
mod handles;
pub mod names;
pub mod queue;
pub mod shared;

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use handles::{code_labels, set_gauge, RunningTotal, ServiceSeries};
pub use handles::{
    CacheMetrics, IdleUpstreamMetrics, KeptObjectMetrics, Outcome, ReuseMetrics, ServiceMetrics,
    SessionMetrics, UpstreamMetrics,
};

pub(crate) type Labels = Vec<(&'static str, String)>;
pub(crate) type FloatGauge = Gauge<f64, AtomicU64>;

/// Reads a live value into the metrics just before a scrape.
pub type Sampler = Box<dyn Fn() + Send + Sync>;

/// Every wharf metric, registered once.
pub struct Metrics {
    registry: Registry,
    /// Samplers by key; a reload replaces a service's sampler under the
    /// same key instead of adding a second one.
    samplers: Mutex<Vec<(String, Sampler)>>,
    calls_outstanding: Family<Labels, Gauge>,
    calls_queued: Family<Labels, Gauge>,
    percent_of_max_calls: Family<Labels, FloatGauge>,
    calls_total: Family<Labels, Counter>,
    call_duration: Family<Labels, Histogram, fn() -> Histogram>,
    throttled_total: Family<Labels, Counter>,
    sessions_active: Gauge,
    percent_of_max_sessions: FloatGauge,
    cache_requests_total: Family<Labels, Counter>,
    cache_bytes: Family<Labels, Gauge>,
    cache_evictions_total: Family<Labels, Counter>,
    upstream_requests_total: Family<Labels, Counter>,
    startup_phase_seconds: Family<Labels, FloatGauge>,
    read_buffers_total: Family<Labels, Counter>,
    read_buffers_spare: Gauge,
    kept_objects_total: Family<Labels, Counter>,
    kept_objects_spare: Family<Labels, Gauge>,
    upstream_idle_descriptors: Gauge,
    upstream_idle_refused_total: Counter,
    upstream_idle_recalled_total: Counter,
    shared_cache: shared::SharedCacheFamilies,
    queue: queue::QueueFamilies,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn duration_histogram() -> Histogram {
    // 100 µs … ~105 s in ×2 steps: covers cache hits and seed 002's 6 s calls.
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the whole catalogue.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let calls_outstanding = Family::default();
        let calls_queued = Family::default();
        let percent_of_max_calls = Family::default();
        let calls_total = Family::default();
        let call_duration = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let throttled_total = Family::default();
        let sessions_active = Gauge::default();
        let percent_of_max_sessions = FloatGauge::default();
        let cache_requests_total = Family::default();
        let cache_bytes = Family::default();
        let cache_evictions_total = Family::default();
        let upstream_requests_total = Family::default();
        let startup_phase_seconds = Family::default();
        let read_buffers_total: Family<Labels, Counter> = Family::default();
        for source in ["reused", "allocated"] {
            let _ = read_buffers_total.get_or_create(&vec![("source", source.to_owned())]);
        }
        let read_buffers_spare = Gauge::default();
        let kept_objects_total = Family::default();
        let kept_objects_spare = Family::default();
        let upstream_idle_descriptors = Gauge::default();
        let upstream_idle_refused_total = Counter::default();
        let upstream_idle_recalled_total = Counter::default();
        // prometheus-client appends `_total` to counters and the unit to
        // metrics registered with one: names below are given without them.
        let counter_name = |name: &'static str| name.trim_end_matches("_total");
        registry.register(
            names::CALLS_OUTSTANDING,
            "Calls of the service being processed (holding a slot)",
            calls_outstanding.clone(),
        );
        registry.register(
            names::CALLS_QUEUED,
            "Calls of the service waiting for a slot",
            calls_queued.clone(),
        );
        registry.register(
            names::PERCENT_OF_MAX_CALLS,
            "(processing + queued) / max_concurrent_calls x 100",
            percent_of_max_calls.clone(),
        );
        registry.register(
            counter_name(names::CALLS_TOTAL),
            "Calls answered, by status code",
            calls_total.clone(),
        );
        registry.register_with_unit(
            "wharf_call_duration",
            "Time from dispatch until the response body is done, queueing included",
            Unit::Seconds,
            call_duration.clone(),
        );
        registry.register(
            counter_name(names::THROTTLED_TOTAL),
            "Calls refused by the bulkhead (queue full or queue timeout)",
            throttled_total.clone(),
        );
        registry.register(
            names::SESSIONS_ACTIVE,
            "Client connections open on the service listener",
            sessions_active.clone(),
        );
        registry.register(
            names::PERCENT_OF_MAX_SESSIONS,
            "sessions_active / max_connections x 100",
            percent_of_max_sessions.clone(),
        );
        registry.register(
            counter_name(names::CACHE_REQUESTS_TOTAL),
            "Proxy calls by cache result",
            cache_requests_total.clone(),
        );
        registry.register(
            names::CACHE_BYTES,
            "Bytes held by the memory cache",
            cache_bytes.clone(),
        );
        registry.register(
            counter_name(names::CACHE_EVICTIONS_TOTAL),
            "Entries evicted to make room",
            cache_evictions_total.clone(),
        );
        registry.register(
            counter_name(names::UPSTREAM_REQUESTS_TOTAL),
            "Requests sent upstream, by outcome",
            upstream_requests_total.clone(),
        );
        registry.register_with_unit(
            "wharf_startup_phase",
            "Duration of each start-up phase",
            Unit::Seconds,
            startup_phase_seconds.clone(),
        );
        registry.register(
            counter_name(names::READ_BUFFERS_TOTAL),
            "Client read buffers taken, by source (reused, allocated)",
            read_buffers_total.clone(),
        );
        registry.register(
            names::READ_BUFFERS_SPARE,
            "Spare client read buffers held for reuse",
            read_buffers_spare.clone(),
        );
        registry.register(
            counter_name(names::KEPT_OBJECTS_TOTAL),
            "Objects kept per worker thread taken, by kind and source (reused, allocated)",
            kept_objects_total.clone(),
        );
        registry.register(
            names::KEPT_OBJECTS_SPARE,
            "Objects kept per worker thread held for reuse, by kind",
            kept_objects_spare.clone(),
        );
        registry.register(
            names::UPSTREAM_IDLE_DESCRIPTORS,
            "Descriptors lent to idle upstream connections (spare leases included)",
            upstream_idle_descriptors.clone(),
        );
        registry.register(
            counter_name(names::UPSTREAM_IDLE_REFUSED_TOTAL),
            "Upstream connections closed instead of kept idle, no descriptor being spare",
            upstream_idle_refused_total.clone(),
        );
        registry.register(
            counter_name(names::UPSTREAM_IDLE_RECALLED_TOTAL),
            "Idle upstream connections closed to give their descriptor to sessions",
            upstream_idle_recalled_total.clone(),
        );
        let shared_cache = shared::SharedCacheFamilies::register(&mut registry);
        let queue = queue::QueueFamilies::register(&mut registry);
        Self {
            registry,
            samplers: Mutex::new(Vec::new()),
            calls_outstanding,
            calls_queued,
            percent_of_max_calls,
            calls_total,
            call_duration,
            throttled_total,
            sessions_active,
            percent_of_max_sessions,
            cache_requests_total,
            cache_bytes,
            cache_evictions_total,
            upstream_requests_total,
            startup_phase_seconds,
            read_buffers_total,
            read_buffers_spare,
            kept_objects_total,
            kept_objects_spare,
            upstream_idle_descriptors,
            upstream_idle_refused_total,
            upstream_idle_recalled_total,
            shared_cache,
            queue,
        }
    }

    /// Creates the series of one service (at zero) and returns its handles.
    pub fn service(&self, service: &str) -> ServiceMetrics {
        let labels = vec![("service", service.to_owned())];
        let _ = self.throttled_total.get_or_create(&labels);
        // The common outcomes exist from start; other codes appear when seen.
        for code in ["200", "503"] {
            let _ = self.calls_total.get_or_create(&code_labels(service, code));
        }
        ServiceMetrics(Arc::new(ServiceSeries {
            service: service.to_owned(),
            outstanding: self.calls_outstanding.get_or_create_owned(&labels),
            queued: self.calls_queued.get_or_create_owned(&labels),
            percent_of_max: self.percent_of_max_calls.get_or_create_owned(&labels),
            duration: self.call_duration.get_or_create_owned(&labels),
            throttled: self.throttled_total.get_or_create_owned(&labels),
            calls_total: self.calls_total.clone(),
            by_code: std::array::from_fn(|_| OnceLock::new()),
        }))
    }

    /// Creates the cache series of one proxy service and returns its handles.
    pub fn cache(&self, service: &str) -> CacheMetrics {
        let result = |result: &str| {
            self.cache_requests_total.get_or_create_owned(&vec![
                ("service", service.to_owned()),
                ("result", result.to_owned()),
            ])
        };
        let labels = vec![("service", service.to_owned())];
        CacheMetrics {
            hit: result("hit"),
            miss: result("miss"),
            bypass: result("bypass"),
            coalesced: result("coalesced"),
            bytes: self.cache_bytes.get_or_create_owned(&labels),
            evictions: RunningTotal::new(self.cache_evictions_total.get_or_create_owned(&labels)),
        }
    }

    /// Creates the upstream series of one (service, backend) pair.
    pub fn upstream(&self, service: &str, backend: &str) -> UpstreamMetrics {
        let outcome = |outcome: &str| {
            self.upstream_requests_total.get_or_create_owned(&vec![
                ("service", service.to_owned()),
                ("backend", backend.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
        };
        UpstreamMetrics {
            ok: outcome("ok"),
            error: outcome("error"),
            timeout: outcome("timeout"),
        }
    }

    /// Creates the shared-tier series of one proxy service (at zero) and returns its handles.
    pub fn shared_cache(&self, service: &str) -> shared::SharedCacheMetrics {
        self.shared_cache.handles(service)
    }

    /// Creates the series of one queue service (at zero) and returns its handles.
    pub fn queue(&self, service: &str) -> queue::QueueMetrics {
        self.queue.handles(service)
    }

    /// Records how long a start-up phase took.
    pub fn startup_phase(&self, phase: &str, seconds: f64) {
        self.startup_phase_seconds
            .get_or_create(&vec![("phase", phase.to_owned())])
            .set(seconds);
    }

    /// The session gauges' handles.
    pub fn sessions(&self, max_connections: usize) -> SessionMetrics {
        SessionMetrics {
            active: self.sessions_active.clone(),
            percent: self.percent_of_max_sessions.clone(),
            max: max_connections.max(1) as f64,
        }
    }

    /// The read-buffer reuse handles (both sources exist at zero from start).
    pub fn read_buffers(&self) -> ReuseMetrics {
        let source = |source: &str| {
            self.read_buffers_total
                .get_or_create_owned(&vec![("source", source.to_owned())])
        };
        ReuseMetrics {
            reused: RunningTotal::new(source("reused")),
            allocated: RunningTotal::new(source("allocated")),
            spare: self.read_buffers_spare.clone(),
        }
    }

    /// The handles of the idle upstream connections' descriptor series (at zero from start).
    pub fn idle_upstream(&self) -> IdleUpstreamMetrics {
        IdleUpstreamMetrics {
            descriptors: self.upstream_idle_descriptors.clone(),
            refused: RunningTotal::new(self.upstream_idle_refused_total.clone()),
            recalled: RunningTotal::new(self.upstream_idle_recalled_total.clone()),
        }
    }

    /// The kept-object series of `kinds` (created at zero) and their handles.
    pub fn kept_objects(&self, kinds: &[&'static str]) -> KeptObjectMetrics {
        let series = kinds
            .iter()
            .map(|&kind| {
                let source = |source: &str| {
                    RunningTotal::new(self.kept_objects_total.get_or_create_owned(&vec![
                        ("kind", kind.to_owned()),
                        ("source", source.to_owned()),
                    ]))
                };
                let series = ReuseMetrics {
                    reused: source("reused"),
                    allocated: source("allocated"),
                    spare: self
                        .kept_objects_spare
                        .get_or_create_owned(&vec![("kind", kind.to_owned())]),
                };
                (kind, series)
            })
            .collect();
        KeptObjectMetrics { series }
    }

    /// Adds a function run before every scrape.
    pub fn add_sampler(&self, sampler: Sampler) {
        self.samplers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((String::new(), sampler));
    }

    /// Sets the sampler registered under `key`, replacing an earlier one
    /// (a reloaded service samples its new state, not its old one).
    pub fn set_sampler(&self, key: &str, sampler: Sampler) {
        let mut samplers = self.samplers.lock().unwrap_or_else(|p| p.into_inner());
        match samplers.iter_mut().find(|(k, _)| !k.is_empty() && k == key) {
            Some(slot) => slot.1 = sampler,
            None => samplers.push((key.to_owned(), sampler)),
        }
    }

    /// Samples live values and renders them in the classic Prometheus text
    /// format (0.0.4): what a scraper that does not ask for OpenMetrics reads.
    pub fn encode_classic(&self) -> String {
        classic::from_openmetrics(&self.encode())
    }

    /// Samples live values and renders them in the OpenMetrics text format
    /// (`application/openmetrics-text; version=1.0.0`).
    pub fn encode(&self) -> String {
        for (_, sampler) in self
            .samplers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            sampler();
        }
        let mut text = String::with_capacity(16 * 1024);
        if encode(&mut text, &self.registry).is_err() {
            // Writing to a String cannot fail; keep the scrape answerable anyway.
            let _ = writeln!(text, "# encoding failed");
        }
        text
    }
}

#[cfg(test)]
mod tests;
