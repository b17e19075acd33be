//! What can go wrong in an exchange with an upstream, and whether it is safe to try again.

use std::io;

use wharf_http1::MessageError;

/// A connection opened ahead that the idle pool would not keep ([`crate::KeepFailure`]): the
/// pool's caps are reached, or the open sessions may need its descriptor. It was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no room in the idle pool (its caps, or no descriptor to spare)")]
pub struct NoRoom;

/// An exchange that did not produce a usable response head, or a body that broke.
///
/// `Display` says what happened in lowercase, without the upstream's name: callers add it
/// (`origin http://a.example:80: connection closed before a response head`).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Writing the request failed.
    #[error("sending the request failed")]
    Write(#[source] io::Error),
    /// Reading the response failed (reset, or a TLS error).
    #[error("reading the response failed")]
    Read(#[source] io::Error),
    /// The upstream closed the connection before a complete response head.
    #[error("connection closed before a response head ({received} bytes received)")]
    ClosedBeforeHead {
        /// Bytes of the head received before the close.
        received: usize,
    },
    /// The response head is not valid HTTP/1.x.
    #[error("malformed response head: {0}")]
    MalformedHead(String),
    /// The response head is larger than the client accepts.
    #[error("response head larger than {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The response framing is invalid (bad content-length, unknown transfer coding).
    #[error("invalid response framing: {0}")]
    Framing(String),
    /// The body ended before its declared end: EOF inside a content-length body or before
    /// the last chunk.
    #[error("body ended early: {received} bytes received{}", expected_text(*.expected))]
    Truncated {
        /// Body bytes received.
        received: u64,
        /// The content-length, when one was declared.
        expected: Option<u64>,
    },
    /// A chunked body is malformed.
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
    /// The request body the caller supplied failed while it was being sent.
    #[error("request body failed")]
    RequestBody(#[source] Box<dyn std::error::Error + Send + Sync>),
}

fn expected_text(expected: Option<u64>) -> String {
    expected.map_or_else(String::new, |len| format!(" of {len}"))
}

impl From<MessageError> for UpstreamError {
    fn from(error: MessageError) -> Self {
        match error {
            MessageError::Malformed(why) => UpstreamError::MalformedHead(why),
            MessageError::TooLarge { limit } => UpstreamError::HeadTooLarge { limit },
            MessageError::TooManyHeaders { limit } => {
                UpstreamError::MalformedHead(format!("more than {limit} header lines"))
            }
            MessageError::Framing(why) => UpstreamError::Framing(why),
            MessageError::Chunked(why) => UpstreamError::Chunked(why),
        }
    }
}

/// A request that got no usable response head: the error, and whether to try again.
#[derive(Debug)]
pub struct SendError {
    /// What went wrong.
    pub error: UpstreamError,
    /// The connection was a reused keep-alive one, no response byte came back and no request
    /// body byte was taken from the caller: the signature of a connection the upstream closed
    /// while it sat idle. Sending the same request again on a new connection is safe.
    pub stale: bool,
}
