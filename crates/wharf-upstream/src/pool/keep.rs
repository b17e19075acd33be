//! A floor of idle connections per upstream (a service's `preconnect`): connections opened
//! ahead at start and opened again, in the background, when calls take the idle ones below
//! the floor, so that a wave of new calls finds them open instead of connecting in the call.
//!
//! Why: a wave of slow calls takes every pooled connection to its upstream, and the fast
//! calls that follow then each connect, on the core they came in on. In issue 4's
//! responsiveness scenario (100 fast calls behind 1,000 slow ones), on the first wave after a
//! start, 12 times: fast p99 median 3.9 ms keeping 128 per core against 4.9 ms keeping 1,
//! lower in 11 of 12 (`bench/RESULTS.md` stop 50). Later waves found the connections the
//! earlier ones returned either way (`strace`: no connect at all in a steady round). The
//! idea is Envoy's preconnecting and a database pool's minimum idle; the floor is per core,
//! since each core's calls take from their own pool.
//!
//! The pool knows the floor and says when it is short ([`IdlePool::keep_idle`] gives a
//! [`KeptIdle`]); how to open a connection (the SSRF guard, TLS) is the service's, handed to
//! [`KeptIdle::fill`] and [`KeptIdle::keep`] as a function. A floor raises its upstream's
//! caps to itself, so that kept connections never push each other out; the open-files
//! ledger bounds them as it bounds every idle connection. Nothing runs while the floor is
//! met: the keeper wakes when a call takes a connection and leaves fewer, or when the sweep
//! closed some (past the idle timeout, or closed by the upstream), and opens them
//! [`SETTLE`] later. A start waits for one batch only ([`KeptIdle::start`]).

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::debug;

use super::{upstream_entry, IdlePool, Slots, Upstream};
use crate::connection::Connection;
use crate::error::NoRoom;

/// Connections a keeper opens at once: a floor of hundreds fills in a few round trips
/// without a connect storm against the upstream.
const OPEN_AT_ONCE: usize = 8;

/// How long a keeper waits after it is woken before it opens connections: the wave of calls
/// that took them is still being served, and connects of its own would compete with it.
/// Without it the first-wave p99 above was worse keeping 128 than keeping 1 in 4 of 6 runs.
const SETTLE: Duration = Duration::from_millis(50);

/// How long a keeper waits after it could not open or keep a connection before it tries
/// again (when a call or the sweep next wakes it): an upstream that is down is not
/// hammered, and its calls report it themselves.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// An upstream's floor, under the pool's lock.
pub(super) struct Floor {
    /// Idle connections to keep.
    count: usize,
    /// Wakes the keeper: the idle connections fell below `count`, or the pool is gone.
    wake: Arc<Notify>,
}

impl Upstream {
    /// This upstream's floor (0 without one).
    pub(super) fn floor_count(&self) -> usize {
        self.floor.as_ref().map_or(0, |floor| floor.count)
    }

    /// Under the lock, after idle connections were taken or closed: wakes the keeper when
    /// fewer than the floor are left. One comparison when there is no floor.
    pub(super) fn wake_keeper_if_short(&self) {
        if let Some(floor) = &self.floor {
            if self.idle.len() < floor.count {
                floor.wake.notify_one();
            }
        }
    }
}

impl Slots {
    /// On the pool's drop: ends every keeper's wait (they find the pool gone).
    pub(super) fn wake_keepers(&self) {
        for upstream in self.by_key.values() {
            if let Some(floor) = &upstream.floor {
                floor.wake.notify_one();
            }
        }
    }
}

/// What stopped a [`KeptIdle::fill`].
#[derive(Debug)]
pub enum KeepFailure<E> {
    /// The service's function could not open a connection.
    Open(E),
    /// A connection was opened, but the pool had no room for it (the open-files budget).
    NoRoom(NoRoom),
}

impl<E: std::fmt::Display> std::fmt::Display for KeepFailure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepFailure::Open(error) => error.fmt(f),
            KeepFailure::NoRoom(no_room) => no_room.fmt(f),
        }
    }
}

/// The floor of one upstream in one pool, for the task that keeps it; it does not keep the
/// pool alive (a service rebuilt by a reload drops its pools, and their keepers end).
#[derive(Debug)]
pub struct KeptIdle {
    pool: Weak<IdlePool>,
    key: Arc<str>,
    wake: Arc<Notify>,
}

