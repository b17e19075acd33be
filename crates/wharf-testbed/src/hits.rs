//! Request counters per path, read in-process by tests and served as JSON on `/hits`.
//!
//! [`Hits`] counts every request by its path (without the query) as it arrives. The hot path
//! takes a read lock and bumps an atomic; the write lock is taken only the first time a path
//! is seen. The number of distinct paths is bounded ([`MAX_PATHS`]) so a path scan cannot grow
//! the map without limit: later new paths are counted under [`OTHER_PATHS`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

/// Distinct paths counted one by one; more are lumped under [`OTHER_PATHS`].
pub(crate) const MAX_PATHS: usize = 10_000;

/// The key that counts requests to paths beyond the first [`MAX_PATHS`].
pub(crate) const OTHER_PATHS: &str = "(other)";

/// Requests seen since start (or the last reset), per path and in total.
#[derive(Debug, Default)]
pub(crate) struct Hits {
    /// Requests counted, all paths together.
    total: AtomicU64,
    /// Guards the set of known paths; the counts themselves are atomics updated under the
    /// read lock.
    per_path: RwLock<HashMap<Box<str>, AtomicU64>>,
}

impl Hits {
    /// Counts one request to `path`.
    pub(crate) fn record(&self, path: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        {
            let map = self.per_path.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(count) = map.get(path) {
                count.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut map = self
            .per_path
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let key = if map.len() < MAX_PATHS || map.contains_key(path) {
            path
        } else {
            OTHER_PATHS
        };
        map.entry(key.into())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Requests seen for exactly `path` (0 if never seen).
    pub(crate) fn get(&self, path: &str) -> u64 {
        let map = self.per_path.read().unwrap_or_else(PoisonError::into_inner);
        map.get(path).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Requests seen for all paths together.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Every path seen and its count, sorted by path.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, u64> {
        let map = self.per_path.read().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(path, count)| (path.to_string(), count.load(Ordering::Relaxed)))
            .collect()
    }

    /// Forgets every count.
    pub(crate) fn reset(&self) {
        let mut map = self
            .per_path
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        map.clear();
        self.total.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_path_and_resets() {
        let hits = Hits::default();
        hits.record("/fast");
        hits.record("/fast");
        hits.record("/bytes/10");
        assert_eq!(hits.get("/fast"), 2);
        assert_eq!(hits.get("/bytes/10"), 1);
        assert_eq!(hits.get("/slow"), 0);
        assert_eq!(hits.total(), 3);
        assert_eq!(hits.snapshot().len(), 2);
        hits.reset();
        assert_eq!(hits.get("/fast"), 0);
        assert_eq!(hits.total(), 0);
    }

    #[test]
    fn distinct_paths_are_bounded() {
        let hits = Hits::default();
        for i in 0..MAX_PATHS + 5 {
            hits.record(&format!("/p/{i}"));
        }
        hits.record("/p/0");
        assert_eq!(hits.get("/p/0"), 2);
        assert_eq!(hits.get(OTHER_PATHS), 5);
        assert_eq!(hits.snapshot().len(), MAX_PATHS + 1);
        assert_eq!(hits.total(), MAX_PATHS as u64 + 6);
    }
}
