//! The handles the hot paths hold, resolved once from [`crate::Metrics`]: a count is an
//! atomic add on a series already found, never a label lookup. Also the two ways a value
//! kept elsewhere reaches a series at scrape time ([`RunningTotal`] for counters,
//! [`set_gauge`] for gauges).
//!
//! Main types: [`ServiceMetrics`], [`CacheMetrics`], [`UpstreamMetrics`],
//! [`SessionMetrics`], and the reuse series ([`ReuseMetrics`], [`KeptObjectMetrics`],
//! [`IdleUpstreamMetrics`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::{FloatGauge, Labels};

pub(crate) fn code_labels(service: &str, code: &str) -> Labels {
    vec![("service", service.to_owned()), ("code", code.to_owned())]
}

/// The handles of one service's call counters; cloning shares them (one
/// reference count, no allocation: layers clone it per call).
#[derive(Clone)]
pub struct ServiceMetrics(pub(crate) Arc<ServiceSeries>);

/// Status codes 100..=599 each get a slot in [`ServiceSeries::by_code`].
pub(crate) const CODES: usize = 500;

pub(crate) struct ServiceSeries {
    pub(crate) service: String,
    pub(crate) outstanding: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) percent_of_max: FloatGauge,
    pub(crate) duration: Histogram,
    pub(crate) throttled: Counter,
    pub(crate) calls_total: Family<Labels, Counter>,
    /// The `calls_total` counter of each status code, resolved on first
    /// use so later calls skip the family's lock and label allocation.
    pub(crate) by_code: [OnceLock<Counter>; CODES],
}

impl std::fmt::Debug for ServiceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceMetrics")
            .field("service", &self.0.service)
            .finish()
    }
}

impl ServiceMetrics {
    /// Counts one answered call with its status and duration.
    pub fn call_done(&self, code: u16, seconds: f64) {
        let series = &*self.0;
        series.duration.observe(seconds);
        let counter = match usize::from(code)
            .checked_sub(100)
            .and_then(|i| series.by_code.get(i))
        {
            Some(slot) => slot.get_or_init(|| series.counter_for(code)),
            // Not a valid status; hyper never produces one, count it anyway.
            None => &series.counter_for(code),
        };
        counter.inc();
    }

    /// Counts one call refused by the bulkhead.
    pub fn throttled(&self) {
        self.0.throttled.inc();
    }

    /// Sets the bulkhead gauges (called by a sampler).
    pub fn set_load(&self, processing: usize, queued: usize, percent_of_max: f64) {
        self.0.outstanding.set(processing as i64);
        self.0.queued.set(queued as i64);
        self.0.percent_of_max.set(percent_of_max);
    }
}

impl ServiceSeries {
    fn counter_for(&self, code: u16) -> Counter {
        self.calls_total
            .get_or_create_owned(&code_labels(&self.service, &code.to_string()))
    }
}

/// The handles of one proxy service's cache counters.
#[derive(Debug, Clone)]
pub struct CacheMetrics {
    pub(crate) hit: Counter,
    pub(crate) miss: Counter,
    pub(crate) bypass: Counter,
    pub(crate) coalesced: Counter,
    pub(crate) bytes: Gauge,
    pub(crate) evictions: RunningTotal,
}

impl CacheMetrics {
    /// Counts one call by its `x-cache` result: hit, miss, bypass, coalesced.
    pub fn request(&self, result: &str) {
        match result {
            "hit" => self.hit.inc(),
            "miss" => self.miss.inc(),
            "coalesced" => self.coalesced.inc(),
            _ => self.bypass.inc(),
        };
    }

    /// Sets bytes held and catches the eviction counter up with the
    /// cache's own running total (called by a sampler).
    pub fn sample(&self, bytes: u64, evictions_total: u64) {
        set_gauge(&self.bytes, bytes);
        self.evictions.catch_up(evictions_total);
    }
}

