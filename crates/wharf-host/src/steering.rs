//! Connection steering by CPU (`server.cpu_steering`): which CPU each core's listener asks
//! the kernel for, and the guard that turns steering off for a core that keeps holding far
//! more than its share of the open sessions.
//!
//! With `SO_INCOMING_CPU` set on the listeners of a `SO_REUSEPORT` group, the kernel gives a
//! new connection to the listener whose CPU handled its SYN, and to the hash over all of them
//! when none matches (reliably from Linux 6.2, kernel commit b261eda84ec1 "soreuseport: Fix
//! socket selection for SO_INCOMING_CPU"; from 4.6 until then the group's hash could win). Over
//! loopback the SYN is handled on the CPU of the thread that called `connect`, so each client
//! thread's connections land on one core. Why that matters (issue 4, bench/RESULTS.md stop 27):
//! when one client thread drives connections of both cores, a core preempted by it waits a
//! whole scheduler tick while the other core keeps the client busy; paired, the client runs
//! out of work and yields. Over a NIC the SYN's CPU is its receive queue's, so with fewer
//! queues than cores the steered cores would take every connection: [`Balance`] watches for
//! that, by the sessions each core holds open, checked at most once a second and only acted
//! on when three checks in a row agree (a burst from one client thread is over by then; the
//! lab's burst scenario opens 2,000 connections at once). A burst has a watch of its own: a
//! core whose accepts outrun the others' by [`BURST_EXCESS`] within [`BURST_WINDOW`] pauses
//! its steering for [`BURST_PAUSE`] (with steering alone, one of the lab's bursts of 2,000 had
//! one core return from accept4 2,008 times and the other fewer than 100).
//!
//! Main items: [`cpus_for`], [`steer_listener`], [`Balance`], [`CoreBalance`] (whose
//! [`CoreBalance::accepted_on`] each steering core calls per accept), [`OpenSession`].

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

/// How often (at most) a core checks its share of the open sessions, at an accept.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Checks in a row that must find a core over its share before it stops steering: a burst of
/// connections from one client thread is over by the next check; a NIC queue that feeds one
/// CPU is not.
const STRIKES: u32 = 3;

/// Fewer open sessions than this (over all cores) are never called uneven.
const MIN_SESSIONS: usize = 32;

/// A core is over its share when it holds more than this many times its fair share
/// (1 / cores) of the open sessions.
const MAX_SHARE_FACTOR: usize = 3; // over 2: 1.5 x

/// A burst: a core whose accepts outrun the others' (on average) by this many within
/// [`BURST_WINDOW`] pauses its steering. A 64-connection round of a client with two threads
/// puts 32 on each core; a burst of thousands from one client thread's CPU gets past it
/// within milliseconds (issue 4's burst scenario, above).
const BURST_EXCESS: u64 = 64;

/// The span over which a burst's excess is counted; a core's accepts start a new one when the
/// last is this old.
const BURST_WINDOW: Duration = Duration::from_millis(10);

/// How long a core's steering pauses after a burst: the SYNs of its CPU go by the hash.
const BURST_PAUSE: Duration = Duration::from_secs(1);

/// What a core does with its listener after an accept ([`CoreBalance::opened_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steer {
    /// Nothing changes.
    Keep,
    /// A burst: stop steering for [`BURST_PAUSE`].
    Pause,
    /// The pause is over: steer again.
    Resume,
    /// The open sessions stayed uneven: stop steering for good.
    Stop,
}

/// The CPU core `index` steers for, one per core: the `index`-th CPU this process may run on
/// (its affinity mask, so `taskset -c 2,3` gives CPUs 2 and 3). A core beyond the mask's CPUs
/// gets `None` (it takes only connections whose CPU no core claims, by the hash).
pub(crate) fn cpus_for(cores: usize) -> Vec<Option<u32>> {
    let allowed: Vec<u32> = match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&cpu| set.is_set(cpu))
            .filter_map(|cpu| u32::try_from(cpu).ok())
            .collect(),
        // Without the mask, the CPUs are numbered from 0.
        Err(_) => (0..cores)
            .filter_map(|cpu| u32::try_from(cpu).ok())
            .collect(),
    };
    cpus_from(&allowed, cores)
}

/// [`cpus_for`] on a known list of allowed CPUs.
fn cpus_from(allowed: &[u32], cores: usize) -> Vec<Option<u32>> {
    (0..cores)
        .map(|index| allowed.get(index).copied())
        .collect()
}

/// Asks the kernel to give `listener` the new connections whose SYN it handled on `cpu`.
pub(crate) fn steer_listener(listener: impl AsFd, cpu: u32) -> io::Result<()> {
    rustix::net::sockopt::set_socket_incoming_cpu(listener, cpu).map_err(io::Error::from)
}

