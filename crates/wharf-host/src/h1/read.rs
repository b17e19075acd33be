//! Reading a request: the head (with the HTTP/2 preface sniffed on a fresh connection, and
//! the head and keep-alive deadlines), the `http::Request` a service gets, and the bytes
//! behind it. Memory is taken only once the socket is readable and given back when nothing
//! is buffered, so an idle or waiting connection holds no read buffer.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use http::{Request, StatusCode, Version};
use tokio::time::Instant;
use tracing::debug;
use wharf_http1::request::{parse_request_head_for, ParsedRequest, RequestFraming, RequestParse};
use wharf_http1::MessageError;

use super::body::BodyFeed;
use super::spare;
use super::{Conn, RequestInfo, Transport, H2_PREFACE, MAX_READ, MIN_READ, MIN_SPARE};
use crate::call::ClientAddr;
use crate::dispatch::{Dispatcher, Routed};
use crate::error::json_error;
use crate::request_body::RequestBody;

/// What reading a request head gave.
#[allow(clippy::large_enum_variant)] // returned by value, never stored
pub(super) enum Head {
    /// A request, and the service it goes to.
    Request(ParsedRequest, Routed),
    /// Nothing more will come: EOF, idle timeout, or the drain with no request started.
    Done,
    /// The head did not come within `header_read_timeout`.
    TimedOut,
    /// The head is unusable: answer with this status and close.
    Bad(StatusCode, MessageError),
    /// The HTTP/2 preface.
    Http2,
}

/// The `http::Request` a service gets, and the connection's end of its body.
pub(super) fn build_request(
    parsed: ParsedRequest,
    peer: Option<SocketAddr>,
) -> (Request<RequestBody>, Option<BodyFeed>) {
    let (feed, body) = match parsed.framing {
        RequestFraming::None => (None, RequestBody::Empty),
        RequestFraming::Length(len) => {
            let (feed, body) = BodyFeed::new(Some(len), parsed.expect_continue);
            (Some(feed), RequestBody::Http1(body))
        }
        RequestFraming::Chunked => {
            let (feed, body) = BodyFeed::new(None, parsed.expect_continue);
            (Some(feed), RequestBody::Http1(body))
        }
    };
    let mut request = Request::new(body);
    *request.method_mut() = parsed.method;
    *request.uri_mut() = parsed.uri;
    *request.version_mut() = parsed.version;
    *request.headers_mut() = parsed.headers;
    if let Some(peer) = peer {
        // A kept map: the call's context goes in it too (see wharf_http1::recycle).
        *request.extensions_mut() = wharf_http1::recycle::extensions();
        request.extensions_mut().insert(ClientAddr(peer));
    }
    (request, feed)
}

