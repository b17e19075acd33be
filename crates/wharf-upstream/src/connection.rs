//! One HTTP/1.1 connection to an upstream, and one exchange on it.
//!
//! [`Connection::send`] writes the request (head, then the body streamed with its own framing)
//! and reads the response head; the returned [`ResponseBody`] reads the body from the same
//! socket when polled, and puts the connection back in its pool once the body has been read
//! to its end. Everything happens in the task that polls: no connection task, no channel, no
//! wake-up of another thread between the upstream's bytes and the client's socket.
//!
//! Memory: the read buffer is allocated only once the socket is readable, so a call waiting
//! for a slow upstream holds none; its size adapts to the reads (8 KiB up to 64 KiB).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Response};
use http_body::Body;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::body::ResponseBody;
use crate::error::{SendError, UpstreamError};
use crate::exchange::Exchange;
use crate::pool::PoolSlot;
use crate::request::{EncodedRequest, RequestHead};
use crate::stream::UpstreamStream;
use wharf_http1::relay::HeadFields;
use wharf_http1::request::{encode_request_head, request_framing, RequestFraming};
use wharf_http1::response::{parse_response_head, HeadParse, ParsedHead};

/// First read size, and the smallest the adaptive size shrinks to.
const MIN_READ: usize = 8 * 1024;
/// The largest read size (long bodies read in bigger steps, fewer system calls). Not larger:
/// 100 KiB pass-through calls on 2 shared cores cost 43.2 / 37.8 / 36.9 µs of CPU each with
/// 256 / 128 / 64 KiB (6 interleaved rounds side by side; 16 and 32 KiB cost 38.4 and 36.6
/// against 39.8 in another), the saving in system time (~8 µs) over a little more user time
/// (~1 µs); page faults are not it (≤ 0.01 per call with either). Pinned to one core: 47.4
/// at 256 KiB, 41.9 at 64 KiB.
const MAX_READ: usize = 64 * 1024;
/// Below this much free room the buffer is grown before reading.
const MIN_SPARE: usize = 2 * 1024;

/// An open connection to an upstream.
#[derive(Debug)]
pub struct Connection {
    pub(crate) io: UpstreamStream,
    /// Bytes read and not yet consumed; no capacity while nothing is being read.
    pub(crate) buf: BytesMut,
    /// The next read's size (adapts between `MIN_READ` and `MAX_READ`).
    read_size: usize,
    /// Whether it sat idle in a pool (see [`Connection::is_reused`]).
    pooled: bool,
    /// Whether a body went by `splice(2)` here yet (its socket's receive buffer is then
    /// raised once: [`UpstreamStream::raise_receive_buffer`]).
    spliced: bool,
}

/// How sending a request body ended.
enum BodySent {
    /// Every byte went out.
    Complete,
    /// The upstream began a final answer first; the rest of the body was not sent.
    Interrupted,
}

impl Connection {
    /// A connection over an established socket.
    pub fn new(io: impl Into<UpstreamStream>) -> Self {
        Self {
            io: io.into(),
            buf: BytesMut::new(),
            read_size: MIN_READ,
            pooled: false,
            spliced: false,
        }
    }

    /// Whether this connection sat idle in a pool: it came back after an exchange, or it
    /// was opened ahead and kept (a floor, `preconnect`); a connection is used again only
    /// through a pool. Either way the upstream may have closed it meanwhile, so a failure
    /// before any byte of an answer means it was stale, and the request may go again on a
    /// new connection (a connection opened ahead included: see the regression test
    /// `a_connection_opened_ahead_that_the_upstream_drops_unanswered_is_stale`).
    pub fn is_reused(&self) -> bool {
        self.pooled
    }

    /// Notes that the connection goes into a pool's idle stack.
    pub(crate) fn pooled(&mut self) {
        self.pooled = true;
    }

