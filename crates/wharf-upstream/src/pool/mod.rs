//! Idle keep-alive connections, by upstream, for reuse.
//!
//! [`IdlePool`] keeps connections whose last response was read to its end, under a key that
//! names the upstream (`http://host:port` for an origin, a backend's URL for a route). A call
//! takes the most recently used one (its socket is the least likely to have been closed by
//! the upstream's idle timer) after a free check that it is still open. Both the number of
//! idle connections per key and in all are bounded, and connections idle past
//! `idle_timeout` are closed: by the next call for that key, or by the sweep
//! ([`IdlePool::sweep_from_first_call`]) when no call comes. Nothing here polls an idle
//! connection: it costs its socket and a few dozen bytes and no task; the read buffer it kept from its
//! last exchange is given back by the next sweep. A pool that holds nothing (no idle
//! connection, no upstream being connected to or waited for) has nothing to sweep: its
//! sweeper sleeps without a timer until a call comes, so an unused gateway is not woken.
//!
//! New connections are opened a few at a time per upstream ([`IdlePool::acquire`]): a call
//! that finds no idle connection opens one if fewer than `max_connecting_per_key` are being
//! opened, and otherwise waits for whichever comes first: a connection checked in, a connect
//! finishing, or `max_connect_wait` (then it opens its own). Under a burst of new calls to
//! a fast upstream most calls reuse a connection the previous calls just returned instead
//! of each opening its own; calls behind slow ones that hold their connections wait at most
//! `max_connect_wait`.
//!
//! Idle connections are descriptors the open sessions may need: a pool keeps one only with
//! a descriptor lent by the process's [`DescriptorLedger`] (borrowed `LEASE` at a time),
//! and gives them back when the ledger recalls them for sessions, closing each upstream's
//! oldest idle connections first; before a call opens a connection of its own the ledger is
//! asked to make room. So the caps above bound the pool, and what sessions leave free
//! bounds it further.
//!
//! The descriptors' loan and recall are in `lending`, the sweep of stale connections in
//! `sweep`; the tests, in `tests.rs`, drive both through the pool.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use tokio::sync::Notify;
use wharf_limits::descriptors::{DescriptorLedger, Lender};

use crate::connection::Connection;
use crate::error::NoRoom;
use keep::Floor;
pub use keep::{KeepFailure, KeptIdle};
use lending::borrow_one;

mod keep;
mod lending;
mod sweep;
#[cfg(test)]
mod tests;

/// An idle connection, since when, and whether a keeper opened it ahead of any call (cleared
/// once a call has used it: it comes back through [`PoolSlot::check_in`]).
struct Idle {
    connection: Connection,
    since: Instant,
    opened_ahead: bool,
}

/// What a look at an idle connection found.
enum IdleState {
    /// Young enough and, as far as can be told without reading it, still open.
    Usable,
    /// Past the idle timeout, or closed by the upstream after a call used it.
    Stale,
    /// Opened ahead and closed by the upstream before any call used it, at most this long
    /// after its opening (what pauses a floor, `keep`).
    ClosedUnused(Duration),
}

impl Idle {
    fn state(&self, now: Instant, idle_timeout: Duration) -> IdleState {
        let age = now.duration_since(self.since);
        if age >= idle_timeout {
            IdleState::Stale
        } else if self.connection.is_reusable() {
            IdleState::Usable
        } else if self.opened_ahead {
            IdleState::ClosedUnused(age)
        } else {
            IdleState::Stale
        }
    }
}

/// One upstream's idle connections, and the calls opening or waiting for one.
#[derive(Default)]
struct Upstream {
    /// Oldest first.
    idle: Vec<Idle>,
    /// Connections being opened now (each by a call holding a [`ConnectPermit`]).
    connecting: usize,
    /// Calls waiting in [`IdlePool::acquire`].
    waiting: usize,
    /// Wakes one waiting call: a connection came back or a connect finished.
    wake: Arc<Notify>,
    /// Idle connections kept open ahead of calls, if any (`keep`).
    floor: Option<Floor>,
}

impl Upstream {
    /// Nothing held, nobody opening or waiting, and no floor: the key can be forgotten.
    fn is_unused(&self) -> bool {
        self.idle.is_empty() && self.connecting == 0 && self.waiting == 0 && self.floor.is_none()
    }
}

/// Idle connections per upstream that keep their read buffer for the next call: calls take
/// the most recently returned connection, so under keep-alive load the same few dozen
/// cycle at the top of the stack; those below give the buffer (a few KiB) back as they
/// sink past this depth. Without it, the 4,096 connections a wave of 10,000 slow calls
/// left behind held 16 MiB of buffers until the next sweep (issue 4's 10,000-slow run:
/// RSS 50 MiB in flight, 66 MiB once they were returned).
const BUFFERED_DEPTH: usize = 64;

