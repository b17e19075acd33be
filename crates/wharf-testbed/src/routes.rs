//! The endpoint table, and the small endpoints that need no module of their own.
//!
//! [`handle`] counts the request in [`Hits`], picks the handler by path and turns a
//! [`RequestError`] into its JSON response, so a handler only returns `Result`. Methods are not
//! checked except on `/hits` (GET/HEAD read, DELETE resets): a route test may send any method
//! to any endpoint, and `/echo` reports the method it got. Pattern bodies live in `data`,
//! `/echo` in `echo`, `/stock` in `stock`.

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, TRANSFER_ENCODING,
};
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;

use crate::body::TestbedBody;
use crate::error::RequestError;
use crate::hits::Hits;
use crate::query::{parse_number, Query};
use crate::respond::{json, text, with_status, Resp, TEXT};
use crate::{data, echo, stock};

/// State shared by every connection of one testbed.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Requests seen per path.
    pub(crate) hits: Hits,
}

/// Serves one request; never fails.
pub(crate) async fn handle(state: &State, req: Request<Incoming>) -> Resp {
    let path = req.uri().path();
    if path != "/hits" {
        state.hits.record(path);
    }
    route(state, req)
        .await
        .unwrap_or_else(RequestError::into_response)
}

async fn route(state: &State, req: Request<Incoming>) -> Result<Resp, RequestError> {
    let query = Query::new(req.uri().query());
    let path = req.uri().path();
    match path {
        "/" => Ok(text(StatusCode::OK, INDEX)),
        "/fast" => Ok(text(StatusCode::OK, Bytes::from_static(b"ok\n"))),
        "/slow" => slow(query).await,
        "/echo" => echo::echo(req).await,
        "/stream" => data::stream(query),
        "/truncate" => data::truncate(query),
        "/stall" => data::stall(query),
        "/delay-headers" => data::delay_headers(query).await,
        "/hits" => hits(state, req.method()),
        "/headers" => headers(query),
        "/redirect" => redirect(query),
        _ => {
            if let Some(n) = path.strip_prefix("/bytes/") {
                data::bytes(req.headers(), n)
            } else if let Some(code) = path.strip_prefix("/stock/") {
                stock::stock(query, code).await
            } else if let Some(code) = path.strip_prefix("/status/") {
                status(code)
            } else {
                Err(RequestError::NotFound {
                    path: path.to_owned(),
                })
            }
        }
    }
}

/// What `GET /` answers: the endpoint list.
const INDEX: &str = "\
wharf testbed endpoints (GET unless said; bad parameters: 400 JSON)
/fast                                          200 \"ok\\n\" at once
/slow?ms=6000                                  200 after ms
/stream?first_byte_ms=1000&total_ms=2500&bytes=10000&chunks=10
                                               chunked; first chunk at first_byte_ms, last at total_ms
/bytes/N                                       N pattern bytes, cacheable, etag (If-None-Match: 304)
/stock/CODE?ms=6000                            JSON quote after ms
/echo                                          any method: request back as JSON
/status/CODE                                   that status (200-599); 3xx but 304: location /fast
/truncate?bytes=1024[&chunked=1]               declares 2N (1 if N=0), sends N, aborts
/stall?bytes=1024&ms=6000                      content-length 2N: N bytes, pause ms, N bytes
/delay-headers?ms=1000&bytes=1024              headers after ms, then the bytes
/headers?Name=value&...                        200 with those response headers
/redirect?to=URL[&code=302]                    redirect (301/302/303/307/308) to URL
/hits                                          JSON requests per path; DELETE resets
";

/// `/slow?ms=6000`: 200 after `ms`.
async fn slow(query: Query<'_>) -> Result<Resp, RequestError> {
    let delay = query.millis("ms", 6000)?;
    tokio::time::sleep(delay).await;
    Ok(text(
        StatusCode::OK,
        format!("slow: waited {} ms\n", delay.as_millis()),
    ))
}

