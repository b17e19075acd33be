//! [`ResponseReader`]: reads one HTTP/1.1 response off a connection and drops its body;
//! [`ResponseError`]: how a response can be broken.
//!
//! The reader owns the connection's one buffer (8 KiB, doubled when full up to 64 KiB, then
//! reused for every response on the connection). A response is read as:
//!
//! 1. the head, parsed with `httparse` once complete (at most [`MAX_HEAD`] bytes, 100
//!    fields); 1xx interim responses (`100 Continue`, `103 Early Hints`) are skipped;
//! 2. the body's framing from the head (RFC 9112 §6.3): none for 204 and 304;
//!    `Transfer-Encoding` (chunked last: [`ChunkedDecoder`]; otherwise to the close);
//!    `Content-Length`; else everything up to the close;
//! 3. the body, read through the buffer and dropped as it arrives; on a plain TCP
//!    connection the bytes of a `Content-Length` body past the buffered ones are dropped in
//!    the kernel instead ([`Drain`]: `recv` with `MSG_TRUNC`), never copied out. The client
//!    must not be what limits a figure (issue 4), and at 100 KiB a call it came close: 95 %
//!    of its core at 65,000 hits a second pinned, 86 % with the drop (stop 41's lab).
//!
//! The connection may carry another call only if the response said so (HTTP/1.1 without
//! `Connection: close`, or HTTP/1.0 with `keep-alive`), its end was framed (not the close)
//! and nothing followed it. Anything malformed or cut short is a [`ResponseError`], never a
//! response. Writing the request and judging the status are `Conn`'s job.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;

use http::StatusCode;
use nix::sys::socket::{self, MsgFlags};
use tokio::io::{AsyncRead, AsyncReadExt, Interest};
use tokio::net::TcpStream;

use crate::client::chunked::ChunkedDecoder;
use crate::client::CallError;

/// Largest response head (status line and fields) accepted, and the buffer's largest size.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// The buffer's first size: a typical head and small body in one read.
const INITIAL_BUFFER: usize = 8 * 1024;

/// Most header fields in one head (as hyper's default).
const MAX_FIELDS: usize = 100;

/// How a response was broken. Each one fails the call.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// The connection ended before any byte of a response.
    #[error("connection closed before a response")]
    ClosedBeforeResponse,
    /// The connection ended inside the head.
    #[error("connection closed after {0} bytes of the response head")]
    ClosedInHead(usize),
    /// The head is not valid HTTP/1.x.
    #[error("malformed response head")]
    Head(#[source] httparse::Error),
    /// The head did not end within the bound (64 KiB).
    #[error("response head over {0} bytes")]
    HeadTooLarge(usize),
    /// A status code below 100.
    #[error("invalid status code {0}")]
    Status(u16),
    /// `101 Switching Protocols` to a request that asked for no upgrade.
    #[error("101 switching protocols without an upgrade request")]
    UnexpectedUpgrade,
    /// `Content-Length` is not one number (or several equal ones).
    #[error("invalid content-length {0:?}")]
    ContentLength(String),
    /// The connection ended before the length `Content-Length` declared.
    #[error("connection closed after {got} of {expected} body bytes")]
    Truncated {
        /// Declared length.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// The chunked framing is broken (the reason).
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
    /// The connection ended before the last chunk.
    #[error("connection closed inside the chunked body")]
    ClosedInChunked,
}

/// How the body of a response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Up to the server's close.
    Close,
}

/// What the head of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    /// The status code (100..=999).
    code: u16,
    /// How the body ends.
    framing: Framing,
    /// Whether the server allows another request on the connection.
    keep_alive: bool,
}

/// The end of a response whose body was read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    /// The final (non-1xx) status.
    pub(crate) status: StatusCode,
    /// Whether the connection can carry the next request.
    pub(crate) reusable: bool,
}

