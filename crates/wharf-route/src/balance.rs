//! The order in which a call tries a route's backends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use wharf_config::Strategy;

use crate::backend::Backend;

/// Picks backend order per call.
#[derive(Debug)]
pub struct Balancer {
    strategy: Strategy,
    /// Next start index for round_robin.
    next: AtomicUsize,
}

impl Balancer {
    /// A balancer for `strategy`.
    pub fn new(strategy: Strategy) -> Self {
        Self {
            strategy,
            next: AtomicUsize::new(0),
        }
    }

    /// Backends in the order to try: healthy ones by strategy, then ejected
    /// ones as a last resort (better a probe than a certain 502).
    pub fn order(&self, backends: &[Arc<Backend>]) -> Vec<Arc<Backend>> {
        let count = backends.len();
        let mut order: Vec<Arc<Backend>> = match self.strategy {
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
        // Stable partition: available backends first, order kept.
        order.sort_by_key(|backend| !backend.is_available());
        order
    }
}
