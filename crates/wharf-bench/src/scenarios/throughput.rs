//! `throughput`: a closed loop at fixed concurrency on keep-alive connections.
//!
//! `concurrency` workers each keep one connection and send the next request as soon as the
//! previous response has been read. Nothing is recorded during `warmup`; then, for
//! `duration`, every call that finishes counts: requests/s are successful calls per second
//! of that window, latencies are theirs, errors are counted. A connection that breaks is
//! reopened (the reconnect is part of the next call's latency); after a connect error a worker
//! pauses `RETRY_PAUSE` so a dead target is not hammered. Calls still in flight when the
//! window closes are abandoned. Each worker keeps its own histogram; they are merged at the
//! end, so workers share nothing while measuring.
//!
//! The workers run on client threads of their own, one per CPU the client may use (at most one
//! per worker), each a one-thread runtime that owns its share of the connections, as wrk's
//! threads do: a connection's calls stay on the thread that opened it. (On the work-stealing
//! runtime a connection's task moved between the client's threads, so each client thread
//! drove connections of every core of a gateway that keeps a connection on one core, and one
//! core preempted behind a busy client thread waited a whole scheduler tick: issue 4's
//! shared cache-hit tail, bench/RESULTS.md stop 27.)
//!
//! With the target's server processes known (`Target::server_pids`), their CPU time over
//! the window is reported too: `server_cpu_us_per_call` (per successful call) and
//! `server_cores` (cores kept busy on average).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{keep_alive_call, CallError, Endpoint};
use crate::limits;
use crate::progress::{ticks, Progress};
use crate::report::{Better, Setting, Unit};
use crate::scenarios::{human, setting, ClassRound, Ctx, Prepared, Round};
use crate::server_cpu;
use crate::stats::ErrorCounts;
use crate::BenchError;

/// Pause of a worker after a connect error.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Settings of `throughput`.
#[derive(Debug, Clone)]
pub struct ThroughputConfig {
    /// Workers, each with one keep-alive connection and one call at a time (default 64; 1
    /// to 10,000, [`limits::CONCURRENCY`]).
    pub concurrency: u32,
    /// The measured window (default 10 s).
    pub duration: Duration,
    /// Load before the window, not recorded (default 2 s).
    pub warmup: Duration,
}

impl Default for ThroughputConfig {
    fn default() -> Self {
        ThroughputConfig {
            concurrency: 64,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
        }
    }
}

impl ThroughputConfig {
    pub(crate) fn settings(&self) -> Vec<Setting> {
        vec![
            setting("concurrency", self.concurrency),
            setting("duration", human(self.duration)),
            setting("warmup", human(self.warmup)),
        ]
    }

    pub(crate) fn units(&self) -> u64 {
        ticks(self.warmup + self.duration)
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if self.concurrency == 0 || self.duration.is_zero() {
            return Err(BenchError::Settings(
                "throughput needs a concurrency and a duration above zero".into(),
            ));
        }
        limits::CONCURRENCY.check("--concurrency", self.concurrency)
    }
}

/// What one worker measured.
struct Worker {
    class: ClassRound,
    warmup_errors: ErrorCounts,
}

/// One worker's loop until `end`; calls finishing before `measure_from` are not recorded.
async fn worker(
    endpoint: Arc<Endpoint>,
    first_n: u64,
    timeout: Duration,
    measure_from: Instant,
    end: Instant,
) -> Worker {
    let mut out = Worker {
        class: ClassRound::new("requests"),
        warmup_errors: ErrorCounts::default(),
    };
    let mut conn = None;
    let mut n = first_n;
    let deadline = tokio::time::Instant::from_std(end);
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let result = tokio::select! {
            result = keep_alive_call(&mut conn, &endpoint, endpoint.request(n), timeout) => result,
            () = tokio::time::sleep_until(deadline) => break,
        };
        n += 1;
        let finished = Instant::now();
        if finished >= measure_from {
            out.class.record(finished - started, &result);
        } else if let Err(error) = &result {
            out.warmup_errors.record(error);
        }
        if let Err(CallError::Connect { .. }) = result {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
    out
}

/// How many client threads carry `concurrency` workers: one per CPU this process may run on
/// (its affinity: under `taskset -c 0`, one), and no more than there are workers.
fn client_threads(concurrency: u32) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    cpus.min(concurrency as usize).max(1)
}

/// The first call number of each worker, dealt out to `threads` client threads: worker *i*
/// (first number *i* × 2^40, far apart for `{n}` templates) runs on thread *i* mod
/// `threads`, so the threads' shares differ by one at most.
fn deal(concurrency: u32, threads: usize) -> Vec<Vec<u64>> {
    let stride = 1u64 << 40;
    let threads = threads.max(1);
    let mut dealt = vec![Vec::new(); threads];
    for (i, share) in (0..u64::from(concurrency)).zip((0..threads).cycle()) {
        dealt[share].push(i * stride);
    }
    dealt
}

