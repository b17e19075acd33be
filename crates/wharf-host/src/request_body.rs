//! The body of a request as services see it, whichever server read it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::BoxError;
use crate::h1::IncomingBody;

/// A request body: none, one read by wharf's HTTP/1.1 server, or one read by hyper (HTTP/2).
///
/// Errors (the client broke the framing or went away mid-body) are boxed; a service that
/// forwards the body passes them on as its own failure.
#[derive(Debug, Default)]
pub enum RequestBody {
    /// No body.
    #[default]
    Empty,
    /// Read from an HTTP/1.1 connection as it is polled.
    Http1(IncomingBody),
    /// Read by hyper from an HTTP/2 stream.
    Http2(hyper::body::Incoming),
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Http1(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Http2(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|error| Box::new(error) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Http1(body) => body.is_end_stream(),
            RequestBody::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Http1(body) => body.size_hint(),
            RequestBody::Http2(body) => body.size_hint(),
        }
    }
}
