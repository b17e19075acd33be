//! What a hosted service is, and how to make one from an async function.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};

use crate::body::ResponseBody;
use crate::request_body::RequestBody;

/// The future of one call: a response, always (errors are responses too).
pub type CallFuture = Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>;

/// A hosted service: answers every request with a response (errors are
/// responses too, built with [`crate::error::json_error`]).
///
/// Calling it takes `&self` and costs one reference-counted handle, never a
/// copy of the service: the host dispatches every request through it. Its
/// work starts when the returned future is first polled.
/// [`handler`] makes one from an async function.
#[derive(Clone)]
pub struct HostService(Arc<dyn Fn(Request<RequestBody>) -> CallFuture + Send + Sync>);

impl HostService {
    /// A service from a function that returns each call's future.
    pub fn new<F>(call: F) -> Self
    where
        F: Fn(Request<RequestBody>) -> CallFuture + Send + Sync + 'static,
    {
        Self(Arc::new(call))
    }

    /// Starts one call.
    pub fn call(&self, request: Request<RequestBody>) -> CallFuture {
        (self.0)(request)
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
    HostService::new(move |request| Box::pin(f(request)))
}
