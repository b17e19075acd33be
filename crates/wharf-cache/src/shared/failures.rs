//! When a failing shared tier is worth a log line. Every failed operation is counted (the
//! metrics) and skips the tier for that call; logging each one would flood the log while
//! Redis is down, and logging none at warn level would leave a tier that never works (a
//! wrong URL or database) silent. [`FailureLog`] decides: a warning at the first failure,
//! then at most one every [`FAILURE_WARN_EVERY`] with the number of failures since the last
//! one, and a line when the tier answers again after a warning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Least time between two warnings about a failing shared tier.
pub const FAILURE_WARN_EVERY: Duration = Duration::from_secs(30);

/// The rate limiter of failure warnings of one tier.
#[derive(Debug, Default)]
pub(super) struct FailureLog {
    /// Set while the tier fails: a successful operation checks it without the lock.
    failing: AtomicBool,
    /// Guards the counts and the time of the last warning.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the last warning was logged.
    last_warning: Option<Instant>,
    /// Failures not yet counted in a warning.
    unreported: u64,
    /// A warning was logged since the tier last worked, so its recovery is worth a line.
    warned: bool,
}

/// The tier works again after a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovered {
    /// Failures after the last warning that no warning counted.
    pub(super) unreported: u64,
}

impl FailureLog {
    /// Records a failure at `now`. `Some(n)`: a warning is due, covering `n` failures (this
    /// one included) since the last warning.
    pub(super) fn failure(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.failing.store(true, Ordering::Relaxed);
        state.unreported += 1;
        let due = state
            .last_warning
            .is_none_or(|last| now.saturating_duration_since(last) >= FAILURE_WARN_EVERY);
        if !due {
            return None;
        }
        state.last_warning = Some(now);
        state.warned = true;
        Some(std::mem::take(&mut state.unreported))
    }

    /// Records a successful operation. `Some`: the tier failed, was warned about, and now
    /// works again. Only an atomic load while the tier works.
    pub(super) fn success(&self) -> Option<Recovered> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.failing.store(false, Ordering::Relaxed);
        if !std::mem::take(&mut state.warned) {
            // Failures in between warnings (a flapping Redis): the next warning counts them.
            return None;
        }
        Some(Recovered {
            unreported: std::mem::take(&mut state.unreported),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_at_the_first_failure_then_at_most_once_per_period_with_the_count() {
        let log = FailureLog::default();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert_eq!(log.success(), None, "working: nothing to say");
        assert_eq!(log.failure(at(0)), Some(1), "the first failure warns");
        for secs in 1..30 {
            assert_eq!(log.failure(at(secs)), None, "rate-limited at {secs}s");
        }
        // 29 failures since the warning, plus this one.
        assert_eq!(log.failure(at(30)), Some(30));
        assert_eq!(log.failure(at(31)), None);
        assert_eq!(
            log.success(),
            Some(Recovered { unreported: 1 }),
            "recovery after a warning is logged"
        );
        assert_eq!(log.success(), None, "once");
        // Failing again soon after: no new warning before the period is over, and no
        // recovery line for failures nobody was warned of (a flapping Redis stays quiet).
        assert_eq!(log.failure(at(40)), None);
        assert_eq!(log.success(), None);
        assert_eq!(
            log.failure(at(61)),
            Some(2),
            "both failures since the last warning"
        );
    }
}
