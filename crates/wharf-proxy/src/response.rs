//! The proxy's answers to a served call: a hit from its cache entry, whose fields are
//! encoded once and shared by every hit; a fetched or coalesced response built from the
//! origin's head, relabelled when its body came from the shared tier; and a pass-through;
//! each says in `x-cache` how it was served ([`CacheResult`]). Errors are
//! [`crate::error`]'s.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::response::Parts;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use wharf_cache::{CachedResponse, ResponseHead};
use wharf_host::ResponseBody;
use wharf_http1::recycle;
use wharf_http1::relay::RelayedFields;

use crate::body::from_entry;
use crate::fill::FillSource;

/// Response header telling how the call was served.
pub(crate) const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
/// Response header telling which tier served a hit: `memory` or `shared`.
pub(crate) const X_CACHE_TIER: HeaderName = HeaderName::from_static("x-cache-tier");

/// How a response was served, as reported in `x-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    /// Served from a fresh cache entry.
    Hit,
    /// Fetched (and being cached) for this call.
    Miss,
    /// Not cacheable by request: `cacheDuration` absent or 0.
    Bypass,
    /// Streamed from another call's fill in progress.
    Coalesced,
}

impl CacheResult {
    /// The label value (`hit`, `miss`, `bypass`, `coalesced`).
    pub fn as_str(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Bypass => "bypass",
            CacheResult::Coalesced => "coalesced",
        }
    }
}

/// The answer to a memory hit at `now`. Its fields are encoded once per entry (relayed
/// headers, `x-cache: hit`, `x-cache-tier: memory`) as the lines the server writes, and
/// shared by every hit; only `age` is set anew, in an otherwise empty map: no map cloned,
/// no field encoded again, no formatting for ages under an hour.
pub(crate) fn hit_response(entry: &Arc<CachedResponse>, now: Instant) -> Response<ResponseBody> {
    let lines = entry.served_head.get_or_init(|| {
        let mut headers = HeaderMap::with_capacity(entry.head.headers.len() + 2);
        for (name, value) in &entry.head.headers {
            headers.append(name.clone(), value.clone());
        }
        headers.insert(X_CACHE, HeaderValue::from_static(CacheResult::Hit.as_str()));
        headers.insert(X_CACHE_TIER, HeaderValue::from_static("memory"));
        RelayedFields::from_map(&headers)
    });
    let mut response = Response::new(from_entry(entry));
    *response.status_mut() = entry.head.status;
    *response.headers_mut() = recycle::header_map_with_capacity(1);
    response
        .headers_mut()
        .insert(header::AGE, age_value(entry.age_secs(now)));
    *response.extensions_mut() = recycle::extensions();
    response.extensions_mut().insert(lines.clone());
    response
}

/// `age` values of the first hour, formatted once into static text: a static value's clone
/// copies a pointer, where a formatted one's takes a count every core's hits share.
static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();

/// The `age` header value for `secs`.
fn age_value(secs: u64) -> HeaderValue {
    let ages = AGES.get_or_init(|| {
        (0..3600u64)
            .map(|secs| HeaderValue::from_static(Box::leak(secs.to_string().into_boxed_str())))
            .collect()
    });
    usize::try_from(secs)
        .ok()
        .and_then(|secs| ages.get(secs))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(secs))
}

/// A fetched or coalesced response: `head` as the origin sent it (its relayed fields),
/// with `x-cache` saying how it was served.
pub(crate) fn build_response(
    head: &ResponseHead,
    body: ResponseBody,
    result: CacheResult,
) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    *response.headers_mut() = head.headers.clone();
    response
        .headers_mut()
        .insert(X_CACHE, HeaderValue::from_static(result.as_str()));
    response
}

/// Relabels a fill's response whose body came from the shared tier (`source`): a Redis hit
/// is a hit, with its `age`; an entry another instance fetched while this one waited for it
/// is that instance's fill, shared (`coalesced`). Says `x-cache-tier: shared`; returns the
/// result it put in `x-cache`.
pub(crate) fn from_shared_tier(
    response: &mut Response<ResponseBody>,
    source: &FillSource,
) -> CacheResult {
    let headers = response.headers_mut();
    let result = match source {
        FillSource::Shared { stored_at } => {
            let age = Instant::now().saturating_duration_since(*stored_at);
            headers.insert(header::AGE, HeaderValue::from(age.as_secs()));
            CacheResult::Hit
        }
        FillSource::SharedAfterWait => CacheResult::Coalesced,
    };
    headers.insert(X_CACHE, HeaderValue::from_static(result.as_str()));
    headers.insert(X_CACHE_TIER, HeaderValue::from_static("shared"));
    result
}

/// A pass-through answer: the origin's status, `body` relayed, `x-cache: bypass`. The
/// relayed fields came as lines (in `parts`' extensions, written as they are); its map holds
/// none of the origin's fields (the length is the body's).
pub(crate) fn bypass_response(parts: Parts, body: ResponseBody) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.status_mut() = parts.status;
    *response.headers_mut() = parts.headers;
    *response.extensions_mut() = parts.extensions;
    response.headers_mut().insert(
        X_CACHE,
        HeaderValue::from_static(CacheResult::Bypass.as_str()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_values_are_the_decimal_seconds_within_and_past_the_first_hour() {
        for secs in [0, 1, 9, 10, 99, 100, 999, 1000, 3599, 3600, 86_400] {
            assert_eq!(
                age_value(secs).to_str().unwrap(),
                secs.to_string(),
                "age {secs}"
            );
        }
    }
}
