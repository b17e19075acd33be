//! Calls on a new connection timed by the kernel (the burst's): the request leaves within the
//! connect, and the response's arrival is the socket's receive timestamp, not the moment the
//! client got round to reading it.
//!
//! A client that starts thousands of calls at once is still busy starting the later ones when
//! the first ones' responses come in. A task that connects and then waits for its socket to
//! turn writable runs again only after every task woken before it, and so does its read: timed
//! at the read, each early call lasts about as long as the client takes to start them all,
//! whatever the server did (issue 4: the client must not be the bottleneck). So here:
//! - the socket is made and connected without blocking and the request is sent at once: on
//!   loopback the handshake completes within `connect`, so the request leaves at the call's
//!   start (when it has not completed, the call waits for the socket to turn writable, as a
//!   tokio connect does);
//! - `SO_TIMESTAMPNS` has the kernel stamp each received segment (CLOCK_REALTIME) and the
//!   response is read with `recvmsg`: the stamp of the read that completed it is when its last
//!   byte reached the socket.
//!
//! The response is read and checked as by [`Conn::call`](super::Conn::call): the whole body,
//! 2xx or a [`CallError`].
//!
//! Linux stamps received segments only while some socket asks for stamps, and it switches
//! that on from a work queue, some time after the first socket asks: segments that arrive
//! before then carry no stamp, and a TCP read of them gives none. A run that times calls
//! this way first holds stamping on ([`stamping_on`]) so that its first calls are stamped too.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    SockaddrStorage,
};
use tokio::io::{AsyncRead, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::response::Drain;
use super::{bounded, CallError, Conn, Endpoint, Req};

/// One call on a connection of its own, bounded by `timeout`: `Ok` with the time (as the
/// kernel stamped it, CLOCK_REALTIME) its response's last byte arrived.
///
/// Without a stamp (a kernel that gave none) the time of the read stands in: later, never
/// earlier, than the arrival.
pub(crate) async fn stamped_fresh_call(
    endpoint: &Endpoint,
    req: Req,
    timeout: Duration,
) -> Result<SystemTime, CallError> {
    bounded(timeout, async {
        let mut conn = connect_sending(endpoint.addr(), &req).await?;
        let mut stamped = StampedRead {
            stream: &conn.stream,
            arrived: None,
        };
        let response = conn.reader.read(&mut stamped).await?;
        let arrived = stamped.arrived.unwrap_or_else(SystemTime::now);
        if response.status.is_success() {
            Ok(arrived)
        } else {
            Err(CallError::Status(response.status))
        }
    })
    .await
}

/// A new connection to `addr` with `req` sent on it (at once when the handshake is done by
/// the time `connect` returns, else once the socket turns writable), receive timestamps on.
async fn connect_sending(addr: SocketAddr, req: &Req) -> Result<Conn, CallError> {
    let failed = |source: io::Error| CallError::Connect { addr, source };
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket::socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| failed(e.into()))?;
    // Small requests must leave at once, as a browser's do.
    let _ = socket::setsockopt(&fd, sockopt::TcpNoDelay, &true);
    socket::setsockopt(&fd, sockopt::ReceiveTimestampns, &true).map_err(|e| failed(e.into()))?;
    match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(failed(e.into())),
    }
    let bytes = req.as_bytes();
    let sent = match socket::send(fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
        Ok(n) => n,
        // The handshake is still under way: the request waits for it below.
        Err(Errno::EAGAIN) => 0,
        // It failed (refused, reset): the connect's error.
        Err(e) => return Err(failed(e.into())),
    };
    let mut stream = TcpStream::from_std(std::net::TcpStream::from(fd)).map_err(failed)?;
    if sent < bytes.len() {
        stream.writable().await.map_err(failed)?;
        if let Some(e) = stream.take_error().map_err(failed)? {
            return Err(failed(e));
        }
        stream
            .write_all(&bytes[sent..])
            .await
            .map_err(|source| CallError::Io {
                during: "sending the request",
                source,
            })?;
    }
    Ok(Conn::new(stream))
}

/// Reads `stream` with `recvmsg`, keeping the receive timestamp of the last read that
/// returned bytes.
struct StampedRead<'a> {
    stream: &'a TcpStream,
    /// The kernel's stamp on the last bytes read, if any came with one.
    arrived: Option<SystemTime>,
}

/// Reads through: the stamp wanted is that of the read that completed the response, and the
/// bodies stamped calls fetch are small.
impl Drain for StampedRead<'_> {}

