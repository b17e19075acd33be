//! Writing a response: its framing (RFC 9112 §6.3, as the server decides it) and head,
//! handed to a [`MessageWriter`] for the head and body, then whatever is left of the
//! request body, read and dropped so that the connection can serve the next request.

use std::future::{poll_fn, Future};
use std::task::Poll;
use std::time::Duration;

use http::{header, HeaderMap, Response, StatusCode, Version};
use http_body::Body;
use wharf_http1::relay::RelayedFields;
use wharf_http1::response::{encode_response_head, ConnectionOption, ResponseFraming};

use super::body::{BodyFeed, FeedStep};
use super::date::with_http_date;
use super::message::{MessageWriter, COPY_SMALL};
use super::{Conn, RequestInfo, Transport};
use crate::body::ResponseBody;

/// A request body the service left unread is read and dropped up to this much, so the
/// connection can serve the next request; a longer one closes the connection.
const DRAIN_LIMIT: u64 = 64 * 1024;
/// How long draining an unread request body may take.
const DRAIN_TIME: Duration = Duration::from_secs(2);
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
        // Room for a small body too: it is copied behind the head (`MessageWriter::push`).
        let small_body = match exact {
            Some(len) if !no_body && len <= COPY_SMALL as u64 => len as usize,
            _ => 0,
        };
        let mut head = super::heads::take(256 + small_body);
        with_http_date(|date| {
            encode_response_head(
                status,
                &parts.headers,
                // Read in place, not removed: a map emptied by the removal would look
                // unallocated to `recycle_extensions`, and not be kept.
                parts.extensions.get::<RelayedFields>(),
                framing,
                connection,
                date,
                &mut head,
            );
        });
        // The head is encoded: its maps serve the next messages on this thread.
        wharf_http1::recycle::recycle(parts.headers);
        wharf_http1::recycle::recycle_extensions(parts.extensions);
        let declared = match framing {
            ResponseFraming::Length(len) => Some(len),
            _ => None,
        };
        let body = (!no_body).then_some(body);
        let chunked = framing == ResponseFraming::Chunked;
        let writer = MessageWriter::new(head, body, declared, chunked, self.limits.idle_timeout)
            .splicing(self.limits.splice_bodies);
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
    wharf_http1::parse_content_length(headers.get(header::CONTENT_LENGTH)?.as_bytes())
}
