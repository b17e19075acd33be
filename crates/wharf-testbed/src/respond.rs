//! Small builders for the testbed's responses: JSON, plain text, and the shared header values.
//!
//! Responses are built with `Response::new` and header inserts, which cannot fail, rather than
//! `Response::builder()`, whose errors would need handling on every path.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::body::TestbedBody;

/// Every testbed response.
pub(crate) type Resp = Response<TestbedBody>;

/// `content-type` of JSON bodies.
pub(crate) const JSON: HeaderValue = HeaderValue::from_static("application/json");
/// `content-type` of text bodies.
pub(crate) const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
/// `content-type` of pattern bodies.
pub(crate) const OCTETS: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// A response with `status`, no headers and `body`.
pub(crate) fn with_status(status: StatusCode, body: TestbedBody) -> Resp {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}

/// `value` as a JSON body.
pub(crate) fn json(status: StatusCode, value: &impl Serialize) -> Resp {
    let body = serde_json::to_vec(value).expect("testbed JSON values are plain data");
    let mut resp = with_status(status, TestbedBody::full(body));
    resp.headers_mut().insert(CONTENT_TYPE, JSON);
    resp
}

/// A text body.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Resp {
    let mut resp = with_status(status, TestbedBody::full(body));
    resp.headers_mut().insert(CONTENT_TYPE, TEXT);
    resp
}
