//! Count: `wharf_calls_total{service,code}` and
//! `wharf_call_duration_seconds{service}`, measured until the response body
//! is done (a streamed call lasts as long as its body).

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Layer, Service};
use wharf_metrics::ServiceMetrics;

use crate::body::{guard_body, ResponseBody};
use crate::layers::CallFuture;
use crate::service::HostService;

/// Counts a service's calls.
#[derive(Clone)]
pub struct CountLayer {
    metrics: ServiceMetrics,
}

impl CountLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: ServiceMetrics) -> Self {
        Self { metrics }
    }
}

impl Layer<HostService> for CountLayer {
    type Service = Count;

    fn layer(&self, inner: HostService) -> Count {
        Count {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// A counted service.
#[derive(Clone)]
pub struct Count {
    inner: HostService,
    metrics: ServiceMetrics,
}

/// Records the call when the response body is done.
struct CallDone {
    metrics: ServiceMetrics,
    code: u16,
    started: Instant,
}

impl Drop for CallDone {
    fn drop(&mut self) {
        self.metrics
            .call_done(self.code, self.started.elapsed().as_secs_f64());
    }
}

impl Service<Request<Incoming>> for Count {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = CallFuture<Result<Response<ResponseBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let inner = self.inner.call(request);
        Box::pin(async move {
            let response = inner.await?;
            let done = CallDone {
                metrics,
                code: response.status().as_u16(),
                started,
            };
            Ok(guard_body(response, done))
        })
    }
}
