//! One client connection (a "session"): its activity clock and the
//! watchdog that enforces `header_read_timeout` and `idle_timeout`.
//!
//! hyper's own header timer also runs while a keep-alive connection is
//! idle, which would cap `idle_timeout` at `header_read_timeout`; so the
//! host tracks both itself. The head timer runs from accept (or from the
//! first byte of a later request) until the request is dispatched: a
//! slowloris connection is dropped when it expires. The idle timer runs
//! while no call is in flight and no request has started: the connection
//! is then closed gracefully. A call whose response cannot be written (the
//! client stopped reading) for `idle_timeout` has its connection cut. Only
//! reads that start a request, writes that block, and the end of a call
//! read the clock.
//!
//! Everything that moves a deadline happens in the connection's own task
//! (reads, writes, the end of a response body), so the watchdog, polled in
//! that task too, needs no notification: it sees a new `generation` after
//! polling the connection and moves its timer if a deadline came closer.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Marks "no request head is being read".
const NO_HEAD: u64 = u64::MAX;

/// The clocks of one connection, in milliseconds since it opened.
#[derive(Debug)]
pub(crate) struct SessionClock {
    opened: Instant,
    last_activity_ms: AtomicU64,
    head_started_ms: AtomicU64,
    calls_in_flight: AtomicUsize,
    /// Since when a write has been blocked (socket buffer full because the
    /// client does not read); `NO_HEAD` when writes make progress.
    write_blocked_ms: AtomicU64,
    /// Bumped whenever a deadline may have moved (a call ended, a request
    /// head started, a write blocked).
    generation: AtomicU64,
}

impl SessionClock {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            // The first request's head is due from accept on.
            head_started_ms: AtomicU64::new(0),
            calls_in_flight: AtomicUsize::new(0),
            write_blocked_ms: AtomicU64::new(NO_HEAD),
            generation: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    fn instant_at(&self, ms: u64) -> Instant {
        self.opened + Duration::from_millis(ms)
    }

