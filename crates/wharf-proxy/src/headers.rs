//! Which origin response headers reach the client, and whether a response
//! may be cached at all.

use http::header::{self, HeaderMap, HeaderName};
use http::StatusCode;

/// Headers relayed from the origin (SPEC §3), plus `location` so that
/// redirects are relayed intact. Everything else, hop-by-hop headers
/// included, stays behind. Lower-case names: the form the upstream client's relay mode
/// matches a head's fields with (`wharf_upstream::HeadFields::Relay`).
pub(crate) static RELAYED: [&str; 8] = [
    "content-type",
    "content-length",
    "content-encoding",
    "etag",
    "last-modified",
    "cache-control",
    "location",
    "expires",
];

/// [`RELAYED`] as the upstream client's relay mode takes it.
pub(crate) static RELAYED_ONLY: wharf_upstream::Relayed = wharf_upstream::Relayed::Only(&RELAYED);

/// The subset of `origin` headers the client gets.
pub fn relayed_headers(origin: &HeaderMap) -> HeaderMap {
    let mut relayed = HeaderMap::with_capacity(RELAYED.len() + 3);
    for name in RELAYED {
        for value in origin.get_all(name) {
            relayed.append(HeaderName::from_static(name), value.clone());
        }
    }
    relayed
}

/// Why a response is not stored, or `None` when it may be.
pub fn not_cacheable_reason(
    status: StatusCode,
    headers: &HeaderMap,
    max_object_bytes: u64,
) -> Option<&'static str> {
    if status != StatusCode::OK {
        return Some("status is not 200");
    }
    if headers.contains_key(header::SET_COOKIE) {
        return Some("set-cookie");
    }
    // Read as bytes: a value with one non-ASCII byte (obs-text, RFC 9110
    // §5.5) fails `to_str`, and skipping it would cache a `private` answer.
    let forbidden_directive = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&byte| byte == b','))
        .map(|directive| {
            let name = directive.split(|&byte| byte == b'=').next().unwrap_or(&[]);
            name.trim_ascii()
        })
        .any(|name| {
            name.eq_ignore_ascii_case(b"no-store") || name.eq_ignore_ascii_case(b"private")
        });
    if forbidden_directive {
        return Some("cache-control no-store or private");
    }
    if declared_length(headers).is_some_and(|len| len > max_object_bytes) {
        return Some("content-length over max_object_bytes");
    }
    None
}

/// The `content-length` the origin declared, if valid.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn relays_only_the_listed_headers() {
        let origin = headers(&[
            ("content-type", "text/plain"),
            ("etag", "\"x\""),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("set-cookie", "a=b"),
            ("x-secret", "1"),
            ("location", "/next"),
        ]);
        let relayed = relayed_headers(&origin);
        assert_eq!(relayed.len(), 3);
        assert!(relayed.contains_key("content-type"));
        assert!(relayed.contains_key("etag"));
        assert!(relayed.contains_key("location"));
    }

    #[test]
    fn cacheability_rules() {
        let ok = StatusCode::OK;
        assert_eq!(not_cacheable_reason(ok, &headers(&[]), 10), None);
        assert!(not_cacheable_reason(StatusCode::NOT_FOUND, &headers(&[]), 10).is_some());
        assert!(not_cacheable_reason(
            ok,
            &headers(&[("cache-control", "max-age=5, No-Store")]),
            10
        )
        .is_some());
        assert!(
            not_cacheable_reason(ok, &headers(&[("cache-control", "private=\"x\"")]), 10).is_some()
        );
        assert!(not_cacheable_reason(ok, &headers(&[("set-cookie", "a=b")]), 10).is_some());
        // A directive list with a non-ASCII byte still names `private`.
        let mut obs_text = HeaderMap::new();
        obs_text.append(
            header::CACHE_CONTROL,
            HeaderValue::from_bytes(b"private, x=\xc3\xa9").expect("obs-text is a valid value"),
        );
        assert!(not_cacheable_reason(ok, &obs_text, 10).is_some());
        assert!(not_cacheable_reason(ok, &headers(&[("content-length", "11")]), 10).is_some());
        assert_eq!(
            not_cacheable_reason(ok, &headers(&[("content-length", "10")]), 10),
            None
        );
        assert_eq!(
            not_cacheable_reason(ok, &headers(&[("cache-control", "public, max-age=60")]), 10),
            None
        );
    }
}
