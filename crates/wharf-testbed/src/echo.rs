//! `/echo`: the request line, headers and body sent back as JSON.
//!
//! Headers are listed in the order received with duplicates kept, values as UTF-8 (lossy), so
//! a test can see exactly what a gateway forwarded (`via`, `x-forwarded-for`, removed or set
//! headers). The body is read whole, up to [`ECHO_LIMIT`].

use std::borrow::Cow;

use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde::Serialize;

use crate::error::RequestError;
use crate::respond::{json, Resp};

/// Largest request body `/echo` reads: 16 MiB; larger ones get 413.
pub(crate) const ECHO_LIMIT: usize = 16 << 20;

/// The JSON `/echo` answers with.
#[derive(Debug, Serialize)]
struct Echo<'a> {
    method: &'a str,
    uri: String,
    version: &'static str,
    headers: Vec<(&'a str, Cow<'a, str>)>,
    body: Cow<'a, str>,
    body_len: usize,
}

/// `/echo`, any method.
pub(crate) async fn echo(req: Request<Incoming>) -> Result<Resp, RequestError> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, ECHO_LIMIT)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<LengthLimitError>() {
                RequestError::BodyTooLarge { limit: ECHO_LIMIT }
            } else {
                RequestError::BodyRead(e)
            }
        })?
        .to_bytes();
    let echo = Echo {
        method: parts.method.as_str(),
        uri: parts.uri.to_string(),
        version: version_name(parts.version),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), String::from_utf8_lossy(value.as_bytes())))
            .collect(),
        body: String::from_utf8_lossy(&body),
        body_len: body.len(),
    };
    Ok(json(StatusCode::OK, &echo))
}

/// `HTTP/1.1` and the like.
fn version_name(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "unknown",
    }
}