impl AsyncRead for StampedRead<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            let into = buf.initialize_unfilled();
            let fd = this.stream.as_raw_fd();
            match this
                .stream
                .try_io(Interest::READABLE, || recv_stamped(fd, into))
            {
                Ok((n, stamp)) => {
                    if n > 0 && stamp.is_some() {
                        this.arrived = stamp;
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale: `try_io` cleared it, so the next poll waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Keeps the kernel stamping received segments while it lives: a loopback connection whose
/// client end asked for stamps.
pub(crate) struct StampingOn {
    _client: std::net::TcpStream,
    _server: std::net::TcpStream,
}

/// Asks the kernel to stamp received segments and waits, up to `within`, until one arrives
/// stamped: a byte is sent over a loopback connection every millisecond until its read
/// comes with a stamp. `None` when none did in time. Blocking; errors are the sockets'.
pub(crate) fn stamping_on(within: Duration) -> io::Result<Option<StampingOn>> {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let client = std::net::TcpStream::connect(listener.local_addr()?)?;
    socket::setsockopt(&client, sockopt::ReceiveTimestampns, &true)?;
    let (mut server, _) = listener.accept()?;
    let deadline = std::time::Instant::now() + within;
    loop {
        server.write_all(b".")?;
        let (_, stamp) = recv_stamped(client.as_raw_fd(), &mut [0u8; 16])?;
        if stamp.is_some() {
            return Ok(Some(StampingOn {
                _client: client,
                _server: server,
            }));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One `recvmsg` into `into`: the bytes read and the kernel's receive timestamp of the last
/// segment among them (`SCM_TIMESTAMPNS`), if it gave one.
fn recv_stamped(fd: RawFd, into: &mut [u8]) -> io::Result<(usize, Option<SystemTime>)> {
    // Room for one control message holding a timespec (CMSG_SPACE(16) is 32 on Linux).
    let mut control = [0u8; 64];
    let mut iov = [io::IoSliceMut::new(into)];
    let msg = socket::recvmsg::<()>(fd, &mut iov, Some(&mut control), MsgFlags::empty())?;
    let mut stamp = None;
    for message in msg.cmsgs()? {
        if let ControlMessageOwned::ScmTimestampns(ts) = message {
            // A stamp before 1970 cannot come from a clock that runs; leave it out.
            if let (Ok(secs), Ok(nanos)) = (u64::try_from(ts.tv_sec()), u32::try_from(ts.tv_nsec()))
            {
                stamp = Some(UNIX_EPOCH + Duration::new(secs, nanos));
            }
        }
    }
    Ok((msg.bytes, stamp))
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::Waker;
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    async fn listener() -> (TcpListener, Endpoint) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        (listener, Endpoint::resolve("t", &url).await.unwrap())
    }

    /// Reads one request head from `socket`.
    async fn read_head(socket: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole head");
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    }

    #[tokio::test]
    async fn the_request_leaves_within_the_first_poll() {
        let (listener, endpoint) = listener().await;
        let req = endpoint.request(0);
        // Polled once and never again: on loopback the handshake is done inside connect, so
        // the request must already be on its way.
        let mut call = std::pin::pin!(connect_sending(endpoint.addr(), &req));
        let polled = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_ready(), "the call waited for the socket");
        let (mut socket, _) = listener.accept().await.unwrap();
        assert_eq!(read_head(&mut socket).await, req.as_bytes());
    }

    #[tokio::test]
    async fn the_arrival_is_the_kernels_stamp_not_the_read() {
        // Without it the response may arrive before the kernel has switched stamping on.
        let stamping = tokio::task::spawn_blocking(|| stamping_on(Duration::from_secs(10)))
            .await
            .unwrap()
            .unwrap();
        assert!(stamping.is_some(), "the kernel never stamped a segment");
        let (listener, endpoint) = listener().await;
        let mut conn = connect_sending(endpoint.addr(), &endpoint.request(0))
            .await
            .unwrap();
        let (mut socket, _) = listener.accept().await.unwrap();
        read_head(&mut socket).await;
        socket.write_all(OK).await.unwrap();
        let sent = SystemTime::now();
        // The client reads late, as a client busy starting other calls does.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut stamped = StampedRead {
            stream: &conn.stream,
            arrived: None,
        };
        let response = conn.reader.read(&mut stamped).await.unwrap();
        let read = SystemTime::now();
        assert!(response.status.is_success());
        let arrived = stamped.arrived.expect("the kernel stamped the response");
        let late = read.duration_since(arrived).unwrap();
        assert!(
            late >= Duration::from_millis(150),
            "read {late:?} after arrival"
        );
        // Stamped after it was written (within a clock's rounding) and before the sleep's end.
        let after_send = arrived
            .duration_since(sent)
            .unwrap_or_else(|e| Duration::ZERO.saturating_sub(e.duration()));
        assert!(after_send < Duration::from_millis(50), "{after_send:?}");
    }

    #[tokio::test]
    async fn a_whole_call_returns_the_arrival_and_checks_the_status() {
        let (listener, endpoint) = listener().await;
        tokio::spawn(async move {
            for response in [OK, b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n"] {
                let (mut socket, _) = listener.accept().await.unwrap();
                read_head(&mut socket).await;
                socket.write_all(response).await.unwrap();
            }
        });
        let before = SystemTime::now();
        let started = Instant::now();
        let arrived = stamped_fresh_call(&endpoint, endpoint.request(0), Duration::from_secs(5))
            .await
            .unwrap();
        let span = arrived.duration_since(before).unwrap_or_default();
        assert!(span <= started.elapsed(), "{span:?}");
        let err = stamped_fresh_call(&endpoint, endpoint.request(1), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CallError::Status(s) if s.as_u16() == 503),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_connect_is_a_connect_error() {
        let (listener, endpoint) = listener().await;
        drop(listener);
        let err = stamped_fresh_call(&endpoint, endpoint.request(0), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CallError::Connect { addr, .. } if addr == endpoint.addr()),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn no_response_in_time_is_a_timeout() {
        let (listener, endpoint) = listener().await;
        let err = stamped_fresh_call(&endpoint, endpoint.request(0), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Timeout(_)), "{err:?}");
        drop(listener);
    }
}
