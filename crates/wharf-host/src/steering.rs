//! Connection steering by CPU (`server.cpu_steering`): which CPU each core's listener asks
//! the kernel for, and the guard that turns steering off for a core taking far more than its
//! share of the new connections.
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
//! that.
//!
//! Main items: [`cpus_for`], [`steer`], [`stop_steering`], [`Balance`], [`CoreBalance`].

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// New connections (over all cores) between two checks of a core's share: enough that a
/// burst from one client thread does not end steering, few enough that a one-queue NIC is
/// caught within a fraction of a second of real traffic.
const WINDOW: u64 = 256;

/// A core stops steering when it took more than this many times its fair share (1 / cores)
/// of a window's connections.
const MAX_SHARE_FACTOR: f64 = 1.5;

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

/// The new connections each core accepted since start, shared by the cores.
#[derive(Debug)]
pub(crate) struct Balance {
    /// Per core index: connections accepted. Each core adds to its own, reads all.
    accepted: Box<[AtomicU64]>,
}

impl Balance {
    /// A balance for `cores` cores.
    pub(crate) fn new(cores: usize) -> Arc<Self> {
        Arc::new(Balance {
            accepted: (0..cores).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The watch of core `index` (below the count given to [`Balance::new`]).
    pub(crate) fn core(self: &Arc<Self>, index: usize) -> CoreBalance {
        CoreBalance {
            balance: Arc::clone(self),
            index,
            mine_at_check: 0,
            total_at_check: 0,
        }
    }

    fn total(&self) -> u64 {
        self.accepted
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .sum()
    }
}

/// One core's side of the [`Balance`]: counts its accepts and checks its share of each
/// window.
#[derive(Debug)]
pub(crate) struct CoreBalance {
    balance: Arc<Balance>,
    index: usize,
    /// This core's count and the total at the window's start.
    mine_at_check: u64,
    total_at_check: u64,
}

impl CoreBalance {
    /// Counts one connection accepted by this core. True when this core took more than
    /// [`MAX_SHARE_FACTOR`] times its share of the last [`WINDOW`] connections: it should
    /// stop steering.
    pub(crate) fn accepted(&mut self) -> bool {
        let Some(count) = self.balance.accepted.get(self.index) else {
            return false;
        };
        let mine = count.fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.balance.total();
        let window = total.saturating_sub(self.total_at_check);
        if window < WINDOW {
            return false;
        }
        let taken = mine.saturating_sub(self.mine_at_check);
        self.mine_at_check = mine;
        self.total_at_check = total;
        let fair = window as f64 / self.balance.accepted.len() as f64;
        taken as f64 > MAX_SHARE_FACTOR * fair
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

    #[test]
    fn an_even_spread_keeps_steering() {
        let balance = Balance::new(2);
        let mut cores = [balance.core(0), balance.core(1)];
        for i in 0..10 * WINDOW {
            // 60/40 is uneven but within 1.5 x the fair share.
            let core = usize::from(i % 5 >= 3);
            assert!(!cores[core].accepted(), "core {core} tripped at {i}");
        }
    }

    #[test]
    fn a_core_taking_every_connection_stops_steering_within_a_window() {
        let balance = Balance::new(2);
        let mut busy = balance.core(0);
        let _idle = balance.core(1);
        let tripped = (1..=WINDOW).find(|_| busy.accepted());
        assert_eq!(tripped, Some(WINDOW));
    }

    #[test]
    fn a_lone_core_never_stops_steering() {
        let balance = Balance::new(1);
        let mut only = balance.core(0);
        assert!((0..4 * WINDOW).all(|_| !only.accepted()));
    }

    #[test]
    fn a_short_burst_on_one_core_does_not_stop_steering() {
        let balance = Balance::new(2);
        let mut cores = [balance.core(0), balance.core(1)];
        // 100 connections from one client thread, then an even spread.
        for _ in 0..100 {
            assert!(!cores[0].accepted());
        }
        for i in 0..4 * WINDOW {
            let core = (i % 2) as usize;
            assert!(!cores[core].accepted(), "core {core} tripped at {i}");
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
