//! The client's own resources: how busy it was (`CpuClock`, [`ClientLoad`]) and how many
//! sockets it may open ([`raise_nofile_limit`]).
//!
//! The client must not be the bottleneck. Its CPU time (all threads of this process, from
//! `CLOCK_PROCESS_CPUTIME_ID`) over the wall time of a measurement, divided by the cores,
//! says how close it came to saturating the machine; the reports print it and warn above
//! [`SATURATED`]. When a server runs in the same process (the tests' testbed) its CPU time is
//! counted too. A `LoadMeter` also samples the busiest [`WINDOW`] of a measurement, since a
//! burst can saturate the client for a moment in a round that is idle on average.
//!
//! The client's share alone can look modest on a core that is full: pinned to one core beside
//! an upstream, the client may use half of it while the other half serves the upstream, and
//! then the figures measure that core, not the target. So the load also says how busy the
//! client's cores were with everything on them (`/proc/stat`, every process and interrupt),
//! and the reports warn above [`CORES_FULL`] when the client was pinned to some of the
//! machine's cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use rustix::thread::{sched_getaffinity, CpuSet};
use rustix::time::{clock_gettime, ClockId};
use serde::Serialize;

/// Share of all cores above which the client is said to be near saturation.
pub const SATURATED: f64 = 0.8;

/// Share of the client's cores' time, busy with anything, above which they are said to be full.
pub const CORES_FULL: f64 = 0.95;

/// The window over which the busiest moment of a measurement is found (`peak_busy`).
pub const WINDOW: Duration = Duration::from_millis(250);

/// A point in the process's CPU time and in wall time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    cpu: Duration,
    wall: Instant,
}

impl CpuClock {
    /// Now.
    pub(crate) fn now() -> CpuClock {
        CpuClock {
            cpu: process_cpu_time(),
            wall: Instant::now(),
        }
    }

    /// CPU and wall time spent since `self`.
    pub(crate) fn load(&self) -> ClientLoad {
        let cpu = process_cpu_time().saturating_sub(self.cpu);
        ClientLoad::new(cpu.as_secs_f64(), self.wall.elapsed().as_secs_f64())
    }
}

/// A point in the time of the CPUs this process may run on, busy (with anything) and in all,
/// in clock ticks of `/proc/stat`; `None` where that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CoreTicks {
    busy: u64,
    total: u64,
    /// The machine's CPUs (all `cpuN` lines), for whether the client was pinned to some.
    machine_cores: usize,
}

impl CoreTicks {
    /// Now, for the CPUs in this process's affinity mask.
    pub(crate) fn now() -> Option<CoreTicks> {
        let allowed = sched_getaffinity(None).ok()?;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        CoreTicks::parse(&stat, |cpu| cpu < CpuSet::MAX_CPU && allowed.is_set(cpu))
    }

    /// The sum over the `cpuN` lines of `stat` whose N is `allowed`. Busy is user, nice,
    /// system, irq, softirq and steal (a stolen tick was not the client's to use); idle and
    /// iowait are not. Guest time is already inside user.
    fn parse(stat: &str, allowed: impl Fn(usize) -> bool) -> Option<CoreTicks> {
        let mut sum = CoreTicks {
            busy: 0,
            total: 0,
            machine_cores: 0,
        };
        let mut counted = 0;
        for line in stat.lines() {
            let Some((name, fields)) = line.split_once(' ') else {
                continue;
            };
            // The machine-wide "cpu" line has no number and is skipped.
            let Some(cpu) = name
                .strip_prefix("cpu")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            sum.machine_cores += 1;
            if !allowed(cpu) {
                continue;
            }
            let ticks: Vec<u64> = fields
                .split_whitespace()
                .take(8)
                .map(|f| f.parse().ok())
                .collect::<Option<_>>()?;
            let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
                return None;
            };
            let busy = user + nice + system + irq + softirq + steal;
            sum.busy += busy;
            sum.total += busy + idle + iowait;
            counted += 1;
        }
        (counted > 0).then_some(sum)
    }

    /// The share of the time since `self` that the CPUs were busy, or `None` when no tick
    /// passed (or the counters went backwards).
    fn busy_since(&self, now: &CoreTicks) -> Option<f64> {
        let total = now.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let busy = now.busy.checked_sub(self.busy)?;
        Some(busy as f64 / total as f64)
    }
}

