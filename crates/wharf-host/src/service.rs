//! What a hosted service is, and how to make one from an async function.

use std::convert::Infallible;
use std::future::Future;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::util::BoxCloneSyncService;

use crate::body::ResponseBody;

/// A hosted service: answers every request with a response (errors are
/// responses too, built with [`crate::error::json_error`]).
///
/// It must be always ready and lazy: `call` only builds the future, and
/// the work starts when it is polled. The host's layers rely on this: the
/// bulkhead creates the inner future at once and polls it only after a
/// slot is taken. [`handler`] makes such services.
pub type HostService = BoxCloneSyncService<Request<Incoming>, Response<ResponseBody>, Infallible>;

/// Makes a [`HostService`] from an async function.
///
/// ```
/// use wharf_host::{body, handler, HostService};
/// let hello: HostService = handler(|_request| async { http::Response::new(body::full("hello")) });
/// ```
pub fn handler<F, Fut>(f: F) -> HostService
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    BoxCloneSyncService::new(tower::service_fn(move |request| {
        let response = f(request);
        async move { Ok::<_, Infallible>(response.await) }
    }))
}
