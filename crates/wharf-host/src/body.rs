//! The response body type every service returns, and small constructors.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

/// The error a streamed response body may end with. Ending with an error
/// makes the host abort the response (close the connection, or omit the
/// chunked terminator), which is how a truncated origin body reaches the
/// client as a truncation.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: fixed bytes or a stream of chunks.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding exactly `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> ResponseBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}
