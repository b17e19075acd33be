//! The backend's response body on its way back to the client, which counts
//! the call against its backend until it ends (the connection itself goes
//! back to the pool only when the body was read to the end, see
//! [`wharf_upstream::ResponseBody`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wharf_upstream::{ResponseBody as UpstreamBody, UpstreamError};

use crate::backend::Backend;

/// Counts a call against its backend while the response body streams.
pub(crate) struct Lease {
    pub(crate) backend: Arc<Backend>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.call_ended();
    }
}

pin_project_lite::pin_project! {
    /// A backend's response body relayed to the client; the call stops counting against the
    /// backend when the body ends, fails or is dropped.
    pub(crate) struct RelayBody {
        #[pin]
        body: UpstreamBody,
        lease: Option<Lease>,
    }
}

impl RelayBody {
    pub(crate) fn new(body: UpstreamBody, lease: Lease) -> Self {
        Self {
            body,
            lease: Some(lease),
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let mut this = self.project();
        let polled = this.body.as_mut().poll_frame(cx);
        // hyper stops polling a body that says it has ended: the lease ends
        // with the last frame, not with a `None` that may never be asked for.
        let ended = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            this.lease.take();
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
