//! Counters of a `queue` service: messages published, delivered, retried, dead-lettered and
//! redelivered, dead letters the broker did not store, and the messages still pending in the
//! broker.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::{names, Labels};

/// How a publish ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker stored the message (202).
    Ok,
    /// The broker had the message id already (202, stored once).
    Duplicate,
    /// Not acknowledged by the broker (the client got an error).
    Error,
}

/// Why a delivery attempt will be retried, as the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The backend answered with a status other than 2xx.
    Rejected,
    /// The backend did not answer in time.
    Timeout,
    /// The backend could not be connected to (held, not counted as an attempt).
    Unreachable,
}

/// The families, registered once by [`crate::Metrics::new`].
pub(crate) struct QueueFamilies {
    published: Family<Labels, Counter>,
    delivered: Family<Labels, Counter>,
    retried: Family<Labels, Counter>,
    dead_lettered: Family<Labels, Counter>,
    dead_letter_failed: Family<Labels, Counter>,
    redelivered: Family<Labels, Counter>,
    pending: Family<Labels, Gauge>,
}

impl QueueFamilies {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let families = Self {
            published: Family::default(),
            delivered: Family::default(),
            retried: Family::default(),
            dead_lettered: Family::default(),
            dead_letter_failed: Family::default(),
            redelivered: Family::default(),
            pending: Family::default(),
        };
        let counter_name = |name: &'static str| name.trim_end_matches("_total");
        registry.register(
            counter_name(names::QUEUE_PUBLISHED_TOTAL),
            "Queue messages published, by outcome",
            families.published.clone(),
        );
        registry.register(
            counter_name(names::QUEUE_DELIVERED_TOTAL),
            "Queue messages delivered to the backend and acknowledged",
            families.delivered.clone(),
        );
        registry.register(
            counter_name(names::QUEUE_RETRIED_TOTAL),
            "Queue delivery attempts that failed and will be retried, by reason",
            families.retried.clone(),
        );
        registry.register(
            counter_name(names::QUEUE_DEAD_LETTERED_TOTAL),
            "Queue messages sent to the dead-letter subject",
            families.dead_lettered.clone(),
        );
        registry.register(
            counter_name(names::QUEUE_DEAD_LETTER_FAILED_TOTAL),
            "Queue dead letters the broker did not store (kept, and tried again)",
            families.dead_letter_failed.clone(),
        );
        registry.register(
            counter_name(names::QUEUE_REDELIVERED_TOTAL),
            "Queue deliveries of a message the broker had delivered before",
            families.redelivered.clone(),
        );
        registry.register(
            names::QUEUE_PENDING,
            "Queue messages accepted but not yet acknowledged (sampled from the consumer)",
            families.pending.clone(),
        );
        families
    }

    /// Creates every series of `service` at zero and returns the handles.
    pub(crate) fn handles(&self, service: &str) -> QueueMetrics {
        let labels = vec![("service", service.to_owned())];
        let with = |name: &'static str, value: &str| {
            vec![("service", service.to_owned()), (name, value.to_owned())]
        };
        QueueMetrics {
            published: ["ok", "duplicate", "error"].map(|outcome| {
                self.published
                    .get_or_create_owned(&with("outcome", outcome))
            }),
            delivered: self.delivered.get_or_create_owned(&labels),
            retried: ["rejected", "timeout", "unreachable"]
                .map(|reason| self.retried.get_or_create_owned(&with("reason", reason))),
            dead_lettered: self.dead_lettered.get_or_create_owned(&labels),
            dead_letter_failed: self.dead_letter_failed.get_or_create_owned(&labels),
            redelivered: self.redelivered.get_or_create_owned(&labels),
            pending: self.pending.get_or_create_owned(&labels),
        }
    }
}

/// The handles of one queue service's counters.
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    /// By [`PublishOutcome`] order: ok, duplicate, error.
    published: [Counter; 3],
    delivered: Counter,
    /// By [`RetryReason`] order: rejected, timeout, unreachable.
    retried: [Counter; 3],
    dead_lettered: Counter,
    dead_letter_failed: Counter,
    redelivered: Counter,
    pending: Gauge,
}

impl QueueMetrics {
    /// Counts one publish by its outcome.
    pub fn published(&self, outcome: PublishOutcome) {
        self.published[outcome as usize].inc();
    }

    /// Counts one message delivered and acknowledged.
    pub fn delivered(&self) {
        self.delivered.inc();
    }

    /// Counts one failed attempt that will be retried.
    pub fn retried(&self, reason: RetryReason) {
        self.retried[reason as usize].inc();
    }

    /// Counts one message sent to the dead-letter subject.
    pub fn dead_lettered(&self) {
        self.dead_lettered.inc();
    }

    /// Counts one dead letter the broker did not store.
    pub fn dead_letter_failed(&self) {
        self.dead_letter_failed.inc();
    }

    /// Counts one delivery of a message the broker had delivered before.
    pub fn redelivered(&self) {
        self.redelivered.inc();
    }

    /// Sets the pending gauge (from the consumer's info).
    pub fn set_pending(&self, pending: u64) {
        crate::set_gauge(&self.pending, pending);
    }
}
