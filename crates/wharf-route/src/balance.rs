//! The order in which a call tries a route's backends, and the probe of an ejected backend
//! that the call may take on the way ([`Order`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use wharf_config::Strategy;

use crate::backend::{Backend, Probe};

/// Picks backend order per call.
#[derive(Debug)]
pub struct Balancer {
    strategy: Strategy,
    /// Next start index for round_robin.
    next: AtomicUsize,
}

/// The backends one call tries, in order.
#[derive(Debug)]
pub struct Order {
    /// The backends, first to last.
    pub backends: Vec<Arc<Backend>>,
    /// The probe of an ejected backend this call took, if any: that backend is first in
    /// `backends`. Held for the first attempt only (dropped, it lets another call probe).
    pub probe: Option<Probe>,
}

/// Where a backend goes in a call's order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// An ejected backend this call probes: first, so that the probe is the call's first
    /// attempt, never a right held by a call that ends on another backend.
    Probe,
    /// A backend that is not ejected: by strategy.
    Available,
    /// An ejected backend another call probes, or whose window runs: a last resort (better
    /// a try than a certain 502).
    Ejected,
}

impl Balancer {
    /// A balancer for `strategy`.
    pub fn new(strategy: Strategy) -> Self {
        Self {
            strategy,
            next: AtomicUsize::new(0),
        }
    }

    /// Backends in the order to try: one ejected backend past its window that this call
    /// probes (at most one, see [`Backend::try_probe`]), then the available ones by
    /// strategy, then the other ejected ones as a last resort.
    pub fn order(&self, backends: &[Arc<Backend>]) -> Order {
        let count = backends.len();
        let by_strategy: Vec<Arc<Backend>> = match self.strategy {
            Strategy::Failover => backends.to_vec(),
            Strategy::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed) % count.max(1);
                (0..count)
                    .map(|i| backends[(start + i) % count].clone())
                    .collect()
            }
            Strategy::LeastOutstanding => {
                let mut sorted = backends.to_vec();
                // Stable: ties keep configuration order.
                sorted.sort_by_key(|backend| backend.outstanding());
                sorted
            }
        };
        // The common case, every backend healthy: the strategy's order as it is, without
        // the ranking's two more allocations per call.
        if by_strategy.iter().all(|backend| backend.is_available()) {
            return Order {
                backends: by_strategy,
                probe: None,
            };
        }
        // Ranked once per backend (taking a probe is not a question to ask twice). With
        // `failover` a backend behind an available one is a backup, not to be tried while
        // the one before it answers: it is not probed, and stays a last resort.
        let mut probe = None;
        let mut available_before = false;
        let mut ranked: Vec<(Rank, Arc<Backend>)> = by_strategy
            .into_iter()
            .map(|backend| {
                let backup = self.strategy == Strategy::Failover && available_before;
                let rank = if backend.is_available() {
                    available_before = true;
                    Rank::Available
                } else if probe.is_none() && !backup {
                    match backend.try_probe() {
                        Some(taken) => {
                            probe = Some(taken);
                            Rank::Probe
                        }
                        None => Rank::Ejected,
                    }
                } else {
                    Rank::Ejected
                };
                (rank, backend)
            })
            .collect();
        // Stable: the strategy's order kept within each rank.
        ranked.sort_by_key(|(rank, _)| *rank);
        Order {
            backends: ranked.into_iter().map(|(_, backend)| backend).collect(),
            probe,
        }
    }
}
