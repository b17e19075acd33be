//! The in-memory tier: committed responses bounded by their total size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};

use crate::entry::CachedResponse;

/// A byte-bounded map from cache key to committed response.
///
/// Bounded by `max_bytes` of body and header weight. quick_cache shards its
/// capacity, so the shard count is chosen to let one shard hold an object of
/// `max_object_bytes`: otherwise the largest allowed objects could never be
/// admitted.
pub struct MemoryCache {
    entries: Cache<String, Arc<CachedResponse>, EntryWeighter, DefaultHashBuilder, EvictionCounter>,
    /// Evictions made to free room (not expiries or replacements).
    evictions: Arc<AtomicU64>,
}

impl std::fmt::Debug for MemoryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCache")
            .field("bytes", &self.bytes())
            .field("entries", &self.entries.len())
            .finish()
    }
}

#[derive(Clone)]
struct EntryWeighter;

impl Weighter<String, Arc<CachedResponse>> for EntryWeighter {
    fn weight(&self, key: &String, value: &Arc<CachedResponse>) -> u64 {
        // Never 0: zero-weight items are never evicted by quick_cache.
        value.weight() + key.len() as u64
    }
}

#[derive(Clone)]
struct EvictionCounter(Arc<AtomicU64>);

impl Lifecycle<String, Arc<CachedResponse>> for EvictionCounter {
    // Evicted values are dropped outside the shard lock by holding them here.
    type RequestState = Vec<Arc<CachedResponse>>;

    fn begin_request(&self) -> Self::RequestState {
        Vec::new()
    }

    fn on_evict(&self, state: &mut Self::RequestState, _key: String, value: Arc<CachedResponse>) {
        self.0.fetch_add(1, Ordering::Relaxed);
        state.push(value);
    }
}

impl MemoryCache {
    /// A cache holding at most `max_bytes`, admitting objects up to `max_object_bytes`.
    pub fn new(max_bytes: u64, max_object_bytes: u64) -> Self {
        let max_object_bytes = max_object_bytes.clamp(1, max_bytes.max(1));
        // One shard per core-ish, but never so many that an object of
        // max_object_bytes (plus its header weight) outgrows a shard.
        // quick_cache refuses items heavier than a shard's hot target (97 %
        // of the shard), hence the 5 % margin on top of header weight.
        let per_shard_need = (max_object_bytes + 64 * 1024) * 21 / 20;
        let room_for = (max_bytes / per_shard_need).max(1);
        let shards = (room_for.min(16) as usize).next_power_of_two();
        let shards = if shards as u64 > room_for {
            shards / 2
        } else {
            shards
        }
        .max(1);
        let evictions = Arc::new(AtomicU64::new(0));
        // Guess of the typical entry size, for the hash table's initial size.
        let estimated_items = (max_bytes / (16 * 1024)).clamp(64, 1 << 20) as usize;
        let options = OptionsBuilder::new()
            .estimated_items_capacity(estimated_items)
            .weight_capacity(max_bytes.max(1))
            .shards(shards)
            .build()
            .expect("capacities are non-zero, so the cache options are valid");
        let entries = Cache::with_options(
            options,
            EntryWeighter,
            DefaultHashBuilder::default(),
            EvictionCounter(evictions.clone()),
        );
        Self { entries, evictions }
    }

    /// The fresh entry for `key` at `now`; an expired entry is removed.
    pub fn get(&self, key: &str, now: Instant) -> Option<Arc<CachedResponse>> {
        let entry = self.entries.get(key)?;
        if entry.is_fresh(now) {
            return Some(entry);
        }
        self.entries
            .remove_if(key, |current| Arc::ptr_eq(current, &entry));
        None
    }

    /// Stores `entry` under `key`, replacing any older one.
    pub fn insert(&self, key: String, entry: Arc<CachedResponse>) {
        self.entries.insert(key, entry);
    }

    /// Drops the entry for `key`, if any.
    pub fn remove(&self, key: &str) {
        self.entries.remove(key);
    }

    /// Bytes currently held (the weight of all entries).
    pub fn bytes(&self) -> u64 {
        self.entries.weight()
    }

    /// Number of entries currently held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries evicted to make room since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::ResponseHead;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use std::time::Duration;

    fn entry(len: usize, now: Instant, ttl: Duration) -> Arc<CachedResponse> {
        let head = Arc::new(ResponseHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
        });
        Arc::new(CachedResponse::new(
            head,
            vec![Bytes::from(vec![7u8; len])],
            now,
            ttl,
        ))
    }

    #[test]
    fn fresh_entry_is_served_and_expired_one_is_dropped() {
        let cache = MemoryCache::new(1 << 20, 1 << 16);
        let now = Instant::now();
        cache.insert("k".into(), entry(100, now, Duration::from_secs(10)));
        assert!(cache.get("k", now + Duration::from_secs(9)).is_some());
        assert!(cache.get("k", now + Duration::from_secs(10)).is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn bounded_in_bytes_and_counts_evictions() {
        let max = 1 << 20;
        let cache = MemoryCache::new(max, 100 * 1024);
        let now = Instant::now();
        for i in 0..100 {
            cache.insert(
                format!("k{i}"),
                entry(64 * 1024, now, Duration::from_secs(60)),
            );
            assert!(cache.bytes() <= max, "weight {} over {max}", cache.bytes());
        }
        assert!(cache.evictions() > 0);
        assert!(cache.len() < 100);
    }

    #[test]
    fn an_object_of_max_object_bytes_is_admitted() {
        let cache = MemoryCache::new(4 << 20, 2 << 20);
        let now = Instant::now();
        cache.insert("big".into(), entry(2 << 20, now, Duration::from_secs(60)));
        assert!(cache.get("big", now).is_some());
    }
}
