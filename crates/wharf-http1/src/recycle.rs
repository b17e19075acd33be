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
//!
//! Other crates keep their own values the same way ([`Kept`] stacks with [`keep`] and
//! [`take_kept`]: the host's read buffers and response head buffers). Every stack counts, per
//! thread, the takes that reused a kept value or found none, and the values it holds;
//! [`kept_stats`] sums them by kind for `/metrics` (SPEC §5: buffer reuse with its
//! statistics).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

use http::{Extensions, HeaderMap};

/// Maps kept per thread: about the responses one worker has in flight at once.
pub const KEPT_PER_THREAD: usize = 64;
/// Larger maps are not kept.
pub const MAX_KEPT_CAPACITY: usize = 64;

/// The `kind` of the kept header maps in [`kept_stats`].
pub const HEADER_MAPS: &str = "header_map";
/// The `kind` of the kept extension maps in [`kept_stats`].
pub const EXTENSION_MAPS: &str = "extensions";

thread_local! {
    static KEPT: RefCell<Kept<HeaderMap>> = RefCell::new(Kept::new(HEADER_MAPS));
    static KEPT_EXTENSIONS: RefCell<Kept<Extensions>> = RefCell::new(Kept::new(EXTENSION_MAPS));
}

/// One thread's kept values of one kind, and its counts for [`kept_stats`].
pub struct Kept<T> {
    values: Vec<T>,
    counts: Arc<KeptCounts>,
}

/// One thread's stack of kept values: a `thread_local!` of a `RefCell<Kept<T>>`.
pub type KeptStack<T> = LocalKey<RefCell<Kept<T>>>;

/// One thread's counts of one kind. Only the owning thread writes them (plain loads and
/// stores, no locked instructions: a shared counter bounced between two workers would cost
/// more than the malloc it counts); [`kept_stats`] sums them over [`THREADS`].
struct KeptCounts {
    kind: &'static str,
    /// Takes that got a kept value.
    reused: AtomicU64,
    /// Takes that found none (the caller allocates).
    allocated: AtomicU64,
    /// Values the thread holds now: its stack's length, mirrored for [`kept_stats`] (which
    /// runs on another thread).
    held: AtomicU64,
}

/// Every thread's counts, kept after the thread ends (totals never go back).
static THREADS: Mutex<Vec<Arc<KeptCounts>>> = Mutex::new(Vec::new());

impl<T> Kept<T> {
    /// An empty stack of `kind` (the label its counts are summed under), counted from now.
    pub fn new(kind: &'static str) -> Self {
        let counts = Arc::new(KeptCounts {
            kind,
            reused: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            held: AtomicU64::new(0),
        });
        THREADS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(counts.clone());
        Self {
            values: Vec::new(),
            counts,
        }
    }

    fn mirror_held(&self) {
        self.counts
            .held
            .store(self.values.len() as u64, Ordering::Relaxed);
    }
}

impl<T> Drop for Kept<T> {
    fn drop(&mut self) {
        self.counts.held.store(0, Ordering::Relaxed); // freed with the thread
    }
}

fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// The next thread's number (see [`thread_number`]).
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number, taken at its first call to [`thread_number`].
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number, for state sharded by thread (the upstream idle pools, the host's
/// in-flight list): threads are numbered in the order they first ask, so threads that start
/// working side by side (the host's cores, in the start-up warm-up) get consecutive numbers,
/// and thus distinct shards of any set of at least as many.
pub fn thread_number() -> usize {
    THREAD.with(|thread| *thread)
}

/// The value last kept on this thread's `stack`, if any (counted as reused, or as
/// allocated when there is none).
pub fn take_kept<T>(stack: &'static KeptStack<T>) -> Option<T> {
    take_kept_if(stack, |_| true)
}

/// The value last kept on this thread's `stack` if `fits` it; counted as [`take_kept`].
pub fn take_kept_if<T>(stack: &'static KeptStack<T>, fits: impl FnOnce(&T) -> bool) -> Option<T> {
    stack.with(|kept| {
        let kept = &mut *kept.borrow_mut();
        let taken = match kept.values.last() {
            Some(value) if fits(value) => kept.values.pop(),
            _ => None,
        };
        match taken {
            Some(_) => bump(&kept.counts.reused),
            None => bump(&kept.counts.allocated),
        }
        kept.mirror_held();
        taken
    })
}

/// Keeps `value` on this thread's `stack`, unless the stack holds `bound` values already
/// (then `value` is dropped).
pub fn keep<T>(stack: &'static KeptStack<T>, value: T, bound: usize) {
    stack.with(|kept| {
        let kept = &mut *kept.borrow_mut();
        if kept.values.len() < bound {
            kept.values.push(value);
            kept.mirror_held();
        }
    });
}

/// One kind's running totals over all threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptStats {
    /// The kind, as given to [`Kept::new`].
    pub kind: &'static str,
    /// Takes that got a kept value.
    pub reused: u64,
    /// Takes that found none and allocated.
    pub allocated: u64,
    /// Values held for reuse now.
    pub held: u64,
}

/// The running totals of every kind kept so far (a kind no thread has used is absent).
pub fn kept_stats() -> Vec<KeptStats> {
    let threads = THREADS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut stats: Vec<KeptStats> = Vec::new();
    for counts in threads.iter() {
        let index = match stats.iter().position(|kind| kind.kind == counts.kind) {
            Some(index) => index,
            None => {
                stats.push(KeptStats {
                    kind: counts.kind,
                    reused: 0,
                    allocated: 0,
                    held: 0,
                });
                stats.len() - 1
            }
        };
        let kind = &mut stats[index];
        kind.reused += counts.reused.load(Ordering::Relaxed);
        kind.allocated += counts.allocated.load(Ordering::Relaxed);
        kind.held += counts.held.load(Ordering::Relaxed);
    }
    stats
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
        let kept = KEPT.with(|kept| kept.borrow().values.len());
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
        assert_eq!(KEPT_EXTENSIONS.with(|kept| kept.borrow().values.len()), 0);
        for _ in 0..KEPT_PER_THREAD + 3 {
            let mut one = Extensions::new();
            one.insert(1u8);
            recycle_extensions(one);
        }
        assert_eq!(
            KEPT_EXTENSIONS.with(|kept| kept.borrow().values.len()),
            KEPT_PER_THREAD
        );
    }

    thread_local! {
        static COUNTED: RefCell<Kept<u32>> = RefCell::new(Kept::new("recycle_test"));
    }

    fn counted() -> KeptStats {
        kept_stats()
            .into_iter()
            .find(|kind| kind.kind == "recycle_test")
            .expect("the test's kind is registered")
    }

    #[test]
    fn takes_are_counted_as_reused_or_allocated_and_held_values_mirrored() {
        assert_eq!(take_kept(&COUNTED), None);
        keep(&COUNTED, 1, 4);
        keep(&COUNTED, 2, 4);
        assert_eq!(counted().held, 2);
        assert_eq!(
            take_kept_if(&COUNTED, |value| *value > 5),
            None,
            "2 does not fit"
        );
        assert_eq!(take_kept(&COUNTED), Some(2));
        let stats = counted();
        assert_eq!((stats.reused, stats.allocated, stats.held), (1, 2, 1));
        // Values held by a thread that ended are no longer counted as held.
        std::thread::spawn(|| keep(&COUNTED, 3, 4)).join().unwrap();
        assert_eq!(counted().held, 1);
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
