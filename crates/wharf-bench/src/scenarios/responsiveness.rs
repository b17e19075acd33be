//! `responsiveness` (seed 002): do slow calls in flight slow down fast ones?
//!
//! N calls to the slow URL start together, each on a connection of its own (as the seed's
//! 25 `WebClient` threads did); after `delay`, M calls to the fast URL start together the same
//! way. Each class gets its latency figures (connect included, to the arrival of the
//! response's last byte as the kernel stamped it: `StampedCall`) and errors. The verdict is
//! `slow_responses`, the seed's count: fast calls that succeeded but finished after the first
//! slow call had succeeded. A server that never lets slow calls hold up fast ones scores 0
//! whatever N is; one that queues fast calls behind slow ones scores M. Failed fast calls are
//! errors, never fast responses; a round where no slow call or no fast call succeeded has no
//! count (and a note), since 0 would pass for a perfect score. `fast_p99_read_ms` is the fast
//! calls' p99 counted to when the client read each response instead (while it starts calls
//! it reads late).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Endpoint;
use crate::limits;
use crate::report::{Better, Setting, Unit};
use crate::scenarios::{
    human, join_all, read_quantile_ms, setting, timeline, ClassRound, Ctx, Outcome, Prepared,
    Round, StampedCall,
};
use crate::BenchError;

/// Settings of `responsiveness`.
#[derive(Debug, Clone)]
pub struct ResponsivenessConfig {
    /// Calls to the slow URL, all started at once (default 25; 1 to 100,000,
    /// [`limits::CONNECTIONS_AT_ONCE`]).
    pub slow_calls: u32,
    /// Calls to the fast URL, all started at once `delay` after the slow ones (default 25;
    /// 1 to 100,000, [`limits::CONNECTIONS_AT_ONCE`]).
    pub fast_calls: u32,
    /// Pause between starting the slow calls and starting the fast ones (default 500 ms).
    pub delay: Duration,
}

impl Default for ResponsivenessConfig {
    fn default() -> Self {
        ResponsivenessConfig {
            slow_calls: 25,
            fast_calls: 25,
            delay: Duration::from_millis(500),
        }
    }
}

impl ResponsivenessConfig {
    pub(crate) fn settings(&self) -> Vec<Setting> {
        vec![
            setting("slow_calls", self.slow_calls),
            setting("fast_calls", self.fast_calls),
            setting("delay", human(self.delay)),
        ]
    }

    pub(crate) fn units(&self) -> u64 {
        u64::from(self.slow_calls) + u64::from(self.fast_calls)
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.slow_calls == 0 || self.fast_calls == 0 {
            return Err(BenchError::Settings(
                "responsiveness needs at least one slow and one fast call".into(),
            ));
        }
        limits::CONNECTIONS_AT_ONCE.check("--slow-calls", self.slow_calls)?;
        limits::CONNECTIONS_AT_ONCE.check("--fast-calls", self.fast_calls)
    }
}

/// Starts one call per request, each on its own connection, and returns their tasks.
fn start_calls(
    endpoint: &Arc<Endpoint>,
    count: u32,
    ctx: &Ctx,
) -> Vec<tokio::task::JoinHandle<StampedCall>> {
    // Requests are built before any call starts, so the calls start back to back.
    let requests: Vec<_> = (0..u64::from(count)).map(|n| endpoint.request(n)).collect();
    requests
        .into_iter()
        .map(|req| {
            let endpoint = Arc::clone(endpoint);
            let timeout = ctx.timeout;
            let progress = ctx.progress.clone();
            tokio::spawn(async move {
                let call = StampedCall::run(&endpoint, req, timeout).await;
                progress.inc(1);
                call
            })
        })
        .collect()
}

/// One round: the slow calls, the pause, the fast calls, then every result.
pub(crate) async fn round(
    config: &ResponsivenessConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let fast = target.fast.as_ref().ok_or_else(|| BenchError::Target {
        target: target.name.clone(),
        what: "responsiveness needs a fast URL".into(),
    })?;
    let origin = Instant::now();
    let slow_tasks = start_calls(&target.main, config.slow_calls, ctx);
    tokio::time::sleep(config.delay).await;
    let fast_started = Instant::now();
    let fast_tasks = start_calls(fast, config.fast_calls, ctx);
    let slow = join_all(slow_tasks, || StampedCall::lost(origin)).await;
    let fast = join_all(fast_tasks, || StampedCall::lost(fast_started)).await;
    let fast_p99_read = read_quantile_ms(&fast, 0.99);
    let slow: Vec<Outcome> = slow.into_iter().map(|c| c.outcome).collect();
    let fast: Vec<Outcome> = fast.into_iter().map(|c| c.outcome).collect();

    let mut round = Round::default();
    let first_slow_done = slow
        .iter()
        .filter(|o| o.result.is_ok())
        .map(|o| o.finished)
        .min();
    let fast_failed = fast.iter().filter(|o| o.result.is_err()).count();
    // A count of fast calls held up needs a slow call to be held up behind and fast calls
    // that were served: without either, 0 would read as a perfect score (issue 4).
    let slow_responses = match first_slow_done {
        Some(first) if fast_failed < fast.len() => Some(
            fast.iter()
                .filter(|o| o.result.is_ok() && o.finished > first)
                .count() as f64,
        ),
        _ => None,
    };
    if fast_failed == fast.len() {
        round.notes.push(format!(
            "no fast call succeeded, so there is no slow_responses: the {fast_failed} failed \
             fast calls are counted as errors"
        ));
    }
    match first_slow_done {
        None => round.notes.push(
            "no slow call succeeded, so there is no slow_responses: no fast call can have \
             waited behind one"
                .to_owned(),
        ),
        Some(first) if first <= fast_started => round.notes.push(format!(
            "a slow call finished {:.0}ms after the start, before the fast calls began: \
             the slow URL is not slow enough to test anything",
            (first - origin).as_secs_f64() * 1000.0
        )),
        Some(_) => {}
    }
    round.classes.push(ClassRound::from_outcomes("slow", &slow));
    round.classes.push(ClassRound::from_outcomes("fast", &fast));
    round.metric("slow_responses", slow_responses, Unit::Count, Better::Lower);
    round.metric("fast_p99_read_ms", fast_p99_read, Unit::Ms, Better::Lower);
    round.timelines.push(timeline("slow", origin, &slow));
    round.timelines.push(timeline("fast", origin, &fast));
    Ok(round)
}
