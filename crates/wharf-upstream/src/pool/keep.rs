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
//! [`SETTLE`] later. A start waits for one batch only ([`KeptIdle::start`]). An upstream that
//! closes connections opened ahead before any call uses them pauses its floor ([`PauseRule`]).

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::{debug, info};

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

/// When a floor stops opening connections ahead for a while: its upstream closed one that no
/// call had used within `closed_within` of its opening. Such an upstream closes idle
/// connections after a few seconds (Node.js and Apache httpd by default after 5 s, Python's
/// `http.server` per request): a kept connection is gone before a call comes, the sweep finds
/// it closed, and the keeper opens it again, for nothing. In issue 4's lab (a Python origin
/// closing idle connections after 2 s, `bench/RESULTS.md` stop 52) a proxy keeping 128 per
/// core connected 219-228 times in 30 s while idle. Paused, the floor is refilled once per
/// `pause` instead (and paused again if that batch is closed as soon); calls' own connections
/// are pooled as always meanwhile. An upstream that closes them after a minute or more
/// (nginx's 75 s) never pauses it, so a call after a long quiet spell still finds one kept.
#[derive(Debug, Clone, Copy)]
pub(super) struct PauseRule {
    /// A connection opened ahead and closed unused sooner than this pauses the floor.
    pub(super) closed_within: Duration,
    /// For how long.
    pub(super) pause: Duration,
}

/// The rule every floor follows (tests shorten it).
pub(super) const PAUSE_RULE: PauseRule = PauseRule {
    closed_within: Duration::from_secs(30),
    pause: Duration::from_secs(300),
};

/// An upstream's floor, under the pool's lock.
pub(super) struct Floor {
    /// Idle connections to keep.
    count: usize,
    /// Wakes the keeper: the idle connections fell below `count`, or the pool is gone.
    wake: Arc<Notify>,
    rule: PauseRule,
    /// The last pause ([`PauseRule`]); over once its `until` has passed.
    paused: Option<Pause>,
}

/// A pause of a floor: nothing is opened ahead until `until`.
#[derive(Clone, Copy)]
pub(super) struct Pause {
    until: Instant,
    /// How soon after its opening the upstream had closed the connection that paused the
    /// floor (for the keeper's log).
    closed_after: Duration,
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

    /// Under the lock: the upstream closed a connection opened ahead before any call used
    /// it, at most `after` after its opening; soon enough, and the floor pauses
    /// ([`PauseRule`]). The keeper learns it when next woken.
    pub(super) fn pause_floor_if_closed_soon(&mut self, after: Duration, now: Instant) {
        if let Some(floor) = &mut self.floor {
            if after < floor.rule.closed_within {
                floor.paused = Some(Pause {
                    until: now + floor.rule.pause,
                    closed_after: after,
                });
            }
        }
    }

    /// The floor's pause, if one is running at `now`.
    fn floor_pause(&self, now: Instant) -> Option<Pause> {
        self.floor
            .as_ref()?
            .paused
            .filter(|pause| pause.until > now)
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
        self.keep_idle_pausing(key, count, PAUSE_RULE)
    }

    /// [`IdlePool::keep_idle`] with its own [`PauseRule`].
    pub(super) fn keep_idle_pausing(
        self: &Arc<Self>,
        key: &str,
        count: usize,
        rule: PauseRule,
    ) -> KeptIdle {
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
            rule,
            paused: None,
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

    /// `key`'s floor's pause, if one is running.
    pub(super) fn floor_pause(&self, key: &str) -> Option<Pause> {
        let now = Instant::now();
        self.lock().by_key.get(key)?.floor_pause(now)
    }
}

impl KeptIdle {
    /// A new pause of the floor: at info the first time (what the operator may want to know
    /// about an upstream's idle timeout), at debug after.
    fn log_pause(&self, pause: &Pause, left: Duration, first: bool) {
        let closed_within_ms = pause.closed_after.as_millis() as u64;
        let paused_secs = left.as_secs();
        if first {
            info!(
                upstream = %self.key,
                closed_within_ms,
                paused_secs,
                "upstream closed a connection kept open ahead before any call used it: none are opened ahead for a while"
            );
        } else {
            debug!(upstream = %self.key, closed_within_ms, paused_secs, "opening ahead paused again");
        }
    }

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
    /// waits a second first, and while the floor is paused (its upstream closed connections
    /// opened ahead before any call used them; how long, the pool's pause rule says) until
    /// the pause ends (the first pause logged at info, later ones at debug). Run it as a task
    /// on the runtime whose calls use the pool.
    pub async fn keep<F, Fut, E>(self, open: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Connection, E>>,
        E: std::fmt::Display,
    {
        // The end of the last pause logged, and whether it was the first.
        let mut logged: Option<Instant> = None;
        loop {
            self.wake.notified().await;
            // Not in the middle of the wave that took them: its calls come first.
            tokio::time::sleep(SETTLE).await;
            loop {
                let Some(pool) = self.pool.upgrade() else {
                    return;
                };
                let Some(pause) = pool.floor_pause(&self.key) else {
                    break;
                };
                drop(pool);
                let left = pause.until.saturating_duration_since(Instant::now());
                if logged != Some(pause.until) {
                    self.log_pause(&pause, left, logged.is_none());
                    logged = Some(pause.until);
                }
                // Woken meanwhile (calls took connections, or the pool is gone): look again.
                let _ = tokio::time::timeout(left, self.wake.notified()).await;
            }
            if let Err(error) = self.fill(&open).await {
                debug!(upstream = %self.key, %error, "could not reopen kept idle connections");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}
