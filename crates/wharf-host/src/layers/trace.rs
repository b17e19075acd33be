//! Trace: each call gets an id, a `call` span (fields `call_id`, `service`,
//! `method`, `target`) and an entry in `/debug/inflight`, which it leaves
//! when its response body is done.

use std::sync::Arc;
use std::time::Instant;

use http::Request;

use crate::call::{CallContext, Inflight, InflightGuard, Phase};

/// Traces a service's calls.
#[derive(Clone)]
pub struct Trace {
    service: Arc<str>,
    inflight: Arc<Inflight>,
}

impl Trace {
    /// Traces calls of `service`, listing them in `inflight`.
    pub fn new(service: &str, inflight: Arc<Inflight>) -> Self {
        Self {
            service: service.into(),
            inflight,
        }
    }

    /// Registers the call (which `started` then), opens its span and puts its
    /// [`CallContext`] in the request's extensions for the service to report phases.
    pub(crate) fn begin<B>(&self, request: &mut Request<B>, started: Instant) -> CallTrace {
        let (call, guard) = self.inflight.begin(
            self.service.clone(),
            request.method(),
            request.uri(),
            started,
        );
        let span = tracing::info_span!(
            "call",
            call_id = call.id(),
            service = %self.service,
            method = %request.method(),
            target = %request.uri(),
        );
        request.extensions_mut().insert(call.clone());
        CallTrace {
            call,
            span,
            _inflight: guard,
        }
    }
}

/// One traced call; its `body_done` phase and the end of its in-flight
/// entry come when it is dropped.
pub(crate) struct CallTrace {
    call: CallContext,
    span: tracing::Span,
    _inflight: InflightGuard,
}

impl CallTrace {
    /// The call's context.
    pub(crate) fn call(&self) -> &CallContext {
        &self.call
    }

    /// The call's span.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }
}

impl Drop for CallTrace {
    fn drop(&mut self) {
        let _entered = self.span.enter();
        self.call.enter(Phase::BodyDone);
    }
}
