//! Connection steering by CPU (`server.cpu_steering`): which CPU each core's listener asks
//! the kernel for, and the guard that turns steering off for a core that keeps holding far
//! more than its share of the open sessions.
//!
//! With `SO_INCOMING_CPU` set on the listeners of a `SO_REUSEPORT` group, the kernel gives a
//! new connection to the listener whose CPU handled its SYN (Linux 6.2 or later; before, the
//! group's hash could still win), and to the hash over all of them when none matches. Over
//! loopback the SYN is handled on the CPU of the thread that called `connect`, so each client
//! thread's connections land on one core. Why that matters (issue 4, bench/RESULTS.md stop 27):
//! when one client thread drives connections of both cores, a core preempted by it waits a
//! whole scheduler tick while the other core keeps the client busy; paired, the client runs
//! out of work and yields. Over a NIC the SYN's CPU is its receive queue's, so with fewer
//! queues than cores the steered cores would take every connection: [`Balance`] watches for
//! that, by the sessions each core holds open, checked at most once a second and only acted
//! on when three checks in a row agree (a burst from one client thread is over by then; the
//! lab's burst scenario opens 2,000 connections at once).
//!
//! Main items: [`cpus_for`], [`steer`], [`stop_steering`], [`Balance`], [`CoreBalance`],
//! [`OpenSession`].

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub(crate) fn steer(listener: impl AsFd, cpu: u32) -> io::Result<()> {
    rustix::net::sockopt::set_socket_incoming_cpu(listener, cpu).map_err(io::Error::from)
}

/// Takes `listener` out of steering: it gets connections by the hash again.
pub(crate) fn stop_steering(listener: impl AsFd) -> io::Result<()> {
    // The option is a C int; -1 (all bits set) is "no CPU".
    rustix::net::sockopt::set_socket_incoming_cpu(listener, u32::MAX).map_err(io::Error::from)
}

/// The sessions each steering core holds open, shared by the cores.
#[derive(Debug)]
pub(crate) struct Balance {
    /// Per core index: sessions open. Each core adds its own (and its sessions' ends
    /// subtract, on any thread); a checking core reads all.
    open: Box<[AtomicUsize]>,
}

impl Balance {
    /// A balance for `cores` cores.
    pub(crate) fn new(cores: usize) -> Arc<Self> {
        Arc::new(Balance {
            open: (0..cores).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// The watch of core `index` (below the count given to [`Balance::new`]).
    pub(crate) fn core(self: &Arc<Self>, index: usize) -> CoreBalance {
        CoreBalance {
            balance: Arc::clone(self),
            index,
            last_check: Instant::now(),
            strikes: 0,
        }
    }
}

/// One core's side of the [`Balance`]: counts its sessions and, at most every
/// [`CHECK_EVERY`], checks its share of all open sessions.
#[derive(Debug)]
pub(crate) struct CoreBalance {
    balance: Arc<Balance>,
    index: usize,
    last_check: Instant,
    /// Checks in a row that found this core over its share.
    strikes: u32,
}

impl CoreBalance {
    /// Counts a session this core just accepted: the guard that uncounts it when the session
    /// ends, and whether this core should stop steering ([`STRIKES`] checks in a row found
    /// it holding more than 1.5 x its share of at least [`MIN_SESSIONS`] open sessions).
    pub(crate) fn opened(&mut self) -> (OpenSession, bool) {
        self.opened_at(Instant::now())
    }

    fn opened_at(&mut self, now: Instant) -> (OpenSession, bool) {
        let open = OpenSession::new(&self.balance, self.index);
        if now.saturating_duration_since(self.last_check) < CHECK_EVERY {
            return (open, false);
        }
        self.last_check = now;
        let counts = &self.balance.open;
        let total: usize = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let mine = counts
            .get(self.index)
            .map_or(0, |c| c.load(Ordering::Relaxed));
        // mine > 1.5 x total / cores, in integers.
        let over = total >= MIN_SESSIONS
            && mine.saturating_mul(2 * counts.len()) > MAX_SHARE_FACTOR.saturating_mul(total);
        self.strikes = if over { self.strikes + 1 } else { 0 };
        (open, self.strikes >= STRIKES)
    }
}

/// A session counted open on its core until dropped.
#[derive(Debug)]
pub(crate) struct OpenSession {
    balance: Arc<Balance>,
    index: usize,
}

impl OpenSession {
    fn new(balance: &Arc<Balance>, index: usize) -> Self {
        if let Some(count) = balance.open.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        OpenSession {
            balance: Arc::clone(balance),
            index,
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        if let Some(count) = self.balance.open.get(self.index) {
            count.fetch_sub(1, Ordering::Relaxed);
        }
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
            let (session, stop) = core.opened_at(now);
            kept.push(session);
            tripped |= stop;
        }
        tripped
    }

    #[test]
    fn an_even_spread_keeps_steering() {
        let balance = Balance::new(2);
        let mut cores = [balance.core(0), balance.core(1)];
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
        let mut busy = balance.core(0);
        let mut quiet = balance.core(1);
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
        let mut busy = balance.core(0);
        let mut quiet = balance.core(1);
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
        let mut only = balance.core(0);
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
        let mut busy = balance.core(0);
        let start = Instant::now();
        let mut kept = Vec::new();
        assert!(!open(&mut busy, MIN_SESSIONS - 4, start, &mut kept));
        // All on one core, checked each second, but fewer than MIN_SESSIONS until the last.
        for second in 1..=4 {
            assert!(!open(&mut busy, 1, start + CHECK_EVERY * second, &mut kept));
        }
    }

    #[test]
    fn a_listener_steers_and_stops() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        steer(&listener, 0).unwrap();
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
