//! The backend's response body on its way back to the client, which counts
//! the call against its backend until it ends (the connection itself goes
//! back to the pool only when the body was read to the end, see
//! [`wharf_upstream::ResponseBody`]). Past the bytes read with the head, a
//! body of a stated length goes from the backend's socket to the client's by
//! `splice(2)` where both are plain sockets ([`SpliceBody`]), as the proxy's
//! pass-through bodies do.

use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wharf_host::body::{BoxError, SpliceBody};
use wharf_upstream::ResponseBody as UpstreamBody;

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
    // Boxed already: what the host's spliceable bodies carry.
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = ready!(this.body.as_mut().poll_frame(cx));
        let stopped = !matches!(polled, Some(Ok(_)));
        release_at_end(this.lease, &this.body, stopped);
        Poll::Ready(polled.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl SpliceBody for RelayBody {
    fn can_splice(&self) -> bool {
        self.body.can_splice()
    }

    fn poll_splice_to(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let mut this = self.project();
        let moved = ready!(this.body.as_mut().get_mut().poll_splice_to(cx, pipe, max));
        let stopped = !matches!(moved, Ok(moved) if moved > 0);
        release_at_end(this.lease, &this.body, stopped);
        Poll::Ready(moved.map_err(Into::into))
    }
}

/// Ends the lease when the body has: it failed or had nothing more (`stopped`), or it says it
/// is complete. hyper stops polling a body that says it has ended, so the lease ends with the
/// last frame or spliced byte, not with a `None` or a 0 that may never be asked for.
fn release_at_end(lease: &mut Option<Lease>, body: &UpstreamBody, stopped: bool) {
    if stopped || body.is_end_stream() {
        lease.take();
    }
}
