//! What a hosted service is, and how to make one from an async function.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use crate::body::ResponseBody;
use crate::registry::RequestFilter;
use crate::request_body::RequestBody;

/// The future of one call: a response, always (errors are responses too).
///
/// A call answered without waiting (a cache hit, an error) is [`CallFuture::ready`] and
/// costs no allocation; one that waits boxes its future ([`CallFuture::new`]).
pub enum CallFuture {
    /// The answer, already there (taken on the first poll).
    Ready(Option<Response<ResponseBody>>),
    /// A call in progress.
    Pending(Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>),
}

impl CallFuture {
    /// An answered call.
    pub fn ready(response: Response<ResponseBody>) -> Self {
        CallFuture::Ready(Some(response))
    }

    /// A call that has to wait.
    pub fn new(future: impl Future<Output = Response<ResponseBody>> + Send + 'static) -> Self {
        CallFuture::Pending(Box::pin(future))
    }

    /// The call as a boxed future, for a caller that keeps it next to other state: a
    /// pending call is already boxed, so only the pointer is kept (a `CallFuture` is as
    /// large as a whole response).
    pub(crate) fn into_boxed(self) -> Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>> {
        match self {
            CallFuture::Pending(future) => future,
            ready => Box::pin(ready),
        }
    }

    /// The answer, if the call needs no polling to have one.
    pub fn take_ready(&mut self) -> Option<Response<ResponseBody>> {
        match self {
            CallFuture::Ready(response) => response.take(),
            CallFuture::Pending(_) => None,
        }
    }
}

impl Future for CallFuture {
    type Output = Response<ResponseBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            // Polled again after its answer: never ready again.
            CallFuture::Ready(response) => response.take().map_or(Poll::Pending, Poll::Ready),
            CallFuture::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for CallFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallFuture::Ready(_) => f.write_str("CallFuture::Ready"),
            CallFuture::Pending(_) => f.write_str("CallFuture::Pending"),
        }
    }
}

/// A hosted service: answers every request with a response (errors are
/// responses too, built with [`crate::error::json_error`]).
///
/// Calling it takes `&self` and costs one reference-counted handle, never a
/// copy of the service: the host dispatches every request through it. Its
/// work starts when the returned future is first polled.
/// [`handler`] makes one from an async function.
#[derive(Clone)]
pub struct HostService {
    call: Arc<dyn Fn(Request<RequestBody>) -> CallFuture + Send + Sync>,
    /// Whether its calls read the request's header fields (see
    /// [`HostService::without_request_fields`]).
    reads_request_fields: bool,
    /// Which requests under its mount it takes, when not all (see
    /// [`HostService::taking_only`]).
    filter: Option<Arc<dyn RequestFilter>>,
}

impl HostService {
    /// A service from a function that returns each call's future.
    pub fn new<F>(call: F) -> Self
    where
        F: Fn(Request<RequestBody>) -> CallFuture + Send + Sync + 'static,
    {
        Self {
            call: Arc::new(call),
            reads_request_fields: true,
            filter: None,
        }
    }

    /// The same service, declared to read none of a request's header fields (its method,
    /// target, body and extensions only): the host then spares an HTTP/1.1 request the map
    /// of its fields, and `headers()` is empty, unless the request has a field the host's
    /// own rules read (`connection`, `transfer-encoding`, `content-length`, `expect`; see
    /// `wharf_http1::request::parse_request_head_for`). HTTP/2 requests keep their map.
    pub fn without_request_fields(self) -> Self {
        self.reading_request_fields(false)
    }

    /// The same service, reading the request's header fields or not as `reads` says: for a
    /// service made around another (the host's layers), which reads what that one reads.
    pub(crate) fn reading_request_fields(mut self, reads: bool) -> Self {
        self.reads_request_fields = reads;
        self
    }

    /// Whether its calls read the request's header fields.
    pub fn reads_request_fields(&self) -> bool {
        self.reads_request_fields
    }

    /// The same service, taking only the requests `filter` admits (a route's `methods` and
    /// `match_headers`): a request it does not admit goes on to the next service mounted at
    /// the same prefix, as [`Mount::Prefix`](crate::Mount::Prefix) says.
    pub fn taking_only(mut self, filter: Arc<dyn RequestFilter>) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Its filter, shared, for a service made around it (the host's layers), which takes
    /// what it takes.
    pub(crate) fn filter_handle(&self) -> Option<Arc<dyn RequestFilter>> {
        self.filter.clone()
    }

    /// Whether `other` is a handle to this very service.
    #[cfg(test)]
    pub(crate) fn is(&self, other: &HostService) -> bool {
        Arc::ptr_eq(&self.call, &other.call)
    }

    /// Its filter, if it takes only some of the requests under its mount.
    pub(crate) fn filter(&self) -> Option<&dyn RequestFilter> {
        self.filter.as_deref()
    }

    /// Starts one call.
    pub fn call(&self, request: Request<RequestBody>) -> CallFuture {
        (self.call)(request)
    }
}

impl std::fmt::Debug for HostService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostService")
    }
}

/// Makes a [`HostService`] from an async function.
///
/// ```
/// use wharf_host::{body, handler, HostService};
/// let hello: HostService = handler(|_request| async { http::Response::new(body::full("hello")) });
/// ```
pub fn handler<F, Fut>(f: F) -> HostService
where
    F: Fn(Request<RequestBody>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    HostService::new(move |request| CallFuture::new(f(request)))
}
