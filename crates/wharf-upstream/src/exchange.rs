//! One exchange on a kept connection as a named future: [`Exchange`] writes a request encoded
//! beforehand and reads the response head, polled in the caller's task. Its state is a few
//! fields (no boxed `async` block), so a call waiting on a slow upstream holds little more
//! than its socket. The connection, its reads and the response it builds are
//! [`crate::connection`]'s.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::{Method, Response};
use tokio::io::AsyncWrite;

use crate::body::ResponseBody;
use crate::connection::{is_reset, Connection};
use crate::error::{SendError, UpstreamError};
use crate::pool::PoolSlot;
use crate::request::EncodedRequest;
use wharf_http1::relay::HeadFields;

/// The future of [`Connection::send_encoded`]: writes the request, then reads the response
/// head.
#[derive(Debug)]
pub struct Exchange {
    /// Until the response head is read.
    connection: Option<Connection>,
    /// What is left to write of the request.
    unwritten: Bytes,
    /// The request is HEAD (its response has no body, whatever it says).
    head_request: bool,
    /// Which response header fields are kept, and how (see [`Exchange::keeping`]).
    fields: HeadFields,
    slot: Option<PoolSlot>,
    /// The connection came from a pool (a failure before any answer is then stale).
    reused: bool,
    /// Still writing (or flushing) the request.
    writing: bool,
    /// Response bytes read.
    received: usize,
}

impl Future for Exchange {
    type Output = Result<Response<ResponseBody>, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(connection) = this.connection.as_mut() else {
            return Poll::Pending; // polled after completion
        };
        if this.writing {
            while !this.unwritten.is_empty() {
                match Pin::new(&mut connection.io).poll_write(cx, &this.unwritten) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(this.fail(io::ErrorKind::WriteZero.into())))
                    }
                    Poll::Ready(Ok(n)) => this.unwritten.advance(n),
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(this.fail(error))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            match Pin::new(&mut connection.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => this.writing = false,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(this.fail(error))),
                Poll::Pending => return Poll::Pending,
            }
            this.received = connection.buf.len();
        }
        let method = if this.head_request {
            &Method::HEAD
        } else {
            &Method::GET
        };
        let parsed = ready!(connection.poll_head(cx, method, this.fields, &mut this.received));
        let Some(connection) = this.connection.take() else {
            return Poll::Pending;
        };
        Poll::Ready(match parsed {
            Ok(parsed) => Ok(connection.respond(parsed, true, this.slot.take())),
            Err(error) => Err(SendError {
                error,
                stale: this.reused && this.received == 0,
            }),
        })
    }
}

impl Exchange {
    /// The exchange of `request` on `connection`, whose response body goes back to `slot`.
    pub(crate) fn new(
        connection: Connection,
        request: &EncodedRequest,
        slot: Option<PoolSlot>,
    ) -> Self {
        Self {
            reused: connection.is_reused(),
            connection: Some(connection),
            unwritten: request.bytes.clone(),
            head_request: request.method == Method::HEAD,
            fields: HeadFields::All,
            slot,
            writing: true,
            received: 0,
        }
    }

    /// Which response header fields to keep, and how (all, in the map, unless told). With
    /// [`HeadFields::Relay`] the response's map is empty and its extensions hold a
    /// [`wharf_http1::relay::RelayedFields`], which an HTTP/1.1 server writes as it is: for
    /// a caller that passes a fixed set of fields on and reads none of the others (the
    /// body's size hint gives the length).
    pub fn keeping(mut self, fields: HeadFields) -> Self {
        self.fields = fields;
        self
    }

    /// Writing the request failed: the connection is closed.
    fn fail(&mut self, error: io::Error) -> SendError {
        self.connection = None;
        let error = UpstreamError::Write(error);
        SendError {
            stale: self.reused && is_reset(&error),
            error,
        }
    }
}
