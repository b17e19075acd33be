//! The response body type every service returns, and small constructors.

use std::any::Any;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

/// The error a streamed response body may end with. Ending with an error
/// makes the host abort the response (close the connection, or omit the
/// chunked terminator), which is how a truncated origin body reaches the
/// client as a truncation.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: fixed bytes, the contents of a file, or a stream of chunks.
///
/// Fixed bytes (an error answer, a cached object) are held as they are, with no box; so is
/// a file ([`ResponseBody::file`]), which a plain socket sends without copying it through
/// user space. Any other body is boxed ([`ResponseBody::new`], or `From` a boxed body).
pub struct ResponseBody(Kind);

enum Kind {
    /// Bytes not handed out yet (`None` once they were).
    Full(Option<Bytes>),
    /// A file's bytes.
    File(FileBody),
    /// Bytes a socket can hand on (see [`SpliceBody`]).
    Spliced(SplicedBody),
    /// Any other body.
    Boxed(UnsyncBoxBody<Bytes, BoxError>),
    /// A body its service boxed already.
    Pinned(Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>),
}

impl ResponseBody {
    /// A body holding exactly `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        ResponseBody(Kind::Full((!bytes.is_empty()).then_some(bytes)))
    }

    /// An empty body.
    pub fn empty() -> Self {
        ResponseBody(Kind::Full(None))
    }

    /// A body of the first `len` bytes of `file`, which must not change while the body
    /// lives (a sealed memfd: the cache's stored bodies). The host's HTTP/1.1 writer hands
    /// the file to a TCP or Unix socket with `sendfile(2)`; anything else (TLS, HTTP/2)
    /// reads it in frames of up to [`FILE_FRAME`] bytes.
    pub fn file<F>(file: Arc<F>, len: u64) -> Self
    where
        F: AsRef<File> + Send + Sync + 'static,
    {
        ResponseBody(Kind::File(FileBody {
            file,
            offset: 0,
            end: len,
            guards: Vec::new(),
        }))
    }

    /// The file this body sends, when it is one.
    pub(crate) fn as_file(&mut self) -> Option<&mut FileBody> {
        match &mut self.0 {
            Kind::File(file) => Some(file),
            _ => None,
        }
    }

    /// A body whose bytes may go from the socket they arrive on to the client's without
    /// passing through user space ([`SpliceBody`]): with `server.splice_bodies`, the host's
    /// HTTP/1.1 writer splices them to a plain socket when the body says it can; anything
    /// else reads its frames.
    pub fn spliced<B: SpliceBody + 'static>(body: Pin<Box<B>>) -> Self {
        ResponseBody(Kind::Spliced(SplicedBody {
            body,
            guards: Vec::new(),
        }))
    }

    /// The spliceable body this is, when it is one.
    pub(crate) fn as_spliced(&mut self) -> Option<&mut SplicedBody> {
        match &mut self.0 {
            Kind::Spliced(body) => Some(body),
            _ => None,
        }
    }

    /// Any body of `Bytes` whose errors convert to [`BoxError`].
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        ResponseBody(Kind::Boxed(body.map_err(Into::into).boxed_unsync()))
    }

    /// A body that is boxed already (a service that had to pin it to poll it first): kept
    /// as it is, with no second box around it.
    pub fn pinned<B>(body: Pin<Box<B>>) -> Self
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        ResponseBody(Kind::Pinned(body))
    }
}

impl From<UnsyncBoxBody<Bytes, BoxError>> for ResponseBody {
    fn from(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        ResponseBody(Kind::Boxed(body))
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Kind::Full(bytes) => f
                .debug_tuple("Full")
                .field(&bytes.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::File(file) => f.debug_tuple("File").field(&file.remaining()).finish(),
            Kind::Spliced(_) => f.write_str("Spliced"),
            Kind::Boxed(_) => f.write_str("Boxed"),
            Kind::Pinned(_) => f.write_str("Pinned"),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Kind::File(file) => Poll::Ready(file.read_frame().map(|read| read.map(Frame::data))),
            Kind::Spliced(body) => body.poll_frame(cx),
            Kind::Boxed(body) => Pin::new(body).poll_frame(cx),
            Kind::Pinned(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Full(bytes) => bytes.is_none(),
            Kind::File(file) => file.remaining() == 0,
            Kind::Spliced(body) => body.body.is_end_stream(),
            Kind::Boxed(body) => body.is_end_stream(),
            Kind::Pinned(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::File(file) => SizeHint::with_exact(file.remaining()),
            Kind::Spliced(body) => body.body.size_hint(),
            Kind::Boxed(body) => body.size_hint(),
            Kind::Pinned(body) => body.size_hint(),
        }
    }
}

/// The most bytes a file body reads into one frame when it is read rather than sent.
pub const FILE_FRAME: usize = 64 * 1024;

/// A file body's state: the part of the file not sent yet, and the guards of the call
/// (see [`guard_body`]), dropped when the last byte was handed out.
pub(crate) struct FileBody {
    file: Arc<dyn AsRef<File> + Send + Sync>,
    offset: u64,
    end: u64,
    guards: Vec<Box<dyn Any + Send>>,
}

impl FileBody {
    /// The file.
    pub(crate) fn file(&self) -> &File {
        (*self.file).as_ref()
    }

    /// Where the part not sent yet starts.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes not sent yet.
    pub(crate) fn remaining(&self) -> u64 {
        self.end - self.offset
    }

    /// Counts `sent` bytes as sent (by the writer's `sendfile`); the guards go with the last.
    pub(crate) fn advance(&mut self, sent: u64) {
        self.offset = (self.offset + sent).min(self.end);
        if self.offset == self.end {
            self.guards.clear();
        }
    }

    /// The next frame read from the file; `None` at the end. A file shorter than the body
    /// said is an error (the writer cuts the response).
    fn read_frame(&mut self) -> Option<Result<Bytes, BoxError>> {
        if self.remaining() == 0 {
            self.guards.clear();
            return None;
        }
        let len = usize::try_from(self.remaining()).map_or(FILE_FRAME, |left| left.min(FILE_FRAME));
        let mut frame = vec![0u8; len];
        match self.file().read_at(&mut frame, self.offset) {
            Ok(read) if read > 0 => {
                frame.truncate(read);
                self.advance(read as u64);
                Some(Ok(Bytes::from(frame)))
            }
            read => {
                self.guards.clear();
                let error = read.err().unwrap_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the body's file ended early",
                    )
                });
                Some(Err(error.into()))
            }
        }
    }
}

