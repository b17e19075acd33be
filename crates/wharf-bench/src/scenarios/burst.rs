//! `burst` (seed 002's thread ramp-up): K new connections at once, one call each.
//!
//! Every call's task and request are made first and wait on one signal, so the K connects
//! leave together when it is given. A server that serves a burst at once has all K served,
//! no errors, and a makespan close to its p99; one that ramps up workers (the seed's "1 thread
//! per 500 ms") shows a long tail. `makespan_ms` runs from the signal to the last successful
//! response (none when no call succeeded: failed calls end early and are counted as errors).
//!
//! The client starts K calls on a few threads, so the last of them starts a while after the
//! signal, and how long depends on the CPU the target leaves it (they share the machine):
//! `last_start_ms` says how long (over all calls: a call's start is the client's, whatever
//! its outcome). While it starts the later calls the earlier ones' responses wait in their
//! sockets, so a call's latency is timed by the kernel (`StampedCall`): from the call's start
//! (its request leaves within the connect) to the arrival of its response's last byte, as the
//! socket stamped it. `p99_read_ms` is the p99 counted to when
//! the client read the response instead (which includes the wait), and `p99_from_signal_ms`
//! the p99 counted from the signal, the latency of a burst's calls as one batch.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::limits;
use crate::report::{Better, Setting, Unit};
use crate::scenarios::{
    join_all, nearest_rank, read_quantile_ms, setting, timeline, ClassRound, Ctx, Outcome,
    Prepared, Round, StampedCall,
};
use crate::BenchError;

/// Settings of `burst`.
#[derive(Debug, Clone)]
pub struct BurstConfig {
    /// New connections opened at once, one call each (default 2000; 1 to 100,000,
    /// [`limits::CONNECTIONS_AT_ONCE`]).
    pub connections: u32,
}

impl Default for BurstConfig {
    fn default() -> Self {
        BurstConfig { connections: 2000 }
    }
}

impl BurstConfig {
    pub(crate) fn settings(&self) -> Vec<Setting> {
        vec![setting("connections", self.connections)]
    }

    pub(crate) fn units(&self) -> u64 {
        u64::from(self.connections)
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.connections == 0 {
            return Err(BenchError::Settings(
                "burst needs at least one connection".into(),
            ));
        }
        limits::CONNECTIONS_AT_ONCE.check("--connections", self.connections)
    }
}

/// One round: K calls released together.
pub(crate) async fn round(
    config: &BurstConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let (go_tx, go_rx) = watch::channel(false);
    let tasks: Vec<_> = (0..u64::from(config.connections))
        .map(|n| {
            let req = target.main.request(n);
            let endpoint = Arc::clone(&target.main);
            let mut go = go_rx.clone();
            let timeout = ctx.timeout;
            let progress = ctx.progress.clone();
            tokio::spawn(async move {
                // Err only if the sender is gone, which it is not before `send` below.
                let _ = go.wait_for(|&go| go).await;
                let call = StampedCall::run(&endpoint, req, timeout).await;
                progress.inc(1);
                call
            })
        })
        .collect();
    // Let the tasks reach the signal before giving it.
    tokio::task::yield_now().await;
    let origin = Instant::now();
    let _ = go_tx.send(true);
    let calls = join_all(tasks, || StampedCall::lost(origin)).await;
    let p99_read = read_quantile_ms(&calls, 0.99);
    let outcomes: Vec<Outcome> = calls.into_iter().map(|c| c.outcome).collect();

    let mut round = Round::default();
    let class = ClassRound::from_outcomes("calls", &outcomes);
    let served = class.latencies.len();
    // To the last *successful* call's end: a failure (a refused connect, a 304) ends at
    // once and would pass for a burst served fast; none served, no makespan.
    let makespan = outcomes
        .iter()
        .filter(|o| o.result.is_ok())
        .map(|o| o.finished.saturating_duration_since(origin))
        .max();
    round.classes.push(class);
    round.metric("served", Some(served as f64), Unit::Count, Better::Higher);
    round.metric(
        "all_served",
        Some(if served == u64::from(config.connections) {
            1.0
        } else {
            0.0
        }),
        Unit::Flag,
        Better::Higher,
    );
    if makespan.is_none() {
        round.notes.push(format!(
            "no call succeeded, so there is no makespan_ms: the {} failed calls are counted \
             as errors",
            outcomes.len()
        ));
    }
    round.metric(
        "makespan_ms",
        makespan.map(|m| m.as_secs_f64() * 1000.0),
        Unit::Ms,
        Better::Lower,
    );
    // Over every call, failed ones too: when the client began a call's connect does not
    // depend on how the call ended, and leaving a failed late start out would understate
    // the client's own delay. It says how far the client lagged, not how the target served.
    let last_start = outcomes
        .iter()
        .map(|o| o.started.saturating_duration_since(origin))
        .max()
        .unwrap_or_default();
    round.metric(
        "last_start_ms",
        Some(last_start.as_secs_f64() * 1000.0),
        Unit::Ms,
        Better::Lower,
    );
    round.metric("p99_read_ms", p99_read, Unit::Ms, Better::Lower);
    let mut from_signal: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.result.is_ok())
        .map(|o| o.finished.saturating_duration_since(origin).as_secs_f64() * 1000.0)
        .collect();
    from_signal.sort_by(f64::total_cmp);
    round.metric(
        "p99_from_signal_ms",
        nearest_rank(&from_signal, 0.99),
        Unit::Ms,
        Better::Lower,
    );
    round.timelines.push(timeline("calls", origin, &outcomes));
    Ok(round)
}
