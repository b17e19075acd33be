//! `idle` (seed 001): is the first call after an idle gap slower than a warm one?
//!
//! A round first takes the warm baselines: `warm_calls` calls on one keep-alive connection
//! and `warm_new_connections` calls on a connection each. Then, for every gap:
//!
//! 1. a fresh keep-alive connection makes one (untimed) call, the target idles for the gap,
//!    and the next call on that same connection is timed (`keepalive_after_GAP_ms`);
//! 2. the target idles for the gap again and a call on a new connection is timed
//!    (`new_conn_after_GAP_ms`).
//!
//! Each is also given as a ratio to its warm median (`..._ratio`): about 1 means no idle
//! penalty (seed 001 saw ~418 ms after 15 s). A server may close a keep-alive connection that
//! idled past its own idle timeout; that is reported as a note, not as an error, and the
//! keep-alive figure is then missing. Each gap is waited twice, so a round lasts about twice
//! the sum of the gaps; with `keep_alive` off only step 2 runs (for gaps past the targets'
//! keep-alive timeouts, where step 1 can only report the connection closed).

use std::time::{Duration, Instant};

use crate::client::{fresh_call, keep_alive_call};
use crate::progress::ticks;
use crate::report::{Better, Setting, Unit};
use crate::scenarios::{human, setting, ClassRound, Ctx, Prepared, Round};
use crate::BenchError;

/// Settings of `idle`.
#[derive(Debug, Clone)]
pub struct IdleConfig {
    /// The idle gaps, each waited twice per round (default 20 s and 120 s).
    pub gaps: Vec<Duration>,
    /// Warm calls on one keep-alive connection for the keep-alive baseline (default 20).
    pub warm_calls: u32,
    /// Warm calls on new connections for the new-connection baseline (default 5).
    pub warm_new_connections: u32,
    /// Whether to time a keep-alive connection after each gap too (default true); off, each
    /// gap is waited once per round, for the call on a new connection only.
    pub keep_alive: bool,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            gaps: vec![Duration::from_secs(20), Duration::from_secs(120)],
            warm_calls: 20,
            warm_new_connections: 5,
            keep_alive: true,
        }
    }
}

impl IdleConfig {
    /// The same settings with every gap a tenth as long (20 s, 120 s → 2 s, 12 s: still
    /// past tokio's 10 s blocking-thread keep-alive).
    pub fn quick(mut self) -> Self {
        for gap in &mut self.gaps {
            *gap /= 10;
        }
        self
    }

    pub(crate) fn settings(&self) -> Vec<Setting> {
        let gaps: Vec<String> = self.gaps.iter().map(|&g| human(g)).collect();
        vec![
            setting("gaps", gaps.join(",")),
            setting("warm_calls", self.warm_calls),
            setting("warm_new_connections", self.warm_new_connections),
            setting("keep_alive", self.keep_alive),
        ]
    }

    pub(crate) fn units(&self) -> u64 {
        let waits = if self.keep_alive { 2 } else { 1 };
        let gaps: u64 = self.gaps.iter().map(|&g| waits * ticks(g)).sum();
        gaps + u64::from(self.warm_calls) + u64::from(self.warm_new_connections)
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.gaps.is_empty() || self.warm_calls == 0 || self.warm_new_connections == 0 {
            return Err(BenchError::Settings(
                "idle needs at least one gap, one warm call and one warm new connection".into(),
            ));
        }
        Ok(())
    }
}

/// `value / base`, when both are known and `base` is not zero.
fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

/// One round: warm baselines, then each gap.
pub(crate) async fn round(
    config: &IdleConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let endpoint = &*target.main;
    let timeout = ctx.timeout;
    let mut n = 0u64;
    let mut next = || {
        n += 1;
        endpoint.request(n)
    };
    let mut round = Round::default();

    let mut warm = ClassRound::new("warm keep-alive");
    let mut conn = None;
    for _ in 0..config.warm_calls {
        let req = next();
        let begin = Instant::now();
        let result = keep_alive_call(&mut conn, endpoint, req, timeout).await;
        warm.record(begin.elapsed(), &result);
        ctx.progress.inc(1);
    }
    drop(conn);
    let mut warm_new = ClassRound::new("warm new connection");
    for _ in 0..config.warm_new_connections {
        let req = next();
        let begin = Instant::now();
        let result = fresh_call(endpoint, req, timeout).await;
        warm_new.record(begin.elapsed(), &result);
        ctx.progress.inc(1);
    }
    let warm_p50 = warm.latencies.p50_ms();
    let warm_new_p50 = warm_new.latencies.p50_ms();

    let mut after_keep_alive = ClassRound::new("after gap, keep-alive");
    let mut after_new = ClassRound::new("after gap, new connection");
    for &gap in &config.gaps {
        let name = human(gap);
        // 1. The same keep-alive connection, before and after the gap.
        let keep_alive_ms = if config.keep_alive {
            let mut conn = None;
            let warmed = keep_alive_call(&mut conn, endpoint, next(), timeout).await;
            ctx.progress.sleep(gap).await;
            match (&warmed, &conn) {
                (Ok(()), Some(c)) if c.is_closed() => {
                    round.notes.push(format!(
                        "the server closed the idle keep-alive connection during the {name} \
                         gap (its idle timeout): no keep-alive figure for it"
                    ));
                    None
                }
                _ => {
                    let req = next();
                    let begin = Instant::now();
                    let result = keep_alive_call(&mut conn, endpoint, req, timeout).await;
                    let took = begin.elapsed();
                    after_keep_alive.record(took, &result);
                    result.is_ok().then_some(took.as_secs_f64() * 1000.0)
                }
            }
        } else {
            None
        };
        // 2. A new connection after the gap.
        ctx.progress.sleep(gap).await;
        let req = next();
        let begin = Instant::now();
        let result = fresh_call(endpoint, req, timeout).await;
        let took = begin.elapsed();
        after_new.record(took, &result);
        let new_ms = result.is_ok().then_some(took.as_secs_f64() * 1000.0);

        let metric = |round: &mut Round, what: &str, value, unit| {
            let name = format!("{what}_after_{name}{}", unit_suffix(unit));
            round.metric(&name, value, unit, Better::Lower);
        };
        if config.keep_alive {
            metric(&mut round, "keepalive", keep_alive_ms, Unit::Ms);
            metric(
                &mut round,
                "keepalive",
                ratio(keep_alive_ms, warm_p50),
                Unit::Ratio,
            );
        }
        metric(&mut round, "new_conn", new_ms, Unit::Ms);
        metric(
            &mut round,
            "new_conn",
            ratio(new_ms, warm_new_p50),
            Unit::Ratio,
        );
    }
    round
        .classes
        .extend([warm, warm_new, after_keep_alive, after_new]);
    Ok(round)
}

/// `_ms` or `_ratio`, the metric name's suffix for `unit`.
fn unit_suffix(unit: Unit) -> &'static str {
    match unit {
        Unit::Ms => "_ms",
        Unit::Ratio => "_ratio",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_divides_gaps_by_ten() {
        let quick = IdleConfig::default().quick();
        assert_eq!(
            quick.gaps,
            [Duration::from_secs(2), Duration::from_secs(12)]
        );
        assert!(quick.units() > 2 * (20 + 120));
    }
}
