//! The socket under an upstream connection: TCP, TLS over TCP, or a Unix socket.
//!
//! [`UpstreamStream`] is the one type the connection code reads and writes, whatever the
//! transport. Besides `AsyncRead`/`AsyncWrite` it can wait for readability without a buffer
//! ([`UpstreamStream::poll_read_ready`]), so a connection waiting on a slow upstream holds no
//! read buffer, and tell whether an idle connection was closed by its peer
//! ([`UpstreamStream::is_known_closed`]) without a system call.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

/// A connected upstream socket.
#[derive(Debug)]
pub enum UpstreamStream {
    /// Plain TCP (`http://`).
    Tcp(TcpStream),
    /// TLS over TCP (`https://`).
    Tls(Box<TlsStream<TcpStream>>),
    /// A Unix domain socket (`unix:`).
    Unix(UnixStream),
}

impl From<TcpStream> for UpstreamStream {
    fn from(stream: TcpStream) -> Self {
        UpstreamStream::Tcp(stream)
    }
}

impl From<TlsStream<TcpStream>> for UpstreamStream {
    fn from(stream: TlsStream<TcpStream>) -> Self {
        UpstreamStream::Tls(Box::new(stream))
    }
}

impl From<UnixStream> for UpstreamStream {
    fn from(stream: UnixStream) -> Self {
        UpstreamStream::Unix(stream)
    }
}

impl UpstreamStream {
    /// Ready when bytes (or EOF) can be read. TLS may hold decrypted bytes the socket does not
    /// show, so a TLS stream is always "ready": the caller then allocates and reads.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            UpstreamStream::Tcp(stream) => stream.poll_read_ready(cx),
            UpstreamStream::Unix(stream) => stream.poll_read_ready(cx),
            UpstreamStream::Tls(_) => Poll::Ready(Ok(())),
        }
    }

    /// Whether an idle connection (no request outstanding) can carry another request: false
    /// when its peer closed it or sent bytes nobody asked for. Costs no system call unless the
    /// reactor saw the socket become readable since the last read that drained it (tokio
    /// clears readiness on a short read), which for an idle connection means EOF or garbage;
    /// a one-byte `try_read` then tells. A TLS connection asks its TCP socket: readable while
    /// idle means a close_notify alert or EOF.
    pub(crate) fn is_reusable(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 1];
        let outcome = match self {
            UpstreamStream::Tcp(stream) => match stream.poll_read_ready(&mut cx) {
                Poll::Pending => return true,
                Poll::Ready(Err(_)) => return false,
                Poll::Ready(Ok(())) => stream.try_read(&mut probe),
            },
            UpstreamStream::Unix(stream) => match stream.poll_read_ready(&mut cx) {
                Poll::Pending => return true,
                Poll::Ready(Err(_)) => return false,
                Poll::Ready(Ok(())) => stream.try_read(&mut probe),
            },
            UpstreamStream::Tls(stream) => {
                // Peek: a TLS record must not be consumed behind rustls' back. Pending
                // means the readiness was stale (peek hit WouldBlock): still open.
                let mut peeked = ReadBuf::new(&mut probe);
                return stream
                    .get_ref()
                    .0
                    .poll_peek(&mut cx, &mut peeked)
                    .is_pending();
            }
        };
        matches!(outcome, Err(error) if error.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether [`UpstreamStream::poll_splice_to`] works here: a plain socket, whose bytes the
    /// kernel can move into a pipe (TLS must decrypt them in user space).
    pub(crate) fn can_splice(&self) -> bool {
        matches!(self, UpstreamStream::Tcp(_) | UpstreamStream::Unix(_))
    }

    /// Raises a TCP socket's receive buffer to [`SPLICED_RECEIVE_BUFFER`] when it is smaller
    /// (never lowers one the kernel already grew); once per connection, at its first spliced
    /// body. Setting it stops the kernel's own sizing for the socket, which splicing did not
    /// get anyway. A failure only leaves the buffer as it was.
    pub(crate) fn raise_receive_buffer(&self) {
        use rustix::net::sockopt::{set_socket_recv_buffer_size, socket_recv_buffer_size};
        let UpstreamStream::Tcp(stream) = self else {
            return;
        };
        match socket_recv_buffer_size(stream) {
            Ok(size) if size >= SPLICED_RECEIVE_BUFFER => {}
            // The kernel doubles the value set (the other half is its bookkeeping), after
            // capping it at `net.core.rmem_max` (4 MiB here; 208 KiB on many hosts).
            _ => {
                if let Err(error) = set_socket_recv_buffer_size(stream, SPLICED_RECEIVE_BUFFER / 2)
                {
                    tracing::debug!(error = %error, "raising a spliced socket's receive buffer failed");
                }
            }
        }
    }

    /// Moves up to `len` bytes from the socket into the (empty, non-blocking) `pipe` with
    /// `splice(2)`, waiting while the socket has none; how many it moved, 0 at EOF.
    pub(crate) fn poll_splice_to(
        &self,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        macro_rules! splice_from {
            ($stream:expr) => {
                loop {
                    ready!($stream.poll_read_ready(cx))?;
                    match $stream.try_io(Interest::READABLE, || splice_into(&$stream, pipe, len)) {
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                        moved => return Poll::Ready(moved),
                    }
                }
            };
        }
        match self {
            UpstreamStream::Tcp(stream) => splice_from!(stream),
            UpstreamStream::Unix(stream) => splice_from!(stream),
            UpstreamStream::Tls(_) => Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
        }
    }
}

/// The receive buffer (as `getsockopt(SO_RCVBUF)` reports it) an upstream TCP socket gets
/// once a body is spliced from it. The kernel grows a socket's buffer as the application
/// reads (`tcp_moderate_rcvbuf`), but bytes taken by `splice(2)` do not grow it (kernel
/// 6.18: without the raise, the exchange test's spliced socket stays at 131072 bytes, and
/// the test fails): a spliced connection stayed at the 128 KiB default,
/// too little for a 100 KiB body in 64 KiB loopback segments. Its window closed on a fifth
/// of the calls, and the same-host upstream paid for the stalls: on stop 46's machine, wharf
/// with one worker beside the testbed on one core, 100 KiB bodies, medians of four
/// interleaved rounds, 0.18 zero-window advertisements a call and 48 µs of the testbed's
/// CPU a call before, none and 30 µs with this buffer, 8.9k against 11.3k req/s (HAProxy,
/// splicing too, 10.5k; bench/RESULTS.md). Bytes read the ordinary way keep the kernel's
/// own sizing.
pub const SPLICED_RECEIVE_BUFFER: usize = 512 * 1024;

/// One non-blocking `splice(2)` of up to `len` bytes from `socket` into `pipe`.
fn splice_into(socket: &impl AsFd, pipe: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    use rustix::pipe::{splice, SpliceFlags};
    splice(
        socket,
        None,
        pipe,
        None,
        len,
        SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
    )
    .map_err(io::Error::from)
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Tcp(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
            UpstreamStream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
