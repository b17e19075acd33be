//! `first-call` (seed 000): is the first call dearer than a warm one?
//!
//! One round opens a new connection and times, separately, the connect and the first request
//! on it; then `warm_calls` requests on the same keep-alive connection give the warm median.
//! `first_over_warm` is the first request's time over that median: about 1 when the first
//! call costs nothing extra (seed 000's service took ~1005 ms for it).
//!
//! The first call of a round is necessarily on a new connection, which a warm keep-alive
//! call is not. So `warm_new_connections` calls follow, each on a connection of its own
//! with its connect timed in: `first_with_connect_over_warm_new` is the connect and the
//! first request over their median, the first call against "a warm call plus connection
//! set-up" (SPEC's wording for seed 000).
//!
//! With a command (`--cmd`, as `cold-start`), the round starts it first, connects as soon as
//! the port accepts, and the first request is the very first the new server serves; the
//! command is stopped at the end of the round.
//!
//! With `prime_calls`, that first connection carries that many calls first (timed apart,
//! as `prime_ms`) and is closed; the timed first request then goes on a new connection.
//! That times the first call of a path a server can only reach after an earlier call: a
//! cache's hit path, which after a start needs the fill first.

use std::time::{Duration, Instant};

use crate::client::{bounded, keep_alive_call, CallError, Conn, Endpoint};
use crate::limits;
use crate::report::{Better, Setting, Unit};
use crate::scenarios::cold_start::ensure_not_listening;
use crate::scenarios::process::{self, Started};
use crate::scenarios::{human, ratio, setting, ClassRound, Ctx, Prepared, Round};
use crate::BenchError;

/// Settings of `first-call`.
#[derive(Debug, Clone)]
pub struct FirstCallConfig {
    /// Keep-alive calls after the first one, for the warm median (default 50; 1 to
    /// 1,000,000, [`limits::WARM_CALLS`]).
    pub warm_calls: u32,
    /// Calls made (on a connection of their own) before the timed first one (default 0; at
    /// most 1,000,000, [`limits::PRIME_CALLS`]).
    pub prime_calls: u32,
    /// Calls after the keep-alive ones, each on a new connection, connect included: the
    /// baseline for the first call with its connect (default 5; 1 to 10,000,
    /// [`limits::WARM_NEW_CONNECTIONS`]).
    pub warm_new_connections: u32,
    /// With a command: how long it may take until its port accepts (default 60 s).
    pub start_timeout: Duration,
    /// With a command: pause between connection attempts (default 5 ms).
    pub poll_interval: Duration,
}

impl Default for FirstCallConfig {
    fn default() -> Self {
        FirstCallConfig {
            warm_calls: 50,
            prime_calls: 0,
            warm_new_connections: 5,
            start_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(5),
        }
    }
}

impl FirstCallConfig {
    pub(crate) fn settings(&self) -> Vec<Setting> {
        vec![
            setting("warm_calls", self.warm_calls),
            setting("prime_calls", self.prime_calls),
            setting("warm_new_connections", self.warm_new_connections),
            setting("start_timeout", human(self.start_timeout)),
            setting("poll_interval", human(self.poll_interval)),
        ]
    }

    pub(crate) fn units(&self) -> u64 {
        1 + u64::from(self.prime_calls)
            + u64::from(self.warm_calls)
            + u64::from(self.warm_new_connections)
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.warm_calls == 0 || self.warm_new_connections == 0 {
            return Err(BenchError::Settings(
                "first-call needs at least one warm call and one warm new-connection call".into(),
            ));
        }
        limits::WARM_CALLS.check("--warm-calls", self.warm_calls)?;
        limits::PRIME_CALLS.check("--prime-calls", self.prime_calls)?;
        limits::WARM_NEW_CONNECTIONS.check("warm_new_connections", self.warm_new_connections)
    }
}

/// Connects as soon as the just-started command accepts; the time of the successful attempt.
async fn connect_when_up(
    config: &FirstCallConfig,
    endpoint: &Endpoint,
    started: &mut Started,
) -> Result<(Conn, Duration), CallError> {
    let deadline = started.exec_at + config.start_timeout;
    loop {
        let attempt = Instant::now();
        match endpoint.connect().await {
            Ok(conn) => return Ok((conn, attempt.elapsed())),
            Err(error @ CallError::Connect { .. }) => {
                if started.exited().is_some() || Instant::now() >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(config.poll_interval).await;
            }
            Err(other) => return Err(other),
        }
    }
}