/// `/status/CODE`: that status, with a small JSON body (none where HTTP forbids one) and
/// `location: /fast` for the redirects (3xx but 304).
fn status(raw: &str) -> Result<Resp, RequestError> {
    let code = parse_number("/status/CODE", raw, 200, 599)?;
    let status = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| RequestError::OutOfRange {
            name: "/status/CODE",
            value: code,
            min: 200,
            max: 599,
        })?;
    let mut resp = match status.as_u16() {
        204 | 205 | 304 => with_status(status, TestbedBody::empty()),
        _ => json(status, &serde_json::json!({ "status": code })),
    };
    // 304 is a 3xx but no redirect: it answers a conditional request, with no target.
    if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
        resp.headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/fast"));
    }
    Ok(resp)
}

/// `/hits`: GET/HEAD the counts as a JSON object, DELETE resets them (204).
fn hits(state: &State, method: &Method) -> Result<Resp, RequestError> {
    match *method {
        Method::GET | Method::HEAD => Ok(json(StatusCode::OK, &state.hits.snapshot())),
        Method::DELETE => {
            state.hits.reset();
            Ok(with_status(StatusCode::NO_CONTENT, TestbedBody::empty()))
        }
        _ => Err(RequestError::MethodNotAllowed {
            path: "/hits".to_owned(),
            method: method.to_string(),
            allowed: "GET, HEAD, DELETE",
        }),
    }
}

/// `/headers?Name=value&...`: 200 `ok\n` with every pair as a response header (repeated names
/// give repeated headers). `content-length` and `transfer-encoding` are refused: they would
/// break the framing. `content-type` defaults to text.
fn headers(query: Query<'_>) -> Result<Resp, RequestError> {
    let mut resp = text(StatusCode::OK, Bytes::from_static(b"ok\n"));
    resp.headers_mut().remove(CONTENT_TYPE);
    for (name, value) in query.pairs() {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| RequestError::Invalid {
                name: name.to_string(),
                value: name.to_string(),
                reason: "is not a valid header name",
            })?;
        if header == CONTENT_LENGTH || header == TRANSFER_ENCODING {
            return Err(RequestError::Invalid {
                name: name.to_string(),
                value: value.to_string(),
                reason: "cannot be set: it would break the response framing",
            });
        }
        let value = HeaderValue::from_str(&value).map_err(|_| RequestError::Invalid {
            name: name.to_string(),
            value: value.to_string(),
            reason: "is not a valid header value",
        })?;
        resp.headers_mut().append(header, value);
    }
    if !resp.headers().contains_key(CONTENT_TYPE) {
        resp.headers_mut().insert(CONTENT_TYPE, TEXT);
    }
    Ok(resp)
}

/// `/redirect?to=URL&code=302`: a redirect to `to`, which is not checked beyond being a valid
/// header value (relative, absolute, even private addresses: SSRF tests need them).
fn redirect(query: Query<'_>) -> Result<Resp, RequestError> {
    let to = query.get("to").ok_or(RequestError::Missing {
        name: "to",
        example: "/redirect?to=/fast",
    })?;
    let location = HeaderValue::from_str(&to).map_err(|_| RequestError::Invalid {
        name: "to".to_owned(),
        value: to.to_string(),
        reason: "is not a valid header value",
    })?;
    let code = query.number("code", 302, 301, 308)?;
    let status = match code {
        301 => StatusCode::MOVED_PERMANENTLY,
        302 => StatusCode::FOUND,
        303 => StatusCode::SEE_OTHER,
        307 => StatusCode::TEMPORARY_REDIRECT,
        308 => StatusCode::PERMANENT_REDIRECT,
        _ => {
            return Err(RequestError::Invalid {
                name: "code".to_owned(),
                value: code.to_string(),
                reason: "is not a redirect status (301, 302, 303, 307 or 308)",
            })
        }
    };
    let mut resp = text(status, Bytes::from_static(b"redirect\n"));
    resp.headers_mut().insert(LOCATION, location);
    Ok(resp)
}
