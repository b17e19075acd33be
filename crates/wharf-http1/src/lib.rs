//! HTTP/1.1 on the wire, for wharf's own server and upstream client: heads parsed and
//! written, body framing decided (RFC 9112 §6), the chunked coding decoded. No I/O: callers
//! bring the bytes.
//!
//! - [`request`]: request heads, written by the client ([`request::encode_request_head`])
//!   and read strictly by the server ([`request::parse_request_head`]), where smuggling is
//!   refused;
//! - [`response`]: response heads, read by the client ([`response::parse_response_head`])
//!   and written by the server ([`response::encode_response_head`]);
//! - [`chunked`]: the chunked coding, decoded in place ([`chunked::ChunkedDecoder`]);
//! - [`MessageError`]: what is wrong with a message, for a 400/431 or a 502.
//!
//! Parsing is `httparse`'s (hyper's own parser); every header value of a parsed head points
//! into one copy of that head, exactly its size.

pub mod chunked;
mod error;
mod fields;
pub mod request;
pub mod response;

pub use error::MessageError;