/// Takes `listener` out of steering: it gets connections by the hash again.
fn stop_steering(listener: impl AsFd) -> io::Result<()> {
    // The option is a C int; -1 (all bits set) is "no CPU".
    rustix::net::sockopt::set_socket_incoming_cpu(listener, u32::MAX).map_err(io::Error::from)
}

/// The sessions each steering core holds open and the connections it accepted, shared by
/// the cores.
#[derive(Debug)]
pub(crate) struct Balance {
    /// Per core index: sessions open. Each core adds its own and its sessions' ends subtract
    /// (sessions stay on their core, so the count's `Arc` is shared by that core only); a
    /// checking core reads all.
    open: Box<[Arc<AtomicUsize>]>,
    /// Per core index: connections accepted since start. Each core adds its own and reads
    /// the others' at each accept (the burst watch).
    accepted: Box<[AtomicU64]>,
}

impl Balance {
    /// A balance for `cores` cores.
    pub(crate) fn new(cores: usize) -> Arc<Self> {
        Arc::new(Balance {
            open: (0..cores).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
            accepted: (0..cores).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The watch of core `index` (below the count given to [`Balance::new`]), which
    /// steers for `cpu`.
    pub(crate) fn core(self: &Arc<Self>, index: usize, cpu: u32) -> CoreBalance {
        let now = Instant::now();
        CoreBalance {
            balance: Arc::clone(self),
            index,
            open: self.open.get(index).cloned().unwrap_or_default(),
            cpu,
            last_check: now,
            strikes: 0,
            burst: Burst {
                start: now,
                mine: 0,
                others: 0,
            },
            paused_until: None,
        }
    }

    /// Connections accepted by core `index`, and by all the others.
    fn accepted(&self, index: usize) -> (u64, u64) {
        let mut mine = 0;
        let mut others = 0;
        for (core, count) in self.accepted.iter().enumerate() {
            let count = count.load(Ordering::Relaxed);
            if core == index {
                mine = count;
            } else {
                others += count;
            }
        }
        (mine, others)
    }
}

/// Where a core's current burst window started: when, and the accept counts then.
#[derive(Debug)]
struct Burst {
    start: Instant,
    mine: u64,
    others: u64,
}

/// One core's side of the [`Balance`]: counts its sessions and accepts; watches for bursts
/// at each accept and, at most every [`CHECK_EVERY`], checks its share of all open sessions.
#[derive(Debug)]
pub(crate) struct CoreBalance {
    balance: Arc<Balance>,
    index: usize,
    /// This core's count in `balance.open`.
    open: Arc<AtomicUsize>,
    /// The CPU this core steers for.
    cpu: u32,
    last_check: Instant,
    /// Checks in a row that found this core over its share.
    strikes: u32,
    burst: Burst,
    /// While a burst's pause lasts: when it ends.
    paused_until: Option<Instant>,
}

impl CoreBalance {
    /// Counts a session core `core` just accepted from `listener`, and changes the
    /// listener's steering as the watches say (logged): stopped for good when [`STRIKES`]
    /// checks in a row found this core holding more than 1.5 x its share of at least
    /// [`MIN_SESSIONS`] open sessions; paused for [`BURST_PAUSE`] when its accepts outran
    /// the others' by [`BURST_EXCESS`] within [`BURST_WINDOW`]; steered again at the first
    /// accept after a pause. Returns the guard that uncounts the session when it ends, and
    /// whether this core still steers (false: drop this watch).
    pub(crate) fn accepted_on(&mut self, listener: impl AsFd, core: usize) -> (OpenSession, bool) {
        let (open, steer) = self.opened_at(Instant::now());
        let changed = match steer {
            Steer::Keep => Ok(()),
            Steer::Pause | Steer::Stop => stop_steering(&listener),
            Steer::Resume => steer_listener(&listener, self.cpu),
        };
        if let Err(error) = changed {
            warn!(core, error = %error, ?steer, "cannot change this core's steering by CPU");
        }
        match steer {
            Steer::Stop => warn!(core, "this core held more than 1.5 x its share of the open sessions at three checks a second or more apart (new connections arrive on few CPUs): it stops steering by CPU (server.cpu_steering), the kernel's hash spreads the new ones"),
            Steer::Pause => debug!(core, "a burst of new connections on this core's CPU: steering paused for 1 s"),
            Steer::Resume => debug!(core, "steering by CPU again after a burst"),
            Steer::Keep => {}
        }
        (open, steer != Steer::Stop)
    }

    /// The watches at an accept at `now`: the session's guard, and what to do with the
    /// listener.
    fn opened_at(&mut self, now: Instant) -> (OpenSession, Steer) {
        let open = OpenSession::new(&self.open);
        if let Some(count) = self.balance.accepted.get(self.index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        if self.sessions_uneven(now) {
            return (open, Steer::Stop);
        }
        (open, self.burst_watch(now))
    }

    /// The burst watch, at an accept.
    fn burst_watch(&mut self, now: Instant) -> Steer {
        let cores = self.balance.accepted.len();
        if cores < 2 {
            return Steer::Keep;
        }
        let (mine, others) = self.balance.accepted(self.index);
        if let Some(until) = self.paused_until {
            if now < until {
                return Steer::Keep;
            }
            self.paused_until = None;
            self.burst = Burst {
                start: now,
                mine,
                others,
            };
            return Steer::Resume;
        }
        if now.saturating_duration_since(self.burst.start) > BURST_WINDOW {
            // A new window, counting this accept.
            self.burst = Burst {
                start: now,
                mine: mine.saturating_sub(1),
                others,
            };
        }
        let taken = mine.saturating_sub(self.burst.mine);
        let others_each = others.saturating_sub(self.burst.others) / (cores as u64 - 1);
        if taken.saturating_sub(others_each) >= BURST_EXCESS {
            self.paused_until = Some(now + BURST_PAUSE);
            return Steer::Pause;
        }
        Steer::Keep
    }

    /// The open-sessions check, at most every [`CHECK_EVERY`]: true at the [`STRIKES`]th
    /// in a row that found this core over its share.
    fn sessions_uneven(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_check) < CHECK_EVERY {
            return false;
        }
        self.last_check = now;
        let counts = &self.balance.open;
        let total: usize = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let mine = self.open.load(Ordering::Relaxed);
        // mine > 1.5 x total / cores, in integers.
        let over = total >= MIN_SESSIONS
            && mine.saturating_mul(2 * counts.len()) > MAX_SHARE_FACTOR.saturating_mul(total);
        self.strikes = if over { self.strikes + 1 } else { 0 };
        self.strikes >= STRIKES
    }
}

/// A session counted open on its core until dropped.
#[derive(Debug)]
pub(crate) struct OpenSession {
    /// Its core's count of open sessions.
    count: Arc<AtomicUsize>,
}

impl OpenSession {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        OpenSession {
            count: Arc::clone(count),
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_take_the_allowed_cpus_in_order() {
        assert_eq!(cpus_from(&[2, 3], 2), vec![Some(2), Some(3)]);
        assert_eq!(cpus_from(&[0, 1, 2, 3], 2), vec![Some(0), Some(1)]);
        // More cores than CPUs: the extra core claims none.
        assert_eq!(cpus_from(&[5], 2), vec![Some(5), None]);
        // The process's own mask: as many CPUs as cores (the runtime's default).
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let cpus = cpus_for(cores);
        assert_eq!(cpus.len(), cores);
        assert!(cpus.iter().all(Option::is_some), "{cpus:?}");
    }

    /// Opens `count` sessions on `core` at `now`; true if any tripped the guard. The
    /// sessions stay open in `kept`.
    fn open(
        core: &mut CoreBalance,
        count: usize,
        now: Instant,
        kept: &mut Vec<OpenSession>,
    ) -> bool {
        let mut tripped = false;
        for _ in 0..count {
            let (session, steer) = core.opened_at(now);
            kept.push(session);
            tripped |= steer == Steer::Stop;
        }
        tripped
    }

    #[test]
    fn an_even_spread_keeps_steering() {
        let balance = Balance::new(2);
        let mut cores = [balance.core(0, 0), balance.core(1, 1)];
        let start = Instant::now();
        let mut kept = Vec::new();
        for second in 1..10 {
            let now = start + CHECK_EVERY * second;
            // 60/40 is uneven but within 1.5 x the fair share.
            assert!(!open(&mut cores[0], 30, now, &mut kept));
            assert!(!open(&mut cores[1], 20, now, &mut kept));
        }
    }

    #[test]
    fn a_core_holding_most_sessions_stops_steering_at_the_third_check() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0, 0);
        let mut quiet = balance.core(1, 1);
        let start = Instant::now();
        let mut kept = Vec::new();
        assert!(!open(&mut quiet, 10, start, &mut kept));
        assert!(!open(&mut busy, 40, start, &mut kept));
        // Checks at most once a second: many accepts within one count once.
        assert!(!open(&mut busy, 100, start + CHECK_EVERY, &mut kept));
        assert!(!open(&mut busy, 100, start + CHECK_EVERY * 2, &mut kept));
        assert!(open(&mut busy, 1, start + CHECK_EVERY * 3, &mut kept));
    }

    #[test]
    fn sessions_that_end_are_not_counted() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0, 0);
        let mut quiet = balance.core(1, 1);
        let start = Instant::now();
        let mut kept = Vec::new();
        assert!(!open(&mut quiet, 20, start, &mut kept));
        for second in 1..10 {
            // A burst of 200 short sessions on one core, each check seeing it, then gone:
            // the next check finds the burst over and starts the count again.
            let mut burst = Vec::new();
            let now = start + CHECK_EVERY * (2 * second);
            assert!(!open(&mut busy, 200, now, &mut burst));
            drop(burst);
            assert!(!open(&mut busy, 1, now + CHECK_EVERY, &mut kept));
        }
    }

