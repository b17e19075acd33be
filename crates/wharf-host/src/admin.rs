//! The admin listener's endpoints: liveness and readiness.
//!
//! Bound separately from the service listener (loopback by default) so that
//! operators' probes neither count as sessions nor compete with calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::body::{full, ResponseBody};
use crate::error::json_error;

/// State the admin endpoints report on.
#[derive(Debug, Default)]
pub struct AdminState {
    /// Set once the service listener accepts calls; cleared when draining.
    pub ready: AtomicBool,
}

/// Answers one admin request.
pub fn respond(state: &Arc<AdminState>, request: &Request<Incoming>) -> Response<ResponseBody> {
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.ready.load(Ordering::Acquire) => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        path => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no admin endpoint at {path} (try /healthz or /readyz)"),
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