impl<S: Transport> Conn<S> {
    /// Answers an unusable request head with `status` and its reason; the connection then
    /// closes.
    pub(super) async fn answer_bad_head(
        &mut self,
        status: StatusCode,
        error: MessageError,
        peer: Option<SocketAddr>,
    ) {
        debug!(peer = ?peer, error = %error, "bad request head");
        let kind = if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
            "headers_too_large"
        } else {
            "bad_request"
        };
        let response = json_error(status, kind, &format!("request head: {error}"));
        let info = RequestInfo {
            head: false,
            version: Version::HTTP_11,
            keep_alive: false,
        };
        let _ = self.write_response(response, &info, &mut None).await;
    }

    /// Reads until a request head is complete. The first request's head is due
    /// `header_read_timeout` after accept; a later one, `idle_timeout` after the previous
    /// response (the keep-alive idle limit) and then `header_read_timeout` after its first
    /// byte.
    pub(super) async fn read_head(&mut self, dispatcher: &Dispatcher) -> Head {
        let mut head_started = self.served == 0 || !self.buf.is_empty();
        if self.served > 0 {
            let after = if head_started {
                self.limits.header_read_timeout
            } else {
                self.limits.idle_timeout
            };
            self.head_due = Instant::now() + after;
        }
        loop {
            if !self.buf.is_empty() {
                if let Some(head) = self.sniff_and_parse(dispatcher) {
                    return head;
                }
            } else if self.buf.capacity() > 0 {
                // Idle between requests: give the buffer back.
                spare::give(std::mem::take(&mut self.buf));
            }
            if self.draining && self.buf.is_empty() {
                return Head::Done;
            }
            let due = self.head_due;
            let read = poll_fn(|cx| {
                if let Poll::Ready(read) = self.poll_read_more(cx) {
                    return Poll::Ready(Some(read));
                }
                if self.poll_stop(cx) && self.buf.is_empty() {
                    return Poll::Ready(None);
                }
                if self.poll_timer(cx, due) {
                    return Poll::Ready(Some(Err(io::ErrorKind::TimedOut.into())));
                }
                Poll::Pending
            })
            .await;
            match read {
                None | Some(Ok(0)) => return Head::Done,
                Some(Ok(_)) => {
                    if !head_started {
                        head_started = true;
                        self.head_due = Instant::now() + self.limits.header_read_timeout;
                    }
                }
                Some(Err(error)) if error.kind() == io::ErrorKind::TimedOut => {
                    return if head_started {
                        Head::TimedOut
                    } else {
                        Head::Done
                    };
                }
                Some(Err(_)) => return Head::Done,
            }
        }
    }

    /// The HTTP/2 preface on a fresh connection, or a parsed HTTP/1 head; `None` when more
    /// bytes are needed.
    pub(super) fn sniff_and_parse(&mut self, dispatcher: &Dispatcher) -> Option<Head> {
        if self.served == 0 && self.buf[0] == H2_PREFACE[0] {
            let n = self.buf.len().min(H2_PREFACE.len());
            if self.buf[..n] == H2_PREFACE[..n] {
                return (n == H2_PREFACE.len()).then_some(Head::Http2);
            }
        }
        self.parse_head(dispatcher)
    }

    /// Parses the buffered bytes: `None` when more are needed. The request's service is
    /// looked up from its path while the head is parsed, so that the fields are kept only
    /// for a service that reads them.
    pub(super) fn parse_head(&mut self, dispatcher: &Dispatcher) -> Option<Head> {
        let mut routed = None;
        let parsed = parse_request_head_for(&self.buf, self.limits.max_header_bytes, |path| {
            let to = dispatcher.route(path);
            let wants = to.wants_request_fields();
            routed = Some(to);
            wants
        });
        match parsed {
            Ok(RequestParse::Partial) => None,
            Ok(RequestParse::Complete(len, request)) => {
                self.buf.advance(len);
                if self.buf.is_empty() {
                    // Nothing pipelined behind it: the call will wait with no buffer held.
                    spare::give(std::mem::take(&mut self.buf));
                }
                // A complete head has had its path asked about; routed from the URI if not.
                let routed = routed.unwrap_or_else(|| dispatcher.route(request.uri.path()));
                Some(Head::Request(request, routed))
            }
            Err(error @ (MessageError::TooLarge { .. } | MessageError::TooManyHeaders { .. })) => {
                Some(Head::Bad(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    error,
                ))
            }
            Err(error) => Some(Head::Bad(StatusCode::BAD_REQUEST, error)),
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` is EOF. Memory is taken only once the socket
    /// is readable, and by the adaptive read size.
    pub(super) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let spare = self.buf.capacity() - self.buf.len();
        if spare < MIN_SPARE {
            if self.buf.is_empty() {
                ready!(self.io.poll_read_ready(cx))?;
            }
            // A buffer freed by an earlier request on this thread, when there is one.
            let reused = if self.buf.capacity() == 0 {
                spare::take(self.read_size)
            } else {
                None
            };
            match reused {
                Some(buf) => self.buf = buf,
                None => self.buf.reserve(self.read_size),
            }
        }
        let spare = self.buf.capacity() - self.buf.len();
        let n = match ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        )) {
            Ok(n) => n,
            Err(error) => {
                self.peer_gone = true;
                return Poll::Ready(Err(error));
            }
        };
        if n == 0 {
            self.peer_gone = true;
        }
        if n == spare {
            self.read_size = (self.read_size * 2).min(MAX_READ);
        } else if n < self.read_size / 4 {
            self.read_size = (self.read_size / 2).max(MIN_READ);
        }
        Poll::Ready(Ok(n))
    }
}
