//! Throttle: the service's bulkhead. A call waits for a slot (phase
//! `queued`) or is refused at once with 503 and `retry-after`; the slot is
//! held until the response body is done.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tower::{Layer, Service};
use wharf_limits::{Bulkhead, Throttled};
use wharf_metrics::ServiceMetrics;

use crate::body::{guard_body, ResponseBody};
use crate::call::{CallContext, Phase};
use crate::error::json_error;
use crate::layers::CallFuture;
use crate::service::HostService;

/// Applies a [`Bulkhead`] to a service.
#[derive(Clone)]
pub struct ThrottleLayer {
    bulkhead: Arc<Bulkhead>,
    metrics: ServiceMetrics,
}

impl ThrottleLayer {
    /// Throttles with `bulkhead`, counting refusals in `metrics`.
    pub fn new(bulkhead: Arc<Bulkhead>, metrics: ServiceMetrics) -> Self {
        Self { bulkhead, metrics }
    }
}

impl Layer<HostService> for ThrottleLayer {
    type Service = Throttle;

    fn layer(&self, inner: HostService) -> Throttle {
        Throttle {
            inner,
            bulkhead: self.bulkhead.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// A service behind a bulkhead.
#[derive(Clone)]
pub struct Throttle {
    inner: HostService,
    bulkhead: Arc<Bulkhead>,
    metrics: ServiceMetrics,
}

impl Service<Request<Incoming>> for Throttle {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = CallFuture<Result<Response<ResponseBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is the bulkhead's, decided per call in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let bulkhead = self.bulkhead.clone();
        let metrics = self.metrics.clone();
        let call = request.extensions().get::<CallContext>().cloned();
        // Host services do their work when polled, not in `call`: the inner
        // future is created now and only polled once a slot is taken.
        let inner = self.inner.call(request);
        Box::pin(async move {
            let enter = |phase| {
                if let Some(call) = &call {
                    call.enter(phase);
                }
            };
            enter(Phase::Queued);
            let permit = match bulkhead.acquire().await {
                Ok(permit) => permit,
                Err(throttled) => {
                    metrics.throttled();
                    return Ok(refusal(throttled));
                }
            };
            enter(Phase::Processing);
            let response = inner.await?;
            Ok(guard_body(response, permit))
        })
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
