//! `cold-start` (seed 003): from exec to the first good response.
//!
//! One round is one start: check that nothing answers at the URL yet, exec the target's
//! command, then try the URL every `poll_interval` on a new connection each time until a 2xx
//! response arrives. Refused connections and non-2xx answers (a server up but not ready) are
//! "not yet"; the round fails (an error in class `first_ok`) if the command exits or
//! `start_timeout` passes first. Then the command is stopped (SIGTERM, SIGKILL after 5 s) and
//! the time it took to exit is reported too. Runs are rounds: with several targets they are
//! interleaved (A B A B …), and the report gives their median, min and max.

use std::time::{Duration, Instant};

use crate::client::{CallError, Endpoint};
use crate::report::{Better, Setting, Unit};
use crate::scenarios::process;
use crate::scenarios::{human, setting, ClassRound, Ctx, Prepared, Round};
use crate::BenchError;

/// Settings of `cold-start` (the number of runs is the number of rounds).
#[derive(Debug, Clone)]
pub struct ColdStartConfig {
    /// How long the command may take to give its first 2xx (default 60 s).
    pub start_timeout: Duration,
    /// Pause between attempts (default 5 ms).
    pub poll_interval: Duration,
}

impl Default for ColdStartConfig {
    fn default() -> Self {
        ColdStartConfig {
            start_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(5),
        }
    }
}

impl ColdStartConfig {
    pub(crate) fn settings(&self) -> Vec<Setting> {
        vec![
            setting("start_timeout", human(self.start_timeout)),
            setting("poll_interval", human(self.poll_interval)),
            setting("stop", "SIGTERM, SIGKILL after 5s"),
        ]
    }

    pub(crate) fn units(&self) -> u64 {
        1
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.start_timeout.is_zero() {
            return Err(BenchError::Settings(
                "cold-start needs a start timeout above zero".into(),
            ));
        }
        Ok(())
    }
}

/// Fails if something already accepts connections at `endpoint`: the time to a first
/// response would then not be the command's.
pub(crate) async fn ensure_not_listening(
    target: &str,
    endpoint: &Endpoint,
) -> Result<(), BenchError> {
    let probe = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(endpoint.addr()),
    )
    .await;
    match probe {
        Ok(Ok(_)) => Err(BenchError::AlreadyListening {
            target: target.to_owned(),
            addr: endpoint.addr(),
        }),
        _ => Ok(()),
    }
}

/// One round: one start, timed, then the stop.
pub(crate) async fn round(
    config: &ColdStartConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let endpoint = &*target.main;
    let words = target
        .command
        .as_deref()
        .ok_or_else(|| BenchError::Target {
            target: target.name.clone(),
            what: "cold-start needs a command".into(),
        })?;
    ensure_not_listening(&target.name, endpoint).await?;
    let mut started = process::start(&target.name, words)?;
    let exec_at = started.exec_at;
    let deadline = exec_at + config.start_timeout;
    let mut attempts = 0u64;
    let mut listening: Option<Duration> = None;
    let mut last_error: Option<CallError> = None;
    let mut exited = None;
    let first_ok = loop {
        let now = Instant::now();
        if now >= deadline {
            break None;
        }
        attempts += 1;
        let attempt = async {
            let mut conn = endpoint.connect().await?;
            listening.get_or_insert_with(|| exec_at.elapsed());
            conn.call(endpoint.request(attempts)).await
        };
        let budget = ctx.timeout.min(deadline - now);
        match tokio::time::timeout(budget, attempt).await {
            Ok(Ok(())) => break Some(exec_at.elapsed()),
            Ok(Err(error)) => last_error = Some(error),
            Err(_) => last_error = Some(CallError::Timeout(budget)),
        }
        if let Some(status) = started.exited() {
            exited = Some(status);
            break None;
        }
        tokio::time::sleep(config.poll_interval).await;
    };
    let stopped = started.stop().await?;
    ctx.progress.inc(1);

    let mut round = Round::default();
    let mut class = ClassRound::new("first_ok");
    match first_ok {
        Some(took) => class.latencies.record(took),
        None => {
            class
                .errors
                .record(&last_error.unwrap_or(CallError::Timeout(config.start_timeout)));
            round.notes.push(match exited {
                Some(status) => format!("the command exited ({status}) before a 2xx response"),
                None => format!(
                    "no 2xx response within {} of the exec",
                    human(config.start_timeout)
                ),
            });
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    round.classes.push(class);
    round.metric(
        "exec_to_first_ok_ms",
        first_ok.map(ms),
        Unit::Ms,
        Better::Lower,
    );
    round.metric(
        "exec_to_listen_ms",
        listening.map(ms),
        Unit::Ms,
        Better::Lower,
    );
    round.metric(
        "attempts",
        Some(attempts as f64),
        Unit::Count,
        Better::Neither,
    );
    round.metric("stop_ms", Some(ms(stopped.took)), Unit::Ms, Better::Lower);
    round.metric(
        "killed",
        Some(if stopped.killed { 1.0 } else { 0.0 }),
        Unit::Flag,
        Better::Lower,
    );
    Ok(round)
}
