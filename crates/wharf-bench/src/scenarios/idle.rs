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
//! After the last gap the warm baselines are taken again. Each timed call is also given as a
//! ratio to its kind's warm median (`..._ratio`): about 1 means no idle penalty (seed 001 saw
//! ~418 ms after 15 s). That median (`warm_keepalive_ms`, `warm_new_conn_ms`) is the lower
//! of the two warm phases' medians: on a shared machine a target's warm calls can be several
//! times slower for a while (where the scheduler left its threads, or another process's
//! load), and a slow phase taken as "warm" would hide an idle penalty; a round whose two
//! phases differ by more than 2 times (`PHASE_SPREAD_NOTE`) gets a note. A server may close a
//! keep-alive connection that idled past its own idle timeout; that is reported as a note, not
//! as an error, and the keep-alive figure is then missing. Each gap is waited twice, so a
//! round lasts about twice the sum of the gaps; with `keep_alive` off only step 2 runs (for
//! gaps past the targets' keep-alive timeouts, where step 1 can only report the connection
//! closed).

use std::time::{Duration, Instant};

use crate::client::{fresh_call, keep_alive_call, Endpoint, Req};
use crate::limits;
use crate::progress::ticks;
use crate::report::{Better, Setting, Unit};
use crate::scenarios::{human, ratio, setting, ClassRound, Ctx, Prepared, Round};
use crate::BenchError;

/// Settings of `idle`.
#[derive(Debug, Clone)]
pub struct IdleConfig {
    /// The idle gaps, each waited twice per round (default 20 s and 120 s); at least one,
    /// each 1 ms or more and given once (each names its own figures).
    pub gaps: Vec<Duration>,
    /// Warm calls on one keep-alive connection for the keep-alive baseline, per warm phase
    /// (default 20; 1 to 1,000,000, [`limits::WARM_CALLS`]).
    pub warm_calls: u32,
    /// Warm calls on new connections for the new-connection baseline, per warm phase
    /// (default 5; 1 to 10,000, [`limits::WARM_NEW_CONNECTIONS`]).
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
        // The warm baselines are taken twice: before the first gap and after the last.
        gaps + 2 * (u64::from(self.warm_calls) + u64::from(self.warm_new_connections))
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        let refuse = |why: String| Err(BenchError::Settings(why));
        if self.gaps.is_empty() {
            return refuse("idle needs at least one gap (e.g. --gaps 20s,120s)".into());
        }
        for (i, &gap) in self.gaps.iter().enumerate() {
            if gap.is_zero() {
                return refuse(
                    "a gap of 0s leaves no idle time to measure: give gaps above zero \
                     (e.g. --gaps 20s,120s)"
                        .into(),
                );
            }
            // Only the API or --quick (a tenth of a gap under 10 ms) can give one: no idle
            // time either, a call's own wake-ups take longer.
            if gap < Duration::from_millis(1) {
                return refuse(format!(
                    "a gap of {gap:?} is under 1ms, the shortest idle gap (--quick divides \
                     each gap by 10)"
                ));
            }
            // The figures are named by their gap: a second one would be dropped.
            if self.gaps[..i].contains(&gap) {
                return refuse(format!(
                    "gap {} is given twice: give each gap once (its figures are named by it)",
                    human(gap)
                ));
            }
        }
        if self.warm_calls == 0 || self.warm_new_connections == 0 {
            return refuse("idle needs at least one warm call and one warm new connection".into());
        }
        limits::WARM_CALLS.check("--warm-calls", self.warm_calls)?;
        limits::WARM_NEW_CONNECTIONS.check("warm_new_connections", self.warm_new_connections)
    }
}

/// Above this ratio between a round's two warm phases (the slower median over the faster) the
/// round gets a note: its target ran at two speeds while warm.
const PHASE_SPREAD_NOTE: f64 = 2.0;

/// One kind of warm call's medians in the phase before the gaps and the one after them.
#[derive(Debug, Clone, Copy)]
struct WarmPhases {
    before: Option<f64>,
    after: Option<f64>,
}

impl WarmPhases {
    /// The warm median the ratios divide by: the faster phase's (either, if only one has one).
    fn baseline(self) -> Option<f64> {
        match (self.before, self.after) {
            (Some(before), Some(after)) => Some(before.min(after)),
            (before, after) => before.or(after),
        }
    }

    /// A note for the round when the phases' medians differ by more than
    /// [`PHASE_SPREAD_NOTE`] times.
    fn spread_note(self, kind: &str) -> Option<String> {
        let (Some(before), Some(after)) = (self.before, self.after) else {
            return None;
        };
        let (slow, fast) = (before.max(after), before.min(after));
        (fast > 0.0 && slow / fast > PHASE_SPREAD_NOTE).then(|| {
            format!(
                "warm {kind} calls: median {before:.3} ms before the gaps, {after:.3} ms \
                 after them (x{:.1}): the target ran at two speeds while warm; the ratios \
                 divide by the faster",
                slow / fast
            )
        })
    }
}

/// One warm phase: `warm_calls` calls on one keep-alive connection, then
/// `warm_new_connections` calls on a connection each; the two classes (keep-alive, new
/// connection), each phase's own so that its median can be read before the round adds it to
/// its classes.
async fn warm_phase(
    config: &IdleConfig,
    endpoint: &Endpoint,
    next_call: &mut u64,
    ctx: &Ctx,
) -> (ClassRound, ClassRound) {
    let mut kept = ClassRound::new("warm keep-alive");
    let mut conn = None;
    for _ in 0..config.warm_calls {
        let req = next_request(endpoint, next_call);
        let begin = Instant::now();
        let result = keep_alive_call(&mut conn, endpoint, req, ctx.timeout).await;
        kept.record(begin.elapsed(), &result);
        ctx.progress.inc(1);
    }
    drop(conn);
    let first = *next_call + 1;
    *next_call += u64::from(config.warm_new_connections);
    let fresh =
        ClassRound::fresh_calls("warm new connection", endpoint, first..=*next_call, ctx).await;
    (kept, fresh)
}

