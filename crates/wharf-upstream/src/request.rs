//! What goes upstream as a request head: [`RequestHead`], borrowed from the caller and
//! encoded as the request is sent, or [`EncodedRequest`], encoded once for a bodiless
//! request sent many times. Sending it is [`crate::Connection`]'s job.

use bytes::Bytes;
use http::{HeaderMap, Method};
use wharf_http1::relay::HeadFields;
use wharf_http1::request::{encode_request_head, request_framing, FieldEdits};

use crate::error::UpstreamError;

/// What [`Connection::send`](crate::Connection::send) writes as the request head.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The origin-form target (`/path?query`); no whitespace or control characters.
    pub target: &'a str,
    /// Every header to send, `host` included; `content-length` and `transfer-encoding` are
    /// replaced by the body's own framing.
    pub headers: &'a HeaderMap,
    /// Fields of `headers` left out, and fields added, as the head is written
    /// ([`FieldEdits::NONE`] for none).
    pub edits: FieldEdits<'a>,
    /// Which of the response's header fields to keep, and how ([`HeadFields::All`]: every
    /// one, in the response's map; see [`Exchange::keeping`](crate::Exchange::keeping) for
    /// the others).
    pub response_fields: HeadFields,
}

/// A bodiless request encoded once, for a caller that sends the same request many times
/// (the proxy, to one target URL).
#[derive(Debug, Clone)]
pub struct EncodedRequest {
    /// The encoded head.
    pub(crate) bytes: Bytes,
    /// Its method (a `HEAD` response has no body).
    pub(crate) method: Method,
}

impl EncodedRequest {
    /// Encodes `method target HTTP/1.1` and `headers` (framing headers dropped: the request
    /// has no body).
    pub fn new(method: &Method, target: &str, headers: &HeaderMap) -> Result<Self, UpstreamError> {
        let mut bytes = Vec::with_capacity(64 + target.len());
        let framing = request_framing(method, true, Some(0));
        encode_request_head(
            method,
            target,
            headers,
            FieldEdits::NONE,
            framing,
            &mut bytes,
        )?;
        Ok(Self {
            bytes: Bytes::from(bytes),
            method: method.clone(),
        })
    }

    /// The bytes that go on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}