    #[test]
    fn a_lone_core_never_stops_steering() {
        let balance = Balance::new(1);
        let mut only = balance.core(0, 0);
        let start = Instant::now();
        let mut kept = Vec::new();
        for second in 1..10 {
            assert!(!open(
                &mut only,
                100,
                start + CHECK_EVERY * second,
                &mut kept
            ));
        }
    }

    #[test]
    fn few_sessions_are_never_uneven() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0, 0);
        let start = Instant::now();
        let mut kept = Vec::new();
        assert!(!open(&mut busy, MIN_SESSIONS - 4, start, &mut kept));
        // All on one core, checked each second, but fewer than MIN_SESSIONS until the last.
        for second in 1..=4 {
            assert!(!open(&mut busy, 1, start + CHECK_EVERY * second, &mut kept));
        }
    }

    /// What each of `count` accepts on `core` at `now` said, other than [`Steer::Keep`].
    fn steers(core: &mut CoreBalance, count: usize, now: Instant) -> Vec<(usize, Steer)> {
        (1..=count)
            .filter_map(|n| {
                let (_session, steer) = core.opened_at(now);
                (steer != Steer::Keep).then_some((n, steer))
            })
            .collect()
    }

    #[test]
    fn a_burst_on_one_core_pauses_its_steering_for_a_while() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0, 0);
        let _quiet = balance.core(1, 1);
        let start = Instant::now() + BURST_WINDOW * 2;
        // The 64th connection within the window, none on the other core: a burst.
        assert_eq!(steers(&mut busy, 100, start), vec![(64, Steer::Pause)]);
        // Paused: nothing changes until the pause is over, then the next accept resumes.
        assert!(steers(&mut busy, 100, start + BURST_PAUSE / 2).is_empty());
        assert_eq!(
            steers(&mut busy, 1, start + BURST_PAUSE + BURST_WINDOW),
            vec![(1, Steer::Resume)]
        );
    }

    #[test]
    fn even_accepts_and_paired_rounds_are_no_burst() {
        let balance = Balance::new(2);
        let mut cores = [balance.core(0, 0), balance.core(1, 1)];
        let start = Instant::now() + BURST_WINDOW * 2;
        // Thousands within one window, alternating between the cores.
        for n in 0..4000 {
            let (_session, steer) = cores[n % 2].opened_at(start);
            assert_eq!(steer, Steer::Keep, "accept {n}");
        }
        // A 64-connection round from two client threads, one after the other: 32 per core.
        let later = start + BURST_WINDOW * 10;
        assert!(steers(&mut cores[0], 32, later).is_empty());
        assert!(steers(&mut cores[1], 32, later).is_empty());
    }

    #[test]
    fn a_window_that_ends_takes_its_count_with_it() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0, 0);
        let start = Instant::now() + BURST_WINDOW * 2;
        // 40 and 40, a window apart: never 64 within one.
        assert!(steers(&mut busy, 40, start).is_empty());
        let next = start + BURST_WINDOW + Duration::from_millis(1);
        assert!(steers(&mut busy, 40, next).is_empty());
    }

    #[test]
    fn a_lone_core_has_no_bursts() {
        let balance = Balance::new(1);
        let mut only = balance.core(0, 0);
        let start = Instant::now() + BURST_WINDOW * 2;
        assert!(steers(&mut only, 1000, start).is_empty());
    }

    #[test]
    fn a_listener_steers_and_stops() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        steer_listener(&listener, 0).unwrap();
        assert_eq!(
            rustix::net::sockopt::socket_incoming_cpu(&listener).unwrap(),
            0
        );
        stop_steering(&listener).unwrap();
        assert_eq!(
            rustix::net::sockopt::socket_incoming_cpu(&listener).unwrap(),
            u32::MAX
        );
    }
}
