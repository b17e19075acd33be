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
//!
//! Each pool's sweeper ([`IdlePool::spawn_sweeper`]) is spawned by the first call that takes
//! the pool, on that call's runtime: a core's pool is swept by a task of the core. A pool that
//! has emptied (its connections idle past their timeout, after a long idle gap) wakes its
//! sleeping sweeper at the next call; on the core, that wake-up is a task queued on the
//! calling thread. Spawned on the main runtime, as it was, it woke one of that runtime's
//! threads in the middle of the call, which on issue 4's 2-CPU machine ran on the calling
//! core's CPU and preempted it twice before the call could connect upstream (traced in
//! stop 38: 85 µs of a 545 µs first call after 100 s idle).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wharf_http1::recycle::thread_number;

use crate::pool::{IdlePool, PoolLimits};

/// Idle pools, one per thread (round-robin over as many as there are CPUs), each with its
/// share of the limits.
#[derive(Debug)]
pub struct PoolShards {
    shards: Box<[Shard]>,
    /// How often the pools' sweepers sweep; `None`: the pools have no sweepers.
    sweep_every: Option<Duration>,
}

/// One thread's pool, and whether its sweeper was spawned.
#[derive(Debug)]
struct Shard {
    pool: Arc<IdlePool>,
    sweeper_spawned: AtomicBool,
}

impl PoolShards {
    /// As many pools as this machine has CPUs, together within `limits` (each bound split
    /// evenly, rounded up, at least one). No sweepers: see [`PoolShards::swept_every`].
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
        let shard = || Shard {
            pool: IdlePool::new(each),
            sweeper_spawned: AtomicBool::new(false),
        };
        Self {
            shards: (0..count).map(|_| shard()).collect(),
            sweep_every: None,
        }
    }

    /// The same pools, each swept every `every` by a sweeper spawned on the runtime of the
    /// first call that takes it ([`PoolShards::here`]; see the module doc).
    pub fn swept_every(self, every: Duration) -> Self {
        Self {
            sweep_every: Some(every),
            ..self
        }
    }

    /// The calling thread's pool; its sweeper is spawned on the calling runtime if it has
    /// none yet (outside a runtime, at a later call).
    pub fn here(&self) -> &Arc<IdlePool> {
        let shard = &self.shards[thread_number() % self.shards.len()];
        if let Some(every) = self.sweep_every {
            // One load per call once spawned; the swap makes one caller the spawner.
            if !shard.sweeper_spawned.load(Ordering::Acquire)
                && !shard.sweeper_spawned.swap(true, Ordering::AcqRel)
                && !shard.pool.spawn_sweeper(every)
            {
                shard.sweeper_spawned.store(false, Ordering::Release);
            }
        }
        &shard.pool
    }

    /// Idle connections over all pools.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.pool.idle_count())
            .sum()
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

    fn current_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Tasks alive on `runtime` after `call` ran inside it.
    fn tasks_after(runtime: &tokio::runtime::Runtime, call: impl FnOnce()) -> usize {
        runtime.block_on(async {
            call();
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        })
    }

    #[test]
    fn a_pools_sweeper_runs_on_the_runtime_of_the_first_call_that_takes_it() {
        let shards = PoolShards::with_count(LIMITS, 1).swept_every(Duration::from_secs(10));
        // Outside a runtime there is nowhere to spawn it: a later call does.
        shards.here();
        let first = current_thread_runtime();
        assert_eq!(
            tasks_after(&first, || {
                shards.here();
            }),
            1
        );
        assert_eq!(
            tasks_after(&first, || {
                shards.here();
            }),
            1,
            "spawned once"
        );
        let other = current_thread_runtime();
        assert_eq!(
            tasks_after(&other, || {
                shards.here();
            }),
            0,
            "the pool's sweeper is on the runtime that first took it"
        );
        // Without `swept_every`, no sweeper.
        let unswept = PoolShards::with_count(LIMITS, 1);
        assert_eq!(
            tasks_after(&other, || {
                unswept.here();
            }),
            0
        );
    }

    #[test]
    fn the_limits_are_split_over_the_pools() {
        let shards = PoolShards::with_count(LIMITS, 2);
        assert_eq!(shards.shards.len(), 2);
        assert_eq!(shards.idle_count(), 0);
        let each = shards.shards[1].pool.limits();
        assert_eq!(each.max_idle_per_key, 4);
        assert_eq!(each.max_idle_total, 3, "rounded up");
        assert_eq!(each.max_connecting_per_key, 16);
        assert_eq!(each.idle_timeout, LIMITS.idle_timeout);
        let one = PoolShards::with_count(LIMITS, 0);
        assert_eq!(one.shards.len(), 1);
    }
}
