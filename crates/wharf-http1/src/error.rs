//! What can be wrong with a message on the wire.

/// A head or body that does not follow HTTP/1.1, or exceeds a limit.
///
/// `Display` is lowercase and says what was wrong; the side (request or response) is the
/// caller's to add.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The head is not valid HTTP/1.x (the parser's reason, or the rule broken).
    #[error("malformed head: {0}")]
    Malformed(String),
    /// The head is larger than allowed.
    #[error("head larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The head has more header lines than allowed.
    #[error("more than {limit} header lines")]
    TooManyHeaders {
        /// The limit in lines.
        limit: usize,
    },
    /// The body's framing is invalid or ambiguous (content-length, transfer-encoding).
    #[error("invalid framing: {0}")]
    Framing(String),
    /// A chunked body is malformed.
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
}