/// Parses a head from the front of `bytes`: `None` if incomplete, else the head and its
/// length.
fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, ResponseError> {
    // Uninitialised: a head is parsed again whenever more of it arrives, and zeroing 100
    // fields each time showed in profiles.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        bytes,
        &mut fields,
    );
    let len = match parsed.map_err(ResponseError::Head)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    // Complete means both are set.
    let (Some(version), Some(code)) = (response.version, response.code) else {
        return Err(ResponseError::Head(httparse::Error::Status));
    };
    if code < 100 {
        return Err(ResponseError::Status(code));
    }
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let (mut close, mut keep_alive) = (false, false);
    for field in response.headers.iter() {
        let name = field.name;
        if name.eq_ignore_ascii_case("content-length") {
            let bad = || ResponseError::ContentLength(String::from_utf8_lossy(field.value).into());
            let mut values = list(field.value).peekable();
            if values.peek().is_none() {
                return Err(bad());
            }
            for value in values {
                let n = parse_length(value).ok_or_else(bad)?;
                if length.is_some_and(|seen| seen != n) {
                    return Err(bad());
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only the last coding of the last field matters: chunked or not.
            if let Some(last) = list(field.value).last() {
                chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in list(field.value) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }
    let no_body = code < 200 || code == 204 || code == 304;
    let framing = match (chunked, length) {
        _ if no_body => Framing::Empty,
        (Some(true), _) => Framing::Chunked,
        (Some(false), _) => Framing::Close,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Close,
    };
    let keep_alive = !close
        && (version == 1 || keep_alive)
        // Both framings at once (a smuggling sign, RFC 9112 §6.3 item 3), or a transfer
        // coding on HTTP/1.0 (§6.1): read as the coding says, then close.
        && !(chunked.is_some() && (length.is_some() || version == 0));
    Ok(Some((
        Head {
            code,
            framing,
            keep_alive,
        },
        len,
    )))
}

/// The non-empty elements of a comma-separated field value, without surrounding whitespace.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// A `Content-Length` number: digits only, within 64 bits.
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// A connection the reader reads responses from, and whether it can drop received bytes
/// without reading them into memory.
pub(crate) trait Drain: AsyncRead + Unpin {
    /// Whether [`Drain::drain`] drops bytes in the kernel. If not (the default), bodies are
    /// read through the buffer, which also sees bytes that came after a response with it;
    /// a drain takes no more than the body, and later bytes are `Conn::is_closed`'s to see.
    const DROPS_IN_KERNEL: bool = false;

    /// Drops up to `room.len()` received bytes, waiting for the first: how many, 0 at the end
    /// of the stream. What `room` holds afterwards is unspecified. By default the bytes are
    /// read into `room`.
    fn drain<'a>(&'a mut self, room: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> {
        self.read(room)
    }
}

impl Drain for TcpStream {
    const DROPS_IN_KERNEL: bool = true;

    /// `recv` with `MSG_TRUNC`: TCP discards up to `room.len()` queued bytes and says how many
    /// (tcp(7)); `room` is not written.
    async fn drain<'a>(&'a mut self, room: &'a mut [u8]) -> io::Result<usize> {
        let fd = self.as_raw_fd();
        self.async_io(Interest::READABLE, || {
            socket::recv(fd, room, MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT)
                .map_err(io::Error::from)
        })
        .await
    }
}

/// Reads responses through one reused buffer; one per connection.
#[derive(Debug)]
pub(crate) struct ResponseReader {
    /// The buffer, all of it initialised; its length is its size.
    buf: Vec<u8>,
    /// Start of the bytes received but not yet consumed.
    start: usize,
    /// End of the bytes received.
    end: usize,
}

impl ResponseReader {
    /// A reader with an empty buffer of the initial size.
    pub(crate) fn new() -> Self {
        ResponseReader {
            buf: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
        }
    }

    /// Reads the next response from `io`, dropping its body.
    pub(crate) async fn read<R: Drain>(&mut self, io: &mut R) -> Result<Response, CallError> {
        let head = loop {
            let head = self.read_head(io).await?;
            match head.code {
                101 => return Err(ResponseError::UnexpectedUpgrade.into()),
                100..=199 => continue,
                _ => break head,
            }
        };
        let status =
            StatusCode::from_u16(head.code).map_err(|_| ResponseError::Status(head.code))?;
        match head.framing {
            Framing::Empty => {}
            Framing::Length(n) => self.skip_length(io, n).await?,
            Framing::Chunked => self.skip_chunked(io).await?,
            Framing::Close => self.skip_to_close(io).await?,
        }
        let rest = self.end - self.start;
        Ok(Response {
            status,
            // Bytes after the response answer no request of ours: the connection is confused.
            reusable: head.keep_alive && head.framing != Framing::Close && rest == 0,
        })
    }

    /// The bytes received and not yet consumed.
    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Marks `n` buffered bytes consumed.
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more bytes after the buffered ones; 0 at the end of the stream.
    ///
    /// For room, the buffered bytes move to the front, or a buffer full of them doubles (up
    /// to [`MAX_HEAD`]; the callers bound what they keep buffered). A read that fills the
    /// whole empty buffer (a large body arriving) doubles it too, so big bodies take fewer
    /// reads.
    async fn fill<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<usize, CallError> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                self.grow();
            }
        }
        let n = io
            .read(&mut self.buf[self.end..])
            .await
            .map_err(|source| CallError::Io {
                during: "reading the response",
                source,
            })?;
        if self.end == 0 && n == self.buf.len() {
            self.grow();
        }
        self.end += n;
        Ok(n)
    }

    /// Doubles the buffer, up to [`MAX_HEAD`].
    fn grow(&mut self) {
        if self.buf.len() < MAX_HEAD {
            self.buf.resize((2 * self.buf.len()).min(MAX_HEAD), 0);
        }
    }

    /// Reads and consumes one head.
    async fn read_head<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<Head, CallError> {
        loop {
            if self.start < self.end {
                if let Some((head, len)) = parse_head(self.buffered())? {
                    self.consume(len);
                    return Ok(head);
                }
                if self.end - self.start >= MAX_HEAD {
                    return Err(ResponseError::HeadTooLarge(MAX_HEAD).into());
                }
            }
            if self.fill(io).await? == 0 {
                let got = self.end - self.start;
                return Err(if got == 0 {
                    ResponseError::ClosedBeforeResponse
                } else {
                    ResponseError::ClosedInHead(got)
                }
                .into());
            }
        }
    }

    /// Drops a body of `expected` bytes: the buffered ones, then the rest as it arrives:
    /// read through the buffer, or dropped in the kernel where the connection can (never
    /// more than the body there: what follows it is not the body's).
    async fn skip_length<R: Drain>(&mut self, io: &mut R, expected: u64) -> Result<(), CallError> {
        let mut left = expected;
        loop {
            let take = usize::try_from(left).map_or(self.end - self.start, |left| {
                left.min(self.end - self.start)
            });
            self.consume(take);
            left -= take as u64;
            if left == 0 {
                return Ok(());
            }
            if R::DROPS_IN_KERNEL {
                // The buffer is empty: the rest goes without a copy.
                return self.drain_body(io, expected, left).await;
            }
            if self.fill(io).await? == 0 {
                return Err(ResponseError::Truncated {
                    expected,
                    got: expected - left,
                }
                .into());
            }
        }
    }

    /// Drops the `left` bytes still to come of a body of `expected`, in the kernel.
    async fn drain_body<R: Drain>(
        &mut self,
        io: &mut R,
        expected: u64,
        mut left: u64,
    ) -> Result<(), CallError> {
        while left > 0 {
            let room =
                usize::try_from(left).map_or(self.buf.len(), |left| left.min(self.buf.len()));
            let n = io
                .drain(&mut self.buf[..room])
                .await
                .map_err(|source| CallError::Io {
                    during: "reading the response",
                    source,
                })?;
            if n == 0 {
                return Err(ResponseError::Truncated {
                    expected,
                    got: expected - left,
                }
                .into());
            }
            // A drain that filled the whole buffer: a large body, taken in larger steps.
            if n == self.buf.len() {
                self.grow();
            }
            left -= n as u64;
        }
        Ok(())
    }

    /// Reads and drops a chunked body, trailers included.
    async fn skip_chunked<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<(), CallError> {
        let mut decoder = ChunkedDecoder::new();
        loop {
            let used = decoder.feed(self.buffered())?;
            self.consume(used);
            if decoder.is_done() {
                return Ok(());
            }
            if self.fill(io).await? == 0 {
                return Err(ResponseError::ClosedInChunked.into());
            }
        }
    }

    /// Reads and drops everything up to the end of the stream.
    async fn skip_to_close<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<(), CallError> {
        loop {
            self.consume(self.end - self.start);
            if self.fill(io).await? == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;

    use super::*;

    /// A connection's incoming bytes, scripted: each piece comes in its own read (cut to the
    /// reader's room), then the end of the stream or an error.
    struct Script {
        pieces: VecDeque<Vec<u8>>,
        then: Option<io::ErrorKind>,
    }

    impl Script {
        /// `bytes` in pieces cut at `splits` (ascending), then the end of the stream.
        fn split(bytes: &[u8], splits: &[usize]) -> Script {
            let mut pieces = VecDeque::new();
            let mut from = 0;
            for &to in splits.iter().chain(std::iter::once(&bytes.len())) {
                if to > from {
                    pieces.push_back(bytes[from..to].to_vec());
                }
                from = to;
            }
            Script { pieces, then: None }
        }
    }

    impl Drain for Script {}

    impl AsyncRead for Script {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let Some(piece) = self.pieces.front_mut() else {
                return Poll::Ready(match self.then {
                    Some(kind) => Err(kind.into()),
                    None => Ok(()),
                });
            };
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            piece.drain(..n);
            if piece.is_empty() {
                self.pieces.pop_front();
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Reads one response from `bytes` split at `splits`, with a fresh reader.
    async fn read(bytes: &[u8], splits: &[usize]) -> Result<Response, CallError> {
        ResponseReader::new()
            .read(&mut Script::split(bytes, splits))
            .await
    }

    /// Every way to cut `bytes` in two, and one byte per read.
    fn cuts(bytes: &[u8]) -> impl Iterator<Item = Vec<usize>> {
        (0..=bytes.len())
            .map(|i| vec![i])
            .chain(std::iter::once((1..bytes.len()).collect()))
    }

    fn ok(code: u16, reusable: bool) -> Response {
        Response {
            status: StatusCode::from_u16(code).unwrap(),
            reusable,
        }
    }

    #[tokio::test]
    async fn reads_each_framing_at_every_split() {
        let cases: &[(&str, &[u8], Response)] = &[
            (
                "content-length",
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello",
                ok(200, true),
            ),
            (
                "empty body",
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                ok(200, true),
            ),
            (
                "equal lengths",
                b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\nok",
                ok(200, true),
            ),
            (
                "chunked, extensions, trailers",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                  5;a=b;c=\"d;e\"\r\nhello\r\nB \r\n, trailers!\r\n0;end\r\n\
                  x-checksum: 42\r\nx-more: yes\r\n\r\n",
                ok(200, true),
            ),
            (
                "chunked, no trailers",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                ok(200, true),
            ),
            (
                "close-delimited",
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of this, up to the close",
                ok(200, false),
            ),
            (
                "close-delimited, empty",
                b"HTTP/1.1 200 OK\r\n\r\n",
                ok(200, false),
            ),
            (
                "transfer coding not chunked: to the close",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\nabcdef",
                ok(200, false),
            ),
            (
                "interim responses first",
                b"HTTP/1.1 100 Continue\r\n\r\n\
                  HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n\
                  HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
                ok(201, true),
            ),
            (
                "no content",
                b"HTTP/1.1 204 No Content\r\n\r\n",
                ok(204, true),
            ),
            (
                "not modified with a length but no body",
                b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
                ok(304, true),
            ),
            (
                "error status with a body",
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy",
                ok(503, true),
            ),
            (
                "connection: close",
                b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 2\r\n\r\nok",
                ok(200, false),
            ),
            (
                "HTTP/1.0",
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
                ok(200, false),
            ),
            (
                "HTTP/1.0 keep-alive",
                b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
                ok(200, true),
            ),
            (
                "chunked and a length: chunked wins, then close",
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n\
                  2\r\nok\r\n0\r\n\r\n",
                ok(200, false),
            ),
        ];
        for (name, bytes, expected) in cases {
            for splits in cuts(bytes) {
                let got = read(bytes, &splits).await;
                assert_eq!(
                    got.as_ref().ok(),
                    Some(expected),
                    "{name}, split at {splits:?}: {got:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn bytes_after_the_response_end_reuse() {
        // Received with the response: this connection is out of step with its requests.
        // (Bytes arriving later are `Conn::is_closed`'s to see.)
        let bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n";
        for split in [0, 10, 38, 39, 41] {
            assert_eq!(read(bytes, &[split]).await.unwrap(), ok(200, false));
        }
    }

    #[tokio::test]
    async fn refuses_malformed_responses_at_every_split() {
        let cases: &[(&str, &[u8], &str)] = &[
            ("nothing", b"", "closed before a response"),
            (
                "cut in the head",
                b"HTTP/1.1 200 OK\r\ncontent-le",
                "closed after 27 bytes of the response head",
            ),
            (
                "bad status line",
                b"HTTP/1.1 2x0 OK\r\n\r\n",
                "malformed response head",
            ),
            (
                "not http",
                b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
                "malformed response head",
            ),
            (
                "status below 100",
                b"HTTP/1.1 099 Low\r\n\r\n",
                "invalid status code 99",
            ),
            (
                "unasked upgrade",
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
                "101 switching protocols",
            ),
            (
                "negative length",
                b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                "invalid content-length \"-1\"",
            ),
            (
                "length with junk",
                b"HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\nx",
                "invalid content-length",
            ),
            (
                "different lengths",
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
                "invalid content-length \"3\"",
            ),
            (
                "empty length",
                b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
                "invalid content-length \"\"",
            ),
            (
                "length over 64 bits",
                b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551616\r\n\r\n",
                "invalid content-length",
            ),
            (
                "truncated body",
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
                "connection closed after 10 of 100 body bytes",
            ),
            (
                "bad chunk size",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                "malformed chunked body: invalid chunk size",
            ),
            (
                "chunk longer than its size",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
                "malformed chunked body: chunk data longer than its size",
            ),
            (
                "cut in a chunk",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
                "closed inside the chunked body",
            ),
            (
                "no last chunk",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
                "closed inside the chunked body",
            ),
            (
                "cut in the trailers",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-t: 1\r\n",
                "closed inside the chunked body",
            ),
            (
                "cut after an interim response",
                b"HTTP/1.1 100 Continue\r\n\r\n",
                "closed before a response",
            ),
        ];
        for (name, bytes, message) in cases {
            for splits in cuts(bytes) {
                let got = read(bytes, &splits).await;
                let error = match got {
                    Err(error @ CallError::Response(_)) => error,
                    other => panic!("{name}, split at {splits:?}: {other:?}"),
                };
                assert!(
                    error.chain().contains(message),
                    "{name}, split at {splits:?}: {}",
                    error.chain()
                );
            }
        }
    }

    #[tokio::test]
    async fn bounds_the_head() {
        let mut head = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        head.resize(MAX_HEAD + 100, b'a');
        head.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        for splits in [vec![], vec![10], vec![MAX_HEAD - 1]] {
            let err = read(&head, &splits).await.unwrap_err();
            assert!(
                matches!(err, CallError::Response(ResponseError::HeadTooLarge(_))),
                "{err:?}"
            );
        }
        // Just under the bound is fine.
        let mut head = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        head.resize(MAX_HEAD - 100, b'a');
        head.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(read(&head, &[3000]).await.unwrap(), ok(200, true));
        let many: Vec<u8> = b"HTTP/1.1 200 OK\r\n"
            .iter()
            .copied()
            .chain(b"x: y\r\n".repeat(MAX_FIELDS + 1))
            .chain(b"\r\n".iter().copied())
            .collect();
        let err = read(&many, &[]).await.unwrap_err();
        assert!(err.chain().contains("too many headers"), "{}", err.chain());
    }

    #[tokio::test]
    async fn reads_large_bodies_through_a_bounded_buffer() {
        let body = vec![b'x'; 1 << 20];
        let mut length = b"HTTP/1.1 200 OK\r\ncontent-length: 1048576\r\n\r\n".to_vec();
        length.extend_from_slice(&body);
        let mut chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for piece in body.chunks(100_000) {
            chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            chunked.extend_from_slice(piece);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let mut close = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        close.extend_from_slice(&body);
        for (bytes, reusable) in [(length, true), (chunked, true), (close, false)] {
            let mut reader = ResponseReader::new();
            let mut script = Script::split(&bytes, &[]);
            let got = reader.read(&mut script).await.unwrap();
            assert_eq!(got, ok(200, reusable));
            assert_eq!(
                reader.buf.len(),
                MAX_HEAD,
                "grown for a large body, bounded"
            );
        }
    }

    /// Over a real socket the body past the buffer is dropped in the kernel: exactly the
    /// body, so the response behind it on the same connection is read whole, and a body
    /// cut short by the close is still an error with the count that arrived.
    #[tokio::test]
    async fn drains_tcp_bodies_up_to_their_end() {
        use tokio::io::AsyncWriteExt;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 1048576\r\n\r\n".to_vec();
            bytes.extend(std::iter::repeat_n(b'x', 1 << 20));
            bytes.extend_from_slice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\ngone");
            // Both in one go: the 404 sits right behind the first body in the queue.
            socket.write_all(&bytes).await.unwrap();
            // The next request, then a body cut short by the close.
            let mut request = [0u8; 1];
            socket.read_exact(&mut request).await.unwrap();
            let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 300000\r\n\r\n".to_vec();
            bytes.extend(std::iter::repeat_n(b'y', 100_000));
            socket.write_all(&bytes).await.unwrap();
            socket.shutdown().await.unwrap();
        });
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut reader = ResponseReader::new();
        assert_eq!(reader.read(&mut stream).await.unwrap(), ok(200, true));
        assert_eq!(reader.read(&mut stream).await.unwrap(), ok(404, true));
        stream.write_all(b"?").await.unwrap();
        let err = reader.read(&mut stream).await.unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Response(ResponseError::Truncated {
                    expected: 300_000,
                    got: 100_000
                })
            ),
            "{err:?}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn reuses_the_buffer_for_the_next_response() {
        let mut reader = ResponseReader::new();
        let first = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        let second = b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\ngone";
        for _ in 0..3 {
            let got = reader.read(&mut Script::split(first, &[7])).await;
            assert_eq!(got.unwrap(), ok(200, true));
            let got = reader.read(&mut Script::split(second, &[])).await;
            assert_eq!(got.unwrap(), ok(404, true));
            assert_eq!((reader.start, reader.end), (0, 0));
        }
        assert_eq!(reader.buf.len(), INITIAL_BUFFER);
    }

    #[tokio::test]
    async fn socket_errors_are_io_errors() {
        let mut script = Script::split(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc", &[]);
        script.then = Some(io::ErrorKind::ConnectionReset);
        let err = ResponseReader::new().read(&mut script).await.unwrap_err();
        assert!(matches!(err, CallError::Io { .. }), "{err:?}");
        assert_eq!(
            err.chain(),
            "connection failed while reading the response: connection reset"
        );
    }
}
