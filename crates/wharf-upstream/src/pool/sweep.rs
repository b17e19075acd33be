//! The sweep of an [`IdlePool`]: closes connections idle past the timeout or found closed
//! and gives back the read buffers of those kept, from a task that starts on the runtime of
//! the pool's first call and sleeps without a timer while the pool holds nothing.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Idle, IdlePool, IdleState, Slots};

impl IdlePool {
    /// Under the lock, before an upstream goes into `by_key`: when the pool held nothing,
    /// wakes its sweeper, which sleeps without a timer while the pool is empty (it looks
    /// again once the lock is released), starting it first if it is deferred to this call.
    pub(super) fn wake_sweeper_if_empty(self: &Arc<Self>, slots: &mut Slots) {
        if slots.by_key.is_empty() {
            if let Some(every) = slots.sweep_deferred.take() {
                self.spawn_sweeper(every);
            }
            self.sweeper_wake.notify_one();
        }
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
                // The soonest the upstream closed one opened ahead and never used.
                let mut closed_unused: Option<Duration> = None;
                let (mut kept, stale): (Vec<Idle>, Vec<Idle>) = idle.drain(..).partition(|entry| {
                    match entry.state(now, self.limits.idle_timeout) {
                        IdleState::Usable => true,
                        IdleState::Stale => false,
                        IdleState::ClosedUnused(after) => {
                            closed_unused = Some(closed_unused.map_or(after, |c| c.min(after)));
                            false
                        }
                    }
                });
                for entry in &mut kept {
                    entry.connection.release_read_buffer();
                }
                *total -= before - kept.len();
                *idle = kept;
                if let Some(after) = closed_unused {
                    upstream.pause_floor_if_closed_soon(after, now);
                }
                if !stale.is_empty() {
                    upstream.wake_keeper_if_short();
                }
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
    pub(super) fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
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
