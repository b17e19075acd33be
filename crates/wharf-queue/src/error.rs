//! What can go wrong with a publish, and its one mapping to status and JSON kind.

use std::time::Duration;

use http::StatusCode;

/// A publish that could not be accepted.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The method is not POST.
    #[error("method {0} is not allowed: a queue accepts POST")]
    Method(http::Method),
    /// `x-wharf-message-id` is not a usable id.
    #[error("x-wharf-message-id {0:?} is not a valid id: use 1 to 128 letters, digits, `-`, `_`, `.` or `:`")]
    BadId(String),
    /// The body is larger than the broker takes in one message.
    #[error("body over {limit} bytes, the broker's largest message")]
    TooLarge {
        /// The broker's `max_payload`.
        limit: usize,
    },
    /// The request body could not be read.
    #[error("request body: {0}")]
    Body(String),
    /// The broker is not reachable or not set up (yet).
    #[error("queue {stream}: broker not ready: {reason}")]
    NotReady {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
    },
    /// The broker refused or failed the publish.
    #[error("queue {stream}: publish not acknowledged: {reason}")]
    Publish {
        /// The stream.
        stream: String,
        /// What the broker or client said.
        reason: String,
    },
    /// No acknowledgement within `publish_timeout`.
    #[error("queue {stream}: no acknowledgement from the broker after {after:?}")]
    Timeout {
        /// The stream.
        stream: String,
        /// `publish_timeout`.
        after: Duration,
    },
}

impl QueueError {
    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            QueueError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            QueueError::BadId(_) | QueueError::Body(_) => StatusCode::BAD_REQUEST,
            QueueError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            QueueError::NotReady { .. }
            | QueueError::Publish { .. }
            | QueueError::Timeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The JSON `error` kind.
    pub fn kind(&self) -> &'static str {
        match self {
            QueueError::Method(_) => "method_not_allowed",
            QueueError::BadId(_) | QueueError::Body(_) => "bad_request",
            QueueError::TooLarge { .. } => "payload_too_large",
            QueueError::NotReady { .. }
            | QueueError::Publish { .. }
            | QueueError::Timeout { .. } => "queue_unavailable",
        }
    }

    /// Whether the client may retry (with the same `x-wharf-message-id`, de-duplicated).
    pub fn retryable(&self) -> bool {
        self.status() == StatusCode::SERVICE_UNAVAILABLE
    }
}
