//! Checked destinations, parsed once per distinct `url` value.
//!
//! Turning a `url` query value into a fetchable destination is the dearest part of a cache
//! hit: percent-decoding, WHATWG parsing with IDNA, the destination policy's pre-resolution
//! checks. All of it is a pure function of the raw value and of the service's (immutable)
//! policy, so [`TargetMemo`] keeps the result for recently seen raw values: a repeated URL
//! costs one hash lookup. The memo holds only targets the policy allowed; refusals and
//! parse errors are computed again each time. It is bounded in entries and in key length,
//! and belongs to one proxy service (a reload with another policy builds a new one).
//!
//! A [`Target`] also carries what every fetch of it needs: the origin label for messages,
//! the pool key, and the request head, encoded once.

use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Method};
use quick_cache::sync::Cache;
use url::{Position, Url};
use wharf_upstream::EncodedRequest;

use crate::destination::DestinationPolicy;
use crate::error::ProxyError;
use crate::request::RawQuery;

/// Sent as `user-agent`: no client header is forwarded to origins (no
/// cookies, credentials or encodings), so the origin sees only wharf.
const USER_AGENT: &str = concat!("wharf/", env!("CARGO_PKG_VERSION"));

/// Raw `url` values remembered.
const MEMO_ENTRIES: usize = 1024;
/// Longer raw values are not remembered (they are parsed every time).
const MEMO_MAX_KEY: usize = 2048;

/// A destination the policy allowed, ready to fetch.
#[derive(Debug)]
pub(crate) struct Target {
    /// The normalised URL; its serialisation is the cache key.
    pub(crate) url: Url,
    /// `scheme://host:port`, for messages and logs.
    pub(crate) label: String,
    /// `GET path?query` with `host` and `user-agent`, as sent to the origin.
    pub(crate) request: EncodedRequest,
}

impl Target {
    /// Builds the fetch details of a checked URL.
    pub(crate) fn new(url: Url) -> Result<Self, ProxyError> {
        let label = format!(
            "{}://{}:{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port_or_known_default().unwrap_or(0)
        );
        let invalid = |what: &str| ProxyError::OriginUnavailable {
            origin: label.clone(),
            message: format!("{what} cannot be sent in a request"),
        };
        let mut headers = HeaderMap::with_capacity(2);
        let host = HeaderValue::from_str(&url[Position::BeforeHost..Position::AfterPort])
            .map_err(|_| invalid("host"))?;
        headers.insert(header::HOST, host);
        headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        let path_and_query = match &url[Position::BeforePath..Position::AfterQuery] {
            "" => "/",
            path => path,
        };
        let request = EncodedRequest::new(&Method::GET, path_and_query, &headers)
            .map_err(|_| invalid("path"))?;
        Ok(Self {
            url,
            label,
            request,
        })
    }

    /// The cache key: the normalised URL.
    pub(crate) fn key(&self) -> &str {
        self.url.as_str()
    }

    /// The idle-connection pool key: `scheme://host[:port]` as normalised.
    pub(crate) fn pool_key(&self) -> &str {
        pool_key(&self.url)
    }
}

/// The idle-connection pool key of a normalised URL: `scheme://host[:port]`, the same for
/// a call's target and for a connection opened ahead (`preconnect_origins`).
pub(crate) fn pool_key(url: &Url) -> &str {
    &url[..Position::BeforePath]
}

/// Recently checked targets by raw `url` value.
pub(crate) struct TargetMemo {
    entries: Cache<String, Arc<Target>>,
}

impl TargetMemo {
    pub(crate) fn new() -> Self {
        Self {
            entries: Cache::new(MEMO_ENTRIES),
        }
    }

    /// The target of `raw`: remembered, or parsed, checked against `policy` and remembered.
    pub(crate) fn resolve(
        &self,
        raw: &RawQuery<'_>,
        policy: &DestinationPolicy,
    ) -> Result<Arc<Target>, ProxyError> {
        if let Some(target) = self.entries.get(raw.url) {
            return Ok(target);
        }
        let url = raw.target()?;
        policy
            .check_url(&url)
            .map_err(|source| ProxyError::Refused {
                host: url.host_str().unwrap_or("").to_owned(),
                source,
            })?;
        let target = Arc::new(Target::new(url)?);
        if raw.url.len() <= MEMO_MAX_KEY {
            self.entries.insert(raw.url.to_owned(), target.clone());
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(url: &str) -> RawQuery<'_> {
        RawQuery {
            url,
            cache_duration: 0,
        }
    }

    #[test]
    fn remembers_allowed_targets_only() {
        let memo = TargetMemo::new();
        let policy = DestinationPolicy::new(false, &[]);
        let first = memo
            .resolve(&raw("http%3A%2F%2FExample.org%2Fa%3Fb%3D1%23frag"), &policy)
            .unwrap();
        assert_eq!(first.key(), "http://example.org/a?b=1");
        assert_eq!(first.label, "http://example.org:80");
        assert_eq!(first.pool_key(), "http://example.org");
        assert_eq!(
            first.request.as_bytes(),
            format!("GET /a?b=1 HTTP/1.1\r\nhost: example.org\r\nuser-agent: {USER_AGENT}\r\n\r\n")
                .as_bytes()
        );
        let again = memo
            .resolve(&raw("http%3A%2F%2FExample.org%2Fa%3Fb%3D1%23frag"), &policy)
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the second call is a memo hit");

        for refused in ["http%3A%2F%2F127.0.0.1%2F", "http://localhost:8080/"] {
            for _ in 0..2 {
                let error = memo.resolve(&raw(refused), &policy).unwrap_err();
                assert_eq!(error.status(), http::StatusCode::FORBIDDEN, "{refused}");
            }
        }
        let error = memo
            .resolve(&raw("ftp%3A%2F%2Fa.example%2F"), &policy)
            .unwrap_err();
        assert_eq!(error.status(), http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_memo_belongs_to_its_policy() {
        // The same raw value through two services with different rules.
        let open = DestinationPolicy::new(true, &[]);
        let closed = DestinationPolicy::new(false, &[]);
        let memo_open = TargetMemo::new();
        let memo_closed = TargetMemo::new();
        assert!(memo_open
            .resolve(&raw("http://127.0.0.1:9/"), &open)
            .is_ok());
        assert!(memo_closed
            .resolve(&raw("http://127.0.0.1:9/"), &closed)
            .is_err());
    }

    #[test]
    fn ports_and_ipv6_hosts() {
        let memo = TargetMemo::new();
        let policy = DestinationPolicy::new(true, &[]);
        let target = memo.resolve(&raw("https://[::1]:8443"), &policy).unwrap();
        assert_eq!(target.label, "https://[::1]:8443");
        assert_eq!(target.pool_key(), "https://[::1]:8443");
        assert!(target
            .request
            .as_bytes()
            .starts_with(b"GET / HTTP/1.1\r\nhost: [::1]:8443\r\n"));
    }
}
