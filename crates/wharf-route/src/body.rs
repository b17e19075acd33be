//! Bodies crossing a route: the client's request body on its way to a
//! backend (or nothing, for a replayed bodiless request), and the
//! backend's response body on its way back, which returns its connection
//! to the pool only when it was read to the end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

use crate::backend::Backend;

pin_project_lite::pin_project! {
    /// The request body sent upstream.
    #[project = ForwardBodyProj]
    pub(crate) enum ForwardBody {
        /// The client's body, streamed untouched.
        Client { #[pin] body: Incoming },
        /// No body (a replay of a bodiless request).
        Empty,
    }
}

impl Body for ForwardBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.project() {
            ForwardBodyProj::Client { body } => body.poll_frame(cx),
            ForwardBodyProj::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ForwardBody::Client { body } => body.is_end_stream(),
            ForwardBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ForwardBody::Client { body } => body.size_hint(),
            ForwardBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// Holds a backend connection while its response body streams.
pub(crate) struct Lease {
    pub(crate) backend: Arc<Backend>,
    pub(crate) connection: Option<SendRequest<ForwardBody>>,
}

impl Lease {
    /// The body was read to its end: the connection can serve another call.
    fn release(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.backend.check_in(connection);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A connection dropped here still had unread response bytes (the
        // client went away mid-body): it is closed, never reused.
        self.connection = None;
        self.backend.call_ended();
    }
}

pin_project_lite::pin_project! {
    /// A backend's response body relayed to the client.
    pub(crate) struct RelayBody {
        #[pin]
        body: Incoming,
        lease: Option<Lease>,
    }
}

impl RelayBody {
    pub(crate) fn new(body: Incoming, lease: Lease) -> Self {
        Self {
            body,
            lease: Some(lease),
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        let polled = this.body.as_mut().poll_frame(cx);
        // hyper stops polling a body that says it has ended, so a body
        // read to its end may never return `None`: release as soon as the
        // last frame is out, or the connection is closed, not reused.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            Poll::Ready(Some(Err(_))) => {
                this.lease.take();
                false
            }
            Poll::Pending => false,
        };
        if ended {
            if let Some(mut lease) = this.lease.take() {
                lease.release();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
