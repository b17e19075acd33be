//! Routes one call to its service, after the host's own checks on the
//! request head.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use wharf_http1::relay::RelayedFields;
use wharf_http1::request::MAX_REQUEST_HEADERS;

use crate::body::{guard_body, ResponseBody};
use crate::call::ClientAddr;
use crate::error::json_error;
use crate::registry::{first_taking, Choice, Found, Registry};
use crate::request_body::RequestBody;
use crate::service::{CallFuture, HostService};
use crate::services::SharedRegistry;
use crate::session::CallOnSession;

/// What dispatch needs, shared by every connection.
pub(crate) struct Dispatcher {
    pub(crate) registry: SharedRegistry,
    pub(crate) max_header_bytes: usize,
}

/// Where a request goes, looked up from its path while its head is read (so an HTTP/1.1
/// head is read for what its service needs of it).
pub(crate) enum Routed {
    /// The service mounted at the path.
    To(HostService),
    /// The first of these services that takes the request (routes sharing a prefix, with
    /// conditions on its method and fields): chosen once the head has been read.
    FirstTaking(Arc<[HostService]>),
    /// No service is mounted there.
    Nowhere,
    /// The path has a `.` or `..` segment: refused before any service sees it.
    DotSegment,
}

impl Routed {
    /// Starts the call.
    pub(crate) fn call(self, request: Request<RequestBody>) -> CallFuture {
        match self {
            Routed::To(service) => service.call(request),
            Routed::FirstTaking(candidates) => {
                let mut request = request;
                match first_taking(&candidates, request.method(), request.headers()) {
                    Some(Choice::Takes(service) | Choice::First(service)) => service.call(request),
                    Some(Choice::WrongMethod(service, allowed)) => {
                        request.extensions_mut().insert(allowed);
                        service.call(request)
                    }
                    // Never empty: a path with no candidate is `Nowhere`.
                    None => not_found(&request),
                }
            }
            Routed::Nowhere => not_found(&request),
            Routed::DotSegment => dot_segment(&request),
        }
    }

    /// Whether the request's header fields are to be kept for the call.
    pub(crate) fn wants_request_fields(&self) -> bool {
        match self {
            Routed::To(service) => service.reads_request_fields(),
            // The choice reads the fields.
            Routed::FirstTaking(_) => true,
            // A 404 or 400 reads nothing of the request but its path.
            Routed::Nowhere | Routed::DotSegment => false,
        }
    }
}

impl Dispatcher {
    /// The service for a request `path` (its URI's path).
    pub(crate) fn route(&self, path: &str) -> Routed {
        if has_dot_segment(path) {
            return Routed::DotSegment;
        }
        match self.current().find(path) {
            Some(Found::One(mounted)) => Routed::To(mounted.service.clone()),
            Some(Found::FirstTaking(candidates)) => Routed::FirstTaking(candidates.clone()),
            None => Routed::Nowhere,
        }
    }

    /// Starts one call: 404 when no service is mounted at the path, else
    /// the service's own call.
    pub(crate) fn call(&self, request: Request<RequestBody>) -> CallFuture {
        self.route(request.uri().path()).call(request)
    }

    /// The current services. One read lock per call to take them; a reload swaps them
    /// whole, so a call sees either the old or the new set.
    fn current(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The answer when no service is mounted at a request's path.
fn not_found<B>(request: &Request<B>) -> CallFuture {
    let response = json_error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no service at {}", request.uri().path()),
    );
    CallFuture::ready(response)
}

/// Whether `path` has a `.` or `..` segment, in any spelling a backend may resolve.
///
/// Services match a request by its path as sent, and a route forwards it as sent: a
/// `/public/../admin` would be matched by the `/public` route and reach the backend's
/// `/admin` once the backend resolves the dots (path confusion). Clients resolve dot
/// segments before sending (RFC 3986 §5.2.4), so only a crafted request has one, and it
/// is refused rather than rewritten. Spellings: the dots percent-encoded (`%2e`); the
/// slashes around them encoded (`%2f`, which nginx decodes before resolving) or written
/// as a backslash (`\`, `%5c`: Windows servers); a `;params` suffix (`..;`, which Tomcat
/// drops before resolving).
fn has_dot_segment(path: &str) -> bool {
    let bytes = path.as_bytes();
    // Most paths have none of these bytes: one pass, nothing more.
    if !bytes
        .iter()
        .any(|&byte| matches!(byte, b'.' | b'%' | b'\\'))
    {
        return false;
    }
    let mut dots = 0;
    // Whether the segment so far is dots only (and may end in `;params`).
    let mut only_dots = true;
    let mut in_params = false;
    let mut rest = bytes;
    loop {
        let separator = match rest {
            [] => true,
            [b'/' | b'\\', ..] => {
                rest = &rest[1..];
                true
            }
            [b'%', a, b, ..] if is_encoded(*a, *b, b"2f") || is_encoded(*a, *b, b"5c") => {
                rest = &rest[3..];
                true
            }
            _ => false,
        };
        if separator {
            if only_dots && (dots == 1 || dots == 2) {
                return true;
            }
            if rest.is_empty() {
                return false;
            }
            (dots, only_dots, in_params) = (0, true, false);
            continue;
        }
        if in_params {
            rest = &rest[1..];
            continue;
        }
        match rest {
            [b'.', ..] => {
                dots += 1;
                rest = &rest[1..];
            }
            [b'%', a, b, ..] if is_encoded(*a, *b, b"2e") => {
                dots += 1;
                rest = &rest[3..];
            }
            [b';', ..] => {
                in_params = true;
                rest = &rest[1..];
            }
            _ => {
                only_dots = false;
                rest = &rest[1..];
            }
        }
    }
}

/// Whether `%ab` spells the escape `code` (two lowercase hex digits), in either case.
fn is_encoded(a: u8, b: u8, code: &[u8; 2]) -> bool {
    a.eq_ignore_ascii_case(&code[0]) && b.eq_ignore_ascii_case(&code[1])
}

/// The answer to a path with a dot segment.
fn dot_segment<B>(request: &Request<B>) -> CallFuture {
    let response = json_error(
        StatusCode::BAD_REQUEST,
        "bad_request",
        &format!(
            "path {} has a \".\" or \"..\" segment: send it with the dots resolved (RFC 3986 section 5.2.4)",
            request.uri().path()
        ),
    );
    CallFuture::ready(response)
}

/// Answers one HTTP/2 request (served by hyper): 431 for an oversized
/// head, else whatever dispatch answers. `on_session` stays alive until the
/// response body is done.
pub(crate) async fn dispatch_h2(
    dispatcher: Arc<Dispatcher>,
    on_session: CallOnSession,
    client: Option<ClientAddr>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let mut request = request.map(RequestBody::Http2);
    if let Some(client) = client {
        request.extensions_mut().insert(client);
    }
    let head_bytes = request_head_bytes(&request);
    let fields = request.headers().len();
    let is_head = request.method() == http::Method::HEAD;
    let response = if head_bytes > dispatcher.max_header_bytes {
        json_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!(
                "request head is {head_bytes} bytes, over max_header_bytes ({})",
                dispatcher.max_header_bytes
            ),
        )
    } else if fields > MAX_REQUEST_HEADERS {
        // As HTTP/1.1's parser refuses them: h2 itself limits bytes, not fields.
        json_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!("request has {fields} header fields, over {MAX_REQUEST_HEADERS}"),
        )
    } else {
        host_from_authority(&mut request);
        dispatcher.call(request).await
    };
    let response = if is_head {
        without_body(response)
    } else {
        response
    };
    Ok(guard_body(with_relayed_in_map(response), on_session))
}

