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

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use tokio::sync::Notify;
use wharf_limits::descriptors::{DescriptorLedger, Lender};

use crate::connection::Connection;

/// An idle connection and since when.
struct Idle {
    connection: Connection,
    since: Instant,
}

impl Idle {
    /// Young enough and, as far as can be told without reading it, still open.
    fn is_usable(&self, now: Instant, idle_timeout: Duration) -> bool {
        now.duration_since(self.since) < idle_timeout && self.connection.is_reusable()
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
}

impl Upstream {
    /// Nothing held and nobody opening or waiting: the key can be forgotten.
    fn is_unused(&self) -> bool {
        self.idle.is_empty() && self.connecting == 0 && self.waiting == 0
    }
}

/// Idle connections per upstream that keep their read buffer for the next call: calls take
/// the most recently returned connection, so under keep-alive load the same few dozen
/// cycle at the top of the stack; those below give the buffer (a few KiB) back as they
/// sink past this depth. Without it, the 4,096 connections a wave of 10,000 slow calls
/// left behind held 16 MiB of buffers until the next sweep (issue 4's 10,000-slow run:
/// RSS 50 MiB in flight, 66 MiB once they were returned).
const BUFFERED_DEPTH: usize = 64;

/// Descriptors a pool borrows from the ledger at a time, so that keeping and reusing idle
/// connections seldom touches the counter the cores share.
pub(crate) const LEASE: usize = 16;

/// What the pool's mutex guards.
#[derive(Default)]
struct Slots {
    by_key: HashMap<Arc<str>, Upstream>,
    /// Idle connections over all keys.
    total: usize,
    /// Descriptors borrowed from the ledger: at least `total`, at most a few leases more.
    lent: usize,
    /// The interval of the sweeper the next call that brings an upstream in starts
    /// ([`IdlePool::sweep_from_first_call`]); taken by that call.
    sweep_deferred: Option<Duration>,
}

/// Borrows a descriptor for one more idle connection (`total` held now) when the lease
/// (`lent`) has none spare: a lease, or at least one; `false` when the ledger has none.
fn borrow_one(total: usize, lent: &mut usize, ledger: &DescriptorLedger) -> bool {
    if total < *lent {
        return true;
    }
    for count in [LEASE, 1] {
        if ledger.lend(count) {
            *lent += count;
            return true;
        }
    }
    false
}

impl Slots {
    /// Gives back what the lease holds beyond the idle connections and one spare lease.
    fn return_spare(&mut self, ledger: &DescriptorLedger) {
        let spare = self.lent - self.total;
        if spare > 2 * LEASE {
            ledger.give_back(spare - LEASE);
            self.lent -= spare - LEASE;
        }
    }
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
        let lent = self.lock().lent;
        self.ledger.give_back(lent);
        self.sweeper_wake.notify_one();
    }
}

