//! Everything that can go wrong in a proxy call, and the one mapping from
//! an error to its status, JSON `error` kind and fault side.

use std::time::Duration;

use http::StatusCode;

use crate::destination::{Refusal, TargetError};
pub(crate) use wharf_host::error::error_chain;

/// Who caused a failure: decides the status class and whether a retry helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultSide {
    /// The request was wrong (4xx).
    Client,
    /// The origin failed or was too slow (502/504).
    Origin,
}

/// A proxy call that could not be served normally. `Clone` because a
/// fill's failure reaches every call reading that fill.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    /// The method is neither GET nor HEAD.
    #[error("method {0} is not allowed: the proxy only serves GET and HEAD")]
    Method(http::Method),
    /// The query string lacks `url`.
    #[error(
        "missing query parameter `url` (e.g. ?url=https%3A%2F%2Fexample.org%2F&cacheDuration=60)"
    )]
    MissingUrl,
    /// The query string could not be decoded.
    #[error("query parameter `{name}` is not valid percent-encoded UTF-8")]
    BadEncoding {
        /// The parameter.
        name: &'static str,
    },
    /// A parameter appears twice with possibly different values.
    #[error("query parameter `{0}` is given more than once")]
    Repeated(&'static str),
    /// `url` is not a usable target.
    #[error("url {url:?}: {source}")]
    Target {
        /// The value received.
        url: String,
        /// Why it is unusable.
        source: TargetError,
    },
    /// `cacheDuration` is not whole seconds.
    #[error("cacheDuration {0:?} is not a whole number of seconds (e.g. cacheDuration=60)")]
    CacheDuration(String),
    /// `cacheDuration` is whole seconds, but more digits than any cache keeps.
    #[error("cacheDuration {0:?} is too large: at most 10 digits (max_ttl caps it anyway)")]
    CacheDurationTooLarge(String),
    /// The destination is not allowed.
    #[error("destination {host} refused: {source}")]
    Refused {
        /// Host as written in the url.
        host: String,
        /// Which rule refused it.
        source: Refusal,
    },
    /// The origin could not be reached or answered with something invalid.
    #[error("origin {origin}: {message}")]
    OriginUnavailable {
        /// scheme://host:port of the origin.
        origin: String,
        /// What went wrong.
        message: String,
    },
    /// The origin did not answer in time.
    #[error("origin {origin}: {what} after {after:?}")]
    OriginTimeout {
        /// scheme://host:port of the origin.
        origin: String,
        /// Which deadline passed: "no connection", "no response headers", "body not complete".
        what: &'static str,
        /// The configured timeout.
        after: Duration,
    },
    /// The origin's body ended early, was reset or was malformed.
    #[error("origin {origin}: body broken after {received} bytes: {message}")]
    OriginBody {
        /// scheme://host:port of the origin.
        origin: String,
        /// Bytes received before the break.
        received: u64,
        /// What broke.
        message: String,
    },
}

impl ProxyError {
    /// The status the client gets for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::MissingUrl
            | ProxyError::BadEncoding { .. }
            | ProxyError::Repeated(_)
            | ProxyError::Target { .. }
            | ProxyError::CacheDuration(_)
            | ProxyError::CacheDurationTooLarge(_) => StatusCode::BAD_REQUEST,
            ProxyError::Refused { .. } => StatusCode::FORBIDDEN,
            ProxyError::OriginUnavailable { .. } | ProxyError::OriginBody { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::OriginTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The JSON `error` kind for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::Method(_) => "method_not_allowed",
            ProxyError::MissingUrl
            | ProxyError::BadEncoding { .. }
            | ProxyError::Repeated(_)
            | ProxyError::Target { .. }
            | ProxyError::CacheDuration(_)
            | ProxyError::CacheDurationTooLarge(_) => "bad_request",
            ProxyError::Refused { .. } => "forbidden",
            ProxyError::OriginUnavailable { .. } | ProxyError::OriginBody { .. } => "bad_gateway",
            ProxyError::OriginTimeout { .. } => "gateway_timeout",
        }
    }

    /// Who is at fault.
    pub fn side(&self) -> FaultSide {
        if self.status().is_client_error() {
            FaultSide::Client
        } else {
            FaultSide::Origin
        }
    }
}