/// What the pool's mutex guards.
#[derive(Default)]
struct Slots {
    by_key: HashMap<Arc<str>, Upstream>,
    /// Idle connections over all keys.
    total: usize,
    /// Descriptors borrowed from the ledger: at least `total`, at most a few leases more.
    lent: usize,
    /// The floors of all keys together: kept connections come on top of `max_idle_total`.
    floors: usize,
    /// The interval of the sweeper the next call that brings an upstream in starts
    /// ([`IdlePool::sweep_from_first_call`]); taken by that call.
    sweep_deferred: Option<Duration>,
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
    /// Connections being opened at once per upstream, by [`IdlePool::acquire`]; further
    /// calls wait for one of them or for a connection to come back.
    pub max_connecting_per_key: usize,
    /// The longest a call waits so in [`IdlePool::acquire`] before it opens a connection
    /// anyway.
    pub max_connect_wait: Duration,
}

/// What [`IdlePool::acquire`] gives a call: a pooled connection, or the right to open one.
#[derive(Debug)]
pub enum Checkout {
    /// An idle connection, open as far as can be told without reading it.
    Idle(PoolSlot, Connection),
    /// No idle connection: open one, holding the permit until it is open (or failed).
    Connect(PoolSlot, ConnectPermit),
}

/// One of an upstream's `max_connecting_per_key` connects in progress; dropping it lets a
/// waiting call open the next.
#[derive(Debug)]
pub struct ConnectPermit {
    pool: Arc<IdlePool>,
    key: Arc<str>,
}

impl Drop for ConnectPermit {
    fn drop(&mut self) {
        self.pool
            .count_off(&self.key, |upstream| &mut upstream.connecting);
    }
}

/// Counts a call as waiting for as long as it waits (also when its future is dropped).
struct Waiting<'a> {
    pool: &'a IdlePool,
    /// `None` once disarmed: the caller counts the call off itself.
    key: Option<Arc<str>>,
}

impl Waiting<'_> {
    fn disarm(mut self) {
        self.key = None;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // A wake-up this call took with it goes to the next waiting call.
            self.pool.count_off(&key, |upstream| &mut upstream.waiting);
        }
    }
}

/// What [`IdlePool::acquire`] does after looking under the lock.
enum Next {
    /// Got one; maybe wake the next waiting call too.
    Done(Checkout, Option<Arc<Notify>>),
    /// Wait on this upstream's wake-ups.
    Wait(Arc<Notify>),
}

/// The map's own `Arc` of `key` when it has one, else a new one.
fn shared_key(by_key: &HashMap<Arc<str>, Upstream>, key: &str) -> Arc<str> {
    match by_key.get_key_value(key) {
        Some((existing, _)) => existing.clone(),
        None => Arc::from(key),
    }
}

/// `key`'s upstream (added when new) with the map's `Arc` of the key.
fn upstream_entry<'a>(
    by_key: &'a mut HashMap<Arc<str>, Upstream>,
    key: &str,
) -> (Arc<str>, &'a mut Upstream) {
    let key = shared_key(by_key, key);
    let upstream = by_key.entry(key.clone()).or_default();
    (key, upstream)
}

/// Idle connections by upstream key.
pub struct IdlePool {
    limits: PoolLimits,
    slots: Mutex<Slots>,
    /// Lends the descriptors idle connections hold, and recalls them for sessions.
    ledger: Arc<DescriptorLedger>,
    /// Wakes the sweeper sleeping on an empty pool: a first upstream came in, or the pool
    /// is gone (then the sweeper ends).
    sweeper_wake: Arc<Notify>,
}

impl Drop for IdlePool {
    fn drop(&mut self) {
        // The idle connections close with the pool.
        let slots = self.lock();
        self.ledger.give_back(slots.lent);
        slots.wake_keepers();
        drop(slots);
        self.sweeper_wake.notify_one();
    }
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
        self.pool.check_in(&self.key, connection, false);
    }
}

impl IdlePool {
    /// An empty pool with these bounds, borrowing from the process's ledger.
    pub fn new(limits: PoolLimits) -> Arc<Self> {
        Self::with_ledger(limits, DescriptorLedger::process())
    }

    /// An empty pool with these bounds, borrowing from `ledger`.
    pub fn with_ledger(limits: PoolLimits, ledger: Arc<DescriptorLedger>) -> Arc<Self> {
        let pool = Arc::new(Self {
            limits,
            slots: Mutex::new(Slots::default()),
            ledger,
            sweeper_wake: Arc::new(Notify::new()),
        });
        let lender: Weak<dyn Lender> = Arc::downgrade(&(pool.clone() as Arc<dyn Lender>));
        pool.ledger.register(lender);
        pool
    }

