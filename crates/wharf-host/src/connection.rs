//! One accepted connection's task: HTTP/1.1 (wharf's own, [`crate::h1`]), or HTTP/2
//! (hyper) when the client opens with its preface or TLS negotiates it, and the session it
//! holds (the session count and the `max_connections` slot) until it closes.
//!
//! A plain connection's task is a [`Session`]: a hand-written future around the HTTP/1.1
//! connection's future, not an async block, because every layer of async blocks keeps its
//! own copy of its arguments, and with ten thousand connections open that is memory.
//! TLS and HTTP/2 connections are rarer and larger; they run as ordinary boxed futures.

use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use crate::accept::SessionGuard;
use crate::call::ClientAddr;
use crate::dispatch::{dispatch_h2, Dispatcher};
use crate::h1::{self, Prefixed, Served, Transport};
use crate::session::{ClockedStream, SessionClock, Verdict};
use crate::steering::OpenSession;

/// What a connection holds while it is open: released when its task ends. The last is its
/// count on its core's steering balance (with `server.cpu_steering`).
pub(crate) type Held = (SessionGuard, OwnedSemaphorePermit, Option<OpenSession>);

/// The session timeouts of every connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLimits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// `server.splice_bodies`.
    pub(crate) splice_bodies: bool,
}

/// What every session task needs.
#[derive(Clone)]
pub(crate) struct SessionParts {
    pub(crate) h2: Arc<http2::Builder<TokioExecutor>>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) limits: SessionLimits,
}

impl SessionParts {
    fn h1_limits(&self) -> h1::Limits {
        h1::Limits {
            header_read_timeout: self.limits.header_read_timeout,
            idle_timeout: self.limits.idle_timeout,
            max_header_bytes: self.dispatcher.max_header_bytes,
            splice_bodies: self.limits.splice_bodies,
        }
    }
}

/// Starts the task of a plain (TCP or Unix socket) connection.
pub(crate) fn spawn_plain<S: Transport>(
    parts: SessionParts,
    stream: S,
    peer: Option<SocketAddr>,
    held: Held,
) {
    let http1 = h1::serve(
        stream,
        parts.dispatcher.clone(),
        parts.h1_limits(),
        parts.stop.clone(),
        peer,
    );
    tokio::spawn(Session {
        http1,
        http2: None,
        parts: Some(parts),
        peer,
        held: Some(held),
        stream: PhantomData,
    });
}

/// Starts the task of a TLS connection: the handshake (within the head deadline), then
/// HTTP/2 when ALPN chose it, else HTTP/1.1.
pub(crate) fn spawn_tls(
    parts: SessionParts,
    tls: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    held: Held,
) {
    tokio::spawn(async move {
        let _held = held;
        let handshake = tokio::time::timeout(parts.limits.header_read_timeout, tls.accept(stream));
        let stream = match handshake.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                debug!(peer = %peer, error = %error, "tls handshake failed");
                return;
            }
            Err(_) => {
                debug!(peer = %peer, "tls handshake timed out");
                return;
            }
        };
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            serve_h2(parts, stream, Some(peer)).await;
            return;
        }
        let http1 = h1::serve(
            stream,
            parts.dispatcher.clone(),
            parts.h1_limits(),
            parts.stop.clone(),
            Some(peer),
        );
        if let Served::Http2(stream, prefix) = http1.await {
            serve_h2(parts, Prefixed::new(prefix, stream), Some(peer)).await;
        }
    });
}

pin_project_lite::pin_project! {
    /// A plain connection's task: HTTP/1.1, turning into HTTP/2 if the client opens with
    /// its preface.
    struct Session<S, F> {
        #[pin]
        http1: F,
        // Set once the connection turned out to speak HTTP/2.
        http2: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        // For the HTTP/2 hand-over.
        parts: Option<SessionParts>,
        peer: Option<SocketAddr>,
        // Released when the task ends.
        held: Option<Held>,
        stream: PhantomData<fn() -> S>,
    }
}

impl<S, F> Future for Session<S, F>
where
    S: Transport,
    F: Future<Output = Served<S>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A session's turn is work for the core's busy polling (`server.busy_poll_us`).
        crate::busy_poll::worked();
        let mut this = self.project();
        loop {
            if let Some(http2) = this.http2.as_mut() {
                if http2.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.held.take();
                return Poll::Ready(());
            }
            match this.http1.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Served::Closed) => {
                    this.held.take();
                    return Poll::Ready(());
                }
                Poll::Ready(Served::Http2(stream, prefix)) => {
                    let Some(parts) = this.parts.take() else {
                        this.held.take();
                        return Poll::Ready(());
                    };
                    let peer = *this.peer;
                    *this.http2 = Some(Box::pin(serve_h2(
                        parts,
                        Prefixed::new(prefix, stream),
                        peer,
                    )));
                }
            }
        }
    }
}

