//! wharf's HTTP/1.1 server connection: one task reads a request head, calls the service,
//! writes the response, and starts over (keep-alive, pipelining in order).
//!
//! Why not hyper's: hyper keeps an 8 KiB read buffer and an 8 KiB write buffer for the
//! whole life of a connection, and its connection future is several KiB more; with ten
//! thousand slow calls in flight that is most of the memory a gateway uses. Here a
//! connection holds a read buffer only while bytes are being read (it waits for the socket
//! to become readable before taking one, and gives it back when a keep-alive connection goes
//! idle), and a write buffer only while a response head is being written. It also does the
//! host's session duties itself: the head deadline from accept or from the first byte of a
//! request (`header_read_timeout`, the slowloris guard), the keep-alive idle timeout, the
//! write-stall timeout of a client that stops reading, the drain on shutdown, and the
//! cancellation of a call whose client went away.
//!
//! Parsing and framing are `wharf-http1`'s (strict: smuggling material is a 400). HTTP/2
//! with prior knowledge is recognised by its preface and handed back to the caller, which
//! serves it with hyper. Response bodies go out with vectored writes: the head and the first
//! chunks of a small response leave in one system call.
//!
//! - `serve`: the connection loop;
//! - `read.rs`: request heads, their deadlines, and the `http::Request` a service gets;
//! - `spare.rs`: read buffers kept per worker thread between requests, with their counts;
//! - `body.rs`: request bodies fed to the service on demand ([`IncomingBody`]);
//! - `write.rs`: response framing and writing;
//! - `transport.rs`: the sockets, and `Prefixed` for a handed-over connection;
//! - `date.rs`: the cached `date` header.

mod body;
mod date;
mod heads;
mod message;
pub(crate) mod pipes;
mod read;
mod spare;
mod transport;
mod write;

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{StatusCode, Version};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tracing::debug;
use wharf_http1::MessageError;

pub use body::{IncomingBody, RequestBodyError};
pub(crate) use heads::RESPONSE_HEADS;
pub(crate) use spare::READ_BUFFERS;
pub(crate) use transport::{Prefixed, Transport};

use crate::dispatch::Dispatcher;
use body::{BodyFeed, FeedStep};
use read::{build_request, Head};

/// First read size, and the smallest the adaptive size shrinks to.
const MIN_READ: usize = 4 * 1024;
/// The largest read size (request bodies read in big steps).
const MAX_READ: usize = 64 * 1024;
/// Below this much free room the buffer is grown before reading.
const MIN_SPARE: usize = 1024;
/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// `100 Continue`, for a client that waits for it before sending its body.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The session limits of every connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_header_bytes: usize,
    /// `server.splice_bodies`: spliceable response bodies go through a pipe.
    pub(crate) splice_bodies: bool,
}

/// How a connection ended.
pub(crate) enum Served<S> {
    /// Closed (by either side, a timeout, or the drain).
    Closed,
    /// The client speaks HTTP/2 with prior knowledge: here is the socket and what was read.
    Http2(S, Bytes),
}

/// One HTTP/1.1 connection.
struct Conn<S> {
    io: S,
    /// Bytes read and not yet consumed; no capacity while the connection waits idle.
    buf: BytesMut,
    read_size: usize,
    limits: Limits,
    /// Resolves when the host drains: made at the session's first wait for a request head
    /// (see [`Conn::poll_stop`]), `None` before that and once it resolved.
    stop: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The drain signal as `stop` last saw it (as the session began, before `stop` exists):
    /// while it has not changed since `stop` was polled pending, `stop` holds this task's
    /// waker and need not be polled again.
    stop_seen: watch::Receiver<bool>,
    /// The host is draining: finish the current call, then close.
    draining: bool,
    /// The session timer (head, idle, write stall), moved lazily: it may fire early, and
    /// the deadline is checked again then.
    timer: Pin<Box<Sleep>>,
    /// `timer` was polled pending at its current deadline (its waker registered).
    timer_waiting: bool,
    /// When the current wait for a head ends (see [`Conn::head_due`]).
    head_due: Instant,
    /// Responses written.
    served: u64,
    /// A read saw the client's FIN, or the socket failed: closing needs no FIN of ours
    /// (nothing unread is left to turn the close into a reset).
    peer_gone: bool,
}

