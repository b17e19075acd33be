//! What a cache entry is: a response head plus its complete body.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use wharf_http1::relay::RelayedFields;

use crate::sealed::{SealedFile, SEALED_FROM};

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

/// Where a stored body's bytes are.
#[derive(Debug, Clone)]
pub enum StoredBody {
    /// In memory: one exact-size chunk up to [`COMPACT_UP_TO`], else the origin's chunks.
    Chunks(Arc<[Bytes]>),
    /// In a sealed in-memory file (from [`SEALED_FROM`] up to [`COMPACT_UP_TO`], while
    /// files are available), which a socket is handed without a copy.
    File(Arc<SealedFile>),
}

impl StoredBody {
    /// The body as chunks: the stored ones, or the file's bytes read into one.
    pub fn chunks(&self) -> std::io::Result<Arc<[Bytes]>> {
        match self {
            StoredBody::Chunks(chunks) => Ok(chunks.clone()),
            StoredBody::File(file) => Ok(vec![file.read_all()?].into()),
        }
    }
}

/// A complete response body that arrived intact, with its freshness.
#[derive(Debug)]
pub struct CachedResponse {
    /// Status and relayed headers.
    pub head: Arc<ResponseHead>,
    /// The body's bytes.
    pub body: StoredBody,
    /// Sum of the chunks' lengths.
    pub body_len: u64,
    /// When the body was complete.
    pub stored_at: Instant,
    /// When the entry stops being served.
    pub expires_at: Instant,
    /// The head's fields as a server answers a hit with them (its own fields added), as
    /// wire lines: built once by that server on the first hit, shared by every hit after.
    pub served_head: OnceLock<RelayedFields>,
}

impl CachedResponse {
    /// Builds an entry stored `now` that stays fresh for `ttl`.
    ///
    /// Everything read from a socket is a slice of a larger read buffer, and
    /// keeping the slice pins the whole buffer, so the cache would hold far
    /// more memory than the bytes it counts. Hence the entry owns its bytes:
    /// the header values are copied (see `owned_head`), and a body up to
    /// [`COMPACT_UP_TO`] is copied into a sealed file (from [`SEALED_FROM`],
    /// see `sealed`) or one buffer of exactly its length. A larger body keeps
    /// its chunks (they fill their buffers, and a copy would double the peak
    /// memory of a fill that readers still hold).
    pub fn new(head: Arc<ResponseHead>, body: Vec<Bytes>, now: Instant, ttl: Duration) -> Self {
        let head = owned_head(&head);
        let body_len: u64 = body.iter().map(|c| c.len() as u64).sum();
        let sealed = (SEALED_FROM..=COMPACT_UP_TO)
            .contains(&body_len)
            .then(|| SealedFile::create(&body, body_len))
            .flatten();
        let body = if let Some(sealed) = sealed {
            StoredBody::File(Arc::new(sealed))
        } else if body_len <= COMPACT_UP_TO {
            let mut compact =
                bytes::BytesMut::with_capacity(usize::try_from(body_len).unwrap_or(0));
            for chunk in &body {
                compact.extend_from_slice(chunk);
            }
            StoredBody::Chunks(vec![compact.freeze()].into())
        } else {
            StoredBody::Chunks(body.into())
        };
        Self {
            head,
            body,
            body_len,
            stored_at: now,
            expires_at: now + ttl,
            served_head: OnceLock::new(),
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

/// A copy of `head` whose header values own their bytes.
///
/// hyper parses a response head in place: each header value is a slice of
/// the connection's read buffer (up to ~400 KiB, often holding earlier
/// bodies too), so a cached `content-type` would keep that whole buffer
/// alive for as long as the entry lives (issue 7: RSS grew ~2 MiB/min
/// under cache churn while the cache's bytes stayed flat).
fn owned_head(head: &ResponseHead) -> Arc<ResponseHead> {
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    for (name, value) in &head.headers {
        // Any value hyper accepted is valid here too; should one not be,
        // keeping it shared beats dropping it.
        let mut owned = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        owned.set_sensitive(value.is_sensitive());
        headers.append(name.clone(), owned);
    }
    Arc::new(ResponseHead {
        status: head.status,
        headers,
    })
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
        let StoredBody::Chunks(body) = &entry.body else {
            panic!("a 10-byte body is kept in memory");
        };
        assert_eq!(body.len(), 1);
        assert_eq!(body[0].as_ref(), [7u8; 10]);
        // Its own buffer, not a view of the read buffer.
        let stored = body[0].as_ptr() as usize;
        let read = read_buffer.as_ptr() as usize;
        assert!(stored < read || stored >= read + read_buffer.len());
    }

    #[test]
    fn a_mid_size_body_is_kept_in_a_sealed_file_and_a_large_one_in_its_chunks() {
        let head = Arc::new(ResponseHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
        });
        let whole: Vec<u8> = (0..SEALED_FROM as usize * 2).map(|i| i as u8).collect();
        let chunks = vec![
            Bytes::copy_from_slice(&whole[..1000]),
            Bytes::copy_from_slice(&whole[1000..]),
        ];
        let entry =
            CachedResponse::new(head.clone(), chunks, Instant::now(), Duration::from_secs(1));
        assert_eq!(entry.body_len, whole.len() as u64);
        let StoredBody::File(file) = &entry.body else {
            panic!("a body of 2 x SEALED_FROM is kept in a sealed file");
        };
        assert_eq!(file.len(), whole.len() as u64);
        assert_eq!(&entry.body.chunks().unwrap()[0][..], &whole[..]);

        let large = vec![
            Bytes::from(vec![1u8; COMPACT_UP_TO as usize]),
            Bytes::from_static(b"!"),
        ];
        let entry =
            CachedResponse::new(head, large.clone(), Instant::now(), Duration::from_secs(1));
        let StoredBody::Chunks(body) = &entry.body else {
            panic!("a body over COMPACT_UP_TO keeps its chunks");
        };
        assert_eq!(body.len(), 2);
        assert_eq!(body[0].as_ptr(), large[0].as_ptr());
    }

    /// Issue 7: a cached head must not keep the read buffer it was parsed
    /// from, which holds ~400 KiB where the values need a few bytes.
    #[test]
    fn issue_7_cached_headers_do_not_pin_the_read_buffer() {
        let mut read_buffer = b"text/plain".to_vec();
        read_buffer.resize(64 * 1024, b' ');
        let read_buffer = Bytes::from(read_buffer);
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_maybe_shared(read_buffer.slice(0..10)).unwrap(),
        );
        let mut secret = HeaderValue::from_maybe_shared(read_buffer.slice(0..4)).unwrap();
        secret.set_sensitive(true);
        headers.append(http::header::ETAG, secret.clone());
        headers.append(http::header::ETAG, secret);
        let head = Arc::new(ResponseHead {
            status: StatusCode::OK,
            headers,
        });
        let entry = CachedResponse::new(head, Vec::new(), Instant::now(), Duration::from_secs(1));

        let read = read_buffer.as_ptr() as usize..read_buffer.as_ptr() as usize + read_buffer.len();
        assert_eq!(entry.head.headers.len(), 3);
        assert_eq!(entry.head.headers["content-type"], "text/plain");
        let etags: Vec<_> = entry.head.headers.get_all("etag").iter().collect();
        assert_eq!(etags, ["text", "text"]);
        assert!(etags.iter().all(|value| value.is_sensitive()));
        for value in entry.head.headers.values() {
            let stored = value.as_bytes().as_ptr() as usize;
            assert!(
                !read.contains(&stored),
                "a header value still points into the read buffer"
            );
        }
    }
}
