//! Finds the fill in progress for a cache key, so misses coalesce.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::fill::{Fill, FillReader, FillWriter};

/// Fills in progress by cache key.
#[derive(Debug, Default)]
pub struct FillRegistry {
    /// Key → fill still shareable from its first byte. Entries are removed
    /// by the fill's driver when it ends (see [`FillRegistry::remove`]).
    fills: Mutex<HashMap<String, Arc<Fill>>>,
}

/// The outcome of [`FillRegistry::join_or_start`].
#[derive(Debug)]
pub enum Joined {
    /// A fill for the key was already running: read it.
    Follower(FillReader),
    /// This caller must fetch: it got the writer and its own reader.
    Leader(FillWriter, FillReader),
}

impl FillRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins the shareable fill for `key`, or starts and registers a new one.
    pub fn join_or_start(&self, key: &str, max_object_bytes: u64) -> Joined {
        let mut fills = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(reader) = fills.get(key).and_then(Fill::attach) {
            return Joined::Follower(reader);
        }
        let (writer, fill) = Fill::start(max_object_bytes);
        let reader = fill
            .attach()
            .expect("a fill that has not started is committable, so attachable");
        fills.insert(key.to_owned(), fill);
        Joined::Leader(writer, reader)
    }

    /// Unregisters `fill` from `key` if it is still the one registered.
    pub fn remove(&self, key: &str, fill: &Arc<Fill>) {
        let mut fills = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        if fills
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, fill))
        {
            fills.remove(key);
        }
    }

    /// Fills currently registered.
    pub fn len(&self) -> usize {
        self.fills.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no fill is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