/// Serves one connection until it closes, or until it turns out to speak HTTP/2.
///
/// Not an `async fn`: an async fn's future keeps its arguments next to the locals they are
/// moved into, so the socket and the rest would be held twice by every session. The block
/// below owns `conn` and uses it in place.
pub(crate) fn serve<S: Transport>(
    io: S,
    dispatcher: Arc<Dispatcher>,
    limits: Limits,
    stop: watch::Receiver<bool>,
    peer: Option<SocketAddr>,
) -> impl Future<Output = Served<S>> + Send {
    let due = Instant::now() + limits.header_read_timeout;
    // A session that begins while the host already drains answers its one request with
    // `connection: close`.
    let draining = *stop.borrow();
    let mut conn = Conn {
        io,
        buf: BytesMut::new(),
        read_size: MIN_READ,
        limits,
        draining,
        stop_seen: stop,
        stop: None,
        timer: Box::pin(tokio::time::sleep_until(due)),
        timer_waiting: false,
        head_due: due,
        served: 0,
        peer_gone: false,
    };
    async move {
        loop {
            // The call starts within this block, so neither the parsed head nor the request
            // stays in the session's state while the call runs (a block's locals end with it).
            let (call, mut feed, info) = {
                let next = match conn.read_head(&dispatcher).await {
                    Head::Request(request, routed) => {
                        let info = RequestInfo {
                            head: request.method == http::Method::HEAD,
                            version: request.version,
                            keep_alive: request.keep_alive,
                        };
                        let (request, feed) = build_request(request, peer);
                        Next::Call(routed.call(request), feed, info)
                    }
                    Head::Done => break,
                    Head::TimedOut => {
                        debug!(peer = ?peer, "request head not received within header_read_timeout; closing");
                        break;
                    }
                    Head::Bad(status, error) => Next::Refuse(status, error),
                    Head::Http2 => {
                        let prefix = std::mem::take(&mut conn.buf).freeze();
                        return Served::Http2(conn.io, prefix);
                    }
                };
                match next {
                    Next::Call(call, feed, info) => (call, feed, info),
                    Next::Refuse(status, error) => {
                        // Boxed: a rare path, kept out of the connection's own future.
                        Box::pin(conn.answer_bad_head(status, error, peer)).await;
                        break;
                    }
                }
            };
            let keep_alive = match conn.drive(call, &mut feed, &info).await {
                Driven::Gone => {
                    debug!(peer = ?peer, "client closed the connection during the call; call cancelled");
                    break;
                }
                Driven::Written(keep_alive) => keep_alive,
                Driven::Writing(mut writer, keep_alive) => {
                    let io = &mut conn.io;
                    poll_fn(|cx| writer.poll_write(io, cx)).await && keep_alive
                }
            };
            if !keep_alive || !conn.finish_request_body(&mut feed).await {
                break;
            }
            conn.served += 1;
        }
        conn.close().await;
        Served::Closed
    }
}

/// Resolves when the host's drain signal turns true; never when the host is gone without
/// draining (its connections are being dropped anyway).
async fn drain_signal(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|draining| *draining).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Appends `value` in hexadecimal (a chunk size) to `out`.
fn write_hex(value: usize, out: &mut Vec<u8>) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = DIGITS[rest % 16];
        rest /= 16;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// What a request head leads to.
enum Next {
    /// The call, started, with the connection's end of its body and what the response
    /// needs to know.
    Call(crate::service::CallFuture, Option<BodyFeed>, RequestInfo),
    /// An unusable head: answer with this status, then close.
    Refuse(StatusCode, MessageError),
}

/// What became of a call.
enum Driven {
    /// The client went away: the call was cancelled.
    Gone,
    /// The response was written whole (`true`), and may be followed by another.
    Written(bool),
    /// The response is being written (its body streams, or the socket is full); then it
    /// may be followed by another.
    Writing(Box<message::MessageWriter>, bool),
}

/// What the response needs to know of its request.
pub(crate) struct RequestInfo {
    /// A HEAD request: no body goes out.
    pub(crate) head: bool,
    pub(crate) version: Version,
    /// The request allows the connection to persist.
    pub(crate) keep_alive: bool,
}

