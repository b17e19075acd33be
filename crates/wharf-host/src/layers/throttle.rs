//! Throttle: the service's bulkhead. A call waits for a slot (phase
//! `queued`) or is refused at once with 503 and `retry-after`; the slot is
//! held until the response body is done.

use std::sync::Arc;

use http::{header, HeaderValue, Response, StatusCode};
use tracing::Span;
use wharf_limits::{Bulkhead, CallPermit, Throttled};
use wharf_metrics::ServiceMetrics;

use crate::body::ResponseBody;
use crate::call::{CallContext, Phase};
use crate::error::json_error;

/// Applies a [`Bulkhead`] to a service's calls.
#[derive(Clone)]
pub struct Throttle {
    bulkhead: Arc<Bulkhead>,
    metrics: ServiceMetrics,
}

impl Throttle {
    /// Throttles with `bulkhead`, counting refusals in `metrics`.
    pub fn new(bulkhead: Arc<Bulkhead>, metrics: ServiceMetrics) -> Self {
        Self { bulkhead, metrics }
    }

    /// A free slot for the call now, without queueing. Every call passes
    /// `queued`, if only for this instant (docs/tracing.md); `span` is the call's.
    pub(crate) fn try_admit(&self, call: &CallContext, span: &Span) -> Option<CallPermit> {
        call.enter_in(span, Phase::Queued);
        let permit = self.bulkhead.try_acquire()?;
        call.enter_in(span, Phase::Processing);
        Some(permit)
    }

    /// A slot for a call that [`Throttle::try_admit`] found none for (so it
    /// is in `queued` already), after waiting in the queue, or the 503 that
    /// refuses it. The caller polls this inside the call's span.
    pub(crate) async fn admit(
        &self,
        call: &CallContext,
    ) -> Result<CallPermit, Response<ResponseBody>> {
        match self.bulkhead.acquire().await {
            Ok(permit) => {
                call.enter(Phase::Processing);
                Ok(permit)
            }
            Err(throttled) => {
                self.metrics.throttled();
                Err(refusal(throttled))
            }
        }
    }
}

fn refusal(throttled: Throttled) -> Response<ResponseBody> {
    let message = match throttled {
        Throttled::QueueFull => "service busy: every call slot is taken and the queue is full",
        Throttled::QueueTimeout => "service busy: no call slot freed up within queue_timeout",
    };
    let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, "throttled", message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
