//! Response head buffers kept per worker thread between responses.
//!
//! Every response is encoded into a buffer of its own (its head, with a small body copied
//! behind it). At a few hundred bytes plus a 1 KiB body that buffer is past the allocator's
//! per-thread cache, and its malloc and free were the costliest pair of a pass-through call
//! (~800 instructions of ~27,000, counted with callgrind). A writer gives its buffer back
//! here when it is done; the next response on the thread takes it (a kept stack of
//! `wharf_http1::recycle`, as header maps are). Bounded: at most [`KEPT_PER_THREAD`]
//! buffers, none larger than [`MAX_KEPT_BYTES`].

use std::cell::RefCell;

use wharf_http1::recycle::{keep, take_kept, Kept};

/// Buffers kept per thread: about the responses one worker writes at once.
const KEPT_PER_THREAD: usize = 32;
/// Larger buffers (a head grown past the small-body room) are freed, not kept.
pub(super) const MAX_KEPT_BYTES: usize = 16 * 1024;

/// The `kind` of the kept head buffers on `/metrics` (`wharf_kept_objects_total`).
pub(crate) const RESPONSE_HEADS: &str = "response_head";

thread_local! {
    static KEPT: RefCell<Kept<Vec<u8>>> = RefCell::new(Kept::new(RESPONSE_HEADS));
}

/// An empty buffer with room for at least `capacity` bytes: a kept one when there is one.
pub(super) fn take(capacity: usize) -> Vec<u8> {
    match take_kept(&KEPT) {
        Some(mut buffer) => {
            buffer.reserve(capacity);
            buffer
        }
        None => Vec::with_capacity(capacity),
    }
}

/// Keeps `buffer` (emptied) for the next response on this thread, within the bounds.
pub(super) fn give(mut buffer: Vec<u8>) {
    if buffer.capacity() == 0 || buffer.capacity() > MAX_KEPT_BYTES {
        return;
    }
    buffer.clear();
    keep(&KEPT, buffer, KEPT_PER_THREAD);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty() {
        // Each test runs on a thread of its own: nothing is kept yet.
        let mut buffer = take(300);
        buffer.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        let at = buffer.as_ptr();
        give(buffer);
        let again = take(100);
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same allocation, not a new one");
    }

    #[test]
    fn large_buffers_are_freed_and_the_stack_is_bounded() {
        give(Vec::with_capacity(MAX_KEPT_BYTES + 1));
        assert!(take_kept(&KEPT).is_none(), "the large one was freed");
        for _ in 0..KEPT_PER_THREAD + 5 {
            give(Vec::with_capacity(64));
        }
        let mut kept = 0;
        while take_kept(&KEPT).is_some() {
            kept += 1;
        }
        assert_eq!(kept, KEPT_PER_THREAD);
    }
}
