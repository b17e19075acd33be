//! A response on its way out ([`MessageWriter`]): the encoded head and then the body, with
//! vectored writes.
//!
//! Frames are gathered while the body has them ready (until [`HIGH_WATER`] is buffered) and
//! written in one `writev`, and nothing waits in a buffer while the body is not ready.
//! Small parts are copied behind the head instead (up to [`COPY_SMALL`]), so a small
//! response leaves in one plain `send`: cheaper in the kernel than a `writev` of two parts.
//! A body in a file goes by `sendfile`, a spliceable one through a pipe. A body that fails,
//! or that disagrees with its declared length, is cut after what was already written: the
//! connection closes without the chunked terminator or short of the content-length, which
//! is how the client sees a truncation. A client that stops reading is cut after
//! `idle_timeout` without write progress.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use tokio::io::AsyncWrite;
use tokio::time::Sleep;
use tracing::debug;

use super::pipes::Pipe;
use super::transport::SendFile;
use crate::body::ResponseBody;

/// Ready body frames are gathered while less than this is buffered, so one write carries
/// at most this plus one frame; nothing waits for frames that are not ready. Room for a
/// head and two of an upstream connection's largest reads (64 KiB): at 64 KiB a 100 KiB
/// body whose head and first read passed the limit left in two writes, and with
/// `TCP_NODELAY` each write ends in a segment of its own, so the first sent a runt of a
/// few dozen bytes past one loopback segment (measured in `bench/RESULTS.md`, stop 36).
const HIGH_WATER: usize = 128 * 1024;
/// The end of a chunked body (no trailers).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Body parts up to this size are copied behind the head rather than written as parts of
/// their own. Measured at 1 KiB (a pass-through call: ~1 µs less kernel time with one
/// `send` than with a two-part `writev`, bf6a77b); 4 KiB is a bound chosen, not measured.
pub(super) const COPY_SMALL: usize = 4 * 1024;
/// The head's buffer grows with copied parts up to this size.
const HEAD_ROOM: usize = 8 * 1024;

/// Most parts gathered for one vectored write (a chunked body takes three per frame).
const PARTS: usize = 12;

/// A response on its way out: the encoded head, then body frames gathered into one vectored
/// write while they are ready. The first attempt runs where the response appeared, with
/// nothing allocated for it; a response that has to wait (a streaming body, a full socket)
/// is boxed for the rest, so a connection's own future stays small.
pub(crate) struct MessageWriter {
    head: Vec<u8>,
    /// Bytes of `head` already written.
    head_sent: usize,
    /// Body parts (data, and chunk framing) waiting to be written, in order.
    parts: [Bytes; PARTS],
    /// How many of `parts` are in use.
    queued: usize,
    /// Head and body bytes waiting to be written.
    buffered: usize,
    /// The body, until it ended (or failed).
    body: Option<ResponseBody>,
    /// The content-length stated in the head.
    declared: Option<u64>,
    chunked: bool,
    /// Body bytes queued so far.
    sent: u64,
    /// The body failed or disagreed with its length: the message is cut.
    cut: bool,
    /// Running while writes make no progress (the client does not read).
    stall: Option<Pin<Box<Sleep>>>,
    idle_timeout: Duration,
    /// The pipe a spliced body goes through (see [`MessageWriter::splice_part`]); `None`
    /// until the first splice, or when none could be had.
    pipe: Option<Pipe>,
    /// No pipe could be had, or splicing is off (`server.splice_bodies`): the body is
    /// written as frames.
    no_pipe: bool,
}

impl Drop for MessageWriter {
    fn drop(&mut self) {
        super::heads::give(std::mem::take(&mut self.head));
    }
}