    /// The pool's bounds.
    #[cfg(test)]
    pub(crate) fn limits(&self) -> PoolLimits {
        self.limits
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
            let Slots { by_key, total, .. } = &mut *slots;
            shared_key = self::shared_key(by_key, key);
            if let Some(upstream) = by_key.get_mut(key) {
                found = take_idle(upstream, total, now, self.limits.idle_timeout, &mut closed);
                upstream.wake_keeper_if_short();
            }
            slots.return_spare(&self.ledger);
        }
        drop(closed);
        if found.is_none() {
            // The caller connects: a descriptor lent to an idle connection may be needed.
            self.ledger.make_room();
        }
        let slot = PoolSlot {
            pool: self.clone(),
            key: shared_key,
        };
        (slot, found)
    }

    /// A pooled connection to `key`, or the right to open one without waiting when fewer
    /// than `max_connecting_per_key` are being opened; `None` when the call has to wait
    /// ([`IdlePool::acquire`]). No await, no allocation beyond a new key's.
    pub fn try_acquire(self: &Arc<Self>, key: &str) -> Option<Checkout> {
        let now = Instant::now();
        let mut closed = Vec::new();
        let checkout = {
            let mut slots = self.lock();
            self.wake_sweeper_if_empty(&mut slots);
            let Slots { by_key, total, .. } = &mut *slots;
            let (key, upstream) = upstream_entry(by_key, key);
            let checkout = self.take_or_permit(key, upstream, total, now, &mut closed, false);
            slots.return_spare(&self.ledger);
            checkout
        };
        drop(closed);
        self.before_connecting(checkout.as_ref());
        checkout
    }

    /// A pooled connection to `key`, or the right to open one; waits while
    /// `max_connecting_per_key` connects are in progress and no connection is idle, until
    /// one comes back, a connect finishes or `max_connect_wait` passes (then it connects
    /// anyway: behind slow calls that hold their connections, waiting longer only queues
    /// it). The caller bounds the wait (its own timeout).
    pub async fn acquire(self: &Arc<Self>, key: &str) -> Checkout {
        let mut waiting: Option<Waiting<'_>> = None;
        let mut waited_out = false;
        loop {
            // Counted off below, under the same lock that looks again.
            let was_waiting = waiting.take().map(Waiting::disarm).is_some();
            let now = Instant::now();
            let mut closed = Vec::new();
            let next = {
                let mut slots = self.lock();
                self.wake_sweeper_if_empty(&mut slots);
                let Slots { by_key, total, .. } = &mut *slots;
                let (key, upstream) = upstream_entry(by_key, key);
                if was_waiting {
                    upstream.waiting = upstream.waiting.saturating_sub(1);
                }
                match self.take_or_permit(
                    key.clone(),
                    upstream,
                    total,
                    now,
                    &mut closed,
                    waited_out,
                ) {
                    Some(checkout) => {
                        // Room for another waiting call too (several wake-ups may have
                        // collapsed into one `Notify` permit): pass the turn along.
                        let more = upstream.waiting > 0
                            && (!upstream.idle.is_empty() || self.may_connect(upstream));
                        Next::Done(checkout, more.then(|| upstream.wake.clone()))
                    }
                    None => {
                        upstream.waiting += 1;
                        waiting = Some(Waiting {
                            pool: self,
                            key: Some(key),
                        });
                        Next::Wait(upstream.wake.clone())
                    }
                }
            };
            drop(closed);
            match next {
                Next::Done(checkout, pass_on) => {
                    if let Some(wake) = pass_on {
                        wake.notify_one();
                    }
                    self.before_connecting(Some(&checkout));
                    return checkout;
                }
                // A wake-up sent between the lock's release and this await is kept by the
                // `Notify` (one permit) and ends this wait at once.
                Next::Wait(wake) => {
                    let woken = tokio::time::timeout(self.limits.max_connect_wait, wake.notified());
                    waited_out = woken.await.is_err();
                }
            }
        }
    }

    /// Outside the lock, when the call is to open a connection: asks the ledger to recall
    /// lent descriptors the open sessions need (this pool's too), so that the connect finds
    /// one. Two loads when nothing is overdrawn.
    fn before_connecting(&self, checkout: Option<&Checkout>) {
        if let Some(Checkout::Connect(..)) = checkout {
            self.ledger.make_room();
        }
    }

    /// Whether `upstream` has a connect slot free.
    fn may_connect(&self, upstream: &Upstream) -> bool {
        upstream.connecting < self.limits.max_connecting_per_key.max(1)
    }

    /// Under the lock: the freshest idle connection of `upstream`, else a connect permit if
    /// one is free (or `regardless`), else `None`.
    fn take_or_permit(
        self: &Arc<Self>,
        key: Arc<str>,
        upstream: &mut Upstream,
        total: &mut usize,
        now: Instant,
        closed: &mut Vec<Idle>,
        regardless: bool,
    ) -> Option<Checkout> {
        let slot = PoolSlot {
            pool: self.clone(),
            key: key.clone(),
        };
        let taken = take_idle(upstream, total, now, self.limits.idle_timeout, closed);
        upstream.wake_keeper_if_short();
        if let Some(connection) = taken {
            return Some(Checkout::Idle(slot, connection));
        }
        if regardless || self.may_connect(upstream) {
            upstream.connecting += 1;
            let permit = ConnectPermit {
                pool: self.clone(),
                key,
            };
            return Some(Checkout::Connect(slot, permit));
        }
        None
    }

    /// Counts one call off `counter` of `key`'s upstream (a connect that finished, a wait
    /// that was abandoned) and wakes a waiting call to take the turn.
    fn count_off(&self, key: &str, counter: fn(&mut Upstream) -> &mut usize) {
        let wake = {
            let mut slots = self.lock();
            slots.by_key.get_mut(key).and_then(|upstream| {
                let count = counter(upstream);
                *count = count.saturating_sub(1);
                (upstream.waiting > 0).then(|| upstream.wake.clone())
            })
        };
        if let Some(wake) = wake {
            wake.notify_one();
        }
    }

    /// Keeps `connection`, opened ahead of any call (by a [`KeptIdle`]), idle under `key` for
    /// the calls to come, within the same bounds as a connection a call returned; [`NoRoom`]
    /// when it was closed instead.
    pub(crate) fn keep_opened_ahead(
        self: &Arc<Self>,
        key: &str,
        connection: Connection,
    ) -> Result<(), NoRoom> {
        let key = shared_key(&self.lock().by_key, key);
        if self.check_in(&key, connection, true) {
            Ok(())
        } else {
            Err(NoRoom)
        }
    }

    /// Keeps `connection` idle under `key` (`opened_ahead`: by a keeper, not returned by a
    /// call); `false` when it was closed instead.
    fn check_in(
        self: &Arc<Self>,
        key: &Arc<str>,
        mut connection: Connection,
        opened_ahead: bool,
    ) -> bool {
        let mut surplus = None;
        let wake;
        {
            let mut slots = self.lock();
            self.wake_sweeper_if_empty(&mut slots);
            let Slots {
                by_key,
                total,
                lent,
                floors,
                ..
            } = &mut *slots;
            let upstream = by_key.entry(key.clone()).or_default();
            // A floor raises its key's cap to itself, and the total's by all floors.
            let per_key = self.limits.max_idle_per_key.max(upstream.floor_count());
            if upstream.idle.len() >= per_key {
                // Keep the newest: the oldest is the likeliest to be closed by the upstream.
                surplus = Some(upstream.idle.remove(0));
                *total -= 1;
            }
            // Past the caps, or no descriptor to spare beside the open sessions.
            let full = *total >= self.limits.max_idle_total + *floors;
            if full || !borrow_one(*total, lent, &self.ledger) {
                drop(slots);
                if !full {
                    self.ledger.count_refused();
                }
                drop(surplus);
                return false; // `connection` is closed here, outside the lock
            }
            connection.pooled();
            upstream.idle.push(Idle {
                connection,
                since: Instant::now(),
                opened_ahead,
            });
            // The connection pushed below the top `BUFFERED_DEPTH` gives its read buffer
            // back now, not at the next sweep: the next calls take from the top.
            let sunk = upstream.idle.len().checked_sub(BUFFERED_DEPTH + 1);
            if let Some(deeper) = sunk.and_then(|index| upstream.idle.get_mut(index)) {
                deeper.connection.release_read_buffer();
            }
            *total += 1;
            wake = (upstream.waiting > 0).then(|| upstream.wake.clone());
        }
        drop(surplus);
        if let Some(wake) = wake {
            wake.notify_one();
        }
        true
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.lock().total
    }
}

/// The freshest idle connection of `upstream` that is still usable; stale ones met on the
/// way go to `closed` (closed by the caller, outside the lock), and one the upstream closed
/// unused soon after it was opened ahead may pause the floor (`keep`).
fn take_idle(
    upstream: &mut Upstream,
    total: &mut usize,
    now: Instant,
    idle_timeout: Duration,
    closed: &mut Vec<Idle>,
) -> Option<Connection> {
    while let Some(candidate) = upstream.idle.pop() {
        *total -= 1;
        match candidate.state(now, idle_timeout) {
            IdleState::Usable => return Some(candidate.connection),
            IdleState::Stale => {}
            IdleState::ClosedUnused(after) => upstream.pause_floor_if_closed_soon(after, now),
        }
        closed.push(candidate);
    }
    None
}