/// The round's next request: calls are numbered from 1 in the order they are made.
fn next_request(endpoint: &Endpoint, count: &mut u64) -> Req {
    *count += 1;
    endpoint.request(*count)
}

/// One round: warm baselines, each gap, the warm baselines again.
pub(crate) async fn round(
    config: &IdleConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let endpoint = &*target.main;
    let timeout = ctx.timeout;
    let mut n = 0u64;
    let mut round = Round::default();

    // The round's warm classes start as the first phase's, the second is added to them.
    let (mut warm, mut warm_new) = warm_phase(config, endpoint, &mut n, ctx).await;
    let (warm_before, warm_new_before) = (warm.latencies.p50_ms(), warm_new.latencies.p50_ms());

    let mut after_keep_alive = ClassRound::new("after gap, keep-alive");
    let mut after_new = ClassRound::new("after gap, new connection");
    // Each gap's timed calls (keep-alive, new connection), in milliseconds.
    let mut timed = Vec::with_capacity(config.gaps.len());
    for &gap in &config.gaps {
        let name = human(gap);
        // 1. The same keep-alive connection, before and after the gap.
        let keep_alive_ms = if config.keep_alive {
            let mut conn = None;
            let req = next_request(endpoint, &mut n);
            let warmed = keep_alive_call(&mut conn, endpoint, req, timeout).await;
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
                    let req = next_request(endpoint, &mut n);
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
        let req = next_request(endpoint, &mut n);
        let begin = Instant::now();
        let result = fresh_call(endpoint, req, timeout).await;
        let took = begin.elapsed();
        after_new.record(took, &result);
        let new_ms = result.is_ok().then_some(took.as_secs_f64() * 1000.0);
        timed.push((name, keep_alive_ms, new_ms));
    }

    let (warm_after, warm_new_after) = warm_phase(config, endpoint, &mut n, ctx).await;
    let kept_phases = WarmPhases {
        before: warm_before,
        after: warm_after.latencies.p50_ms(),
    };
    let new_phases = WarmPhases {
        before: warm_new_before,
        after: warm_new_after.latencies.p50_ms(),
    };
    warm.absorb(&warm_after);
    warm_new.absorb(&warm_new_after);
    round.notes.extend(kept_phases.spread_note("keep-alive"));
    round.notes.extend(new_phases.spread_note("new-connection"));
    let (warm_p50, warm_new_p50) = (kept_phases.baseline(), new_phases.baseline());
    round.metric("warm_keepalive_ms", warm_p50, Unit::Ms, Better::Lower);
    round.metric("warm_new_conn_ms", warm_new_p50, Unit::Ms, Better::Lower);
    for (name, keep_alive_ms, new_ms) in timed {
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
    fn the_baseline_is_the_faster_warm_phase_and_a_wide_spread_gets_a_note() {
        let phases = |before, after| WarmPhases { before, after };
        // A slow phase before the gaps: the ratios divide by the phase after them.
        let slow_first = phases(Some(0.9), Some(0.05));
        assert_eq!(slow_first.baseline(), Some(0.05));
        let note = slow_first.spread_note("keep-alive").unwrap();
        assert!(
            note.contains("0.900 ms before") && note.contains("0.050 ms after"),
            "{note}"
        );
        assert!(note.contains("x18.0"), "{note}");
        // And the other way round.
        assert_eq!(phases(Some(0.04), Some(0.3)).baseline(), Some(0.04));
        // Within the spread: the faster, no note.
        let close = phases(Some(0.05), Some(0.09));
        assert_eq!(close.baseline(), Some(0.05));
        assert_eq!(close.spread_note("keep-alive"), None);
        // A phase whose calls all failed: the other, no note.
        let one = phases(None, Some(0.2));
        assert_eq!(one.baseline(), Some(0.2));
        assert_eq!(one.spread_note("new-connection"), None);
        assert_eq!(phases(None, None).baseline(), None);
    }

    #[test]
    fn gaps_must_be_given_above_zero_and_once() {
        let with_gaps = |gaps: &[u64]| IdleConfig {
            gaps: gaps.iter().copied().map(Duration::from_millis).collect(),
            ..IdleConfig::default()
        };
        for (gaps, says) in [
            (
                &[][..],
                "idle needs at least one gap (e.g. --gaps 20s,120s)",
            ),
            (
                &[0],
                "a gap of 0s leaves no idle time to measure: give gaps above zero",
            ),
            (&[20_000, 0], "a gap of 0s leaves no idle time"),
            (&[2000, 5000, 2000], "gap 2s is given twice"),
        ] {
            let error = with_gaps(gaps).check().unwrap_err();
            assert!(error.to_string().starts_with(says), "{gaps:?}: {error}");
        }
        // --quick takes a 5 ms gap under 1 ms.
        let error = with_gaps(&[5]).quick().check().unwrap_err();
        assert!(error.to_string().contains("500µs is under 1ms"), "{error}");
        assert!(with_gaps(&[1, 20_000]).check().is_ok());
    }

    #[test]
    fn the_settings_give_the_gaps_as_they_are_written_on_the_command_line() {
        let settings = IdleConfig::default().settings();
        assert_eq!(
            (settings[0].name.as_str(), settings[0].value.as_str()),
            ("gaps", "20s,120s")
        );
    }

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