    /// Gives the read buffer's memory back while nothing is buffered. Between exchanges the
    /// buffer keeps the tail of its last allocation for the next response (no allocation per
    /// call); a connection left idle does not need it.
    pub(crate) fn release_read_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }

    /// An idle connection that can carry another request (see
    /// [`UpstreamStream::is_reusable`]).
    pub(crate) fn is_reusable(&self) -> bool {
        self.buf.is_empty() && self.io.is_reusable()
    }

    /// Sends one request and reads the response head. The body is read as the returned
    /// response's body is polled; read to its end, the connection goes back to `slot`'s pool
    /// (unless the upstream or the framing said it must close).
    ///
    /// The request body is borrowed: when the error says `stale`, not a frame of it was taken,
    /// and the same request can go again on another connection.
    /// No timeout is applied here: callers bound the whole call.
    pub async fn send<B>(
        mut self,
        request: RequestHead<'_>,
        body: Pin<&mut B>,
        slot: Option<PoolSlot>,
    ) -> Result<Response<ResponseBody>, SendError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let reused = self.is_reused();
        let framing = request_framing(
            request.method,
            body.is_end_stream(),
            body.size_hint().exact(),
        );
        let mut head = Vec::with_capacity(256);
        encode_request_head(
            request.method,
            request.target,
            request.headers,
            request.edits,
            framing,
            &mut head,
        )
        .map_err(|error| SendError {
            error: error.into(),
            stale: false,
        })?;
        let mut body_started = false;
        let mut keep_alive_allowed = true;
        // Response bytes read so far (interim answers read while the body was being sent).
        let mut received = self.buf.len();
        let written = match framing {
            RequestFraming::None | RequestFraming::Length(0) => self.write_head(&head).await,
            RequestFraming::Length(_) | RequestFraming::Chunked => {
                let sending = Sending {
                    method: request.method,
                    fields: request.response_fields,
                    framing,
                };
                match self
                    .write_with_body(
                        Bytes::from(head),
                        body,
                        sending,
                        &mut body_started,
                        &mut received,
                    )
                    .await
                {
                    Ok(BodySent::Complete) => Ok(()),
                    Ok(BodySent::Interrupted) => {
                        // The upstream answered before taking the whole body: what is left
                        // of it on this connection is unknown, so it is not reused.
                        keep_alive_allowed = false;
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            }
        };
        if let Err(error) = written {
            // An upstream that sent anything (an interim answer) was there: not stale.
            let stale = reused && !body_started && received == 0 && is_reset(&error);
            return Err(SendError { error, stale });
        }
        self.receive(
            request.method,
            request.response_fields,
            reused && !body_started,
            keep_alive_allowed,
            received,
            slot,
        )
        .await
    }

    /// Sends a bodiless request encoded beforehand (see [`EncodedRequest`]) and reads the
    /// response head, as [`Connection::send`] does. The returned future is small (a few
    /// hundred bytes): a call waiting on a slow upstream holds little more than its socket.
    pub fn send_encoded(self, request: &EncodedRequest, slot: Option<PoolSlot>) -> Exchange {
        Exchange::new(self, request, slot)
    }

    /// Reads the response head once the request is out, keeping its `fields` as asked.
    /// `retry_safe`: a failure before any response byte marks the error stale; `received`:
    /// the response bytes read while the request was being sent.
    async fn receive(
        mut self,
        method: &Method,
        fields: HeadFields,
        retry_safe: bool,
        keep_alive_allowed: bool,
        mut received: usize,
        slot: Option<PoolSlot>,
    ) -> Result<Response<ResponseBody>, SendError> {
        let parsed = poll_fn(|cx| self.poll_head(cx, method, fields, &mut received)).await;
        match parsed {
            Ok(parsed) => Ok(self.respond(parsed, keep_alive_allowed, slot)),
            Err(error) => {
                let stale = retry_safe && received == 0;
                Err(SendError { error, stale })
            }
        }
    }

    /// The response to a parsed head: the body reads from this connection.
    pub(crate) fn respond(
        self,
        mut parsed: ParsedHead,
        keep_alive_allowed: bool,
        slot: Option<PoolSlot>,
    ) -> Response<ResponseBody> {
        parsed.keep_alive &= keep_alive_allowed;
        let mut response = Response::new(());
        *response.status_mut() = parsed.status;
        *response.version_mut() = parsed.version;
        *response.headers_mut() = std::mem::take(&mut parsed.headers);
        if let Some(relayed) = parsed.relayed.take() {
            *response.extensions_mut() = wharf_http1::recycle::extensions();
            response.extensions_mut().insert(relayed);
        }
        let body = ResponseBody::new(self, parsed.framing, parsed.keep_alive, slot);
        response.map(|()| body)
    }

    async fn write_head(&mut self, head: &[u8]) -> Result<(), UpstreamError> {
        self.io
            .write_all(head)
            .await
            .map_err(UpstreamError::Write)?;
        self.io.flush().await.map_err(UpstreamError::Write)
    }

    /// Writes the head and streams the body with `sending.framing`, stopping early if the
    /// upstream starts a final answer (it may refuse a body without reading it). Interim
    /// answers read meanwhile are skipped and counted in `received`.
    async fn write_with_body<B>(
        &mut self,
        head: Bytes,
        mut body: Pin<&mut B>,
        sending: Sending<'_>,
        body_started: &mut bool,
        received: &mut usize,
    ) -> Result<BodySent, UpstreamError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let framing = sending.framing;
        let chunked = framing == RequestFraming::Chunked;
        let declared = match framing {
            RequestFraming::Length(len) => Some(len),
            _ => None,
        };
        let mut sent_body: u64 = 0;
        let mut parts: Vec<Bytes> = vec![head];
        let mut body_done = false;
        poll_fn(|cx| loop {
            while !parts.is_empty() {
                match write_parts(&mut self.io, cx, &mut parts) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(error)) => {
                        return Poll::Ready(Err(UpstreamError::Write(error)))
                    }
                    Poll::Pending => return self.pending_unless_answering(cx, &sending, received),
                }
            }
            if body_done {
                return Pin::new(&mut self.io)
                    .poll_flush(cx)
                    .map_ok(|()| BodySent::Complete)
                    .map_err(UpstreamError::Write);
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    *body_started = true;
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers are not forwarded
                    };
                    if data.is_empty() {
                        continue;
                    }
                    sent_body += data.len() as u64;
                    if declared.is_some_and(|len| sent_body > len) {
                        return Poll::Ready(Err(UpstreamError::RequestBody(
                            "request body longer than its declared length".into(),
                        )));
                    }
                    if chunked {
                        parts.push(Bytes::from(format!("{:x}\r\n", data.len())));
                        parts.push(data);
                        parts.push(Bytes::from_static(b"\r\n"));
                    } else {
                        parts.push(data);
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    *body_started = true;
                    return Poll::Ready(Err(UpstreamError::RequestBody(error.into())));
                }
                Poll::Ready(None) => {
                    if declared.is_some_and(|len| sent_body != len) {
                        return Poll::Ready(Err(UpstreamError::RequestBody(
                            "request body shorter than its declared length".into(),
                        )));
                    }
                    if chunked {
                        parts.push(Bytes::from_static(b"0\r\n\r\n"));
                    }
                    body_done = true;
                }
                Poll::Pending => return self.pending_unless_answering(cx, &sending, received),
            }
        })
        .await
    }

    /// While the request body waits (on the client, or on a full socket), an upstream that
    /// has started a final answer ends the sending. TLS hides that signal; its body is sent
    /// whole.
    ///
    /// Interim (1xx) answers are read and skipped here, and the sending goes on: an upstream
    /// may send `100 Continue` unasked, or to an `expect` another client put on the request
    /// (RFC 9110 §15.2: a client parses any 1xx; §10.1.1: it need not wait for one). Taken
    /// for the start of the answer, it left the body unsent and the call waiting for a
    /// final answer that an upstream still reading the body never gives. A final head, a
    /// head that does not parse (101 among them) or the connection's end interrupt the
    /// sending; [`Connection::receive`] then reads or reports them from the buffer.
    fn pending_unless_answering(
        &mut self,
        cx: &mut Context<'_>,
        sending: &Sending<'_>,
        received: &mut usize,
    ) -> Poll<Result<BodySent, UpstreamError>> {
        if matches!(self.io, UpstreamStream::Tls(_)) {
            return Poll::Pending;
        }
        loop {
            if !self.buf.is_empty() {
                match parse_response_head(&self.buf, sending.method, sending.fields) {
                    Ok(HeadParse::Interim(len)) => {
                        self.buf.advance(len);
                        continue;
                    }
                    // Possibly an interim answer: read on before deciding.
                    Ok(HeadParse::Partial) => {}
                    Ok(HeadParse::Complete(..)) | Err(_) => {
                        return Poll::Ready(Ok(BodySent::Interrupted))
                    }
                }
            }
            // Pending registers the task for the upstream's next bytes, as the write or the
            // body registered it for theirs.
            match ready!(self.poll_read_more(cx)) {
                Ok(0) => return Poll::Ready(Ok(BodySent::Interrupted)),
                Ok(n) => *received += n,
                Err(error) => return Poll::Ready(Err(UpstreamError::Read(error))),
            }
        }
    }

    /// Reads until a final response head is complete; skips interim (1xx) responses.
    /// `received` counts the response bytes that came back.
    pub(crate) fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        fields: HeadFields,
        received: &mut usize,
    ) -> Poll<Result<ParsedHead, UpstreamError>> {
        loop {
            // Nothing buffered is the usual case when the request has just been sent (and
            // again when the runtime polls before the answer came): no parse to try.
            let parsed = if self.buf.is_empty() {
                Ok(HeadParse::Partial)
            } else {
                parse_response_head(&self.buf, method, fields)
            };
            match parsed {
                Ok(HeadParse::Partial) => {}
                Ok(HeadParse::Interim(len)) => {
                    self.buf.advance(len);
                    continue;
                }
                Ok(HeadParse::Complete(len, head)) => {
                    self.buf.advance(len);
                    return Poll::Ready(Ok(head));
                }
                Err(error) => return Poll::Ready(Err(error.into())),
            }
            match ready!(self.poll_read_more(cx)) {
                Ok(0) => {
                    let received = *received;
                    return Poll::Ready(Err(UpstreamError::ClosedBeforeHead { received }));
                }
                Ok(n) => *received += n,
                Err(error) => return Poll::Ready(Err(UpstreamError::Read(error))),
            }
        }
    }

    /// A body on this connection went by `splice(2)`: reads here need only take response
    /// heads (and what follows them in the same segment), so the next read starts small
    /// again rather than copying the next body's first 64 KiB through user space.
    pub(crate) fn body_spliced(&mut self) {
        self.read_size = MIN_READ;
        if !self.spliced {
            self.spliced = true;
            self.io.raise_receive_buffer();
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` is EOF. The buffer is grown only once the
    /// socket is readable, and by the adaptive read size.
    pub(crate) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let spare = self.buf.capacity() - self.buf.len();
        if spare < MIN_SPARE {
            if self.buf.is_empty() {
                // Nothing buffered: wait for bytes before taking memory for them.
                ready!(self.io.poll_read_ready(cx))?;
            }
            self.buf.reserve(self.read_size);
        }
        let spare = self.buf.capacity() - self.buf.len();
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if n == spare {
            self.read_size = (self.read_size * 2).min(MAX_READ);
        } else if n < self.read_size / 4 {
            self.read_size = (self.read_size / 2).max(MIN_READ);
        }
        Poll::Ready(Ok(n))
    }
}

/// What [`Connection::write_with_body`] needs of the request besides its bytes: the framing
/// of its body, and how to read an answer that comes while the body is being sent.
struct Sending<'a> {
    method: &'a Method,
    fields: HeadFields,
    framing: RequestFraming,
}

/// Writes as much of `parts` as the socket takes now (vectored), dropping what went out.
fn write_parts(
    io: &mut UpstreamStream,
    cx: &mut Context<'_>,
    parts: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    let slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
    let written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?;
    if written == 0 {
        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
    }
    let done = wharf_http1::advance_parts(parts, written);
    parts.drain(..done);
    Poll::Ready(Ok(()))
}

/// A write failure that a closed idle connection produces (or a read failure, when reading
/// an answer while the body was being sent met it first).
pub(crate) fn is_reset(error: &UpstreamError) -> bool {
    matches!(error, UpstreamError::Write(io) | UpstreamError::Read(io) if matches!(
        io.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted
    ))
}
