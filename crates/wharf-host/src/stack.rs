//! The one place where a service gets the host's qualities.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;
use wharf_config::LimitsConfig;
use wharf_limits::{Bulkhead, CallPermit};
use wharf_metrics::Metrics;

use crate::body::{guard_body, ResponseBody};
use crate::call::{Inflight, Phase};
use crate::layers::count::{CallCount, Count};
use crate::layers::throttle::Throttle;
use crate::layers::trace::{CallTrace, Trace};
use crate::service::HostService;

/// Wraps `service` in the host's layers (see [`Stack::call`] for their
/// order). The layers are plain parts of one future, not a chain of boxed
/// services: a call costs one allocation for the stack's future and one
/// for the body guard, whatever the number of layers.
pub(crate) fn hosted(
    name: &str,
    limits: &LimitsConfig,
    metrics: &Metrics,
    inflight: &Arc<Inflight>,
    service: HostService,
) -> HostService {
    let service_metrics = metrics.service(name);
    let bulkhead = Arc::new(Bulkhead::new(
        limits.max_concurrent_calls,
        limits.max_queued_calls,
        limits.queue_timeout,
    ));
    let sampled = (bulkhead.clone(), service_metrics.clone());
    metrics.set_sampler(
        &format!("bulkhead:{name}"),
        Box::new(move || {
            let (bulkhead, metrics) = &sampled;
            let stats = bulkhead.stats();
            metrics.set_load(stats.processing, stats.queued, stats.percent_of_max_calls());
        }),
    );
    let stack = Arc::new(Stack {
        trace: Trace::new(name, inflight.clone()),
        count: Count::new(service_metrics.clone()),
        throttle: Throttle::new(bulkhead, service_metrics),
        service,
    });
    HostService::new(move |request| {
        let stack = stack.clone();
        Box::pin(async move { stack.call(request).await })
    })
}

/// A service and its layers.
struct Stack {
    trace: Trace,
    count: Count,
    throttle: Throttle,
    service: HostService,
}

/// What a call holds until its response body is done. Fields drop in
/// order: the slot is freed, then the call is counted, then its trace ends.
struct CallGuards {
    _permit: Option<CallPermit>,
    _count: CallCount,
    _trace: CallTrace,
}

impl Stack {
    /// One call through the layers, outermost first:
    ///
    /// 1. trace — call id, `call` span, `/debug/inflight` entry; outermost so
    ///    that time spent queued is visible and traced too;
    /// 2. count — calls by status and their duration, throttled 503s included;
    /// 3. throttle — the service's own bulkhead (slots + bounded queue), so a
    ///    saturated service never holds up another.
    async fn call(&self, mut request: Request<Incoming>) -> Response<ResponseBody> {
        let trace = self.trace.begin(&mut request);
        let span = trace.span().clone();
        let mut count = self.count.begin();
        let admitted = self
            .throttle
            .admit(trace.call())
            .instrument(span.clone())
            .await;
        let (response, permit) = match admitted {
            Ok(permit) => {
                let response = self.service.call(request).instrument(span.clone()).await;
                span.in_scope(|| trace.call().enter(Phase::Body));
                (response, Some(permit))
            }
            Err(refusal) => (refusal, None),
        };
        count.set_status(response.status().as_u16());
        guard_body(
            response,
            CallGuards {
                _permit: permit,
                _count: count,
                _trace: trace,
            },
        )
    }
}