/// Serves one HTTP/2 connection (hyper) until it ends, enforcing the session
/// timeouts and closing gracefully when the host drains.
async fn serve_h2<S>(parts: SessionParts, stream: S, peer: Option<SocketAddr>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let SessionParts {
        h2,
        dispatcher,
        mut stop,
        limits,
    } = parts;
    let peer_label = peer.map_or_else(|| "unix".to_owned(), |peer| peer.to_string());
    let clock = SessionClock::new();
    let io = TokioIo::new(ClockedStream::new(stream, clock.clone()));
    let service_clock = clock.clone();
    let service = hyper::service::service_fn(move |request| {
        dispatch_h2(
            dispatcher.clone(),
            service_clock.call_started(),
            peer.map(ClientAddr),
            request,
        )
    });
    let connection = h2.serve_connection(io, service);
    tokio::pin!(connection);
    let stop_signal = stop.changed();
    tokio::pin!(stop_signal);
    // Stays `false` once the drain signal fired or can no longer fire.
    let mut watch_stop = true;
    // When the GOAWAY went out (idle or drain): the connection ends an idle
    // period after it if the client has not closed it by then.
    let mut closing_since: Option<tokio::time::Instant> = None;
    let first_due = match clock.check(limits.header_read_timeout, limits.idle_timeout) {
        Verdict::WaitUntil(instant) => instant,
        _ => tokio::time::Instant::now(),
    };
    let timer = tokio::time::sleep_until(first_due);
    tokio::pin!(timer);
    let mut seen_generation = clock.generation();
    std::future::poll_fn(|cx| loop {
        if let Poll::Ready(result) = connection.as_mut().poll(cx) {
            if let Err(error) = result {
                debug!(peer = %peer_label, error = %error, "connection ended with error");
            }
            return Poll::Ready(());
        }
        if watch_stop {
            if let Poll::Ready(changed) = stop_signal.as_mut().poll(cx) {
                watch_stop = false;
                if changed.is_ok() && closing_since.is_none() {
                    closing_since = Some(tokio::time::Instant::now());
                    connection.as_mut().graceful_shutdown();
                    continue;
                }
            }
        }
        // A deadline only comes closer through something the connection
        // just did in this task: move the timer then, never on every poll.
        let generation = clock.generation();
        if generation != seen_generation {
            seen_generation = generation;
            if let Verdict::WaitUntil(due) =
                clock.check(limits.header_read_timeout, limits.idle_timeout)
            {
                if due < timer.deadline() {
                    timer.as_mut().reset(due);
                }
            }
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // The timer fired: a deadline passed, or it was set for one that has
        // moved later since; look again.
        let next = match clock.check(limits.header_read_timeout, limits.idle_timeout) {
            Verdict::WaitUntil(instant) => instant,
            Verdict::HeadTimedOut => {
                debug!(peer = %peer_label, "request head not received within header_read_timeout; closing");
                return Poll::Ready(());
            }
            Verdict::WriteStalled => {
                debug!(peer = %peer_label, "response not read by the client within idle_timeout; closing");
                return Poll::Ready(());
            }
            Verdict::Idle => {
                let now = tokio::time::Instant::now();
                match closing_since {
                    // A GOAWAY the client left unanswered for an idle period: a
                    // peer that never closes would otherwise hold its session
                    // slot (and `max_connections`) for ever.
                    Some(since) if now >= since + limits.idle_timeout => {
                        debug!(peer = %peer_label, "still open an idle_timeout after goaway; closing");
                        return Poll::Ready(());
                    }
                    // Closing for less than that (a drain's GOAWAY may come just
                    // before an idle deadline): the client gets its idle period
                    // to answer it.
                    Some(since) => since + limits.idle_timeout,
                    None => {
                        debug!(peer = %peer_label, "idle_timeout; closing");
                        closing_since = Some(now);
                        connection.as_mut().graceful_shutdown();
                        now + limits.idle_timeout
                    }
                }
            }
        };
        timer.as_mut().reset(next);
    })
    .await;
}