/// Measures the client's load over a measurement, and its busiest [`WINDOW`], with a task
/// that reads the CPU clock once a window.
#[derive(Debug)]
pub(crate) struct LoadMeter {
    start: CpuClock,
    cores: Option<CoreTicks>,
    /// The highest `busy` of a window so far, as `f64` bits.
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LoadMeter {
    /// Starts measuring now.
    pub(crate) fn start() -> LoadMeter {
        let peak = Arc::new(AtomicU64::new(0f64.to_bits()));
        let task = tokio::spawn({
            let peak = Arc::clone(&peak);
            async move {
                let mut window = CpuClock::now();
                loop {
                    tokio::time::sleep(WINDOW).await;
                    let busy = window.load().busy;
                    window = CpuClock::now();
                    let _ = peak.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                        (busy > f64::from_bits(old)).then_some(busy.to_bits())
                    });
                }
            }
        });
        LoadMeter {
            start: CpuClock::now(),
            cores: CoreTicks::now(),
            peak,
            task,
        }
    }

    /// Stops measuring: the load since [`LoadMeter::start`], with its busiest window (the
    /// whole measurement's when it was shorter than a window).
    pub(crate) fn finish(self) -> ClientLoad {
        self.task.abort();
        let mut load = self.start.load().with_cores(self.cores);
        load.peak_busy = f64::from_bits(self.peak.load(Ordering::Relaxed)).max(load.busy);
        load
    }
}

/// CPU time used by every thread of this process so far.
fn process_cpu_time() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The cores this process may use.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How busy the client (this process) was during a measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClientLoad {
    /// CPU time of all the process's threads, in seconds.
    pub cpu_seconds: f64,
    /// Wall time, in seconds.
    pub wall_seconds: f64,
    /// The cores available to the process.
    pub cores: usize,
    /// `cpu_seconds / (wall_seconds × cores)`: 1.0 means every core was busy all the time.
    pub busy: f64,
    /// `busy` of the busiest [`WINDOW`] (at least `busy`).
    pub peak_busy: f64,
    /// How busy the client's cores were with everything on them (the client, other
    /// processes, interrupts), as a share of their time; `None` where `/proc/stat` could
    /// not be read.
    pub cores_busy: Option<f64>,
    /// The machine's cores (0 where unknown): more than `cores` when the client was pinned.
    pub machine_cores: usize,
}

impl ClientLoad {
    /// The load of `cpu_seconds` spent over `wall_seconds` on this machine's cores.
    pub(crate) fn new(cpu_seconds: f64, wall_seconds: f64) -> ClientLoad {
        let cores = cores();
        let busy = if wall_seconds > 0.0 {
            cpu_seconds / (wall_seconds * cores as f64)
        } else {
            0.0
        };
        ClientLoad {
            cpu_seconds,
            wall_seconds,
            cores,
            busy,
            peak_busy: busy,
            cores_busy: None,
            machine_cores: 0,
        }
    }

    /// This load with how busy the client's cores were since `since` (taken when the
    /// measurement began).
    pub(crate) fn with_cores(mut self, since: Option<CoreTicks>) -> ClientLoad {
        if let (Some(start), Some(now)) = (since, CoreTicks::now()) {
            self.cores_busy = start.busy_since(&now);
            self.machine_cores = now.machine_cores;
        }
        self
    }

    /// Two measurements together (the busiest window of either; the cores' business
    /// weighted by each one's wall time).
    pub(crate) fn plus(&self, other: &ClientLoad) -> ClientLoad {
        let mut sum = ClientLoad::new(
            self.cpu_seconds + other.cpu_seconds,
            self.wall_seconds + other.wall_seconds,
        );
        sum.peak_busy = self.peak_busy.max(other.peak_busy).max(sum.busy);
        sum.cores_busy = match (self.cores_busy, other.cores_busy) {
            (Some(a), Some(b)) if sum.wall_seconds > 0.0 => {
                Some((a * self.wall_seconds + b * other.wall_seconds) / sum.wall_seconds)
            }
            (a, b) => a.or(b),
        };
        sum.machine_cores = self.machine_cores.max(other.machine_cores);
        sum
    }

    /// Whether the client ran on some of the machine's cores only (`taskset`), and those
    /// were full ([`CORES_FULL`]) with the client and whatever shared them.
    pub fn pinned_cores_full(&self) -> bool {
        self.cores < self.machine_cores && self.cores_busy.is_some_and(|b| b >= CORES_FULL)
    }

