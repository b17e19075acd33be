//! Writing a response: its framing (RFC 9112 §6.3, as the server decides it), the head, and
//! the body with vectored writes, then whatever is left of the request body.
//!
//! Frames are gathered while the body has them ready (up to [`HIGH_WATER`]) and written in
//! one `writev`, so a small response (head and body) leaves in one system call, and nothing
//! waits in a buffer while the body is not ready. A body that fails, or that disagrees with
//! its declared length, is cut after what was already written: the connection closes
//! without the chunked terminator or short of the content-length, which is how the client
//! sees a truncation. A client that stops reading is cut after `idle_timeout` without write
//! progress.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{header, HeaderMap, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::AsyncWrite;
use tokio::time::Sleep;
use tracing::debug;
use wharf_http1::response::{encode_response_head, ConnectionOption, ResponseFraming};

use super::body::{BodyFeed, FeedStep};
use super::date::with_http_date;
use super::{Conn, RequestInfo, Transport};
use crate::body::ResponseBody;

/// Body bytes gathered before they are written, at most.
const HIGH_WATER: usize = 64 * 1024;
/// A request body the service left unread is read and dropped up to this much, so the
/// connection can serve the next request; a longer one closes the connection.
const DRAIN_LIMIT: u64 = 64 * 1024;
/// How long draining an unread request body may take.
const DRAIN_TIME: Duration = Duration::from_secs(2);
/// The end of a chunked body (no trailers).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Most parts gathered for one vectored write (a chunked body takes three per frame).
const PARTS: usize = 12;

impl<S: Transport> Conn<S> {
    /// Writes `response` (an answer the host makes itself, e.g. to a bad head); whether the
    /// connection can carry another request. A service's response is written from
    /// [`Conn::drive`](super::Conn), in the poll that produced it.
    pub(super) async fn write_response(
        &mut self,
        response: Response<ResponseBody>,
        info: &RequestInfo,
        feed: &mut Option<BodyFeed>,
    ) -> bool {
        let (mut writer, keep_alive) = self.start_message(response, info, feed);
        let io = &mut self.io;
        poll_fn(|cx| writer.poll_write(io, cx)).await
            && keep_alive
            && self.finish_request_body(feed).await
    }

    /// After a response: what the service left of the request body is drained, so the next
    /// request can follow; whether it can.
    pub(super) async fn finish_request_body(&mut self, feed: &mut Option<BodyFeed>) -> bool {
        match feed {
            // Boxed: a rare path, kept out of the connection's own future.
            Some(feed) if !feed.is_complete() => Box::pin(self.drain(feed)).await,
            _ => true,
        }
    }

    /// Decides the framing and encodes the head; whether the connection may persist.
    pub(super) fn start_message(
        &self,
        response: Response<ResponseBody>,
        info: &RequestInfo,
        feed: &Option<BodyFeed>,
    ) -> (MessageWriter, bool) {
        let (parts, body) = response.into_parts();
        let status = parts.status;
        let request_body_broken = feed
            .as_ref()
            .is_some_and(|feed| feed.is_finished() && !feed.is_complete());
        let mut keep_alive = info.keep_alive && !self.draining && !request_body_broken;
        let no_body = info.head
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let declared = declared_length(&parts.headers);
        let exact = body.size_hint().exact();
        let framing = if no_body {
            let content_length = match status {
                StatusCode::NO_CONTENT => None,
                _ if status.is_informational() => None,
                StatusCode::NOT_MODIFIED => declared,
                _ => declared.or(exact),
            };
            ResponseFraming::NoBody { content_length }
        } else if let Some(len) = declared.or(exact) {
            ResponseFraming::Length(len)
        } else if info.version == Version::HTTP_11 {
            ResponseFraming::Chunked
        } else {
            keep_alive = false;
            ResponseFraming::UntilClose
        };
        let connection = if !keep_alive {
            ConnectionOption::Close
        } else if info.version == Version::HTTP_10 {
            ConnectionOption::KeepAlive
        } else {
            ConnectionOption::Default
        };
        let mut head = Vec::with_capacity(256);
        with_http_date(|date| {
            encode_response_head(status, &parts.headers, framing, connection, date, &mut head);
        });
        let writer = MessageWriter {
            buffered: head.len(),
            head,
            head_sent: 0,
            parts: Default::default(),
            queued: 0,
            body: (!no_body).then_some(body),
            declared: match framing {
                ResponseFraming::Length(len) => Some(len),
                _ => None,
            },
            chunked: framing == ResponseFraming::Chunked,
            sent: 0,
            cut: false,
            stall: None,
            idle_timeout: self.limits.idle_timeout,
        };
        (writer, keep_alive)
    }

