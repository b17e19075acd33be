//! Idle pools by thread: each thread that calls upstreams takes its connections from a pool
//! of its own, so a connection is used on the thread (and the runtime, and the epoll) that
//! opened it, and the threads do not contend for one pool's lock.
//!
//! The host runs sessions on cores, one thread each with a runtime of its own
//! (`wharf_host`'s `cores`): a pooled connection opened on one core and taken by another
//! would be read through the first core's epoll, which wakes the second across threads on
//! every response. Threads get pools in the order they first call, round-robin over as many
//! pools as the machine has CPUs ([`thread_number`]); the cores, started together, get
//! distinct ones.

use std::sync::Arc;
use std::time::Duration;

use wharf_http1::recycle::thread_number;

use crate::pool::{IdlePool, PoolLimits};

/// Idle pools, one per thread (round-robin over as many as there are CPUs), each with its
/// share of the limits.
#[derive(Debug)]
pub struct PoolShards {
    shards: Box<[Arc<IdlePool>]>,
}

impl PoolShards {
    /// As many pools as this machine has CPUs, together within `limits` (each bound split
    /// evenly, rounded up, at least one).
    pub fn new(limits: PoolLimits) -> Self {
        let count = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_count(limits, count)
    }

    /// `count` pools (at least one) together within `limits`.
    pub fn with_count(limits: PoolLimits, count: usize) -> Self {
        let count = count.max(1);
        let share = |limit: usize| limit.div_ceil(count).max(1);
        let each = PoolLimits {
            max_idle_per_key: share(limits.max_idle_per_key),
            max_idle_total: share(limits.max_idle_total),
            max_connecting_per_key: share(limits.max_connecting_per_key),
            ..limits
        };
        Self {
            shards: (0..count).map(|_| IdlePool::new(each)).collect(),
        }
    }

    /// The calling thread's pool.
    pub fn here(&self) -> &Arc<IdlePool> {
        &self.shards[thread_number() % self.shards.len()]
    }

    /// Sweeps every pool every `every`, each from the first call through it on, in that
    /// call's runtime (see [`IdlePool::sweep_from_first_call`]): the core the pool serves.
    pub fn sweep_from_first_call(&self, every: Duration) {
        for shard in self.shards.iter() {
            shard.sweep_from_first_call(every);
        }
    }

    /// Idle connections over all pools.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.shards.iter().map(|shard| shard.idle_count()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PoolLimits = PoolLimits {
        max_idle_per_key: 8,
        max_idle_total: 5,
        idle_timeout: Duration::from_secs(1),
        max_connecting_per_key: 32,
        max_connect_wait: Duration::from_millis(1),
    };

    #[test]
    fn a_thread_keeps_its_pool_and_other_threads_get_others() {
        let shards = Arc::new(PoolShards::with_count(LIMITS, 2));
        let mine = Arc::as_ptr(shards.here());
        assert_eq!(
            Arc::as_ptr(shards.here()),
            mine,
            "the same pool on every call"
        );
        // Two threads started one after the other take consecutive numbers: one of them
        // gets the pool this thread does not have.
        let others: Vec<_> = (0..2)
            .map(|_| {
                let shards = shards.clone();
                std::thread::spawn(move || Arc::as_ptr(shards.here()) as usize)
                    .join()
                    .unwrap()
            })
            .collect();
        assert!(others.iter().any(|&other| other != mine as usize));
    }

    #[test]
    fn the_limits_are_split_over_the_pools() {
        let shards = PoolShards::with_count(LIMITS, 2);
        assert_eq!(shards.shards.len(), 2);
        assert_eq!(shards.idle_count(), 0);
        let each = shards.shards[1].limits();
        assert_eq!(each.max_idle_per_key, 4);
        assert_eq!(each.max_idle_total, 3, "rounded up");
        assert_eq!(each.max_connecting_per_key, 16);
        assert_eq!(each.idle_timeout, LIMITS.idle_timeout);
        let one = PoolShards::with_count(LIMITS, 0);
        assert_eq!(one.shards.len(), 1);
    }
}
