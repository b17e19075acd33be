//! Why a request cannot be served, and the JSON error response for it.
//!
//! [`RequestError`] covers bad input only: the testbed never fails on its own. Each variant
//! maps to a status and a JSON `error` kind in [`RequestError::status`] and
//! [`RequestError::kind`]; the body is `{"error": kind, "message": Display}`, the shape SPEC §3
//! gives wharf's own errors.

use http::StatusCode;

use crate::respond::{json, Resp};

/// A request the testbed refuses.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// A number parameter that does not parse.
    #[error("{name}: {value:?} is not a whole number")]
    NotANumber {
        /// Query parameter or path part, e.g. `ms` or `/bytes/N`.
        name: &'static str,
        /// The value as sent.
        value: String,
    },
    /// A number parameter outside its range.
    #[error("{name}: {value} is outside {min}..={max}")]
    OutOfRange {
        /// Query parameter or path part.
        name: &'static str,
        /// The value as sent.
        value: u64,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// Any other bad parameter value.
    #[error("{name}: {value:?} {reason}")]
    Invalid {
        /// Query parameter or path part.
        name: String,
        /// The value as sent.
        value: String,
        /// What is wrong with it, e.g. `is not a valid header name`.
        reason: &'static str,
    },
    /// A parameter that has no default.
    #[error("{name}: missing (e.g. {example})")]
    Missing {
        /// Query parameter.
        name: &'static str,
        /// A working request.
        example: &'static str,
    },
    /// No endpoint at that path.
    #[error("no testbed endpoint at {path} (GET / lists them)")]
    NotFound {
        /// The request path.
        path: String,
    },
    /// The endpoint exists but not for that method.
    #[error("{path} does not accept {method} (allowed: {allowed})")]
    MethodNotAllowed {
        /// The request path.
        path: String,
        /// The request method.
        method: String,
        /// The methods it does accept, for the `allow` header.
        allowed: &'static str,
    },
    /// `/echo` got a body over its limit.
    #[error("request body over {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request body could not be read (the client went away or broke framing).
    #[error("reading the request body failed")]
    BodyRead(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl RequestError {
    /// The response status for this error.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::NotANumber { .. }
            | Self::OutOfRange { .. }
            | Self::Invalid { .. }
            | Self::Missing { .. }
            | Self::BodyRead(_) => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// The JSON `error` kind for this error.
    pub(crate) fn kind(&self) -> &'static str {
        match self.status() {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            _ => "bad_request",
        }
    }

    /// The JSON error response.
    pub(crate) fn into_response(self) -> Resp {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(&self);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        let mut resp = json(
            self.status(),
            &serde_json::json!({ "error": self.kind(), "message": message }),
        );
        if let Self::MethodNotAllowed { allowed, .. } = self {
            resp.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static(allowed));
        }
        resp
    }
}