    /// Whether the client came near saturating the machine on average ([`SATURATED`]).
    pub fn saturated(&self) -> bool {
        self.busy >= SATURATED
    }

    /// E.g. `"12% of 2 cores on average, 85% at the busiest 250ms; the cores 97% busy
    /// with everything on them"`.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "{:.0}% of {} cores on average, {:.0}% at the busiest {}ms",
            self.busy * 100.0,
            self.cores,
            self.peak_busy * 100.0,
            WINDOW.as_millis()
        );
        if let Some(cores_busy) = self.cores_busy {
            text.push_str(&format!(
                "; the cores {:.0}% busy with everything on them",
                cores_busy * 100.0
            ));
        }
        text
    }
}

/// Raises this process's soft limit on open files to its hard limit, so thousands of
/// simultaneous connections can be opened, and returns the soft limit now in force (`None`:
/// unlimited).
///
/// Failure to raise it is not an error: calls that run out of descriptors are counted as
/// connect errors, and the scenarios note when they need more than the limit.
pub fn raise_nofile_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_clock_counts_busy_time() {
        let start = CpuClock::now();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let load = start.load();
        assert!(load.cpu_seconds > 0.02, "{load:?}");
        assert_eq!(load.peak_busy, load.busy);
        assert!(load.busy > 0.0 && load.busy <= 1.01, "{load:?}");
        assert!(load.describe().contains("cores"));
    }

    #[tokio::test]
    async fn load_meter_reports_a_peak() {
        let meter = LoadMeter::start();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let load = meter.finish();
        assert!(load.peak_busy >= load.busy, "{load:?}");
        assert!(load.wall_seconds >= 0.03, "{load:?}");
    }

    const STAT: &str = "cpu  300 0 100 1000 0 0 0 0 0 0
cpu0 200 0 50 400 10 5 5 0 0 0
cpu1 100 0 50 600 0 0 0 30 0 0
intr 12345
";

    #[test]
    fn core_ticks_sum_the_allowed_cpus_only() {
        let both = CoreTicks::parse(STAT, |_| true);
        assert_eq!(
            both,
            Some(CoreTicks {
                busy: 260 + 180,
                total: 670 + 780,
                machine_cores: 2
            })
        );
        let first = CoreTicks::parse(STAT, |cpu| cpu == 0);
        assert_eq!(
            first,
            Some(CoreTicks {
                busy: 260,
                total: 670,
                machine_cores: 2
            })
        );
        assert_eq!(CoreTicks::parse(STAT, |cpu| cpu == 7), None);
        assert_eq!(CoreTicks::parse("cpu0 1 2 x\n", |_| true), None);
    }

    #[test]
    fn cores_busy_is_the_busy_share_of_the_ticks_between_two_readings() {
        let before = CoreTicks::parse(STAT, |cpu| cpu == 0);
        let later = "cpu0 280 0 60 410 10 5 5 0 0 0\ncpu1 100 0 50 700 0 0 0 30 0 0\n";
        let after = CoreTicks::parse(later, |cpu| cpu == 0);
        let (Some(before), Some(after)) = (before, after) else {
            panic!("unparsed: {before:?} {after:?}");
        };
        // 90 busy ticks of 100 on CPU 0; CPU 1 is not the client's.
        assert_eq!(before.busy_since(&after), Some(0.9));
        assert_eq!(after.busy_since(&after), None, "no tick passed");
    }

    #[test]
    fn a_pinned_client_on_full_cores_is_told_apart_from_a_shared_one() {
        let mut load = ClientLoad::new(0.5, 1.0);
        load.cores = 1;
        load.machine_cores = 2;
        load.cores_busy = Some(0.99);
        assert!(load.pinned_cores_full());
        assert!(
            load.describe().contains("99% busy with everything"),
            "{}",
            load.describe()
        );
        let mut other = load;
        other.wall_seconds = 3.0;
        other.cores_busy = Some(0.5);
        let both = load.plus(&other);
        assert_eq!(both.cores_busy, Some((0.99 + 1.5) / 4.0));
        assert!(!both.pinned_cores_full());
        load.machine_cores = 1;
        assert!(
            !load.pinned_cores_full(),
            "not pinned: the client had every core"
        );
    }

    #[test]
    fn nofile_limit_is_at_least_the_default() {
        let limit = raise_nofile_limit();
        assert!(limit.is_none_or(|l| l >= 256), "{limit:?}");
    }
}
