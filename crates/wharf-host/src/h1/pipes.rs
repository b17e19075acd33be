//! Pipes for splicing a response body from one socket to another (`splice(2)`: the kernel
//! moves the bytes' pages socket → pipe → socket; nothing is copied through user space).
//!
//! A pipe is two descriptors, so they are bounded: at most [`MAX_PIPES`] exist in the
//! process ([`SPLICE_PIPE_FDS`] is kept out of the session budget), and a message that
//! finds none writes its body as frames instead. A pipe that is empty when its message
//! ends is kept for the thread's next one (up to [`KEPT_PER_THREAD`]); one that still holds
//! bytes (the client went away mid-body) is closed with them.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pipes open at most in the process, kept ones included.
pub(crate) const MAX_PIPES: usize = 64;
/// Descriptors the pipes may hold (two each), kept out of the session budget.
pub(crate) const SPLICE_PIPE_FDS: u64 = 2 * MAX_PIPES as u64;
/// Empty pipes a thread keeps for its next spliced body.
const KEPT_PER_THREAD: usize = 16;
/// The bytes a pipe holds (the kernel's default: 16 pages).
pub(crate) const PIPE_BYTES: usize = 64 * 1024;

/// Pipes open now; changes only when a pipe is made or closed, not per message.
static OPEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept(Vec::new())) };
}

/// A pipe's read and write ends.
struct Ends {
    read: OwnedFd,
    write: OwnedFd,
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
        Ok((read, write)) => Some(Ends { read, write }),
        Err(error) => {
            OPEN.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(error = %error, "cannot make a pipe; writing the body as frames");
            None
        }
    }
}
