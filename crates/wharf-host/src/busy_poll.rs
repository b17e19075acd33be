//! Busy polling before a core sleeps (`server.busy_poll_us`): a core that runs out of work
//! keeps checking its sockets, without blocking, for up to the configured time before it
//! sleeps in `epoll_wait`, so a request that arrives within that time finds the core
//! running.
//!
//! Why: waking a sleeping core costs whoever wakes it. The kernel sends the sleeping CPU an
//! interrupt from the waker's CPU, and in a virtual machine that interrupt, and the halted
//! CPU's return, go through the hypervisor. Issue 4's pinned pass-through lab counted one
//! such interrupt per call on wharf's CPU (`irq_vectors:call_function_single_entry`,
//! 1.00-1.30 per call at 100 KiB in two counts; nginx, whose core never ran out of work,
//! 0.04-0.05; with a 50 µs window 0.015), paid by the CPU where the
//! client and the origin run. HAProxy has the same trade as its `busy-polling` option. It
//! costs CPU: a core spins for the whole window after every burst of work, also when no
//! request follows, so it is off by default and meant for cores the gateway has to itself.
//!
//! How, on tokio's one-thread runtime: the runtime calls its park hook when its run queue
//! is empty, then sleeps unless the hook made work. Within the window the hook wakes an
//! idle task of the core's own ([`spin`]); the runtime then polls its I/O and timers with a
//! zero timeout instead of sleeping, runs that task (which does nothing) and whatever the
//! poll woke, and calls the hook again. The window counts from when the core last ran out
//! of work: a session's task notes each of its turns ([`worked`]), and the hook restarts
//! the window when it sees a new one. (Tasks other than sessions, such as cache fills, do
//! not restart it; a session follows them when their work reaches a client.)

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// The busy-poll state of the core thread the hook runs on.
struct Spinning {
    /// The idle task's waker, once it has run.
    idle_task: RefCell<Option<Waker>>,
    /// Turns of session tasks on this thread ([`worked`]), wrapping.
    turns: Cell<u64>,
    /// `turns` when the hook last saw them change...
    turns_seen: Cell<u64>,
    /// ...and when that was: when the core last ran out of work.
    idle_since: Cell<Option<Instant>>,
}

thread_local! {
    static SPINNING: Spinning = const {
        Spinning {
            idle_task: RefCell::new(None),
            turns: Cell::new(0),
            turns_seen: Cell::new(0),
            idle_since: Cell::new(None),
        }
    };
}

/// Notes that a session's task ran on this thread: the core had work. One add to a
/// thread-local counter, also on threads that never busy-poll.
pub(crate) fn worked() {
    SPINNING.with(|state| state.turns.set(state.turns.get().wrapping_add(1)));
}

/// The runtime's park hook for a window of `window`: keeps the core polling instead of
/// sleeping until it has found no work for that long. Runs on the core's thread, when its
/// run queue is empty.
pub(crate) fn before_park(window: Duration) {
    let now = Instant::now();
    SPINNING.with(|state| {
        let turns = state.turns.get();
        let idle_since = match state.idle_since.get() {
            Some(since) if turns == state.turns_seen.get() => since,
            _ => now,
        };
        state.turns_seen.set(turns);
        state.idle_since.set(Some(idle_since));
        if now.saturating_duration_since(idle_since) < window {
            if let Some(waker) = state.idle_task.borrow().as_ref() {
                waker.wake_by_ref();
            }
        }
    });
}