impl<S: Transport> Conn<S> {
    /// Runs the call to its response, feeding the request body when the service asks for
    /// it, and watching the socket otherwise: a client that closes cancels the call (`None`).
    ///
    /// A closure over the call, not an `async fn`: that would hold the call twice (its
    /// argument and the local it moves into) in every session's state.
    fn drive<'a>(
        &'a mut self,
        mut call: crate::service::CallFuture,
        feed: &'a mut Option<BodyFeed>,
        info: &'a RequestInfo,
    ) -> impl Future<Output = Driven> + 'a {
        let mut continue_sent = 0usize;
        poll_fn(move |cx| loop {
            let answered = match call.take_ready() {
                Some(response) => Some(response),
                None => match Pin::new(&mut call).poll(cx) {
                    Poll::Ready(response) => Some(response),
                    Poll::Pending => None,
                },
            };
            if let Some(response) = answered {
                // A drain that began during the call (which did not wake the session) ends
                // the connection after this response, and the response says so.
                self.check_stop();
                // The first write attempt, in this very poll: a ready response leaves now,
                // with nothing allocated for its writing.
                let (mut writer, keep_alive) = self.start_message(response, info, feed);
                return Poll::Ready(match writer.poll_write(&mut self.io, cx) {
                    Poll::Ready(written) => Driven::Written(written && keep_alive),
                    Poll::Pending => Driven::Writing(Box::new(writer), keep_alive),
                });
            }
            match feed.as_mut().filter(|feed| !feed.is_finished()) {
                Some(feed) => {
                    feed.register(cx);
                    match feed.step(&mut self.buf, false, cx.waker()) {
                        FeedStep::Progress => continue,
                        FeedStep::Idle | FeedStep::Finished => return Poll::Pending,
                        FeedStep::SendContinue => {
                            match self.poll_write_continue(cx, &mut continue_sent) {
                                Poll::Ready(Ok(())) => {
                                    feed.continue_sent();
                                    continue;
                                }
                                Poll::Ready(Err(error)) => {
                                    feed.fail(Some(error));
                                    continue;
                                }
                                Poll::Pending => return Poll::Pending,
                            }
                        }
                        FeedStep::NeedBytes => match self.poll_read_more(cx) {
                            Poll::Ready(Ok(0)) => {
                                feed.fail(None);
                                continue;
                            }
                            Poll::Ready(Ok(_)) => continue,
                            Poll::Ready(Err(error)) => {
                                feed.fail(Some(error));
                                continue;
                            }
                            Poll::Pending => return Poll::Pending,
                        },
                    }
                }
                None => {
                    // Nothing to feed: watch for the client going away. Bytes of a pipelined
                    // next request are kept, up to one head's worth.
                    if self.buf.len() >= self.limits.max_header_bytes {
                        return Poll::Pending;
                    }
                    match self.poll_read_more(cx) {
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                            return Poll::Ready(Driven::Gone)
                        }
                        Poll::Ready(Ok(_)) => continue,
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }
        })
    }

    fn poll_write_continue(
        &mut self,
        cx: &mut Context<'_>,
        sent: &mut usize,
    ) -> Poll<io::Result<()>> {
        while *sent < CONTINUE.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &CONTINUE[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Whether the host is draining, with this task woken when it starts to: for a wait for
    /// a request head, where nothing else would wake the session.
    ///
    /// The drain signal is made and polled (registering this task in the signal's waiter
    /// list, one lock shared by every core, taken again when the session ends) at the
    /// first such wait, so a connection that sends its one request at once never
    /// registers. Once registered, it stays so until the signal changes: while it has
    /// not, an atomic load of its version stands in for the poll (~200 instructions each,
    /// in a profile of a call).
    fn poll_stop(&mut self, cx: &mut Context<'_>) -> bool {
        if self.draining {
            return true;
        }
        let stop = match &mut self.stop {
            Some(stop) => {
                // An error: the host is gone without draining, and `stop` never resolves.
                if !self.stop_seen.has_changed().unwrap_or(false) {
                    return false;
                }
                stop
            }
            None => self
                .stop
                .insert(Box::pin(drain_signal(self.stop_seen.clone()))),
        };
        // Marked seen before the poll: a change after this mark, even during the poll,
        // reads as changed at the next check (after the wake-up it sends).
        self.stop_seen.mark_unchanged();
        if stop.as_mut().poll(cx).is_ready() {
            self.draining = true;
            self.stop = None;
        }
        self.draining
    }

    /// Notes a drain that began while a call ran, without registering for the signal (the
    /// call wakes the session itself): read just before the call's response head is
    /// written, the one place a call's session uses `draining`. The signal's value is read
    /// only when its version changed (rare: a lock, not taken otherwise).
    fn check_stop(&mut self) {
        if !self.draining
            && self.stop_seen.has_changed().unwrap_or(false)
            && *self.stop_seen.borrow()
        {
            self.draining = true;
            self.stop = None;
        }
    }

    /// Whether `due` has passed. The timer is only ever moved earlier here; when it fires
    /// early (its deadline had moved later), it is set to `due` and waits again.
    ///
    /// A timer polled pending stays registered with this task's waker until its deadline:
    /// while that holds and `due` is no earlier, whether it fired is an atomic load, not a
    /// poll (~400 instructions a call in a profile, with the drain signal's the largest
    /// cost of the session's own waits).
    fn poll_timer(&mut self, cx: &mut Context<'_>, due: Instant) -> bool {
        if due < self.timer.deadline() {
            self.timer.as_mut().reset(due);
            self.timer_waiting = false;
        } else if self.timer_waiting && !self.timer.is_elapsed() {
            return false;
        }
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                self.timer_waiting = true;
                return false;
            }
            if Instant::now() >= due {
                return true;
            }
            self.timer.as_mut().reset(due);
            self.timer_waiting = false;
        }
    }

    /// Sends FIN after the last response so the client reads everything, then lets go.
    /// A client that already closed its side gets no shutdown: dropping the socket sends
    /// the FIN, and a burst of one-call connections saves a system call and a timer each.
    async fn close(&mut self) {
        if self.peer_gone {
            return;
        }
        let shutdown = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = poll_fn(|cx| Pin::new(&mut self.io).poll_shutdown(cx)).await;
        });
        let _ = shutdown.await;
    }
}
