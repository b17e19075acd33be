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

impl<S: Transport> Conn<S> {
    /// Writes `response`; whether the connection can carry another request.
    pub(super) async fn write_response(
        &mut self,
        response: Response<ResponseBody>,
        info: &RequestInfo,
        feed: &mut Option<BodyFeed>,
    ) -> bool {
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
        let body = (!no_body).then_some(body);
        if !self.write_message(Bytes::from(head), body, framing).await {
            return false;
        }
        if !keep_alive {
            return false;
        }
        match feed {
            Some(feed) if !feed.is_complete() => self.drain(feed).await,
            _ => true,
        }
    }

    /// Writes the head and the body; false when the message was cut or the socket failed.
    async fn write_message(
        &mut self,
        head: Bytes,
        mut body: Option<ResponseBody>,
        framing: ResponseFraming,
    ) -> bool {
        let declared = match framing {
            ResponseFraming::Length(len) => Some(len),
            _ => None,
        };
        let chunked = framing == ResponseFraming::Chunked;
        let mut queued = Vec::with_capacity(4);
        let mut buffered = head.len();
        queued.push(head);
        let mut sent: u64 = 0;
        let mut cut = false;
        let mut stall: Option<Pin<Box<Sleep>>> = None;
        let idle_timeout = self.limits.idle_timeout;
        poll_fn(|cx| loop {
            if let Some(frames) = body.as_mut().filter(|_| buffered < HIGH_WATER) {
                match Pin::new(frames).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        let Ok(mut data) = frame.into_data() else {
                            continue; // trailers are not written
                        };
                        if data.is_empty() {
                            continue;
                        }
                        if let Some(len) = declared {
                            let room = len - sent;
                            if data.len() as u64 > room {
                                // Longer than declared: send what fits, then cut.
                                data.truncate(room as usize);
                                cut = true;
                                body = None;
                            }
                        }
                        sent += data.len() as u64;
                        if chunked {
                            let size = Bytes::from(format!("{:x}\r\n", data.len()));
                            buffered += size.len() + data.len() + 2;
                            queued.push(size);
                            queued.push(data);
                            queued.push(Bytes::from_static(b"\r\n"));
                        } else if !data.is_empty() {
                            buffered += data.len();
                            queued.push(data);
                        }
                        continue;
                    }
                    Poll::Ready(Some(Err(error))) => {
                        debug!(error = %crate::error::error_chain(&*error), "response body failed; cutting the response");
                        cut = true;
                        body = None;
                    }
                    Poll::Ready(None) => {
                        body = None;
                        if declared.is_some_and(|len| sent < len) {
                            debug!(sent, "response body shorter than its length; cutting the response");
                            cut = true;
                        } else if chunked {
                            buffered += LAST_CHUNK.len();
                            queued.push(Bytes::from_static(LAST_CHUNK));
                        }
                    }
                    Poll::Pending if queued.is_empty() => return Poll::Pending,
                    Poll::Pending => {}
                }
            }
            if !queued.is_empty() {
                match write_queued(&mut self.io, cx, &mut queued) {
                    Poll::Ready(Ok(written)) => {
                        buffered = buffered.saturating_sub(written);
                        stall = None;
                        continue;
                    }
                    Poll::Ready(Err(error)) => {
                        debug!(error = %error, "writing the response failed");
                        return Poll::Ready(false);
                    }
                    Poll::Pending => {
                        // The client does not read: cut it after idle_timeout without progress.
                        let timer = stall
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle_timeout)));
                        if timer.as_mut().poll(cx).is_ready() {
                            debug!("response not read by the client within idle_timeout; closing");
                            return Poll::Ready(false);
                        }
                        return Poll::Pending;
                    }
                }
            }
            if body.is_none() {
                return match Pin::new(&mut self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => Poll::Ready(!cut),
                    Poll::Ready(Err(_)) => Poll::Ready(false),
                    Poll::Pending => Poll::Pending,
                };
            }
        })
        .await
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

/// Writes as much of `queued` as the socket takes now (vectored), dropping what went out.
fn write_queued<S: AsyncWrite + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    queued: &mut Vec<Bytes>,
) -> Poll<io::Result<usize>> {
    let slices: [io::IoSlice<'_>; 16] =
        std::array::from_fn(|i| io::IoSlice::new(queued.get(i).map_or(&[][..], |part| &part[..])));
    let count = queued.len().min(slices.len());
    let written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?;
    if written == 0 {
        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
    }
    let mut left = written;
    let mut done = 0;
    for part in queued.iter_mut() {
        let take = left.min(part.len());
        part.advance(take);
        left -= take;
        if part.is_empty() {
            done += 1;
        } else {
            break;
        }
    }
    queued.drain(..done);
    Poll::Ready(Ok(written))
}