    /// Reads and drops what the service left of the request body, within limits; whether
    /// the next request can follow on this connection.
    async fn drain(&mut self, feed: &mut BodyFeed) -> bool {
        let start = feed.received();
        let timer = tokio::time::sleep(DRAIN_TIME);
        tokio::pin!(timer);
        poll_fn(|cx| loop {
            match feed.step(&mut self.buf, true, cx.waker()) {
                FeedStep::Finished => return Poll::Ready(feed.is_complete()),
                FeedStep::Progress => continue,
                // A client still waiting for `100 Continue` has sent no body: close.
                FeedStep::SendContinue | FeedStep::Idle => return Poll::Ready(false),
                FeedStep::NeedBytes => {
                    if feed.received() - start > DRAIN_LIMIT {
                        return Poll::Ready(false);
                    }
                    match self.poll_read_more(cx) {
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(false),
                        Poll::Ready(Ok(_)) => continue,
                        Poll::Pending => {
                            return if timer.as_mut().poll(cx).is_ready() {
                                Poll::Ready(false)
                            } else {
                                Poll::Pending
                            };
                        }
                    }
                }
            }
        })
        .await
    }
}

/// The response's own `content-length`, when it has a valid one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let value = headers.get(header::CONTENT_LENGTH)?.to_str().ok()?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A response on its way out: the encoded head, then body frames gathered into one vectored
/// write while they are ready. The first attempt runs where the response appeared, with
/// nothing allocated for it; a response that has to wait (a streaming body, a full socket)
/// is boxed for the rest, so a connection's own future stays small.
pub(super) struct MessageWriter {
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
}

impl MessageWriter {
    /// Writes what it can; `Ready(true)` once the whole message is out, `Ready(false)` when
    /// it was cut or the socket failed.
    pub(super) fn poll_write<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        loop {
            if self.buffered < HIGH_WATER && self.queued + 3 <= PARTS {
                if let Some(body) = self.body.as_mut() {
                    match Pin::new(body).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Ok(data) = frame.into_data() {
                                self.queue_data(data);
                            }
                            continue;
                        }
                        Poll::Ready(Some(Err(error))) => {
                            debug!(error = %crate::error::error_chain(&*error), "response body failed; cutting the response");
                            self.cut = true;
                            self.body = None;
                        }
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
                match self.write_some(io, cx) {
                    Poll::Ready(Ok(())) => {
                        self.stall = None;
                        continue;
                    }
                    Poll::Ready(Err(error)) => {
                        debug!(error = %error, "writing the response failed");
                        return Poll::Ready(false);
                    }
                    Poll::Pending => {
                        // The client does not read: cut it after idle_timeout without progress.
                        let idle_timeout = self.idle_timeout;
                        let timer = self
                            .stall
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle_timeout)));
                        if timer.as_mut().poll(cx).is_ready() {
                            debug!("response not read by the client within idle_timeout; closing");
                            return Poll::Ready(false);
                        }
                        return Poll::Pending;
                    }
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
        self.parts[self.queued] = part;
        self.queued += 1;
    }

    /// One vectored write of the head's rest and the queued parts.
    fn write_some<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
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
        let written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?;
        if written == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        self.buffered -= written;
        let mut left = written;
        let from_head = left.min(self.head.len() - self.head_sent);
        self.head_sent += from_head;
        left -= from_head;
        let mut done = 0;
        for part in &mut self.parts[..self.queued] {
            let take = left.min(part.len());
            part.advance(take);
            left -= take;
            if part.is_empty() {
                done += 1;
            } else {
                break;
            }
        }
        if done > 0 {
            self.parts[..self.queued].rotate_left(done);
            self.queued -= done;
        }
        Poll::Ready(Ok(()))
    }
}
