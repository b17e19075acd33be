//! The progress bar: [`Progress`], drawn by `indicatif` on stderr.
//!
//! One bar for the whole run, in "units" each scenario defines (a call, a cold start, a tenth
//! of a second of a timed phase). It is hidden when stderr is not a terminal or with
//! `--quiet`, and then costs an atomic add per unit. Reports go to stdout, so the bar never
//! mixes with them.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One tick of a timed phase ([`Progress::sleep`]): a unit is this much time.
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// Units for `duration` of a timed phase.
pub(crate) fn ticks(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis() / TICK.as_millis()).unwrap_or(u64::MAX)
}

/// The run's progress bar (cheap to clone: every clone moves the same bar).
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` units, drawn only when `visible` and stderr is a terminal.
    pub(crate) fn new(total: u64, visible: bool) -> Progress {
        let bar = if visible && std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {percent:>3}% eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar }
    }

    /// A bar that is never drawn.
    pub(crate) fn hidden() -> Progress {
        Progress {
            bar: ProgressBar::hidden(),
        }
    }

    /// `n` more units done.
    pub(crate) fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// The text beside the bar (scenario, round, target).
    pub(crate) fn message(&self, text: String) {
        self.bar.set_message(text);
    }

    /// Sleeps for `duration`, moving the bar by [`ticks`]`(duration)` units on the way.
    pub(crate) async fn sleep(&self, duration: Duration) {
        let end = Instant::now() + duration;
        let total = ticks(duration);
        let mut done = 0;
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            let due = ticks(duration.saturating_sub(end - now)).min(total);
            self.inc(due - done);
            done = due;
            tokio::time::sleep((end - now).min(TICK)).await;
        }
        self.inc(total - done);
    }

    /// Removes the bar from the terminal.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
