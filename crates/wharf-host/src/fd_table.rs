//! The process's descriptor table, sized once at start.
//!
//! The kernel keeps a process's open files in a table that it doubles when a new descriptor
//! does not fit (64, 128, … entries). In a process with more than one thread, each doubling
//! waits for an RCU grace period (`synchronize_rcu` in the kernel's `expand_fdtable`), and
//! every thread that opens a descriptor meanwhile (accept, socket) waits with it: 15 ms
//! measured here for the `socket()` that took descriptor 2,050. A fresh wharf paid that each
//! time its connections first reached a new size: in bench/compare.sh's responsiveness
//! scenario (1,000 slow calls, then 100 fast ones), the first round's fast p99 was 33-45 ms
//! and the later rounds' 9-14 ms; a fresh process's table holds 256, so a first burst of
//! 2,000 connections (and their upstream ones) meets four doublings on the way to 4,096.
//! Sized while the process still has one thread, growing is a copy with no wait, and the
//! table never shrinks.
//!
//! The table is kernel memory (about 8 bytes an entry, not the process's RSS), so it is sized
//! for at most [`PRESIZE_CAP`] descriptors; beyond that it grows on demand as before.

use std::fs::File;
use std::io;

use rustix::io::fcntl_dupfd_cloexec;

use crate::fd_budget::raise_nofile_limit;

/// The most descriptors the table is sized for at start: 512 KiB of kernel memory, room for
/// ~32,000 proxied calls.
pub const PRESIZE_CAP: u64 = 65_536;

/// Raises the soft open-files limit to the hard one (as the host does when it binds) and sizes
/// the descriptor table for that many descriptors, at most [`PRESIZE_CAP`]. Call it first in
/// `main`, before any thread starts (the runtime's workers). Returns how many descriptors the
/// table now holds at least; an error leaves the table to grow on demand.
pub fn presize_fd_table() -> io::Result<u64> {
    let size = raise_nofile_limit().unwrap_or(PRESIZE_CAP).min(PRESIZE_CAP);
    let Some(highest) = size.checked_sub(1) else {
        return Ok(0);
    };
    let highest = i32::try_from(highest).unwrap_or(i32::MAX);
    // The lowest free descriptor at or above `highest` is `highest` itself (nothing is open
    // that high this early): taking it sizes the table, closing it keeps the size.
    let anchor = File::open("/dev/null")?;
    let duplicate = fcntl_dupfd_cloexec(&anchor, highest)?;
    drop(duplicate);
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FDSize` in /proc/self/status: the descriptor table's size.
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_table_holds_the_open_files_limit_up_to_the_cap() {
        let sized = presize_fd_table().unwrap();
        let limit = raise_nofile_limit().unwrap_or(PRESIZE_CAP);
        assert_eq!(sized, limit.min(PRESIZE_CAP));
        assert!(
            table_size() >= sized,
            "FDSize {} after sizing for {sized}",
            table_size()
        );
        // Nothing is left open at the top.
        let anchor = File::open("/dev/null").unwrap();
        let probe = fcntl_dupfd_cloexec(&anchor, i32::try_from(sized - 1).unwrap()).unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(
            i64::from(probe.as_raw_fd()),
            i64::try_from(sized - 1).unwrap()
        );
    }
}
