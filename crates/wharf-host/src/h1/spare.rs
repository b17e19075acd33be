//! Spare read buffers, kept per worker thread between requests.
//!
//! A connection gives its read buffer back as soon as nothing is buffered, so a call that
//! waits (or an idle keep-alive connection) holds none. Freed to the allocator, that is a
//! malloc and a free of a read buffer for every request; here the buffer goes to a short
//! per-thread stack instead, and the next read on that thread takes it. Bounded: at most
//! [`SPARE_PER_THREAD`] buffers per worker thread, each reclaimed to its full capacity and
//! at most [`MAX_SPARE_BYTES`] (a buffer grown for a large body is freed, not kept).
//! The stack is one of `wharf_http1::recycle`'s kept stacks, which count per thread; their
//! process-wide totals of kind [`READ_BUFFERS`] are on `/metrics` as
//! `wharf_read_buffers_total` and `wharf_read_buffers_spare` (SPEC §5: buffer reuse, with
//! its statistics).

use std::cell::RefCell;

use bytes::BytesMut;
use wharf_http1::recycle::{keep, take_kept_if, Kept};

/// Buffers kept per thread: enough for the connections one worker reads from between two
/// trips to the allocator, small enough to be noise (64 × 4 KiB = 256 KiB per worker).
pub(super) const SPARE_PER_THREAD: usize = 64;
/// Larger buffers are not kept.
pub(super) const MAX_SPARE_BYTES: usize = 16 * 1024;

/// The kind the spare buffers are counted under (a kept stack of `wharf_http1::recycle`).
pub(crate) const READ_BUFFERS: &str = "read_buffer";

thread_local! {
    static SPARE: RefCell<Kept<BytesMut>> = RefCell::new(Kept::new(READ_BUFFERS));
}

/// A spare buffer of this thread with room for at least `min` bytes, if there is one; the
/// caller allocates otherwise (both are counted).
pub(super) fn take(min: usize) -> Option<BytesMut> {
    take_kept_if(&SPARE, |buf| buf.capacity() >= min)
}

/// Keeps `buf` for a later [`take`] on this thread when it is empty, reclaimable to a full
/// first read (nothing else shares its memory) and not oversized; otherwise frees it.
pub(super) fn give(mut buf: BytesMut) {
    if !buf.is_empty() || buf.capacity() == 0 {
        return;
    }
    // Back to the start of its memory (a read advanced past the head), which only works
    // when no frozen slice of it is alive.
    if !buf.try_reclaim(super::MIN_READ) || buf.capacity() > MAX_SPARE_BYTES {
        return;
    }
    keep(&SPARE, buf, SPARE_PER_THREAD);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_is_taken_again_on_the_same_thread() {
        // Runs on its own test thread: the thread-local stack starts empty.
        assert!(take(1024).is_none());
        let mut buf = BytesMut::with_capacity(4096);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let len = buf.len();
        bytes::Buf::advance(&mut buf, len);
        give(buf);
        let again = take(4096).expect("the buffer given back");
        assert!(again.is_empty());
        assert!(again.capacity() >= 4096);
        assert!(take(1024).is_none(), "one buffer given, one taken");
    }

    #[test]
    fn shared_oversized_or_unfinished_buffers_are_not_kept() {
        let mut shared = BytesMut::with_capacity(4096);
        shared.extend_from_slice(b"body");
        let frozen = shared.split().freeze(); // the memory is still shared with `frozen`
        give(shared);
        give(BytesMut::with_capacity(MAX_SPARE_BYTES * 2));
        let mut unfinished = BytesMut::with_capacity(4096);
        unfinished.extend_from_slice(b"pipelined");
        give(unfinished);
        assert!(take(1).is_none(), "nothing was kept");
        drop(frozen);
        for _ in 0..SPARE_PER_THREAD + 8 {
            give(BytesMut::with_capacity(4096));
        }
        let mut kept = 0;
        while take(1).is_some() {
            kept += 1;
        }
        assert_eq!(kept, SPARE_PER_THREAD);
    }
}