impl IdlePool {
    /// Keeps at least `count` connections idle under `key` from now on: this key's caps
    /// rise to `count`, and the [`KeptIdle`] returned is woken whenever fewer are idle. A
    /// second floor for the same key replaces the first (whose keeper keeps watching the
    /// new count).
    pub fn keep_idle(self: &Arc<Self>, key: &str, count: usize) -> KeptIdle {
        let mut slots = self.lock();
        self.wake_sweeper_if_empty(&mut slots);
        let Slots { by_key, floors, .. } = &mut *slots;
        let (key, upstream) = upstream_entry(by_key, key);
        let wake = match upstream.floor.take() {
            Some(previous) => {
                *floors -= previous.count;
                previous.wake
            }
            None => Arc::new(Notify::new()),
        };
        *floors += count;
        upstream.floor = Some(Floor {
            count,
            wake: wake.clone(),
        });
        KeptIdle {
            pool: Arc::downgrade(self),
            key,
            wake,
        }
    }

    /// Borrows from the ledger the descriptors of up to `count` connections about to be
    /// opened and kept (they join the pool's lease, as [`IdlePool::check_in`] would borrow
    /// them); how many it got. Done before connecting, so that a keeper never takes a
    /// descriptor the open sessions then miss.
    fn reserve(&self, count: usize) -> usize {
        let mut slots = self.lock();
        let mut reserved = (slots.lent - slots.total).min(count);
        if reserved < count && self.ledger.lend(count - reserved) {
            slots.lent += count - reserved;
            reserved = count;
        }
        while reserved < count && self.ledger.lend(1) {
            slots.lent += 1;
            reserved += 1;
        }
        reserved
    }

    /// Connections `key` is short of its floor.
    fn shortfall(&self, key: &str) -> usize {
        self.lock().by_key.get(key).map_or(0, |upstream| {
            upstream.floor_count().saturating_sub(upstream.idle.len())
        })
    }
}

impl KeptIdle {
    /// Opens connections with `open` until the floor is met, 8 at a time, and
    /// keeps them idle; the first failure ends it (the next attempt would likely meet the
    /// same). Done at once when the pool is gone.
    pub async fn fill<F, Fut, E>(&self, open: &F) -> Result<(), KeepFailure<E>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Connection, E>>,
    {
        while self.fill_batch(open).await? {}
        Ok(())
    }

    /// Opens one batch of the connections the floor is short of and keeps them; whether
    /// there was anything to open (`false`: the floor is met, or the pool is gone).
    async fn fill_batch<F, Fut, E>(&self, open: &F) -> Result<bool, KeepFailure<E>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Connection, E>>,
    {
        let (wanted, batch) = match self.pool.upgrade() {
            Some(pool) => {
                let wanted = pool.shortfall(&self.key).min(OPEN_AT_ONCE);
                (wanted, pool.reserve(wanted))
            }
            None => return Ok(false),
        };
        if wanted == 0 {
            return Ok(false);
        }
        let opening = (0..batch).map(|_| open());
        let opened = futures_util::future::join_all(opening).await;
        let Some(pool) = self.pool.upgrade() else {
            return Ok(false);
        };
        let mut failure = None;
        for result in opened {
            let kept = result.map_err(KeepFailure::Open).and_then(|connection| {
                pool.keep_opened_ahead(&self.key, connection)
                    .map_err(KeepFailure::NoRoom)
            });
            if let Err(error) = kept {
                failure.get_or_insert(error);
            }
        }
        if batch < wanted {
            failure.get_or_insert(KeepFailure::NoRoom(NoRoom));
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(true),
        }
    }

    /// Opens one batch (8) of the connections the floor is short of, then
    /// leaves [`KeptIdle::keep`] running on this runtime (the core whose calls use the pool)
    /// for the rest and for as long as the pool lives; the first batch's failure, if any.
    /// What a service's start waits for before its port listens: one connect's time
    /// whatever the floor. A floor of 128 opened whole took the start 5.7 ms here, against
    /// 0.24 ms for a floor of 1.
    pub async fn start<F, Fut, E>(self, open: F) -> Result<(), KeepFailure<E>>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Connection, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let first = self.fill_batch(&open).await;
        // The keeper's first round opens the rest.
        self.wake.notify_one();
        tokio::spawn(self.keep(open));
        first.map(|_| ())
    }

    /// Keeps the floor for as long as the pool lives: waits until calls or the sweep leave
    /// fewer idle connections than the floor, then [`KeptIdle::fill`]s again; after a
    /// failure (logged at debug: the calls report an unreachable upstream themselves) it
    /// waits a second first. Run it as a task on the runtime whose calls use the pool.
    pub async fn keep<F, Fut, E>(self, open: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Connection, E>>,
        E: std::fmt::Display,
    {
        loop {
            self.wake.notified().await;
            // Not in the middle of the wave that took them: its calls come first.
            tokio::time::sleep(SETTLE).await;
            if self.pool.strong_count() == 0 {
                return;
            }
            if let Err(error) = self.fill(&open).await {
                debug!(upstream = %self.key, %error, "could not reopen kept idle connections");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}