/// One client thread: its workers (one per first call number) as tasks of a one-thread
/// runtime, until `end`. A worker that panicked is `None` (its calls are counted lost).
fn client_thread(
    endpoint: Arc<Endpoint>,
    first_numbers: Vec<u64>,
    timeout: Duration,
    measure_from: Instant,
    end: Instant,
) -> Result<Vec<Option<Worker>>, BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::ClientThreads)?;
    Ok(runtime.block_on(async move {
        let tasks: Vec<_> = first_numbers
            .into_iter()
            .map(|first_n| {
                tokio::spawn(worker(
                    Arc::clone(&endpoint),
                    first_n,
                    timeout,
                    measure_from,
                    end,
                ))
            })
            .collect();
        let mut workers = Vec::with_capacity(tasks.len());
        for task in tasks {
            workers.push(task.await.ok());
        }
        workers
    }))
}

/// One round: warm-up, then the measured window.
pub(crate) async fn round(
    config: &ThroughputConfig,
    target: &Prepared,
    ctx: &Ctx,
) -> Result<Round, BenchError> {
    let start = Instant::now();
    let measure_from = start + config.warmup;
    let end = measure_from + config.duration;
    let dealt = deal(config.concurrency, client_threads(config.concurrency));
    let mut finished = Vec::with_capacity(dealt.len());
    for (thread, first_numbers) in dealt.into_iter().enumerate() {
        let worker_count = first_numbers.len();
        let endpoint = Arc::clone(&target.main);
        let timeout = ctx.timeout;
        let (done, finishing) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("bench-client-{thread}"))
            .spawn(move || {
                let workers = client_thread(endpoint, first_numbers, timeout, measure_from, end);
                // The receiver is gone only if the round was abandoned.
                let _ = done.send(workers);
            })
            .map_err(BenchError::ClientThreads)?;
        finished.push((finishing, worker_count));
    }
    let progress: &Progress = &ctx.progress;
    let mut server_cpu = None;
    if !target.server_pids.is_empty() {
        progress
            .sleep(measure_from.saturating_duration_since(Instant::now()))
            .await;
        server_cpu = Some((server_cpu::on_cpu(&target.server_pids), Instant::now()));
    }
    progress
        .sleep(end.saturating_duration_since(Instant::now()))
        .await;
    // Read as the window closes, before the workers' last calls are awaited.
    let server_cpu = server_cpu.map(|(before, since)| {
        let after = server_cpu::on_cpu(&target.server_pids);
        let wall = since.elapsed();
        match (before, after) {
            (Ok(before), Ok(after)) => Ok((after.saturating_sub(before), wall)),
            (Err(why), _) | (_, Err(why)) => Err(why),
        }
    });
    let mut class = ClassRound::new("requests");
    let mut warmup_errors = ErrorCounts::default();
    for (thread, worker_count) in finished {
        // A thread that ended without its workers' results panicked: their calls are lost.
        let workers = thread
            .await
            .unwrap_or_else(|_| Ok((0..worker_count).map(|_| None).collect()))?;
        for w in workers {
            match w {
                Some(w) => {
                    class.latencies.merge(&w.class.latencies);
                    class.errors.add(&w.class.errors);
                    warmup_errors.add(&w.warmup_errors);
                }
                None => class.errors.record(&CallError::Lost),
            }
        }
    }
    let mut round = Round::default();
    let rps = class.latencies.len() as f64 / config.duration.as_secs_f64();
    if warmup_errors.total > 0 {
        round.notes.push(format!(
            "{} calls failed during the warm-up (not counted), first: {}",
            warmup_errors.total,
            warmup_errors.first.as_deref().unwrap_or("?")
        ));
    }
    let errors = class.errors.total as f64;
    let calls = class.latencies.len();
    round.classes.push(class);
    round.metric("requests_per_s", Some(rps), Unit::PerSecond, Better::Higher);
    round.metric("errors", Some(errors), Unit::Count, Better::Lower);
    if let Some(server_cpu) = server_cpu {
        let (per_call, cores) = match server_cpu {
            Ok((cpu, wall)) => (
                (calls > 0).then(|| cpu.as_secs_f64() * 1e6 / calls as f64),
                (!wall.is_zero()).then(|| cpu.as_secs_f64() / wall.as_secs_f64()),
            ),
            Err(why) => {
                round
                    .notes
                    .push(format!("the server's CPU time could not be read: {why}"));
                (None, None)
            }
        };
        round.metric("server_cpu_us_per_call", per_call, Unit::Us, Better::Lower);
        round.metric("server_cores", cores, Unit::Ratio, Better::Lower);
    }
    Ok(round)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_dealt_out_evenly_with_distinct_numbers() {
        let dealt = deal(5, 2);
        let stride = 1u64 << 40;
        assert_eq!(
            dealt,
            vec![vec![0, 2 * stride, 4 * stride], vec![stride, 3 * stride]]
        );
        let dealt = deal(64, 3);
        let sizes: Vec<usize> = dealt.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![22, 21, 21]);
        let mut all: Vec<u64> = dealt.into_iter().flatten().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 64);
        // No thread count is never a division by zero: one thread takes all.
        assert_eq!(deal(3, 0), vec![vec![0, stride, 2 * stride]]);
    }

    #[test]
    fn client_threads_never_outnumber_workers() {
        assert_eq!(client_threads(1), 1);
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(client_threads(1000), cpus.min(1000));
    }
}
