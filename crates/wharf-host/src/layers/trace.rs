//! Trace: each call gets an id, a `call` span (fields `call_id`, `service`,
//! `method`, `target`) and an entry in `/debug/inflight`, which it leaves
//! when its response body is done.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::body::{guard_body, ResponseBody};
use crate::call::{CallContext, Inflight, InflightGuard, Phase};
use crate::layers::CallFuture;
use crate::service::HostService;

/// Traces a service's calls.
#[derive(Clone)]
pub struct TraceLayer {
    service: Arc<str>,
    inflight: Arc<Inflight>,
}

impl TraceLayer {
    /// Traces calls of `service`, listing them in `inflight`.
    pub fn new(service: &str, inflight: Arc<Inflight>) -> Self {
        Self {
            service: service.into(),
            inflight,
        }
    }
}

impl Layer<HostService> for TraceLayer {
    type Service = Trace;

    fn layer(&self, inner: HostService) -> Trace {
        Trace {
            inner,
            service: self.service.clone(),
            inflight: self.inflight.clone(),
        }
    }
}

/// A traced service.
#[derive(Clone)]
pub struct Trace {
    inner: HostService,
    service: Arc<str>,
    inflight: Arc<Inflight>,
}

/// Closes the call's record when the body is done.
struct TraceDone {
    call: CallContext,
    span: tracing::Span,
    _inflight: InflightGuard,
}

impl Drop for TraceDone {
    fn drop(&mut self) {
        let _entered = self.span.enter();
        self.call.enter(Phase::BodyDone);
    }
}

impl Service<Request<Incoming>> for Trace {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = CallFuture<Result<Response<ResponseBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Self::Future {
        let (call, guard) =
            self.inflight
                .begin(self.service.clone(), request.method(), request.uri());
        let span = tracing::info_span!(
            "call",
            call_id = call.id(),
            service = %self.service,
            method = %request.method(),
            target = %request.uri(),
        );
        request.extensions_mut().insert(call.clone());
        let inner = self.inner.call(request);
        Box::pin(async move {
            let response = inner.instrument(span.clone()).await?;
            span.in_scope(|| call.enter(Phase::Body));
            let done = TraceDone {
                call,
                span,
                _inflight: guard,
            };
            Ok(guard_body(response, done))
        })
    }
}
