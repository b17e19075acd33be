//! What can go wrong forwarding a call, and its status and JSON kind.

use std::time::Duration;

use http::StatusCode;

/// A route call that could not be forwarded normally.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The method is not in the route's `methods`.
    #[error("method {method} is not routed here (allowed: {allowed})")]
    Method {
        /// The request's method.
        method: http::Method,
        /// The route's methods, comma-separated.
        allowed: String,
    },
    /// A `match_headers` entry did not match.
    #[error("no route matches: header {0} is missing or different")]
    HeaderMismatch(String),
    /// Every attempt failed before a response head arrived.
    #[error("backend {backend}: {message}")]
    Unavailable {
        /// The last backend tried.
        backend: String,
        /// What went wrong there.
        message: String,
    },
    /// The backend sent no response head within `timeout`.
    #[error("backend {backend}: no response headers after {after:?}")]
    Timeout {
        /// The backend.
        backend: String,
        /// The configured timeout.
        after: Duration,
    },
}

impl RouteError {
    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            RouteError::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            RouteError::HeaderMismatch(_) => StatusCode::NOT_FOUND,
            RouteError::Unavailable { .. } => StatusCode::BAD_GATEWAY,
            RouteError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The JSON `error` kind.
    pub fn kind(&self) -> &'static str {
        match self {
            RouteError::Method { .. } => "method_not_allowed",
            RouteError::HeaderMismatch(_) => "not_found",
            RouteError::Unavailable { .. } => "bad_gateway",
            RouteError::Timeout { .. } => "gateway_timeout",
        }
    }
}