/// A body whose bytes can be moved from the socket they arrive on through a pipe with
/// `splice(2)` (the rest of an upstream response of a stated length, on a plain socket),
/// besides being read as frames. Bytes already read into user space come as frames first;
/// [`SpliceBody::can_splice`] says when the rest can be spliced.
pub trait SpliceBody: Body<Data = Bytes, Error = BoxError> + Send {
    /// Whether the next bytes can be spliced now (else they come as frames).
    fn can_splice(&self) -> bool;

    /// Moves up to `max` of the next bytes into `pipe` (empty, non-blocking); how many it
    /// moved, 0 once the body is complete.
    fn poll_splice_to(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        max: usize,
    ) -> Poll<Result<usize, BoxError>>;
}

/// A spliceable body and the guards of the call (see [`guard_body`]), dropped when it ended
/// (or failed).
pub(crate) struct SplicedBody {
    body: Pin<Box<dyn SpliceBody>>,
    guards: Vec<Box<dyn Any + Send>>,
}

impl SplicedBody {
    /// Whether the next bytes can be spliced now.
    pub(crate) fn can_splice(&self) -> bool {
        self.body.can_splice()
    }

    /// See [`SpliceBody::poll_splice_to`]; the guards go at the end or on an error.
    pub(crate) fn poll_splice_to(
        &mut self,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let moved = self.body.as_mut().poll_splice_to(cx, pipe, max);
        if matches!(moved, Poll::Ready(Ok(0) | Err(_))) {
            self.guards.clear();
        }
        moved
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = self.body.as_mut().poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            self.guards.clear();
        }
        frame
    }
}

/// A body holding exactly `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    ResponseBody::full(bytes)
}

/// An empty body.
pub fn empty() -> ResponseBody {
    ResponseBody::empty()
}

pin_project_lite::pin_project! {
    /// A response body that holds `guard` until the body ends, fails or is
    /// dropped (client gone): how a call's slot, counters and in-flight
    /// entry last exactly as long as its response.
    ///
    /// It also makes a failure visible as a truncation: hyper keeps polling
    /// a body while its frames are ready and only then flushes, and a body
    /// error drops whatever was not flushed yet, the response head included.
    /// A body that fails right after a data frame (an upstream read in the
    /// call's own task delivers the last bytes and the break together) would
    /// reach the client as a connection closed with no answer. So an error
    /// that follows data without a pause is held back for one poll: the body
    /// reports "not ready" (and wakes itself), hyper flushes what it has, and
    /// the error comes next.
    pub struct GuardedBody<G> {
        #[pin]
        inner: ResponseBody,
        guard: Option<G>,
        // Data went out since the body last said "not ready".
        unflushed: bool,
        // An error held back until hyper flushed.
        held: Option<BoxError>,
    }
}

impl<G> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        let this = self.project();
        if let Some(error) = this.held.take() {
            this.guard.take();
            return Poll::Ready(Some(Err(error)));
        }
        let polled = this.inner.poll_frame(cx);
        match polled {
            Poll::Ready(Some(Err(error))) if *this.unflushed => {
                *this.unflushed = false;
                *this.held = Some(error);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                *this.unflushed = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None | Some(Err(_))) => {
                this.guard.take();
                polled
            }
            Poll::Pending => {
                *this.unflushed = false;
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Makes `response`'s body hold `guard` until it is done.
pub fn guard_body<G: Send + 'static>(
    response: http::Response<ResponseBody>,
    guard: G,
) -> http::Response<ResponseBody> {
    response.map(|mut inner| {
        match &mut inner.0 {
            // A file body and a spliceable one keep their guards themselves and stay what
            // they are for the writer's `sendfile` or `splice`; the guards drop after the
            // last byte, as a guarded stream's do.
            Kind::File(file) => {
                file.guards.push(Box::new(guard));
                return inner;
            }
            Kind::Spliced(body) => {
                body.guards.push(Box::new(guard));
                return inner;
            }
            _ => {}
        }
        ResponseBody::from(
            GuardedBody {
                inner,
                guard: Some(guard),
                unflushed: false,
                held: None,
            }
            .boxed_unsync(),
        )
    })
}
