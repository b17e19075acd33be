//! The proxy's query parser and cache key:
//! `wharf_proxy::request::ProxyRequest::{from_query, cache_key}`.
//!
//! Properties: any query parses or is refused with a 400, never a panic;
//! the cache key is the target's serialisation, and a fixed point (parsing
//! the key again gives the same key), so one resource never sits under two
//! keys that differ only in spelling; `cacheDuration` is not in the key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wharf_proxy::destination::parse_target;
use wharf_proxy::request::ProxyRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let request = match ProxyRequest::from_query(Some(query)) {
        Ok(request) => request,
        Err(error) => {
            assert_eq!(
                error.status(),
                http::StatusCode::BAD_REQUEST,
                "{query:?}: {error}"
            );
            return;
        }
    };
    let key = request.cache_key();
    assert_eq!(key, request.target.as_str());
    let again =
        parse_target(key).unwrap_or_else(|e| panic!("cache key {key:?} does not parse: {e}"));
    assert_eq!(again.as_str(), key, "cache key is not a fixed point");
    if !query.contains("cacheDuration") {
        assert_eq!(request.cache_duration, 0);
    }
});
