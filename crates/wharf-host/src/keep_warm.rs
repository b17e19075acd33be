//! Keep-warm (`server.keep_warm`; seed 001 on hosts that take idle memory back): the
//! start-up warm-up's calls run again every period, on every core, for as long as the host
//! accepts calls, so that the code, the runtime's and allocator's memory and the kernel's
//! loopback paths a call uses stay resident.
//!
//! Why: on some virtual machines (issue 4's Firecracker guest) the host reclaims or ages
//! guest memory left untouched for a second or so, out of the guest's sight (no page fault
//! is counted), and the first touch of each such page then costs 11-25 µs. A call touches
//! a few hundred pages, so the first call after 10 s idle took 5.5 ms there against 0.01
//! warm; with calls to another URL of the same wharf every 200 ms, 0.8 ms. The pages are
//! the machine's, not the process's: another process touching the same file pages keeps
//! them warm too.
//!
//! A round is skipped while calls keep a core busy (they keep the pages warm); an idle
//! round costs a few loopback calls per core (0.8 % of a core at 200 ms on that machine).
//!
//! What is called, and how, is [`crate::warm_up`]'s; this module only runs it on a timer.
//! Main type: [`KeepWarm`].

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::warm_up::Rig;

/// The running keep-warm; dropping it stops it.
pub(crate) struct KeepWarm {
    task: JoinHandle<()>,
}

impl KeepWarm {
    /// Runs `rig` every `every` (the first time one period from now: the start-up warm-up
    /// has just run) on this runtime, unless a core was busy for more than a quarter of the
    /// period since the last round: calls are keeping the pages warm then, and a round
    /// would only take CPU from them. A period that a slow round overran is skipped, not
    /// made up. A failed round is logged as a warning when it follows a good one (or is
    /// the first), then at debug level while the failure lasts.
    pub(crate) fn start(rig: Rig, every: Duration) -> Self {
        let task = tokio::spawn(async move {
            let mut ticks = interval_at(Instant::now() + every, every);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut failing = false;
            let mut busy_before = rig.cores_busy();
            loop {
                ticks.tick().await;
                let busy_now = rig.cores_busy();
                let serving = busy_now
                    .iter()
                    .zip(&busy_before)
                    .any(|(now, before)| now.saturating_sub(*before) > every / 4);
                if serving {
                    busy_before = busy_now;
                    continue;
                }
                let report = rig.run().await;
                // Read after the round, so that its own time does not count as calls'.
                busy_before = rig.cores_busy();
                match (report.failed.is_empty(), failing) {
                    (true, _) => failing = false,
                    (false, false) => {
                        failing = true;
                        tracing::warn!(failed = ?report.failed, "keep-warm: calls failed; idle pages may go cold");
                    }
                    (false, true) => {
                        tracing::debug!(failed = ?report.failed, "keep-warm: calls still failing");
                    }
                }
            }
        });
        Self { task }
    }
}

impl Drop for KeepWarm {
    fn drop(&mut self) {
        self.task.abort();
    }
}
