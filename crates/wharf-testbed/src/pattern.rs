//! The deterministic byte pattern every testbed body is cut from.
//!
//! Byte `i` of any pattern body is `(i % 251) as u8` ([`pattern_byte`]); 251 is prime, so a
//! shifted, truncated or duplicated chunk never lines up with the expected body by accident.
//! The server slices frames out of one static buffer ([`pattern_slice`]): serving `/bytes/N`
//! allocates nothing per chunk, whatever N is.

use bytes::Bytes;

/// Length of the pattern's period.
const PERIOD: u64 = 251;

/// Largest frame the server sends (64 KiB): big enough for throughput, small enough that a
/// 200 MiB body is a stream, never one buffer.
pub(crate) const CHUNK: usize = 64 * 1024;

/// `CHUNK` bytes of pattern from any phase `0..PERIOD`.
const BUFFER_LEN: usize = CHUNK + PERIOD as usize;

/// The pattern, built at compile time.
static PATTERN: [u8; BUFFER_LEN] = build();

const fn build() -> [u8; BUFFER_LEN] {
    let mut buf = [0u8; BUFFER_LEN];
    let mut i = 0;
    while i < BUFFER_LEN {
        buf[i] = (i as u64 % PERIOD) as u8;
        i += 1;
    }
    buf
}

/// Byte `i` (0-based) of every testbed pattern body: `(i % 251) as u8`.
///
/// ```
/// assert_eq!(wharf_testbed::pattern_byte(0), 0);
/// assert_eq!(wharf_testbed::pattern_byte(250), 250);
/// assert_eq!(wharf_testbed::pattern_byte(251), 0);
/// ```
pub fn pattern_byte(i: u64) -> u8 {
    (i % PERIOD) as u8
}

/// The whole body `/bytes/{len}` (and `/stream?bytes={len}`) sends, for comparing in tests.
///
/// Allocates `len` bytes: meant for test-sized bodies.
///
/// ```
/// let body = wharf_testbed::expected_body(300);
/// assert_eq!(body.len(), 300);
/// assert_eq!(body[252], 1);
/// ```
pub fn expected_body(len: u64) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

/// The pattern bytes `pos..pos + len`, at most [`CHUNK`] of them (a shorter slice when `len`
/// is larger), without allocating.
pub(crate) fn pattern_slice(pos: u64, len: u64) -> Bytes {
    let len = usize::try_from(len).unwrap_or(CHUNK).min(CHUNK);
    let start = (pos % PERIOD) as usize;
    Bytes::from_static(&PATTERN[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_match_the_pattern_at_every_phase() {
        for pos in [0u64, 1, 250, 251, 252, 1_000_003, u64::MAX - CHUNK as u64] {
            let slice = pattern_slice(pos, 1000);
            assert_eq!(slice.len(), 1000);
            for (k, b) in slice.iter().enumerate() {
                assert_eq!(*b, pattern_byte(pos + k as u64), "pos {pos} + {k}");
            }
        }
    }

    #[test]
    fn slices_are_capped_at_one_chunk() {
        assert_eq!(pattern_slice(7, u64::MAX).len(), CHUNK);
        assert_eq!(pattern_slice(7, 0).len(), 0);
    }
}
