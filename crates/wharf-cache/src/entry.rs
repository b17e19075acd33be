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

/// Bodies up to this size are stored compacted in one buffer.
pub const COMPACT_UP_TO: u64 = 256 * 1024;

/// A complete response body that arrived intact, with its freshness.
#[derive(Debug)]
pub struct CachedResponse {
    /// Status and relayed headers.
    pub head: Arc<ResponseHead>,
    /// The body: one exact-size chunk up to [`COMPACT_UP_TO`], else the origin's chunks.
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
    ///
    /// A small body is copied into one buffer of exactly its length: chunks
    /// read from a socket are slices of larger read buffers, and keeping
    /// them would pin those whole buffers, so the cache would hold far
    /// more memory than the bytes it counts. A large body keeps its chunks
    /// (they fill their buffers, and a copy would double the peak memory
    /// of a fill that readers still hold).
    pub fn new(head: Arc<ResponseHead>, body: Vec<Bytes>, now: Instant, ttl: Duration) -> Self {
        let body_len: u64 = body.iter().map(|c| c.len() as u64).sum();
        let body: Arc<[Bytes]> = if body_len <= COMPACT_UP_TO {
            let mut compact =
                bytes::BytesMut::with_capacity(usize::try_from(body_len).unwrap_or(0));
            for chunk in &body {
                compact.extend_from_slice(chunk);
            }
            vec![compact.freeze()].into()
        } else {
            body.into()
        };
        Self {
            head,
            body,
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};

    #[test]
    fn a_stored_body_does_not_pin_the_buffers_it_was_read_into() {
        // A read buffer of 64 KiB of which the body is 10 bytes, in two slices.
        let read_buffer = Bytes::from(vec![7u8; 64 * 1024]);
        let chunks = vec![read_buffer.slice(0..4), read_buffer.slice(100..106)];
        let head = Arc::new(ResponseHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
        });
        let entry =
            CachedResponse::new(head, chunks.clone(), Instant::now(), Duration::from_secs(1));
        assert_eq!(entry.body_len, 10);
        assert_eq!(entry.body.len(), 1);
        assert_eq!(entry.body[0].as_ref(), [7u8; 10]);
        // Its own buffer, not a view of the read buffer.
        let stored = entry.body[0].as_ptr() as usize;
        let read = read_buffer.as_ptr() as usize;
        assert!(stored < read || stored >= read + read_buffer.len());
    }
}
