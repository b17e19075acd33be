//! The CPU time of the processes that serve a target ([`on_cpu`]), so that `throughput` can
//! say what each call cost the server, not only how many calls it answered.
//!
//! On one machine the client, the gateway and its upstream share the cores: a gateway that
//! needs less CPU per call leaves more to the others, and its request rate moves by less
//! than the rounds spread. The CPU per call shows the difference a rate hides. It is read
//! from `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, per thread, kept by the
//! scheduler): finer than the clock ticks of `/proc/PID/stat`, and needing no privilege for
//! the caller's own processes. Threads that end between two readings take their time with
//! them; a server's threads live as long as it does.

use std::path::Path;
use std::time::Duration;

/// On-CPU time of every thread of every process in `pids` so far, or why it cannot be read
/// (a process that is gone, no `/proc`).
pub(crate) fn on_cpu(pids: &[u32]) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    for &pid in pids {
        total += process_on_cpu(Path::new(&format!("/proc/{pid}")))
            .map_err(|why| format!("process {pid}: {why}"))?;
    }
    Ok(total)
}

/// Whether a process with this id exists now.
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}/task")).is_dir()
}

/// The summed on-CPU time of the threads under `proc_dir/task`.
fn process_on_cpu(proc_dir: &Path) -> Result<Duration, String> {
    let tasks = std::fs::read_dir(proc_dir.join("task")).map_err(|e| e.to_string())?;
    let mut nanos: u64 = 0;
    for task in tasks.flatten() {
        // A thread that ended after the listing has no file any more: it counts as nothing.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            nanos = nanos.saturating_add(
                schedstat_nanos(&text).ok_or_else(|| format!("unreadable schedstat {text:?}"))?,
            );
        }
    }
    Ok(Duration::from_nanos(nanos))
}

/// The first field of a `schedstat` line: nanoseconds spent on a CPU.
fn schedstat_nanos(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines() {
        assert_eq!(schedstat_nanos("123456 789 12\n"), Some(123_456));
        assert_eq!(schedstat_nanos(""), None);
        assert_eq!(schedstat_nanos("x 1 2"), None);
    }

    #[test]
    fn this_process_is_seen_busy_and_a_missing_one_is_an_error() {
        let me = std::process::id();
        assert!(exists(me));
        let before = on_cpu(&[me]).unwrap();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = on_cpu(&[me]).unwrap();
        assert!(
            after - before >= Duration::from_millis(10),
            "{before:?} {after:?}"
        );
        // Pids are at most 2^22 on Linux.
        let missing = 1 << 30;
        assert!(!exists(missing));
        let error = on_cpu(&[me, missing]).unwrap_err();
        assert!(error.contains(&missing.to_string()), "{error}");
    }
}
