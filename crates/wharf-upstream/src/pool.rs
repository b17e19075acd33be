//! Idle keep-alive connections, by upstream, for reuse.
//!
//! [`IdlePool`] keeps connections whose last response was read to its end, under a key that
//! names the upstream (`http://host:port` for an origin, a backend's URL for a route). A call
//! takes the most recently used one (its socket is the least likely to have been closed by
//! the upstream's idle timer) after a free check that it is still open. Both the number of
//! idle connections per key and in all are bounded, and connections idle past
//! `idle_timeout` are closed: by the next call for that key, or by the sweep
//! ([`IdlePool::spawn_sweeper`]) when no call comes. Nothing here polls an idle connection:
//! it costs its socket and a few dozen bytes, no buffer and no task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::connection::Connection;

/// An idle connection and since when.
struct Idle {
    connection: Connection,
    since: Instant,
}

/// What the pool's mutex guards.
#[derive(Default)]
struct Slots {
    /// Per upstream key, oldest first.
    by_key: HashMap<Arc<str>, Vec<Idle>>,
    /// Idle connections over all keys.
    total: usize,
}

/// Bounds of an [`IdlePool`].
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Idle connections kept per upstream; beyond it the oldest is closed.
    pub max_idle_per_key: usize,
    /// Idle connections kept over all upstreams; beyond it a returned one is closed.
    pub max_idle_total: usize,
    /// An idle connection older than this is closed, not reused.
    pub idle_timeout: Duration,
}

/// Idle connections by upstream key.
pub struct IdlePool {
    limits: PoolLimits,
    slots: Mutex<Slots>,
}

impl std::fmt::Debug for IdlePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdlePool")
            .field("limits", &self.limits)
            .field("idle", &self.idle_count())
            .finish()
    }
}

/// Where a connection goes back when its response has been read: a pool and a key.
#[derive(Debug, Clone)]
pub struct PoolSlot {
    pool: Arc<IdlePool>,
    key: Arc<str>,
}

impl PoolSlot {
    /// The upstream key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Returns `connection` for reuse.
    pub(crate) fn check_in(&self, connection: Connection) {
        self.pool.check_in(&self.key, connection);
    }
}

impl IdlePool {
    /// An empty pool with these bounds.
    pub fn new(limits: PoolLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            slots: Mutex::new(Slots::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot for `key`, and the most recently used open connection to it if there is one.
    /// Connections found closed or past the idle timeout on the way are closed (after the
    /// lock is released).
    pub fn check_out(self: &Arc<Self>, key: &str) -> (PoolSlot, Option<Connection>) {
        let now = Instant::now();
        let mut closed = Vec::new();
        let mut found = None;
        let shared_key;
        {
            let mut slots = self.lock();
            let Slots { by_key, total } = &mut *slots;
            shared_key = match by_key.get_key_value(key) {
                Some((existing, _)) => existing.clone(),
                None => Arc::from(key),
            };
            if let Some(idle) = by_key.get_mut(key) {
                while let Some(candidate) = idle.pop() {
                    *total -= 1;
                    let fresh = now.duration_since(candidate.since) < self.limits.idle_timeout;
                    if fresh && candidate.connection.is_reusable() {
                        found = Some(candidate.connection);
                        break;
                    }
                    closed.push(candidate);
                }
            }
        }
        drop(closed);
        let slot = PoolSlot {
            pool: self.clone(),
            key: shared_key,
        };
        (slot, found)
    }

    fn check_in(&self, key: &Arc<str>, connection: Connection) {
        let mut surplus = None;
        {
            let mut slots = self.lock();
            let Slots { by_key, total } = &mut *slots;
            let idle = by_key.entry(key.clone()).or_default();
            if idle.len() >= self.limits.max_idle_per_key {
                // Keep the newest: the oldest is the likeliest to be closed by the upstream.
                surplus = Some(idle.remove(0));
                *total -= 1;
            }
            if *total >= self.limits.max_idle_total {
                drop(slots);
                drop(surplus);
                return; // `connection` is closed here, outside the lock
            }
            idle.push(Idle {
                connection,
                since: Instant::now(),
            });
            *total += 1;
        }
        drop(surplus);
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.lock().total
    }

    /// Closes connections idle longer than the timeout or found closed, and forgets keys with
    /// none left.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut closed = Vec::new();
        {
            let mut slots = self.lock();
            let Slots { by_key, total } = &mut *slots;
            by_key.retain(|_, idle| {
                let before = idle.len();
                let mut kept = Vec::with_capacity(before);
                for entry in idle.drain(..) {
                    let fresh = now.duration_since(entry.since) < self.limits.idle_timeout;
                    if fresh && entry.connection.is_reusable() {
                        kept.push(entry);
                    } else {
                        closed.push(entry);
                    }
                }
                *total -= before - kept.len();
                *idle = kept;
                !idle.is_empty()
            });
        }
        drop(closed);
    }

    /// Sweeps every `every` in a task of the current tokio runtime, for as long as the pool
    /// exists; without a runtime (a pool built outside one) there is no sweeper and idle
    /// connections are only closed when their key is used again.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no tokio runtime: idle upstream connections are not swept");
            return;
        };
        let pool: Weak<IdlePool> = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(pool) = pool.upgrade() else { break };
                pool.sweep();
            }
        });
    }
}
