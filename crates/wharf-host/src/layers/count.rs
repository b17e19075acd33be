//! Count: `wharf_calls_total{service,code}` and
//! `wharf_call_duration_seconds{service}`, measured until the response body
//! is done (a streamed call lasts as long as its body).

use std::time::Instant;

use wharf_metrics::ServiceMetrics;

/// The `code` of a call that ended before it had a status: its client went
/// away first. nginx's 499 ("client closed request"), which no HTTP status
/// uses; 0 would read as a status in every dashboard's `code` breakdown.
pub const CLIENT_CLOSED: u16 = 499;

/// Counts a service's calls.
#[derive(Clone)]
pub struct Count {
    metrics: ServiceMetrics,
}

impl Count {
    /// Counts into `metrics`.
    pub fn new(metrics: ServiceMetrics) -> Self {
        Self { metrics }
    }

    /// Starts timing a call that `started` then.
    pub(crate) fn begin(&self, started: Instant) -> CallCount {
        CallCount {
            metrics: self.metrics.clone(),
            code: CLIENT_CLOSED,
            started,
        }
    }
}

/// One call being counted; recorded (status and duration) when dropped.
pub(crate) struct CallCount {
    metrics: ServiceMetrics,
    code: u16,
    started: Instant,
}

impl CallCount {
    /// The status the call answered with.
    pub(crate) fn set_status(&mut self, code: u16) {
        self.code = code;
    }
}

impl Drop for CallCount {
    fn drop(&mut self) {
        self.metrics
            .call_done(self.code, self.started.elapsed().as_secs_f64());
    }
}
