//! Pipes for splicing a response body from one socket to another (`splice(2)`: the kernel
//! moves the bytes' pages socket → pipe → socket; nothing is copied through user space).
//!
//! Each pipe is made to hold [`PIPE_BYTES`], four times the kernel's default, so that a
//! body of up to that size crosses in one step each way. A pipe is two descriptors, so they
//! are bounded: at most [`MAX_PIPES`] exist in the process ([`SPLICE_PIPE_FDS`] is kept out
//! of the session budget), and a message that finds none writes its body as frames instead.
//! A pipe that is empty when its message ends is kept for the thread's next one (up to
//! [`KEPT_PER_THREAD`]); one that still holds bytes (the client went away mid-body) is
//! closed with them.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pipes open at most in the process, kept ones included.
pub(crate) const MAX_PIPES: usize = 64;
/// Descriptors the pipes may hold (two each), kept out of the session budget.
pub(crate) const SPLICE_PIPE_FDS: u64 = 2 * MAX_PIPES as u64;
/// Empty pipes a thread keeps for its next spliced body.
const KEPT_PER_THREAD: usize = 16;
/// The bytes a pipe is made to hold (`F_SETPIPE_SZ`; the kernel's default is 16 pages, 64
/// KiB), so that a body of up to this size goes socket → pipe → socket in one step each way;
/// through 64 KiB pipes a 100 KiB body took two of each. Pinned to one core beside the
/// testbed, 100 KiB pass-through, eight interleaved rounds, wharf's CPU per call fell from
/// 77.8 to 62.0 µs and its rate rose ×1.17 with 256 KiB pipes (128 KiB and 1 MiB did about
/// as well); shared, 67.2 to 58.5 µs, ×1.07 (bench/RESULTS.md, stop 47). At most
/// [`MAX_PIPES`] × this much (16 MiB) of kernel memory is ever in flight in pipes, and only
/// while bodies are. A pipe the kernel does not enlarge (a user over
/// `/proc/sys/fs/pipe-user-pages-soft`) keeps its size and still works: each step moves
/// what it can hold.
pub(crate) const PIPE_BYTES: usize = 256 * 1024;
/// What a pipe holds when it could not be asked for its size: the kernel's default.
const DEFAULT_PIPE_BYTES: usize = 64 * 1024;

/// Pipes open now; changes only when a pipe is made or closed, not per message.
static OPEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept(Vec::new())) };
}

/// A pipe's read and write ends, and the bytes it holds at most.
struct Ends {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

/// A pipe in use by one message, and how many bytes it holds.
pub(crate) struct Pipe {
    ends: Option<Ends>,
    /// Bytes put in and not taken out yet.
    pub(crate) held: usize,
}

impl Pipe {
    /// A kept pipe of this thread, else a new one if fewer than [`MAX_PIPES`] are open;
    /// `None` when none can be had (the caller writes frames instead).
    pub(crate) fn take() -> Option<Pipe> {
        let kept = KEPT.with(|kept| kept.borrow_mut().0.pop());
        let ends = match kept {
            Some(ends) => ends,
            None => make()?,
        };
        Some(Pipe {
            ends: Some(ends),
            held: 0,
        })
    }

    /// The end bytes are spliced into.
    pub(crate) fn write_end(&self) -> Option<BorrowedFd<'_>> {
        self.ends.as_ref().map(|ends| ends.write.as_fd())
    }

    /// The end bytes are spliced out of.
    pub(crate) fn read_end(&self) -> Option<BorrowedFd<'_>> {
        self.ends.as_ref().map(|ends| ends.read.as_fd())
    }

    /// The bytes this pipe holds at most: [`PIPE_BYTES`], or less when the kernel refused
    /// to enlarge it.
    pub(crate) fn capacity(&self) -> usize {
        self.ends
            .as_ref()
            .map_or(DEFAULT_PIPE_BYTES, |ends| ends.capacity)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let Some(ends) = self.ends.take() else {
            return;
        };
        let mut ends = Some(ends);
        if self.held == 0 {
            // Not kept when the thread is ending (its stock is gone): closed below.
            let _ = KEPT.try_with(|kept| {
                if let Some(taken) = ends.take() {
                    ends = kept.borrow_mut().keep(taken);
                }
            });
        }
        if let Some(ends) = ends {
            drop(ends);
            OPEN.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A thread's kept pipes; closed and counted off when the thread ends.
struct Kept(Vec<Ends>);

impl Kept {
    /// Keeps `ends` if there is room; gives them back otherwise.
    fn keep(&mut self, ends: Ends) -> Option<Ends> {
        if self.0.len() < KEPT_PER_THREAD {
            self.0.push(ends);
            return None;
        }
        Some(ends)
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        OPEN.fetch_sub(self.0.len(), Ordering::Relaxed);
    }
}

/// A new non-blocking pipe, counted, if the bound allows.
fn make() -> Option<Ends> {
    if OPEN.fetch_add(1, Ordering::Relaxed) >= MAX_PIPES {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    match rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::NONBLOCK | rustix::pipe::PipeFlags::CLOEXEC,
    ) {
        Ok((read, write)) => {
            let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_BYTES)
                .or_else(|error| {
                    tracing::debug!(error = %error, "cannot enlarge a pipe; it keeps its size");
                    rustix::pipe::fcntl_getpipe_size(&write)
                })
                .unwrap_or(DEFAULT_PIPE_BYTES);
            Some(Ends {
                read,
                write,
                capacity,
            })
        }
        Err(error) => {
            OPEN.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(error = %error, "cannot make a pipe; writing the body as frames");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_is_made_to_hold_a_100_kib_body_whole() {
        let pipe = Pipe::take().expect("fewer than MAX_PIPES pipes are open in the tests");
        let write_end = pipe.write_end().expect("a pipe in use has its ends");
        let size = rustix::pipe::fcntl_getpipe_size(write_end).expect("a pipe has a size");
        assert_eq!(size, PIPE_BYTES, "the kernel's size for a new pipe");
        assert_eq!(pipe.capacity(), size, "the size the message splices by");
        assert!(size >= 100 * 1024, "{size} bytes hold a 100 KiB body");
    }
}
