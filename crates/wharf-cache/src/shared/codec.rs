//! The meta value of a shared entry: everything but the body, in a small binary form.
//!
//! Layout (big-endian): magic `WHC2`; status `u16`; body length `u64`; chunk count `u32`;
//! TTL `u64` (ms); chunk-key version (`u8` length + bytes); header count `u16`, then each
//! header as name (`u16` length + bytes) and value (`u32` length + bytes). A value that does
//! not decode exactly is treated as a miss, never trusted. The older layout (`WHC1`, with
//! the writer's wall-clock store time) lives under other keys (`wharf:`, not `wharf2:`), so
//! it is not met here and expires by its TTL; the new magic is a second guard.
//!
//! No time of day is stored: an entry's age is its TTL minus what Redis has left of it
//! ([`Meta::age`]), so instances whose clocks disagree still agree on an entry's age.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"WHC2";

/// What the meta value says about an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body_len: u64,
    pub(crate) chunks: u32,
    /// Freshness from the time the body was complete, as in the memory tier: the meta
    /// value is written with what was left of it then, and Redis counts that down.
    pub(crate) ttl_ms: u64,
    /// Names this entry's chunk keys, so two writers of one key never mix chunks.
    pub(crate) version: String,
}

impl Meta {
    /// The entry's age, given `pttl`: Redis's `PTTL` of the meta value read with it (ms
    /// left; -2 gone, -1 no expiry). `None` when the entry is no longer fresh, or its meta
    /// value has no expiry (not written by wharf).
    pub(crate) fn age(&self, pttl: i64) -> Option<Duration> {
        let left = u64::try_from(pttl).ok().filter(|&left| left > 0)?;
        Some(Duration::from_millis(self.ttl_ms.saturating_sub(left)))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.headers.len() * 48);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.chunks.to_be_bytes());
        out.extend_from_slice(&self.ttl_ms.to_be_bytes());
        let version = &self.version.as_bytes()[..self.version.len().min(255)];
        out.push(version.len() as u8);
        out.extend_from_slice(version);
        // Header names are at most 64 KiB and values 4 GiB by construction of a response
        // head; more than 65535 relayed headers cannot happen (the proxy relays 8 names).
        let headers: Vec<_> = self.headers.iter().take(usize::from(u16::MAX)).collect();
        out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
        for (name, value) in headers {
            let name = name.as_str().as_bytes();
            out.extend_from_slice(&(name.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
            out.extend_from_slice(&name[..name.len().min(usize::from(u16::MAX))]);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Meta> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return None;
        }
        let status = StatusCode::from_u16(r.u16()?).ok()?;
        let body_len = r.u64()?;
        let chunks = r.u32()?;
        let ttl_ms = r.u64()?;
        let version_len = usize::from(r.u8()?);
        let version = String::from_utf8(r.take(version_len)?.to_vec()).ok()?;
        let count = r.u16()?;
        let mut headers = HeaderMap::with_capacity(usize::from(count));
        for _ in 0..count {
            let name_len = usize::from(r.u16()?);
            let name = HeaderName::from_bytes(r.take(name_len)?).ok()?;
            let value_len = usize::try_from(r.u32()?).ok()?;
            let value = HeaderValue::from_bytes(r.take(value_len)?).ok()?;
            headers.append(name, value);
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Meta {
            status,
            headers,
            body_len,
            chunks,
            ttl_ms,
            version,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("cache-control", HeaderValue::from_static("max-age=60"));
        headers.append("cache-control", HeaderValue::from_static("public"));
        headers.insert("etag", HeaderValue::from_bytes(b"\"\xe9t\xe9\"").unwrap());
        Meta {
            status: StatusCode::OK,
            headers,
            body_len: 1 << 20,
            chunks: 4,
            ttl_ms: 60_000,
            version: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn round_trips_with_repeated_and_non_ascii_headers() {
        let meta = meta();
        assert_eq!(Meta::decode(&meta.encode()), Some(meta));
    }

    #[test]
    fn anything_short_long_or_foreign_is_refused() {
        let bytes = meta().encode();
        for cut in 0..bytes.len() {
            assert_eq!(Meta::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Meta::decode(&longer), None);
        assert_eq!(Meta::decode(b"not a meta value"), None);
        let mut older = bytes.clone();
        older[..4].copy_from_slice(b"WHC1");
        assert_eq!(Meta::decode(&older), None, "the layout with a store time");
    }

    #[test]
    fn age_is_the_ttl_less_what_redis_has_left() {
        let meta = meta();
        assert_eq!(meta.age(50_000), Some(Duration::from_secs(10)));
        assert_eq!(meta.age(60_000), Some(Duration::ZERO));
        // Extended by hand past the TTL: new, not negative.
        assert_eq!(meta.age(90_000), Some(Duration::ZERO));
        assert_eq!(meta.age(1), Some(Duration::from_millis(59_999)));
        assert_eq!(meta.age(0), None, "expired");
        assert_eq!(meta.age(-2), None, "gone");
        assert_eq!(meta.age(-1), None, "no expiry: not wharf's");
    }
}
