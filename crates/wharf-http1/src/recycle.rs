//! Header maps (and extension maps) kept per thread between messages, so parsing a head
//! does not allocate one.
//!
//! A parsed head's [`HeaderMap`] costs two allocations (its index table and its entries).
//! Whoever is done with a map (the server once a response head is encoded, a service once
//! it has read a request's headers) hands it to [`recycle`]; the next head parsed on that
//! thread takes it, emptied, with its capacity. Bounded: at most [`KEPT_PER_THREAD`] maps
//! per thread, none with room for more than [`MAX_KEPT_CAPACITY`] fields (the map of a
//! header flood is freed, not kept). A map not handed back is simply freed.
//!
//! The same goes for [`http::Extensions`]: a message's first extension allocates a map and
//! its table (the host adds the client's address and the call's context to every request;
//! a relayed response head rides in one), two mallocs and two frees a message.
//! [`recycle_extensions`] keeps a used one, emptied, and [`extensions`] hands it out again.

use std::cell::RefCell;
use std::thread::LocalKey;

use http::{Extensions, HeaderMap};

/// Maps kept per thread: about the responses one worker has in flight at once.
pub const KEPT_PER_THREAD: usize = 64;
/// Larger maps are not kept.
pub const MAX_KEPT_CAPACITY: usize = 64;

thread_local! {
    static KEPT: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
    static KEPT_EXTENSIONS: RefCell<Vec<Extensions>> = const { RefCell::new(Vec::new()) };
}

/// One thread's stack of kept values (a `thread_local!` of a `RefCell<Vec<T>>`).
pub type KeptStack<T> = LocalKey<RefCell<Vec<T>>>;

/// The value last kept on this thread's `stack`, if any.
pub fn take_kept<T>(stack: &'static KeptStack<T>) -> Option<T> {
    stack.with(|kept| kept.borrow_mut().pop())
}

/// Keeps `value` on this thread's `stack`, unless the stack holds `bound` values already
/// (then `value` is dropped).
pub fn keep<T>(stack: &'static KeptStack<T>, value: T, bound: usize) {
    stack.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() < bound {
            kept.push(value);
        }
    });
}

/// An empty map with room for `fields`: a kept one when this thread has one.
pub fn header_map_with_capacity(fields: usize) -> HeaderMap {
    match take_kept(&KEPT) {
        Some(mut map) => {
            map.reserve(fields);
            map
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Keeps `map` (emptied) for the next head parsed on this thread, within the bounds.
pub fn recycle(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > MAX_KEPT_CAPACITY {
        return;
    }
    map.clear();
    keep(&KEPT, map, KEPT_PER_THREAD);
}

/// An empty extension map: a kept one (its map already allocated) when this thread has one.
pub fn extensions() -> Extensions {
    take_kept(&KEPT_EXTENSIONS).unwrap_or_default()
}

/// Keeps `extensions` (emptied: its values are dropped now) for the next message on this
/// thread, if it holds a map at all, within [`KEPT_PER_THREAD`].
pub fn recycle_extensions(mut extensions: Extensions) {
    // An empty one may have no map: nothing worth keeping.
    if extensions.is_empty() {
        return;
    }
    extensions.clear();
    keep(&KEPT_EXTENSIONS, extensions, KEPT_PER_THREAD);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderValue, HOST};

    #[test]
    fn a_recycled_map_comes_back_empty_with_its_room() {
        // Each test runs on its own thread: nothing is kept yet.
        let mut map = header_map_with_capacity(8);
        map.insert(HOST, HeaderValue::from_static("example.com"));
        let room = map.capacity();
        recycle(map);
        let again = header_map_with_capacity(4);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room, "the same map, not a new one");
    }

    #[test]
    fn oversized_maps_are_freed_and_the_pool_is_bounded() {
        recycle(HeaderMap::with_capacity(MAX_KEPT_CAPACITY * 4));
        assert_eq!(
            header_map_with_capacity(1).capacity(),
            HeaderMap::<HeaderValue>::with_capacity(1).capacity()
        );
        for _ in 0..KEPT_PER_THREAD + 10 {
            recycle(HeaderMap::with_capacity(8));
        }
        let kept = KEPT.with(|kept| kept.borrow().len());
        assert_eq!(kept, KEPT_PER_THREAD);
    }

    #[test]
    fn recycled_extensions_come_back_empty_and_bounded() {
        let mut used = extensions();
        used.insert(7u32);
        used.insert("stale");
        recycle_extensions(used);
        let again = extensions();
        assert!(again.is_empty(), "a kept map comes back without its values");
        assert!(again.get::<u32>().is_none());
        recycle_extensions(again); // empty: not kept
        assert_eq!(KEPT_EXTENSIONS.with(|kept| kept.borrow().len()), 0);
        for _ in 0..KEPT_PER_THREAD + 3 {
            let mut one = Extensions::new();
            one.insert(1u8);
            recycle_extensions(one);
        }
        assert_eq!(
            KEPT_EXTENSIONS.with(|kept| kept.borrow().len()),
            KEPT_PER_THREAD
        );
    }

    #[test]
    fn a_head_parsed_into_a_recycled_map_has_only_its_own_fields() {
        let mut used = header_map_with_capacity(8);
        used.insert(HOST, HeaderValue::from_static("stale.example"));
        used.insert("x-stale", HeaderValue::from_static("1"));
        recycle(used);
        let wire = b"GET / HTTP/1.1\r\nhost: fresh.example\r\n\r\n";
        let parsed = match crate::request::parse_request_head(wire, 8192) {
            Ok(crate::request::RequestParse::Complete(_, parsed)) => parsed,
            _ => panic!("a complete head"),
        };
        assert_eq!(parsed.headers.len(), 1);
        assert_eq!(parsed.headers[HOST], "fresh.example");
        assert!(parsed.headers.get("x-stale").is_none());
    }
}
