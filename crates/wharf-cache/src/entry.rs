//! What a cache entry is: a response head plus its complete body.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

/// The status and the headers of a response, as they will be relayed.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// The origin's status code.
    pub status: StatusCode,
    /// The headers to relay (already filtered by the proxy).
    pub headers: HeaderMap,
}

/// A complete response body that arrived intact, with its freshness.
#[derive(Debug)]
pub struct CachedResponse {
    /// Status and relayed headers.
    pub head: Arc<ResponseHead>,
    /// The body as the origin's chunks, shared without copying.
    pub body: Arc<[Bytes]>,
    /// Sum of the chunks' lengths.
    pub body_len: u64,
    /// When the body was complete.
    pub stored_at: Instant,
    /// When the entry stops being served.
    pub expires_at: Instant,
}

impl CachedResponse {
    /// Builds an entry stored `now` that stays fresh for `ttl`.
    pub fn new(head: Arc<ResponseHead>, body: Vec<Bytes>, now: Instant, ttl: Duration) -> Self {
        let body_len = body.iter().map(|c| c.len() as u64).sum();
        Self {
            head,
            body: body.into(),
            body_len,
            stored_at: now,
            expires_at: now + ttl,
        }
    }

    /// Whether the entry may still be served at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        now < self.expires_at
    }

    /// Whole seconds since the entry was stored, for the `age` header.
    pub fn age_secs(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.stored_at).as_secs()
    }

    /// Approximate memory held by the entry: body plus headers.
    pub fn weight(&self) -> u64 {
        let headers: usize = self
            .head
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum();
        self.body_len + headers as u64 + 128
    }
}
