//! The sockets an HTTP/1.1 connection runs on, and the prefix that sniffing read.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;

/// A connection's socket. Besides reading and writing, it can say when a read would not
/// block, so a waiting connection holds no read buffer; a transport that cannot tell (TLS,
/// whose records the socket does not show) is always "ready" and reads into a buffer.
pub(crate) trait Transport:
    AsyncRead + AsyncWrite + SendFile + Unpin + Send + 'static
{
    /// Ready when bytes (or EOF) can be read.
    fn poll_read_ready(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A socket that may take a file's bytes straight from the file (`sendfile(2)`: the kernel
/// hands the file's pages to the socket, no copy through user space). A socket whose bytes
/// must pass through user space (TLS encrypts them) cannot.
pub(crate) trait SendFile {
    /// Whether [`SendFile::poll_send_file`] works on this socket.
    fn can_send_file(&self) -> bool {
        false
    }

    /// Sends up to `len` bytes of `file` from `offset`; how many it sent.
    fn poll_send_file(
        &mut self,
        _cx: &mut Context<'_>,
        _file: &File,
        _offset: u64,
        _len: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// Sends up to `len` bytes out of `pipe` (`splice(2)`: the pipe's pages go to the
    /// socket, no copy through user space); how many it sent. Works where
    /// [`SendFile::can_send_file`] does.
    fn poll_splice_from(
        &mut self,
        _cx: &mut Context<'_>,
        _pipe: BorrowedFd<'_>,
        _len: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
}

impl Transport for TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }
}

impl Transport for UnixStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        UnixStream::poll_read_ready(self, cx)
    }
}

/// `sendfile(2)` on a tokio socket: tried when the socket says it is writable, waited for
/// again when the kernel's buffer was full after all.
macro_rules! send_file_on_socket {
    ($($socket:ty),*) => {$(
        impl SendFile for $socket {
            fn can_send_file(&self) -> bool {
                true
            }

            fn poll_send_file(
                &mut self,
                cx: &mut Context<'_>,
                file: &File,
                offset: u64,
                len: usize,
            ) -> Poll<io::Result<usize>> {
                loop {
                    ready!(self.poll_write_ready(cx))?;
                    match self.try_io(Interest::WRITABLE, || send_file(&*self, file, offset, len)) {
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                        sent => return Poll::Ready(sent),
                    }
                }
            }

            fn poll_splice_from(
                &mut self,
                cx: &mut Context<'_>,
                pipe: BorrowedFd<'_>,
                len: usize,
            ) -> Poll<io::Result<usize>> {
                loop {
                    ready!(self.poll_write_ready(cx))?;
                    match self.try_io(Interest::WRITABLE, || splice_out(pipe, &*self, len)) {
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                        sent => return Poll::Ready(sent),
                    }
                }
            }
        }
    )*};
}

send_file_on_socket!(TcpStream, UnixStream);

/// One `sendfile(2)` of `len` bytes of `file` at `offset` to the non-blocking `socket`.
fn send_file(
    socket: impl std::os::fd::AsFd,
    file: &File,
    offset: u64,
    len: usize,
) -> io::Result<usize> {
    let mut offset = offset;
    rustix::fs::sendfile(socket, file, Some(&mut offset), len).map_err(io::Error::from)
}

/// One non-blocking `splice(2)` of up to `len` bytes from `pipe` to `socket`.
fn splice_out(pipe: BorrowedFd<'_>, socket: impl AsFd, len: usize) -> io::Result<usize> {
    use rustix::pipe::{splice, SpliceFlags};
    splice(
        pipe,
        None,
        socket,
        None,
        len,
        SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
    )
    .map_err(io::Error::from)
}

impl Transport for TlsStream<TcpStream> {}

impl SendFile for TlsStream<TcpStream> {}

pin_project_lite::pin_project! {
    /// A socket whose first bytes were already read (to tell HTTP/2 from HTTP/1.1): they are
    /// read again first.
    pub(crate) struct Prefixed<S> {
        prefix: Bytes,
        #[pin]
        io: S,
    }
}

impl<S> Prefixed<S> {
    pub(crate) fn new(prefix: Bytes, io: S) -> Self {
        Self { prefix, io }
    }
}

impl<S: AsyncRead> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        this.io.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}