impl MessageWriter {
    /// A message of the encoded `head` and then `body` (none for a bodiless response),
    /// framed by `declared` length or `chunked`.
    pub(super) fn new(
        head: Vec<u8>,
        body: Option<ResponseBody>,
        declared: Option<u64>,
        chunked: bool,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            buffered: head.len(),
            head,
            head_sent: 0,
            parts: Default::default(),
            queued: 0,
            body,
            declared,
            chunked,
            sent: 0,
            cut: false,
            stall: None,
            idle_timeout,
            pipe: None,
            no_pipe: false,
        }
    }

    /// Whether a spliceable body may go through a pipe (`server.splice_bodies`; on unless
    /// said otherwise): off, it is read and written as frames.
    pub(super) fn splicing(mut self, on: bool) -> Self {
        self.no_pipe = !on;
        self
    }

    /// Writes what it can; `Ready(true)` once the whole message is out, `Ready(false)` when
    /// it was cut or the socket failed.
    pub(super) fn poll_write<S: AsyncWrite + SendFile + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        // A file body goes to a plain socket by `sendfile` once the head is out (not chunked:
        // chunk framing would sit between the file's bytes).
        let by_file = !self.chunked
            && io.can_send_file()
            && self
                .body
                .as_mut()
                .is_some_and(|body| body.as_file().is_some());
        // A spliceable body of a stated length goes to a plain socket through a pipe once
        // the bytes read ahead of it are out (its frames until then).
        let by_splice = !by_file && self.declared.is_some() && io.can_send_file();
        loop {
            let splice_now = by_splice
                && !self.no_pipe
                && (self.pipe.as_ref().is_some_and(|pipe| pipe.held > 0)
                    || self
                        .body
                        .as_mut()
                        .and_then(ResponseBody::as_spliced)
                        .is_some_and(|body| body.can_splice()));
            if by_file {
                if self.buffered == 0 && self.body.is_some() {
                    let sent = self.send_file_part(io, cx);
                    match self.settle(sent, cx, "sending the response's file") {
                        None => continue,
                        Some(done) => return done,
                    }
                }
            } else if splice_now {
                if self.buffered == 0 {
                    match self.splice_part(io, cx) {
                        None => continue,
                        Some(done) => return done,
                    }
                }
            } else if self.buffered < HIGH_WATER && self.queued + 3 <= PARTS {
                if let Some(body) = self.body.as_mut() {
                    match Pin::new(body).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Ok(data) = frame.into_data() {
                                self.queue_data(data);
                            }
                            continue;
                        }
                        Poll::Ready(Some(Err(error))) => self.body_failed(&error),
                        Poll::Ready(None) => {
                            self.body = None;
                            if self.declared.is_some_and(|len| self.sent < len) {
                                debug!(
                                    sent = self.sent,
                                    "response body shorter than its length; cutting the response"
                                );
                                self.cut = true;
                            } else if self.chunked {
                                self.push(Bytes::from_static(LAST_CHUNK));
                            }
                        }
                        Poll::Pending if self.buffered == 0 => return Poll::Pending,
                        Poll::Pending => {}
                    }
                }
            }
            if self.buffered > 0 {
                let written = self.write_some(io, cx);
                match self.settle(written, cx, "writing the response") {
                    None => continue,
                    Some(done) => return done,
                }
            }
            if self.body.is_none() {
                return match Pin::new(&mut *io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => Poll::Ready(!self.cut),
                    Poll::Ready(Err(_)) => Poll::Ready(false),
                    Poll::Pending => Poll::Pending,
                };
            }
        }
    }

    /// What a write's outcome means for [`MessageWriter::poll_write`]: `None` to go on
    /// (it made progress), else what to return: failure, or `Pending` while the socket is
    /// full (see [`MessageWriter::stalled`]).
    fn settle(
        &mut self,
        written: Poll<io::Result<()>>,
        cx: &mut Context<'_>,
        what: &'static str,
    ) -> Option<Poll<bool>> {
        match written {
            Poll::Ready(Ok(())) => {
                self.stall = None;
                None
            }
            Poll::Ready(Err(error)) => {
                debug!(error = %error, "{what} failed");
                Some(Poll::Ready(false))
            }
            Poll::Pending => Some(self.stalled(cx)),
        }
    }

    /// The socket takes no more for now: `Pending`, unless the client has not read for
    /// `idle_timeout` (then the message is given up).
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let idle_timeout = self.idle_timeout;
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle_timeout)));
        if timer.as_mut().poll(cx).is_ready() {
            debug!("response not read by the client within idle_timeout; closing");
            return Poll::Ready(false);
        }
        Poll::Pending
    }

    /// One `sendfile` of the file body's rest, within the declared length; at its end the
    /// body is done (and cut when the file was shorter or longer than declared).
    fn send_file_part<S: SendFile>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let Some(file) = self.body.as_mut().and_then(ResponseBody::as_file) else {
            return Poll::Ready(Ok(()));
        };
        let room = self.declared.map_or(u64::MAX, |len| len - self.sent);
        let len = file.remaining().min(room);
        if len == 0 {
            if file.remaining() > 0 {
                self.end_body("response file", Some("longer than its length"));
            } else if self.declared.is_some_and(|declared| self.sent < declared) {
                self.end_body("response file", Some("shorter than its length"));
            } else {
                self.end_body("response file", None);
            }
            return Poll::Ready(Ok(()));
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let sent = ready!(io.poll_send_file(cx, file.file(), file.offset(), len))?;
        if sent == 0 {
            self.end_body("response file", Some("ended before its length"));
            return Poll::Ready(Ok(()));
        }
        file.advance(sent as u64);
        self.sent += sent as u64;
        Poll::Ready(Ok(()))
    }

    /// One step of a spliced body: the pipe's bytes out to the client when it holds some,
    /// else the body's next bytes into the pipe (within the declared length). `None` to go
    /// on, else what [`MessageWriter::poll_write`] returns: `Pending` while the client's
    /// socket is full (with the idle timer, as any write) or the body has no bytes yet.
    fn splice_part<S: SendFile>(&mut self, io: &mut S, cx: &mut Context<'_>) -> Option<Poll<bool>> {
        let pipe = match &mut self.pipe {
            Some(pipe) => pipe,
            None => match Pipe::take() {
                Some(pipe) => self.pipe.insert(pipe),
                None => {
                    self.no_pipe = true;
                    return None;
                }
            },
        };
        // A pipe in use always has its ends (they leave it only when it is dropped); were
        // one missing, the message fails rather than the loop going round without progress.
        let capacity = pipe.capacity();
        let (Some(read_end), Some(write_end)) = (pipe.read_end(), pipe.write_end()) else {
            return Some(Poll::Ready(false));
        };
        if pipe.held > 0 {
            return match io.poll_splice_from(cx, read_end, pipe.held) {
                Poll::Ready(Ok(0)) => {
                    debug!("the client's socket took no spliced bytes; closing");
                    Some(Poll::Ready(false))
                }
                Poll::Ready(Ok(sent)) => {
                    pipe.held -= sent;
                    self.stall = None;
                    None
                }
                written => self.settle(written.map_ok(|_| ()), cx, "splicing the response"),
            };
        }
        let room = self.declared.map_or(0, |len| len - self.sent);
        let body = self.body.as_mut().and_then(ResponseBody::as_spliced)?;
        if room == 0 {
            let longer = body.can_splice();
            self.end_body(
                "spliced response body",
                longer.then_some("longer than its length"),
            );
            return None;
        }
        let max = usize::try_from(room).map_or(capacity, |room| room.min(capacity));
        match body.poll_splice_to(cx, write_end, max) {
            Poll::Pending => Some(Poll::Pending),
            Poll::Ready(Ok(0)) => {
                self.end_body("spliced response body", Some("shorter than its length"));
                None
            }
            Poll::Ready(Ok(moved)) => {
                pipe.held = moved;
                self.sent += moved as u64;
                None
            }
            Poll::Ready(Err(error)) => {
                self.body_failed(&error);
                None
            }
        }
    }

    /// The body failed (read as frames or spliced): the response is cut after what went.
    fn body_failed(&mut self, error: &crate::body::BoxError) {
        debug!(error = %crate::error::error_chain(&**error), "response body failed; cutting the response");
        self.cut = true;
        self.body = None;
    }

    /// A file or spliced body (`what`) is done: whole, or cut for the reason given.
    fn end_body(&mut self, what: &'static str, cut: Option<&'static str>) {
        if let Some(why) = cut {
            debug!(sent = self.sent, "{what} {why}; cutting the response");
            self.cut = true;
        }
        self.body = None;
    }

    /// Queues a data frame with its framing.
    fn queue_data(&mut self, mut data: Bytes) {
        if data.is_empty() {
            return;
        }
        if let Some(len) = self.declared {
            let room = len - self.sent;
            if data.len() as u64 > room {
                // Longer than declared: send what fits, then cut.
                data.truncate(room as usize);
                self.cut = true;
                self.body = None;
            }
        }
        self.sent += data.len() as u64;
        if self.chunked {
            let mut size = Vec::with_capacity(18);
            super::write_hex(data.len(), &mut size);
            size.extend_from_slice(b"\r\n");
            self.push(Bytes::from(size));
            self.push(data);
            self.push(Bytes::from_static(b"\r\n"));
        } else if !data.is_empty() {
            self.push(data);
        }
    }

    fn push(&mut self, part: Bytes) {
        self.buffered += part.len();
        if self.queued == 0 && part.len() <= COPY_SMALL && self.head.len() + part.len() <= HEAD_ROOM
        {
            // Nothing queued after the head: a small part goes into the head's buffer, so
            // the message leaves in a plain `send` (see `COPY_SMALL`).
            if self.head_sent == self.head.len() {
                self.head.clear();
                self.head_sent = 0;
            }
            self.head.extend_from_slice(&part);
            return;
        }
        self.parts[self.queued] = part;
        self.queued += 1;
    }

    /// One write of the head's rest and the queued parts (vectored when there are parts).
    fn write_some<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let written = if self.queued == 0 {
            // Everything waiting is in the head's buffer: a plain write.
            ready!(Pin::new(&mut *io).poll_write(cx, &self.head[self.head_sent..]))?
        } else {
            let mut slices = [io::IoSlice::new(&[]); PARTS + 1];
            let mut count = 0;
            if self.head_sent < self.head.len() {
                slices[0] = io::IoSlice::new(&self.head[self.head_sent..]);
                count = 1;
            }
            for part in &self.parts[..self.queued] {
                slices[count] = io::IoSlice::new(part);
                count += 1;
            }
            ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?
        };
        if written == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        self.buffered -= written;
        let mut left = written;
        let from_head = left.min(self.head.len() - self.head_sent);
        self.head_sent += from_head;
        left -= from_head;
        let done = wharf_http1::advance_parts(&mut self.parts[..self.queued], left);
        if done > 0 {
            self.parts[..self.queued].rotate_left(done);
            self.queued -= done;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the tests dial their own listeners
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use std::fs::File;
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Records every write: whether it was vectored, and the bytes it took (at most
    /// `max_per_call` a time, to exercise partial writes).
    struct Recorder {
        calls: Vec<(bool, usize)>,
        bytes: Vec<u8>,
        max_per_call: usize,
    }

    impl Recorder {
        fn new(max_per_call: usize) -> Self {
            Self {
                calls: Vec::new(),
                bytes: Vec::new(),
                max_per_call,
            }
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.max_per_call);
            self.bytes.extend_from_slice(&buf[..n]);
            self.calls.push((false, n));
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            slices: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut n = 0;
            for slice in slices {
                let take = slice.len().min(self.max_per_call - n);
                self.bytes.extend_from_slice(&slice[..take]);
                n += take;
            }
            self.calls.push((true, n));
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Copies through `write`, as TLS does.
    impl SendFile for Recorder {}

    fn write_all(mut writer: MessageWriter, io: &mut Recorder) -> bool {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match writer.poll_write(io, &mut cx) {
            Poll::Ready(done) => done,
            Poll::Pending => panic!("a ready body and a ready socket finish in one poll"),
        }
    }

    fn streamed(frames: &[&'static [u8]]) -> ResponseBody {
        let frames: Vec<Result<Frame<Bytes>, crate::body::BoxError>> = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f))))
            .collect();
        ResponseBody::new(StreamBody::new(stream::iter(frames)))
    }

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 1024\r\n\r\n";

    #[test]
    fn a_small_response_leaves_in_one_plain_write() {
        let body = vec![b'x'; 1024];
        let writer = MessageWriter::new(
            HEAD.to_vec(),
            Some(ResponseBody::full(body.clone())),
            Some(1024),
            false,
            Duration::from_secs(1),
        );
        let mut io = Recorder::new(usize::MAX);
        assert!(write_all(writer, &mut io));
        assert_eq!(io.calls, vec![(false, HEAD.len() + 1024)]);
        assert_eq!(io.bytes, [HEAD, &body[..]].concat());
    }

    #[test]
    fn a_large_body_is_not_copied_but_written_vectored() {
        let body = vec![b'y'; 100 * 1024];
        let writer = MessageWriter::new(
            HEAD.to_vec(),
            Some(ResponseBody::full(body.clone())),
            Some(body.len() as u64),
            false,
            Duration::from_secs(1),
        );
        let mut io = Recorder::new(usize::MAX);
        assert!(write_all(writer, &mut io));
        assert_eq!(io.calls, vec![(true, HEAD.len() + body.len())]);
        assert_eq!(io.bytes, [HEAD, &body[..]].concat());
    }

    #[test]
    fn a_body_in_two_full_reads_leaves_in_one_write() {
        // A relayed body as an upstream reads it: one read of 64 KiB less its head, and the
        // rest. Together with the head the first read alone is past 64 KiB, and both are
        // ready: one vectored write takes all, not one per read.
        let first: &'static [u8] = vec![b'a'; 64 * 1024 - 20].leak();
        let rest: &'static [u8] = vec![b'b'; 37 * 1024].leak();
        let len = first.len() + rest.len();
        let writer = MessageWriter::new(
            HEAD.to_vec(),
            Some(streamed(&[first, rest])),
            Some(len as u64),
            false,
            Duration::from_secs(1),
        );
        let mut io = Recorder::new(usize::MAX);
        assert!(write_all(writer, &mut io));
        assert_eq!(io.calls, vec![(true, HEAD.len() + len)]);
        assert_eq!(io.bytes, [HEAD, first, rest].concat());
    }

    #[test]
    fn partial_writes_keep_order_across_copied_and_queued_parts() {
        // Small frames are copied behind the head, a large one is queued after them;
        // a socket taking 7 bytes a time must still see every byte once, in order.
        let big: &'static [u8] = &[b'b'; 5000];
        let writer = MessageWriter::new(
            b"HEAD\r\n".to_vec(),
            Some(streamed(&[b"one", b"two", big, b"three"])),
            None,
            true,
            Duration::from_secs(1),
        );
        let mut io = Recorder::new(7);
        assert!(write_all(writer, &mut io));
        let expected = [
            &b"HEAD\r\n"[..],
            b"3\r\none\r\n",
            b"3\r\ntwo\r\n",
            b"1388\r\n",
            big,
            b"\r\n5\r\nthree\r\n0\r\n\r\n",
        ]
        .concat();
        assert_eq!(
            String::from_utf8_lossy(&io.bytes),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn a_body_longer_than_declared_is_cut_after_the_declared_bytes() {
        let writer = MessageWriter::new(
            b"H\r\n".to_vec(),
            Some(ResponseBody::full(&b"0123456789"[..])),
            Some(4),
            false,
            Duration::from_secs(1),
        );
        let mut io = Recorder::new(usize::MAX);
        assert!(!write_all(writer, &mut io), "a cut message reports failure");
        assert_eq!(io.bytes, b"H\r\n0123");
    }

    /// A body's file, as the cache's sealed bodies are (a memfd).
    struct BodyFile(File);

    impl AsRef<File> for BodyFile {
        fn as_ref(&self) -> &File {
            &self.0
        }
    }

    fn file_of(bytes: &[u8]) -> Arc<BodyFile> {
        use std::io::Write;
        let fd = rustix::fs::memfd_create("test-body", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut file = File::from(fd);
        file.write_all(bytes).unwrap();
        Arc::new(BodyFile(file))
    }

    /// Set when dropped: when a call's guard went.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A file body of `len` bytes behind a call's guard (as `guard_body` puts it), and the
    /// flag that tells the guard went.
    fn guarded_file(file: Arc<BodyFile>, len: u64) -> (ResponseBody, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let response = crate::body::guard_body(
            http::Response::new(ResponseBody::file(file, len)),
            DropFlag(dropped.clone()),
        );
        (response.into_body(), dropped)
    }

    /// A writer of `head` and a file `body` declared `declared` bytes long (not chunked).
    fn file_writer(head: &[u8], body: ResponseBody, declared: u64) -> MessageWriter {
        MessageWriter::new(
            head.to_vec(),
            Some(body),
            Some(declared),
            false,
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_file_body_is_read_in_frames_where_the_socket_cannot_send_files() {
        let body: Vec<u8> = (0..150_000u32).map(|i| i as u8).collect();
        let (file_body, guard_dropped) = guarded_file(file_of(&body), body.len() as u64);
        let writer = file_writer(HEAD, file_body, body.len() as u64);
        let mut io = Recorder::new(usize::MAX);
        assert!(write_all(writer, &mut io));
        assert_eq!(io.bytes, [HEAD, &body[..]].concat());
        assert!(guard_dropped.load(Ordering::SeqCst));
    }

    /// A TCP socket that counts what went through `sendfile` and what through `write`.
    struct Counted {
        socket: tokio::net::TcpStream,
        sent_from_file: usize,
        sent_from_pipe: usize,
        written: usize,
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = ready!(Pin::new(&mut self.socket).poll_write(cx, buf))?;
            self.written += n;
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            slices: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let n = ready!(Pin::new(&mut self.socket).poll_write_vectored(cx, slices))?;
            self.written += n;
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.socket).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.socket).poll_shutdown(cx)
        }
    }

    impl SendFile for Counted {
        fn can_send_file(&self) -> bool {
            self.socket.can_send_file()
        }

        fn poll_send_file(
            &mut self,
            cx: &mut Context<'_>,
            file: &File,
            offset: u64,
            len: usize,
        ) -> Poll<io::Result<usize>> {
            let n = ready!(self.socket.poll_send_file(cx, file, offset, len))?;
            self.sent_from_file += n;
            Poll::Ready(Ok(n))
        }

        fn poll_splice_from(
            &mut self,
            cx: &mut Context<'_>,
            pipe: std::os::fd::BorrowedFd<'_>,
            len: usize,
        ) -> Poll<io::Result<usize>> {
            let n = ready!(self.socket.poll_splice_from(cx, pipe, len))?;
            self.sent_from_pipe += n;
            Poll::Ready(Ok(n))
        }
    }

    /// What the client of [`over_tcp`] read, whether the writer reported the message whole,
    /// and the server socket's counts.
    struct OverTcp {
        received: Vec<u8>,
        whole: bool,
        sent_from_file: usize,
        sent_from_pipe: usize,
        written: usize,
    }

    /// The writer on a real socket pair.
    async fn over_tcp(writer: MessageWriter) -> OverTcp {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
            let mut received = Vec::new();
            client.read_to_end(&mut received).await.unwrap();
            received
        });
        let (socket, _) = listener.accept().await.unwrap();
        let mut server = Counted {
            socket,
            sent_from_file: 0,
            sent_from_pipe: 0,
            written: 0,
        };
        let mut writer = writer;
        let whole = poll_fn(|cx| writer.poll_write(&mut server, cx)).await;
        let Counted {
            socket,
            sent_from_file,
            sent_from_pipe,
            written,
        } = server;
        // Closed, so the client reads to its end.
        drop(socket);
        OverTcp {
            received: reader.await.unwrap(),
            whole,
            sent_from_file,
            sent_from_pipe,
            written,
        }
    }

    #[tokio::test]
    async fn a_file_body_goes_to_a_tcp_socket_whole_and_then_drops_its_guard() {
        // More than a loopback socket takes in one call.
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let (file_body, guard_dropped) = guarded_file(file_of(&body), body.len() as u64);
        let out = over_tcp(file_writer(HEAD, file_body, body.len() as u64)).await;
        assert!(out.whole);
        assert_eq!(out.received.len(), HEAD.len() + body.len());
        assert!(out.received == [HEAD, &body[..]].concat());
        // The head by `write`, every body byte by `sendfile`.
        assert_eq!(out.written, HEAD.len());
        assert_eq!(out.sent_from_file, body.len());
        assert!(guard_dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_file_that_disagrees_with_the_declared_length_is_cut() {
        let body = vec![b'f'; 40_000];
        // Longer than declared: the declared bytes, then the cut.
        let file_body = ResponseBody::file(file_of(&body), body.len() as u64);
        let out = over_tcp(file_writer(b"H\r\n", file_body, 1000)).await;
        assert!(!out.whole, "a cut message reports failure");
        assert_eq!(out.received, [&b"H\r\n"[..], &body[..1000]].concat());

        // The file is shorter than the body said (it ends at 40,000 of 50,000).
        let file_body = ResponseBody::file(file_of(&body), 50_000);
        let out = over_tcp(file_writer(b"H\r\n", file_body, 50_000)).await;
        assert!(!out.whole);
        assert_eq!(out.received, [&b"H\r\n"[..], &body[..]].concat());
    }

    use crate::body::BoxError;

    /// A spliceable body read from a real socket: `ahead` first as a frame (bytes already
    /// read into user space), then up to `remaining` more bytes from `source`, by frames or
    /// spliced; a source that closes early is an error, as an upstream body's is.
    struct SocketBody {
        ahead: Option<Bytes>,
        source: tokio::net::TcpStream,
        remaining: u64,
    }

    impl Body for SocketBody {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            if let Some(ahead) = self.ahead.take() {
                return Poll::Ready(Some(Ok(Frame::data(ahead))));
            }
            if self.remaining == 0 {
                return Poll::Ready(None);
            }
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                ready!(self.source.poll_read_ready(cx))?;
                match self.source.try_read(&mut buf) {
                    Ok(0) => return Poll::Ready(Some(Err("source closed early".into()))),
                    Ok(n) => {
                        self.remaining -= n as u64;
                        buf.truncate(n);
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))));
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(error) => return Poll::Ready(Some(Err(error.into()))),
                }
            }
        }
    }

    impl crate::body::SpliceBody for SocketBody {
        fn can_splice(&self) -> bool {
            self.ahead.is_none() && self.remaining > 0
        }

        fn poll_splice_to(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            pipe: std::os::fd::BorrowedFd<'_>,
            max: usize,
        ) -> Poll<Result<usize, BoxError>> {
            use rustix::pipe::{splice, SpliceFlags};
            if self.remaining == 0 {
                return Poll::Ready(Ok(0));
            }
            let len = usize::try_from(self.remaining).unwrap().min(max);
            loop {
                ready!(self.source.poll_read_ready(cx))?;
                let moved = self.source.try_io(tokio::io::Interest::READABLE, || {
                    splice(&self.source, None, pipe, None, len, SpliceFlags::NONBLOCK)
                        .map_err(io::Error::from)
                });
                match moved {
                    Ok(0) => return Poll::Ready(Err("source closed early".into())),
                    Ok(n) => {
                        self.remaining -= n as u64;
                        return Poll::Ready(Ok(n));
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(error) => return Poll::Ready(Err(error.into())),
                }
            }
        }
    }

    /// A connected socket that is sent `bytes` (then closed) by a task of its own.
    async fn source_sending(bytes: Vec<u8>) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.unwrap();
            peer.write_all(&bytes).await.unwrap();
        });
        tokio::net::TcpStream::connect(address).await.unwrap()
    }

    #[tokio::test]
    async fn a_spliceable_body_goes_through_a_pipe_after_its_read_ahead_bytes() {
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let (ahead, rest) = body.split_at(1000);
        let dropped = Arc::new(AtomicBool::new(false));
        let spliced = ResponseBody::spliced(Box::pin(SocketBody {
            ahead: Some(Bytes::copy_from_slice(ahead)),
            source: source_sending(rest.to_vec()).await,
            remaining: rest.len() as u64,
        }));
        let guarded =
            crate::body::guard_body(http::Response::new(spliced), DropFlag(dropped.clone()));
        let out = over_tcp(file_writer(HEAD, guarded.into_body(), body.len() as u64)).await;
        assert!(out.whole);
        assert!(out.received == [HEAD, &body[..]].concat());
        // The head and the read-ahead bytes by `write`, every other body byte by `splice`.
        assert_eq!(out.written, HEAD.len() + ahead.len());
        assert_eq!(out.sent_from_pipe, rest.len());
        assert!(
            dropped.load(Ordering::SeqCst),
            "the guard goes with the last byte"
        );
    }

    #[tokio::test]
    async fn with_splicing_off_a_spliceable_body_is_read_and_written() {
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let spliced = ResponseBody::spliced(Box::pin(SocketBody {
            ahead: None,
            source: source_sending(body.clone()).await,
            remaining: body.len() as u64,
        }));
        let writer = file_writer(HEAD, spliced, body.len() as u64).splicing(false);
        let out = over_tcp(writer).await;
        assert!(out.whole);
        assert!(out.received == [HEAD, &body[..]].concat());
        assert_eq!(out.sent_from_pipe, 0);
        assert_eq!(out.written, HEAD.len() + body.len());
    }

    #[tokio::test]
    async fn a_spliced_body_that_ends_early_is_cut_after_the_bytes_it_had() {
        let rest = vec![b's'; 200_000];
        let spliced = ResponseBody::spliced(Box::pin(SocketBody {
            ahead: None,
            source: source_sending(rest.clone()).await,
            remaining: 300_000,
        }));
        let out = over_tcp(file_writer(b"H\r\n", spliced, 300_000)).await;
        assert!(!out.whole, "a cut message reports failure");
        assert_eq!(out.received, [&b"H\r\n"[..], &rest[..]].concat());
        assert_eq!(out.sent_from_pipe, rest.len());
    }
}