impl Lender for IdlePool {
    fn recall(&self, wanted: usize) -> usize {
        let mut closed = Vec::new();
        let given = {
            let mut slots = self.lock();
            // The spare lease first: it closes nothing.
            let mut freed = slots.lent - slots.total;
            let Slots { by_key, total, .. } = &mut *slots;
            for upstream in by_key.values_mut() {
                if freed >= wanted {
                    break;
                }
                let closing = (wanted - freed).min(upstream.idle.len());
                // Oldest first: the likeliest to have been closed by the upstream anyway.
                closed.extend(upstream.idle.drain(..closing));
                *total -= closing;
                freed += closing;
            }
            let given = freed.min(slots.lent);
            slots.lent -= given;
            given
        };
        self.ledger.give_back(given);
        if !closed.is_empty() {
            self.ledger.count_recalled(closed.len());
        }
        drop(closed);
        given
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
        self.pool.check_in(&self.key, connection);
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
        if let Some(connection) = take_idle(upstream, total, now, self.limits.idle_timeout, closed)
        {
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

    fn check_in(self: &Arc<Self>, key: &Arc<str>, connection: Connection) {
        let mut surplus = None;
        let wake;
        {
            let mut slots = self.lock();
            self.wake_sweeper_if_empty(&mut slots);
            let Slots {
                by_key,
                total,
                lent,
                ..
            } = &mut *slots;
            let upstream = by_key.entry(key.clone()).or_default();
            if upstream.idle.len() >= self.limits.max_idle_per_key {
                // Keep the newest: the oldest is the likeliest to be closed by the upstream.
                surplus = Some(upstream.idle.remove(0));
                *total -= 1;
            }
            // Past the caps, or no descriptor to spare beside the open sessions.
            let full = *total >= self.limits.max_idle_total;
            if full || !borrow_one(*total, lent, &self.ledger) {
                drop(slots);
                if !full {
                    self.ledger.count_refused();
                }
                drop(surplus);
                return; // `connection` is closed here, outside the lock
            }
            upstream.idle.push(Idle {
                connection,
                since: Instant::now(),
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
    }

    /// Under the lock, before an upstream goes into `by_key`: when the pool held nothing,
    /// wakes its sweeper, which sleeps without a timer while the pool is empty (it looks
    /// again once the lock is released), starting it first if it is deferred to this call.
    fn wake_sweeper_if_empty(self: &Arc<Self>, slots: &mut Slots) {
        if slots.by_key.is_empty() {
            if let Some(every) = slots.sweep_deferred.take() {
                self.spawn_sweeper(every);
            }
            self.sweeper_wake.notify_one();
        }
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.lock().total
    }

    /// Closes connections idle longer than the timeout or found closed, gives back the read
    /// buffers of those kept, and forgets keys with none left.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut closed = Vec::new();
        {
            let mut slots = self.lock();
            let Slots { by_key, total, .. } = &mut *slots;
            by_key.retain(|_, upstream| {
                let idle = &mut upstream.idle;
                let before = idle.len();
                let (mut kept, stale): (Vec<Idle>, Vec<Idle>) = idle
                    .drain(..)
                    .partition(|entry| entry.is_usable(now, self.limits.idle_timeout));
                for entry in &mut kept {
                    entry.connection.release_read_buffer();
                }
                *total -= before - kept.len();
                *idle = kept;
                closed.extend(stale);
                !upstream.is_unused()
            });
            slots.return_spare(&self.ledger);
        }
        drop(closed);
    }

    /// Sweeps the pool every `every` while it holds anything (closing connections idle past
    /// `idle_timeout`, giving back their read buffers), for as long as the pool exists, in a
    /// task that the first call bringing an upstream in starts on its own runtime. A pool
    /// serves the thread that calls through it (a core with a runtime of its own,
    /// [`crate::PoolShards`]): its sweeper then lives on that core, and the call that finds
    /// the pool empty wakes it with a local schedule. A sweeper on the runtime that built the
    /// pools was another thread: waking it was a futex wake of a parked thread on an idle
    /// CPU, made between reading a request and connecting upstream (stop 41: the first call
    /// after a 2-minute idle, `bench/RESULTS.md`).
    pub fn sweep_from_first_call(&self, every: Duration) {
        self.lock().sweep_deferred = Some(every);
    }

    /// Sweeps every `every` in a task of the current tokio runtime while the pool holds
    /// anything, for as long as the pool exists; without a runtime (a pool built outside
    /// one) there is no sweeper and idle connections are only closed when their key is used
    /// again.
    ///
    /// While the pool holds nothing the sweeper waits, with no timer, for the call that
    /// brings in an upstream: an idle process is not woken for a sweep with nothing to do
    /// (seed 001's idle gateway; every service has its pools, every core its own).
    fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no tokio runtime: idle upstream connections are not swept");
            return;
        };
        let pool: Weak<IdlePool> = Arc::downgrade(self);
        let wake = self.sweeper_wake.clone();
        runtime.spawn(async move {
            // Ends once the pool is gone (its drop wakes a sleeping sweeper to see it).
            while let Some(empty) = pool.upgrade().map(|pool| pool.lock().by_key.is_empty()) {
                if empty {
                    // A wake-up given since the look above is kept by the `Notify`.
                    wake.notified().await;
                    continue;
                }
                tokio::time::sleep(every).await;
                let Some(pool) = pool.upgrade() else { break };
                pool.sweep();
            }
        });
    }
}

/// The freshest idle connection of `upstream` that is still usable; stale ones met on the
/// way go to `closed` (closed by the caller, outside the lock).
fn take_idle(
    upstream: &mut Upstream,
    total: &mut usize,
    now: Instant,
    idle_timeout: Duration,
    closed: &mut Vec<Idle>,
) -> Option<Connection> {
    while let Some(candidate) = upstream.idle.pop() {
        *total -= 1;
        if candidate.is_usable(now, idle_timeout) {
            return Some(candidate.connection);
        }
        closed.push(candidate);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    const LIMITS: PoolLimits = PoolLimits {
        max_idle_per_key: 4,
        max_idle_total: 16,
        idle_timeout: Duration::from_secs(30),
        max_connecting_per_key: 2,
        max_connect_wait: Duration::from_secs(30),
    };

    /// An open connection to a listener that keeps its end open.
    async fn open_connection(listener: &TcpListener) -> (Connection, TcpStream) {
        let address = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        (Connection::new(client.unwrap()), accepted.unwrap().0)
    }

    fn expect_connect(checkout: Option<Checkout>) -> (PoolSlot, ConnectPermit) {
        match checkout {
            Some(Checkout::Connect(slot, permit)) => (slot, permit),
            other => panic!("expected the right to connect, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn past_the_connect_slots_a_call_waits_for_a_returned_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(LIMITS);
        let (slot, _first) = expect_connect(pool.try_acquire("up"));
        let _second = expect_connect(pool.try_acquire("up"));
        assert!(
            pool.try_acquire("up").is_none(),
            "both connect slots are taken"
        );

        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire("up").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no connection and no slot: it waits");

        let (connection, _server_end) = open_connection(&listener).await;
        slot.check_in(connection);
        match waiter.await.unwrap() {
            Checkout::Idle(..) => {}
            other => panic!("the waiting call should get the returned connection, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_sweep_gives_back_idle_read_buffers_and_keeps_the_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(LIMITS);
        let (slot, connection) = pool.check_out("up");
        assert!(connection.is_none());
        let (mut connection, _server_end) = open_connection(&listener).await;
        // What a finished exchange leaves: nothing buffered, the allocation's tail kept.
        connection.buf.reserve(8 * 1024);
        slot.check_in(connection);

        pool.sweep();
        assert_eq!(pool.idle_count(), 1, "a fresh, open connection stays");
        match pool.try_acquire("up") {
            Some(Checkout::Idle(_, connection)) => assert_eq!(connection.buf.capacity(), 0),
            other => panic!("expected the idle connection, got {other:?}"),
        }
    }

    /// A ledger with `room` descriptors to lend beside a reserve of 10 and no session.
    fn ledger_with_room(room: u64) -> Arc<DescriptorLedger> {
        let ledger = DescriptorLedger::unlimited();
        ledger.set_limit(Some(10 + room), 10);
        ledger
    }

    /// Checks `count` open connections to `key` into `pool`; returns the upstream's ends.
    async fn fill(
        pool: &Arc<IdlePool>,
        key: &str,
        count: usize,
        listener: &TcpListener,
    ) -> Vec<TcpStream> {
        let mut upstream_ends = Vec::new();
        for _ in 0..count {
            // A slot of its own: `check_out` would take the connection just returned.
            let slot = PoolSlot {
                pool: pool.clone(),
                key: Arc::from(key),
            };
            let (connection, upstream_end) = open_connection(listener).await;
            slot.check_in(connection);
            upstream_ends.push(upstream_end);
        }
        upstream_ends
    }

    /// Whether the upstream's end of a connection sees it closed (EOF) within `wait`: a
    /// close is seen at once, so a short wait tells an open connection.
    async fn sees_close_within(upstream_end: &mut TcpStream, wait: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(wait, upstream_end.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    async fn sees_close(upstream_end: &mut TcpStream) -> bool {
        sees_close_within(upstream_end, Duration::from_millis(100)).await
    }

    #[tokio::test]
    async fn a_connection_is_kept_only_with_a_descriptor_to_spare() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ledger = ledger_with_room(3);
        let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
        let mut ends = fill(&pool, "up", 4, &listener).await;
        assert_eq!(
            pool.idle_count(),
            3,
            "three descriptors to lend, four returned"
        );
        assert_eq!(ledger.lent(), 3);
        assert_eq!(ledger.stats().refused, 1, "the refusal is counted");
        assert!(sees_close(&mut ends[3]).await, "the fourth was closed");
        assert!(!sees_close(&mut ends[2]).await, "the third is kept open");
    }

    #[tokio::test]
    async fn sessions_opening_recall_idle_connections_oldest_first() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ledger = ledger_with_room(8);
        let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
        let mut ends = fill(&pool, "up", 4, &listener).await;
        ends.extend(fill(&pool, "other", 4, &listener).await);
        assert_eq!(pool.idle_count(), 8);
        // Each session may need two descriptors: three of them take back six.
        (0..3).for_each(|_| ledger.session_opened());
        assert_eq!(pool.idle_count(), 2);
        assert_eq!(ledger.lent(), 2);
        assert_eq!(ledger.overdrawn(), 0);
        assert_eq!(
            ledger.stats().recalled,
            6,
            "the closed connections are counted"
        );
        let mut open = Vec::new();
        for (index, end) in ends.iter_mut().enumerate() {
            if !sees_close(end).await {
                open.push(index);
            }
        }
        // Oldest first: the two kept are the newest returned to one of the keys.
        assert!(open == [2, 3] || open == [6, 7], "kept open: {open:?}");
    }

    #[tokio::test]
    async fn a_call_that_connects_takes_its_descriptor_back_from_another_pool() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ledger = ledger_with_room(4);
        let holding = IdlePool::with_ledger(LIMITS, ledger.clone());
        let connecting = IdlePool::with_ledger(LIMITS, ledger.clone());
        let _ends = fill(&holding, "up", 4, &listener).await;
        assert_eq!(holding.idle_count(), 4);
        // Overdrawn without a session opening to recall it (as when a loan raced a
        // session's recall): the connect makes room.
        ledger.set_limit(Some(10), 10);
        assert_eq!(ledger.overdrawn(), 4);
        let _permit = expect_connect(connecting.try_acquire("elsewhere"));
        assert_eq!(
            holding.idle_count(),
            0,
            "every lent descriptor was recalled"
        );
        assert_eq!(ledger.overdrawn(), 0);
    }

    #[tokio::test]
    async fn a_dropped_pool_gives_its_loan_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ledger = ledger_with_room(100);
        let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
        let _ends = fill(&pool, "up", 3, &listener).await;
        assert!(ledger.lent() >= 3);
        drop(pool);
        assert_eq!(ledger.lent(), 0);
    }

    #[tokio::test]
    async fn connections_sunk_below_the_top_of_the_stack_give_their_buffers_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(PoolLimits {
            max_idle_per_key: 1000,
            max_idle_total: 1000,
            ..LIMITS
        });
        let slot = PoolSlot {
            pool: pool.clone(),
            key: Arc::from("up"),
        };
        let mut upstream_ends = Vec::new();
        for _ in 0..BUFFERED_DEPTH + 2 {
            let (mut connection, upstream_end) = open_connection(&listener).await;
            connection.buf.reserve(8 * 1024);
            slot.check_in(connection);
            upstream_ends.push(upstream_end);
        }
        let slots = pool.lock();
        let capacities: Vec<usize> = slots.by_key["up"]
            .idle
            .iter()
            .map(|idle| idle.connection.buf.capacity())
            .collect();
        assert_eq!(capacities[..2], [0, 0], "the two oldest gave theirs back");
        assert!(
            capacities[2..].iter().all(|&capacity| capacity >= 8 * 1024),
            "the top {BUFFERED_DEPTH} keep theirs: {capacities:?}"
        );
    }

    const SWEEP_EVERY: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_sleeps_while_the_pool_holds_nothing_and_wakes_for_a_call() {
        let pool = IdlePool::new(LIMITS);
        pool.spawn_sweeper(SWEEP_EVERY);
        tokio::task::yield_now().await;
        // An upstream put in behind the pool's back, without the wake-up its calls give:
        // a sweeper that ticked would forget it (nothing is held for it).
        pool.lock()
            .by_key
            .insert(Arc::from("planted"), Upstream::default());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            pool.lock().by_key.contains_key("planted"),
            "the sweeper of an empty pool swept"
        );
        pool.lock().by_key.clear();

        // A call's upstream wakes it: within a tick the upstream, unused again, is forgotten.
        drop(expect_connect(pool.try_acquire("up")));
        assert!(pool.lock().by_key.contains_key("up"));
        tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
        assert!(
            pool.lock().by_key.is_empty(),
            "the woken sweeper did not sweep within a tick"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_returned_connection_wakes_the_sweeper_which_gives_back_its_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = IdlePool::new(LIMITS);
        pool.spawn_sweeper(SWEEP_EVERY);
        tokio::task::yield_now().await;
        // The pool holds nothing until the connection comes back (`check_out` adds no key).
        let (slot, _) = pool.check_out("up");
        let (mut connection, _server_end) = open_connection(&listener).await;
        connection.buf.reserve(8 * 1024);
        slot.check_in(connection);
        tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
        let slots = pool.lock();
        let kept = &slots.by_key["up"].idle;
        assert_eq!(kept.len(), 1, "a fresh, open connection stays");
        assert_eq!(kept[0].connection.buf.capacity(), 0, "its buffer was kept");
    }

    /// The sweeper of a pool built on one runtime (the start-up's) and used on another (a
    /// core's) is started by the first call, on the core: there it is woken without waking
    /// another thread.
    #[test]
    fn a_deferred_sweeper_starts_on_the_runtime_of_the_first_call() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let start_up = runtime();
        let pool = start_up.block_on(async {
            let pool = IdlePool::new(LIMITS);
            pool.sweep_from_first_call(SWEEP_EVERY);
            pool
        });
        assert_eq!(start_up.metrics().num_alive_tasks(), 0);
        let core = std::thread::spawn({
            let pool = pool.clone();
            move || {
                let core = runtime();
                let alive = || core.metrics().num_alive_tasks();
                core.block_on(async {
                    let permit = expect_connect(pool.try_acquire("up"));
                    tokio::task::yield_now().await;
                    assert_eq!(alive(), 1, "started by the first call, on its runtime");
                    // Emptied and used again: the same sweeper, woken, not a second one.
                    drop(permit);
                    pool.sweep();
                    assert_eq!(pool.lock().by_key.len(), 0);
                    let _permit = expect_connect(pool.try_acquire("up"));
                    tokio::task::yield_now().await;
                    assert_eq!(alive(), 1);
                });
            }
        });
        core.join().unwrap();
        assert_eq!(
            start_up.metrics().num_alive_tasks(),
            0,
            "none where it was built"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_ends_with_its_pool() {
        let metrics = tokio::runtime::Handle::current().metrics();
        for holding in [false, true] {
            let pool = IdlePool::new(LIMITS);
            pool.spawn_sweeper(SWEEP_EVERY);
            // Asleep without a timer (an empty pool) or on its tick (a pool in use).
            let permit = holding.then(|| expect_connect(pool.try_acquire("up")));
            tokio::task::yield_now().await;
            assert_eq!(metrics.num_alive_tasks(), 1);
            drop(permit);
            drop(pool);
            tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
            assert_eq!(metrics.num_alive_tasks(), 0, "holding: {holding}");
        }
    }

    #[tokio::test]
    async fn a_finished_connect_lets_a_waiting_call_open_the_next() {
        let pool = IdlePool::new(LIMITS);
        let (_, first) = expect_connect(pool.try_acquire("up"));
        let _second = expect_connect(pool.try_acquire("up"));
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire("up").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first); // that connect failed (or is open and in use): its slot is free
        match waiter.await.unwrap() {
            Checkout::Connect(..) => {}
            other => panic!("the waiting call should get the free slot, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waited_too_long_connects_anyway() {
        let pool = IdlePool::new(PoolLimits {
            max_connect_wait: Duration::from_millis(5),
            ..LIMITS
        });
        let _first = expect_connect(pool.try_acquire("up"));
        let _second = expect_connect(pool.try_acquire("up"));
        let started = tokio::time::Instant::now();
        match pool.acquire("up").await {
            Checkout::Connect(..) => {}
            other => panic!("expected a connect past the wait, got {other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_cancelled_wait_and_spent_permits_leave_nothing_behind() {
        let pool = IdlePool::new(LIMITS);
        let first = expect_connect(pool.try_acquire("up"));
        let second = expect_connect(pool.try_acquire("up"));
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire("up").await }
        });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop((first, second));
        {
            let slots = pool.lock();
            let upstream = &slots.by_key["up"];
            assert_eq!((upstream.connecting, upstream.waiting), (0, 0));
        }
        pool.sweep();
        assert!(
            pool.lock().by_key.is_empty(),
            "an unused upstream is forgotten"
        );
    }
}