/// One round: (start the command,) connect, (prime calls and a new connection,) first
/// request, warm requests, warm new-connection requests (, stop).
pub(crate) async fn round(
    config: &FirstCallConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let endpoint = &*target.main;
    let mut round = Round::default();
    let mut started = match &target.command {
        Some(words) => {
            ensure_not_listening(&target.name, endpoint).await?;
            Some(process::start(&target.name, words)?)
        }
        None => None,
    };
    let connected = match started.as_mut() {
        Some(started) => connect_when_up(config, endpoint, started).await,
        None => {
            let attempt = Instant::now();
            bounded(ctx.timeout, endpoint.connect())
                .await
                .map(|conn| (conn, attempt.elapsed()))
        }
    };
    // From exec to an accepted connection, when a command was started.
    let exec_to_connect = match (&started, &connected) {
        (Some(started), Ok(_)) => Some(ms(started.exec_at.elapsed())),
        _ => None,
    };
    if let (Err(error), Some(started)) = (&connected, started.as_mut()) {
        round.notes.push(match started.exited() {
            Some(status) => format!("the command exited ({status}) before it accepted"),
            None => format!(
                "the command did not accept a connection within {} ({error})",
                human(config.start_timeout)
            ),
        });
    }
    // The prime calls' class, when the round makes any.
    let mut prime = (config.prime_calls > 0).then(|| ClassRound::new("prime"));
    let connected = match (connected, prime.as_mut()) {
        (Ok((primed, _)), Some(prime)) => {
            let mut conn = Some(primed);
            for _ in 0..config.prime_calls {
                let begin = Instant::now();
                let result =
                    keep_alive_call(&mut conn, endpoint, endpoint.request(0), ctx.timeout).await;
                prime.record(begin.elapsed(), &result);
                ctx.progress.inc(1);
            }
            drop(conn);
            let attempt = Instant::now();
            bounded(ctx.timeout, endpoint.connect())
                .await
                .map(|conn| (conn, attempt.elapsed()))
        }
        (other, _) => other,
    };
    let mut first = ClassRound::new("first");
    let mut conn = None;
    let (connect_ms, first_ms) = match connected {
        Ok((c, connect_took)) => {
            let begin = Instant::now();
            conn = Some(c);
            let result =
                keep_alive_call(&mut conn, endpoint, endpoint.request(0), ctx.timeout).await;
            let took = begin.elapsed();
            first.record(took, &result);
            (Some(ms(connect_took)), result.is_ok().then(|| ms(took)))
        }
        Err(error) => {
            first.errors.record(&error);
            (None, None)
        }
    };
    ctx.progress.inc(1);

    let mut warm = ClassRound::new("warm");
    for n in 1..=u64::from(config.warm_calls) {
        let begin = Instant::now();
        let result = keep_alive_call(&mut conn, endpoint, endpoint.request(n), ctx.timeout).await;
        warm.record(begin.elapsed(), &result);
        ctx.progress.inc(1);
    }
    drop(conn);
    let warm_p50 = warm.latencies.p50_ms();
    let after_warm = u64::from(config.warm_calls);
    let warm_new = ClassRound::fresh_calls(
        "warm new connection",
        endpoint,
        after_warm + 1..=after_warm + u64::from(config.warm_new_connections),
        ctx,
    )
    .await;
    let warm_new_p50 = warm_new.latencies.p50_ms();
    if let Some(started) = started.take() {
        started.stop().await?;
    }

    if target.command.is_some() {
        round.metric(
            "exec_to_connect_ms",
            exec_to_connect,
            Unit::Ms,
            Better::Lower,
        );
    }
    if let Some(prime) = &prime {
        round.metric(
            "prime_ms",
            prime.latencies.p50_ms(),
            Unit::Ms,
            Better::Lower,
        );
    }
    round.metric("connect_ms", connect_ms, Unit::Ms, Better::Lower);
    round.metric("first_request_ms", first_ms, Unit::Ms, Better::Lower);
    round.metric("warm_p50_ms", warm_p50, Unit::Ms, Better::Lower);
    round.metric(
        "first_over_warm",
        ratio(first_ms, warm_p50),
        Unit::Ratio,
        Better::Lower,
    );
    let first_with_connect = connect_ms.zip(first_ms).map(|(c, f)| c + f);
    round.metric("warm_new_p50_ms", warm_new_p50, Unit::Ms, Better::Lower);
    round.metric(
        "first_with_connect_over_warm_new",
        ratio(first_with_connect, warm_new_p50),
        Unit::Ratio,
        Better::Lower,
    );
    round.classes.extend(prime);
    round.classes.push(first);
    round.classes.push(warm);
    round.classes.push(warm_new);
    Ok(round)
}

/// A duration in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
