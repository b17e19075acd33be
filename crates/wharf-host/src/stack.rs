//! The one place where a service gets the host's qualities.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tracing::Instrument;
use wharf_config::LimitsConfig;
use wharf_limits::{Bulkhead, CallPermit};
use wharf_metrics::Metrics;

use crate::body::{guard_body, ResponseBody};
use crate::call::{Inflight, Phase};
use crate::layers::count::{CallCount, Count};
use crate::layers::throttle::Throttle;
use crate::layers::trace::{CallTrace, Trace};
use crate::request_body::RequestBody;
use crate::service::{CallFuture, HostService};

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
    // The layers read no request fields: the stack reads what its service reads.
    // The same holds for which requests it takes.
    let reads_request_fields = service.reads_request_fields();
    let filter = service.filter_handle();
    let stack = Arc::new(Stack {
        trace: Trace::new(name, inflight.clone()),
        count: Count::new(service_metrics.clone()),
        throttle: Throttle::new(bulkhead, service_metrics),
        service,
    });
    let hosted = HostService::new(move |request| stack.call(request))
        .reading_request_fields(reads_request_fields);
    match filter {
        Some(filter) => hosted.taking_only(filter),
        None => hosted,
    }
}

/// A service and its layers.
struct Stack {
    trace: Trace,
    count: Count,
    throttle: Throttle,
    service: HostService,
}

impl Stack {
    /// One call through the layers, outermost first:
    ///
    /// 1. trace — call id, `call` span, `/debug/inflight` entry; outermost so
    ///    that time spent queued is visible and traced too;
    /// 2. count — calls by status and their duration, throttled 503s included;
    /// 3. throttle — the service's own bulkhead (slots + bounded queue), so a
    ///    saturated service never holds up another.
    ///
    /// With a slot free (the common case) the call's future is the service's
    /// plus the guards, nothing more; only a call that has to queue gets an
    /// async block of its own.
    fn call(self: &Arc<Self>, mut request: Request<RequestBody>) -> CallFuture {
        // One clock read for both layers' start (the inflight list's age, the duration).
        let started = Instant::now();
        let trace = self.trace.begin(&mut request, started);
        let count = self.count.begin(started);
        match self.throttle.try_admit(trace.call(), trace.span()) {
            Some(permit) => {
                let mut inner = trace.span().in_scope(|| self.service.call(request));
                let guards = CallGuards {
                    _permit: Some(permit),
                    count,
                    trace,
                };
                match inner.take_ready() {
                    // Answered at once (a hit, an error): no future at all.
                    Some(response) => CallFuture::ready(guards.respond(response)),
                    None => CallFuture::new(Admitted {
                        inner: inner.into_boxed(),
                        guards: Some(guards),
                    }),
                }
            }
            None => {
                let stack = self.clone();
                CallFuture::new(async move { stack.queued(request, trace, count).await })
            }
        }
    }

    /// A call that found every slot taken: it waits in the bulkhead's queue.
    async fn queued(
        &self,
        request: Request<RequestBody>,
        trace: CallTrace,
        count: CallCount,
    ) -> Response<ResponseBody> {
        let span = trace.span().clone();
        let admitted = self
            .throttle
            .admit(trace.call())
            .instrument(span.clone())
            .await;
        let (inner, permit) = match admitted {
            Ok(permit) => (
                span.in_scope(|| self.service.call(request)).into_boxed(),
                Some(permit),
            ),
            Err(refusal) => (CallFuture::ready(refusal).into_boxed(), None),
        };
        Admitted {
            inner,
            guards: Some(CallGuards {
                _permit: permit,
                count,
                trace,
            }),
        }
        .await
    }
}

/// What a call holds until its response body is done. Fields drop in
/// order: the slot is freed, then the call is counted, then its trace ends.
struct CallGuards {
    _permit: Option<CallPermit>,
    count: CallCount,
    trace: CallTrace,
}

impl CallGuards {
    /// The call's response, its body holding the guards.
    fn respond(mut self, response: Response<ResponseBody>) -> Response<ResponseBody> {
        self.trace.call().enter_in(self.trace.span(), Phase::Body);
        self.count.set_status(response.status().as_u16());
        guard_body(response, self)
    }
}

/// An admitted call: the service's future, polled inside the call's span;
/// its response body gets the guards.
struct Admitted {
    /// The service's future (boxed: only the pointer is kept here).
    inner: Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>,
    guards: Option<CallGuards>,
}

impl Future for Admitted {
    type Output = Response<ResponseBody>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(guards) = this.guards.as_mut() else {
            return Poll::Pending; // polled after completion: never ready again
        };
        let response = {
            let _entered = guards.trace.span().enter();
            match this.inner.as_mut().poll(cx) {
                Poll::Ready(response) => response,
                Poll::Pending => return Poll::Pending,
            }
        };
        let Some(guards) = this.guards.take() else {
            return Poll::Pending;
        };
        let _entered = guards.trace.span().clone().entered();
        Poll::Ready(guards.respond(response))
    }
}
