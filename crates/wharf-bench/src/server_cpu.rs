//! The CPU time of the processes that serve a target (`on_cpu`), so that `throughput` can
//! say what each call cost the server, not only how many calls it answered.
//!
//! On one machine the client, the gateway and its upstream share the cores: a gateway that
//! needs less CPU per call leaves more to the others, and its request rate moves by less
//! than the rounds spread. The CPU per call shows the difference a rate hides.
//!
//! It is read from `/proc/PID/stat` (user + system time): those counters keep the time of
//! the process's threads that have ended, which a sum over the live threads'
//! `/proc/PID/task/*/schedstat` loses (a server that retires idle threads would seem to
//! give CPU time back). They count in clock ticks (`_SC_CLK_TCK`, 100 per second here): over
//! a 2 s window of a busy server one tick is 0.5 %.

use std::time::Duration;

/// CPU time (user + system) used so far by the processes in `pids`, or why it cannot be
/// read (a process that is gone, no `/proc`).
pub(crate) fn on_cpu(pids: &[u32]) -> Result<Duration, String> {
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    let mut ticks: u64 = 0;
    for &pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("process {pid}: {e}"))?;
        let used = cpu_ticks(&stat)
            .ok_or_else(|| format!("process {pid}: unreadable /proc/{pid}/stat {stat:?}"))?;
        ticks = ticks.saturating_add(used);
    }
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// Whether a process with this id exists now.
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/stat")).is_file()
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces and parentheses itself, so fields are counted
/// after its last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name: utime is the 12th, stime the 13th.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0";
        assert_eq!(cpu_ticks(line), Some(325));
        assert_eq!(cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(cpu_ticks("no name"), None);
    }

    #[test]
    fn this_process_is_seen_busy_and_a_missing_one_is_an_error() {
        let me = std::process::id();
        assert!(exists(me));
        let before = on_cpu(&[me]).unwrap();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = on_cpu(&[me]).unwrap();
        // Counted in 10 ms ticks, and the spin may share its core with other tests: at
        // least half of it.
        assert!(
            after - before >= Duration::from_millis(50),
            "{before:?} {after:?}"
        );
        // Pids are at most 2^22 on Linux.
        let missing = 1 << 30;
        assert!(!exists(missing));
        let error = on_cpu(&[me, missing]).unwrap_err();
        assert!(error.contains(&missing.to_string()), "{error}");
    }
}