    /// Bytes arrived. Only the first bytes of a new request (no call in
    /// flight, no head timer running) read the clock: reads are hot.
    fn bytes_read(&self) {
        if self.calls_in_flight.load(Ordering::Acquire) != 0
            || self.head_started_ms.load(Ordering::Acquire) != NO_HEAD
        {
            return;
        }
        let started = self.head_started_ms.compare_exchange(
            NO_HEAD,
            self.now_ms(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        if started.is_ok() {
            self.bump();
        }
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes whenever a deadline may have moved.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// A write could not proceed: start the stall timer (the clock is read
    /// only on this transition, not per write).
    fn write_blocked(&self) {
        if self.write_blocked_ms.load(Ordering::Relaxed) != NO_HEAD {
            return;
        }
        let blocked = self.write_blocked_ms.compare_exchange(
            NO_HEAD,
            self.now_ms(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        if blocked.is_ok() {
            self.bump();
        }
    }

    /// A write made progress.
    fn wrote(&self) {
        if self.write_blocked_ms.load(Ordering::Relaxed) != NO_HEAD {
            self.write_blocked_ms.store(NO_HEAD, Ordering::Release);
        }
    }

    /// A call ended: the idle timer starts from now.
    fn call_ended(&self) {
        self.last_activity_ms
            .store(self.now_ms(), Ordering::Relaxed);
    }

    /// A request head was parsed and dispatched; the returned guard marks
    /// the call done when dropped (after its response body).
    pub(crate) fn call_started(self: &Arc<Self>) -> CallOnSession {
        self.calls_in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started_ms.store(NO_HEAD, Ordering::Release);
        CallOnSession(self.clone())
    }

    /// What the watchdog should do now, or when to look again.
    pub(crate) fn check(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Verdict {
        let now = self.now_ms();
        if self.calls_in_flight.load(Ordering::Acquire) > 0 {
            // A client that stops reading blocks our writes; hyper then
            // stops polling the response body, so no body deadline fires
            // and the call would hold its slot forever. No write progress
            // for idle_timeout cuts the connection.
            let blocked = self.write_blocked_ms.load(Ordering::Acquire);
            if blocked != NO_HEAD {
                let due = blocked + idle_timeout.as_millis() as u64;
                return if now >= due {
                    Verdict::WriteStalled
                } else {
                    Verdict::WaitUntil(self.instant_at(due))
                };
            }
            return Verdict::WaitUntil(self.instant_at(now) + idle_timeout);
        }
        let head_started = self.head_started_ms.load(Ordering::Acquire);
        if head_started != NO_HEAD {
            let due = head_started + header_read_timeout.as_millis() as u64;
            return if now >= due {
                Verdict::HeadTimedOut
            } else {
                Verdict::WaitUntil(self.instant_at(due))
            };
        }
        let idle_due =
            self.last_activity_ms.load(Ordering::Relaxed) + idle_timeout.as_millis() as u64;
        if now >= idle_due {
            Verdict::Idle
        } else {
            Verdict::WaitUntil(self.instant_at(idle_due))
        }
    }
}

/// The watchdog's decision.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing to do before this instant.
    WaitUntil(Instant),
    /// A request head did not arrive within `header_read_timeout`.
    HeadTimedOut,
    /// No call and no traffic for `idle_timeout`.
    Idle,
    /// A response could not be written for `idle_timeout` (the client
    /// stopped reading).
    WriteStalled,
}

/// One call on a session; dropping it marks the call done.
#[derive(Debug)]
pub(crate) struct CallOnSession(Arc<SessionClock>);

impl Drop for CallOnSession {
    fn drop(&mut self) {
        self.0.call_ended();
        self.0.calls_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.bump();
    }
}

pin_project_lite::pin_project! {
    /// A socket that reports reads and writes to its session's clock.
    pub(crate) struct ClockedStream<S> {
        #[pin]
        inner: S,
        clock: Arc<SessionClock>,
    }
}

impl<S> ClockedStream<S> {
    pub(crate) fn new(inner: S, clock: Arc<SessionClock>) -> Self {
        Self { inner, clock }
    }
}

impl<S: AsyncRead> AsyncRead for ClockedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.clock.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite> AsyncWrite for ClockedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write(cx, buf);
        note_write(this.clock, &polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write_vectored(cx, bufs);
        note_write(this.clock, &polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Tracks write progress for the stall timer.
fn note_write(clock: &SessionClock, polled: &Poll<io::Result<usize>>) {
    match polled {
        Poll::Pending => clock.write_blocked(),
        Poll::Ready(Ok(n)) if *n > 0 => clock.wrote(),
        Poll::Ready(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_millis(1000);

    #[tokio::test(start_paused = true)]
    async fn silent_connection_times_out_on_its_head() {
        let clock = SessionClock::new();
        assert!(matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)));
        tokio::time::advance(HEAD).await;
        assert_eq!(clock.check(HEAD, IDLE), Verdict::HeadTimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_connection_goes_idle_only_after_idle_timeout() {
        let clock = SessionClock::new();
        clock.bytes_read();
        let call = clock.call_started();
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)),
            "a call in flight is never cut"
        );
        drop(call);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)),
            "idle 500ms < idle_timeout"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(clock.check(HEAD, IDLE), Verdict::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_writes_stall_is_cut_after_idle_timeout() {
        let clock = SessionClock::new();
        let _call = clock.call_started();
        clock.write_blocked();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)));
        clock.wrote(); // progress resets the timer
        clock.write_blocked();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(clock.check(HEAD, IDLE), Verdict::WriteStalled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_request_head_has_its_own_deadline() {
        let clock = SessionClock::new();
        drop(clock.call_started());
        tokio::time::advance(Duration::from_millis(300)).await;
        clock.bytes_read(); // first bytes of the next request
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(matches!(clock.check(HEAD, IDLE), Verdict::WaitUntil(_)));
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(clock.check(HEAD, IDLE), Verdict::HeadTimedOut);
    }
}