/// The core's idle task: woken by [`before_park`] to keep the runtime from sleeping, it
/// does nothing. Spawn it once on the core's runtime; it never ends.
pub(crate) async fn spin() {
    poll_fn(|cx| {
        SPINNING.with(|state| {
            let mut idle_task = state.idle_task.borrow_mut();
            if !idle_task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *idle_task = Some(cx.waker().clone());
            }
        });
        Poll::<()>::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A one-thread runtime as a core's, with the hook for `window` (none for zero), and a
    /// count of its turns through the park (slept or polled with a zero timeout).
    fn runtime(window: Duration) -> (tokio::runtime::Runtime, Arc<AtomicU64>) {
        let parks = Arc::new(AtomicU64::new(0));
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_all();
        if !window.is_zero() {
            builder.on_thread_park(move || before_park(window));
        }
        let counter = parks.clone();
        let runtime = builder
            .on_thread_unpark(move || {
                counter.fetch_add(1, Ordering::Relaxed);
            })
            .build()
            .unwrap();
        (runtime, parks)
    }

    /// The turns through the park while a core with a `window` has no work for `idle`,
    /// after one session turn; with `turn_every`, a session turn that often (work).
    fn parks(window: Duration, idle: Duration, turn_every: Option<Duration>) -> u64 {
        let (runtime, parks) = runtime(window);
        runtime.block_on(async {
            tokio::spawn(spin());
            tokio::task::yield_now().await;
            worked();
            let start = parks.load(Ordering::Relaxed);
            match turn_every {
                None => tokio::time::sleep(idle).await,
                Some(every) => {
                    let end = Instant::now() + idle;
                    while Instant::now() < end {
                        tokio::time::sleep(every).await;
                        worked();
                    }
                }
            }
            parks.load(Ordering::Relaxed) - start
        })
    }

    #[test]
    fn a_core_with_no_work_polls_within_the_window_then_sleeps() {
        // Without the hook the runtime parks about once for the sleep (a timer wakes it).
        let sleeping = parks(Duration::ZERO, Duration::from_millis(50), None);
        assert!(sleeping <= 3, "{sleeping} parks without busy polling");
        // With a 5 ms window it turns through zero-timeout polls for 5 ms (thousands of
        // turns), then sleeps until the timer.
        let polling = parks(Duration::from_millis(5), Duration::from_millis(50), None);
        assert!(
            polling > 100,
            "{polling} parks: the core slept instead of polling"
        );
        // The window ends: over 300 ms idle there are no more turns than over 50 ms plus
        // noise (a core spinning for the whole 300 ms would make about 6 times as many).
        let long = parks(Duration::from_millis(5), Duration::from_millis(300), None);
        assert!(
            long < polling * 3,
            "{long} parks over 300 ms against {polling} over 50 ms: the core kept spinning"
        );
    }

    #[test]
    fn session_turns_restart_the_window() {
        // Work every 2 ms keeps a 5 ms window open for the whole 100 ms; the same 5 ms
        // window with no work closes after 5 ms.
        let idle = parks(Duration::from_millis(5), Duration::from_millis(100), None);
        let working = parks(
            Duration::from_millis(5),
            Duration::from_millis(100),
            Some(Duration::from_millis(2)),
        );
        assert!(
            working > idle * 5,
            "{working} parks with work every 2 ms against {idle} without: the window did not restart"
        );
    }

    #[test]
    fn a_busy_polling_core_still_serves_io_and_timers() {
        let (runtime, _parks) = runtime(Duration::from_millis(20));
        runtime.block_on(async {
            tokio::spawn(spin());
            worked();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut stream = std::net::TcpStream::connect(address).unwrap();
                stream.write_all(b"ping").unwrap();
                let mut reply = [0; 4];
                stream.read_exact(&mut reply).unwrap();
                reply
            });
            let (mut stream, _) = listener.accept().await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut request = [0; 4];
            stream.read_exact(&mut request).await.unwrap();
            assert_eq!(&request, b"ping");
            stream.write_all(b"pong").await.unwrap();
            // A timer due inside and one due after the window.
            for wait in [Duration::from_millis(5), Duration::from_millis(40)] {
                let started = Instant::now();
                tokio::time::sleep(wait).await;
                assert!(started.elapsed() >= wait);
            }
            let reply = tokio::task::spawn_blocking(move || client.join().unwrap())
                .await
                .unwrap();
            assert_eq!(&reply, b"pong");
        });
    }
}
