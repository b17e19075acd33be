//! Counters of a proxy's shared (Redis) cache tier: lookups by result, failed operations
//! by operation and reason, operation latency, write-through outcomes and leases.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::{names, Labels};

/// One operation against the shared tier, as the `op` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedOp {
    /// Reading an entry (meta value and chunks).
    Get,
    /// Writing a committed entry (chunks, then meta).
    Put,
    /// Taking the cross-instance fill lease (and checking for the entry in the same trip).
    Lease,
    /// Waiting for another instance's fill: checking for the entry and the lease.
    Poll,
    /// Giving the lease back.
    Release,
}

impl SharedOp {
    const ALL: [SharedOp; 5] = [
        SharedOp::Get,
        SharedOp::Put,
        SharedOp::Lease,
        SharedOp::Poll,
        SharedOp::Release,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SharedOp::Get => "get",
            SharedOp::Put => "put",
            SharedOp::Lease => "lease",
            SharedOp::Poll => "poll",
            SharedOp::Release => "release",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why a shared-tier operation failed, as the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedFailure {
    /// The operation did not finish within its time bound.
    Timeout,
    /// Redis answered with an error or the connection failed.
    Error,
}

/// What a lookup in the shared tier found, as the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedLookup {
    /// A complete entry was read.
    Hit,
    /// No entry (or an unusable one).
    Miss,
    /// Redis failed or was too slow; the tier was skipped for this call.
    Error,
    /// Not tried: the tier is resting after recent failures.
    Skipped,
}

/// How a write-through ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedWrite {
    /// Chunks and meta stored.
    Ok,
    /// A Redis operation failed or timed out.
    Error,
    /// Not tried: the tier is resting after recent failures.
    Skipped,
}

/// How taking a fill lease ended, as the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedLease {
    /// This instance fetches from the origin.
    Acquired,
    /// Another instance is fetching; this one waited for its entry.
    Held,
    /// Redis failed, was skipped or too slow: fetched without a lease.
    Error,
}

/// The families, registered once by [`crate::Metrics::new`].
pub(crate) struct SharedCacheFamilies {
    requests: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    writes: Family<Labels, Counter>,
    leases: Family<Labels, Counter>,
}

fn op_histogram() -> Histogram {
    // 50 µs … ~1.6 s in ×2 steps: operations are bounded by their timeout (100 ms default).
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl SharedCacheFamilies {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let families = Self {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(op_histogram as fn() -> Histogram),
            writes: Family::default(),
            leases: Family::default(),
        };
        let counter_name = |name: &'static str| name.trim_end_matches("_total");
        registry.register(
            counter_name(names::SHARED_CACHE_REQUESTS_TOTAL),
            "Shared cache tier lookups, by result",
            families.requests.clone(),
        );
        registry.register(
            counter_name(names::SHARED_CACHE_ERRORS_TOTAL),
            "Shared cache tier operations that failed or timed out (the tier was skipped)",
            families.errors.clone(),
        );
        registry.register_with_unit(
            "wharf_shared_cache_op_duration",
            "Shared cache tier operation latency",
            Unit::Seconds,
            families.duration.clone(),
        );
        registry.register(
            counter_name(names::SHARED_CACHE_WRITES_TOTAL),
            "Committed fills written through to the shared tier, by outcome",
            families.writes.clone(),
        );
        registry.register(
            counter_name(names::SHARED_CACHE_LEASES_TOTAL),
            "Cross-instance fill leases, by result",
            families.leases.clone(),
        );
        families
    }

    /// Creates every series of `service` at zero and returns the handles.
    pub(crate) fn handles(&self, service: &str) -> SharedCacheMetrics {
        let with = |name: &'static str, value: &str| {
            vec![("service", service.to_owned()), (name, value.to_owned())]
        };
        let op_failures = |reason: &str| -> Vec<Counter> {
            SharedOp::ALL
                .iter()
                .map(|op| {
                    self.errors.get_or_create_owned(&vec![
                        ("service", service.to_owned()),
                        ("op", op.as_str().to_owned()),
                        ("reason", reason.to_owned()),
                    ])
                })
                .collect()
        };
        SharedCacheMetrics {
            lookups: ["hit", "miss", "error", "skipped"]
                .map(|result| self.requests.get_or_create_owned(&with("result", result))),
            timeouts: op_failures("timeout"),
            errors: op_failures("error"),
            durations: SharedOp::ALL
                .iter()
                .map(|op| self.duration.get_or_create_owned(&with("op", op.as_str())))
                .collect(),
            writes: ["ok", "error", "skipped"]
                .map(|outcome| self.writes.get_or_create_owned(&with("outcome", outcome))),
            leases: ["acquired", "held", "error"]
                .map(|result| self.leases.get_or_create_owned(&with("result", result))),
        }
    }
}

/// The handles of one proxy service's shared-tier counters.
#[derive(Debug, Clone)]
pub struct SharedCacheMetrics {
    /// By [`SharedLookup`] order: hit, miss, error, skipped.
    lookups: [Counter; 4],
    /// By [`SharedOp`] order.
    timeouts: Vec<Counter>,
    /// By [`SharedOp`] order.
    errors: Vec<Counter>,
    /// By [`SharedOp`] order.
    durations: Vec<Histogram>,
    /// By [`SharedWrite`] order: ok, error, skipped.
    writes: [Counter; 3],
    /// By [`SharedLease`] order: acquired, held, error.
    leases: [Counter; 3],
}

impl SharedCacheMetrics {
    /// Counts one lookup by what it found.
    pub fn lookup(&self, result: SharedLookup) {
        self.lookups[result as usize].inc();
    }

    /// Records one operation's latency and, when it failed, why.
    pub fn op(&self, op: SharedOp, seconds: f64, failure: Option<SharedFailure>) {
        if let Some(histogram) = self.durations.get(op.index()) {
            histogram.observe(seconds);
        }
        let counters = match failure {
            None => return,
            Some(SharedFailure::Timeout) => &self.timeouts,
            Some(SharedFailure::Error) => &self.errors,
        };
        if let Some(counter) = counters.get(op.index()) {
            counter.inc();
        }
    }

    /// Counts one write-through by its outcome.
    pub fn write(&self, outcome: SharedWrite) {
        self.writes[outcome as usize].inc();
    }

    /// Counts one lease attempt by its result.
    pub fn lease(&self, result: SharedLease) {
        self.leases[result as usize].inc();
    }
}
