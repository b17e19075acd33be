//! Routes one call to its service, after the host's own checks on the
//! request head.

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;

use crate::body::{guard_body, ResponseBody};
use crate::call::ClientAddr;
use crate::error::json_error;
use crate::services::SharedRegistry;
use crate::session::CallOnSession;

/// What dispatch needs, shared by every connection.
pub(crate) struct Dispatcher {
    pub(crate) registry: SharedRegistry,
    pub(crate) max_header_bytes: usize,
}

/// Answers one request: 431 for an oversized head, 404 when no service
/// is mounted at the path, else whatever the service answers. `on_session`
/// stays alive until the response body is done.
pub(crate) async fn dispatch(
    dispatcher: Arc<Dispatcher>,
    on_session: CallOnSession,
    client: Option<ClientAddr>,
    mut request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    if let Some(client) = client {
        request.extensions_mut().insert(client);
    }
    let response = route(&dispatcher, request).await;
    Ok(guard_body(response, on_session))
}

async fn route(dispatcher: &Dispatcher, request: Request<Incoming>) -> Response<ResponseBody> {
    let head_bytes = request_head_bytes(&request);
    if head_bytes > dispatcher.max_header_bytes {
        return json_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!(
                "request head is {head_bytes} bytes, over max_header_bytes ({})",
                dispatcher.max_header_bytes
            ),
        );
    }
    // One read lock per call to take the current registry; a reload
    // swaps it whole, so the call sees either the old or the new set.
    let registry = dispatcher
        .registry
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let Some(mounted) = registry.find(request.uri().path()) else {
        return json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no service at {}", request.uri().path()),
        );
    };
    let call = mounted.service.call(request);
    drop(registry);
    call.await
}

/// Size of the request line and headers as sent (approximately, for h2).
fn request_head_bytes<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len()
        + request
            .uri()
            .path_and_query()
            .map_or(1, |pq| pq.as_str().len())
        + 12;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    line + headers
}