/// One kind of reused object's series (the read buffers, or one kind of kept object): the
/// host keeps running totals of its own (`wharf_http1::recycle::kept_stats`) and a sampler
/// copies them here before each scrape.
#[derive(Debug, Clone)]
pub struct ReuseMetrics {
    pub(crate) reused: RunningTotal,
    pub(crate) allocated: RunningTotal,
    pub(crate) spare: Gauge,
}

impl ReuseMetrics {
    /// Catches the counters up with the running totals and sets the spare count.
    pub fn sample(&self, reused_total: u64, allocated_total: u64, spare: u64) {
        self.reused.catch_up(reused_total);
        self.allocated.catch_up(allocated_total);
        set_gauge(&self.spare, spare);
    }
}

/// The idle upstream connections' descriptor series (`wharf_upstream_idle_*`), fed from the
/// open-files ledger's running totals at each scrape.
#[derive(Debug, Clone)]
pub struct IdleUpstreamMetrics {
    pub(crate) descriptors: Gauge,
    pub(crate) refused: RunningTotal,
    pub(crate) recalled: RunningTotal,
}

impl IdleUpstreamMetrics {
    /// Sets the descriptors lent now and catches the counters up with the totals.
    pub fn sample(&self, lent: u64, refused_total: u64, recalled_total: u64) {
        set_gauge(&self.descriptors, lent);
        self.refused.catch_up(refused_total);
        self.recalled.catch_up(recalled_total);
    }
}

/// The kept-object reuse series, by kind (`wharf_kept_objects_*`).
#[derive(Debug, Clone)]
pub struct KeptObjectMetrics {
    pub(crate) series: Vec<(&'static str, ReuseMetrics)>,
}

impl KeptObjectMetrics {
    /// Samples `kind`'s series ([`ReuseMetrics::sample`]); a kind not given to
    /// [`crate::Metrics::kept_objects`] is ignored.
    pub fn sample(&self, kind: &str, reused_total: u64, allocated_total: u64, spare: u64) {
        if let Some((_, series)) = self.series.iter().find(|(known, _)| *known == kind) {
            series.sample(reused_total, allocated_total, spare);
        }
    }
}

/// A counter fed from a running total kept elsewhere (a cache's evictions, the host's
/// buffer counts): each sample adds what the total gained since the last one.
#[derive(Debug, Clone)]
pub(crate) struct RunningTotal {
    pub(crate) counter: Counter,
    /// The running total at the last sample.
    pub(crate) seen: Arc<AtomicU64>,
}

impl RunningTotal {
    pub(crate) fn new(counter: Counter) -> Self {
        Self {
            counter,
            seen: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(crate) fn catch_up(&self, total: u64) {
        let before = self.seen.swap(total, Ordering::Relaxed);
        self.counter.inc_by(total.saturating_sub(before));
    }
}

/// Sets a gauge (an `i64`) from a count, saturating.
pub(crate) fn set_gauge(gauge: &Gauge, value: u64) {
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
}

/// The handles of one upstream's outcome counters.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    pub(crate) ok: Counter,
    pub(crate) error: Counter,
    pub(crate) timeout: Counter,
}

/// How an upstream request ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head arrived.
    Ok,
    /// Connect or protocol failure.
    Error,
    /// A deadline passed.
    Timeout,
}

impl UpstreamMetrics {
    /// Counts one upstream request.
    pub fn record(&self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok.inc(),
            Outcome::Error => self.error.inc(),
            Outcome::Timeout => self.timeout.inc(),
        };
    }
}

/// The session gauges.
#[derive(Debug, Clone)]
pub struct SessionMetrics {
    pub(crate) active: Gauge,
    pub(crate) percent: FloatGauge,
    pub(crate) max: f64,
}

impl SessionMetrics {
    /// Sets the number of open sessions.
    pub fn set_active(&self, active: usize) {
        self.active.set(active as i64);
        self.percent.set(active as f64 * 100.0 / self.max);
    }
}