/// Gives an HTTP/2 request the `host` field of its `:authority` (without userinfo, which RFC
/// 9113 §8.3.1 forbids there), unless it sent one: services read the host from the fields
/// whatever the client's protocol, so that a route's `match_headers` on `host` and its
/// rewrite (`set_headers`, `remove_headers`) apply to it over HTTP/2 as over HTTP/1.1, and
/// its backend sees the name the client asked for (an intermediary forwarding HTTP/2 as
/// HTTP/1.1 writes `:authority` as `host`, §8.3.1).
fn host_from_authority<B>(request: &mut Request<B>) {
    if request.headers().contains_key(http::header::HOST) {
        return;
    }
    let Some(authority) = request.uri().authority() else {
        return;
    };
    let host = authority.as_str().rsplit('@').next().unwrap_or_default();
    if let Ok(value) = http::HeaderValue::from_str(host) {
        request.headers_mut().insert(http::header::HOST, value);
    }
}

/// A HEAD's answer: the head as for GET, no body. hyper's HTTP/2 server sends whatever
/// body it is given, and services answer HEAD as GET (the HTTP/1.1 writer drops the
/// body itself). The length a GET would have had stays in `content-length`.
fn without_body(response: Response<ResponseBody>) -> Response<ResponseBody> {
    let (mut parts, body) = response.into_parts();
    if !parts.headers.contains_key(http::header::CONTENT_LENGTH) {
        if let Some(len) = http_body::Body::size_hint(&body).exact() {
            parts
                .headers
                .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
        }
    }
    Response::from_parts(parts, crate::body::empty())
}

/// HTTP/2 writes its head from the map (hyper): header lines a service relayed as they came
/// ([`RelayedFields`], written as they are by the HTTP/1.1 writer) go into it.
fn with_relayed_in_map(mut response: Response<ResponseBody>) -> Response<ResponseBody> {
    if let Some(relayed) = response.extensions_mut().remove::<RelayedFields>() {
        relayed.append_to(response.headers_mut());
    }
    response
}

/// Size of the request head as the header list HTTP/2 would count it.
fn request_head_bytes<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len()
        + request
            .uri()
            .path_and_query()
            .map_or(1, |pq| pq.as_str().len())
        + 12;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    line + headers
}

#[cfg(test)]
mod tests {
    use super::has_dot_segment;

    #[test]
    fn dot_segments_in_any_spelling_and_nothing_else() {
        for path in [
            "/.",
            "/..",
            "/a/../b",
            "/a/./b",
            "/a/..",
            "/a/%2e%2e/b",
            "/a/%2E%2e/b",
            "/a/.%2e/b",
            "/a/%2e/b",
            // The slashes around them encoded, a backslash, `;params`.
            "/public/x%2f..%2f..%2fadmin",
            "/public/x%2F..%2Fadmin",
            "/public/x\\..\\admin",
            "/public/x%5c..%5cadmin",
            "/public/..;/admin",
            "/public/..;jsessionid=1/admin",
            "/a/.;x",
        ] {
            assert!(has_dot_segment(path), "{path}");
        }
        for path in [
            "/",
            "/proxy",
            "/a.b/c",
            "/a/..b",
            "/a/b..",
            "/a/.../b",
            "/a/%2e%2e%2e",
            "/a/%2f",
            "/v1.2/x",
            "/.well-known/x",
            "/a;b/..c",
            "/a/x.;y",
            "/a/%2",
            "/a/%",
            "/é/ü",
        ] {
            assert!(!has_dot_segment(path), "{path}");
        }
    }
}
