//! Response bodies the proxy streams: straight from an origin (with the
//! total deadline), from a fill in progress, or from a cache entry.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};
use wharf_cache::{CachedResponse, FillFailure, FillReader};
use wharf_host::body::{full, BoxError, ResponseBody};

use crate::error::{error_chain, ProxyError};

pin_project_lite::pin_project! {
    /// An origin body relayed as it arrives, failing once `deadline` passes
    /// so a stalled origin ends in a visible truncation, not a hang.
    pub(crate) struct OriginBody {
        #[pin]
        inner: Incoming,
        #[pin]
        deadline: Sleep,
        origin: String,
        total_timeout: Duration,
        received: u64,
    }
}

impl OriginBody {
    pub(crate) fn new(
        inner: Incoming,
        origin: String,
        deadline: Instant,
        total_timeout: Duration,
    ) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep_until(deadline),
            origin,
            total_timeout,
            received: 0,
        }
    }
}

impl Body for OriginBody {
    type Data = Bytes;
    type Error = ProxyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        *this.received += data.len() as u64;
                    }
                    Some(Ok(frame))
                }
                Some(Err(error)) => Some(Err(ProxyError::OriginBody {
                    origin: this.origin.clone(),
                    received: *this.received,
                    message: error_chain(&error),
                })),
                None => None,
            });
        }
        ready!(this.deadline.poll(cx));
        Poll::Ready(Some(Err(ProxyError::OriginTimeout {
            origin: this.origin.clone(),
            what: "body not complete",
            after: *this.total_timeout,
        })))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Boxes an origin body for the client.
pub(crate) fn relay(body: OriginBody) -> ResponseBody {
    body.map_err(|error| Box::new(error) as BoxError)
        .boxed_unsync()
}

/// A fill's failure as a body error (it is shared, so wrapped, not moved).
#[derive(Debug)]
struct SharedFailure(FillFailure);

impl std::fmt::Display for SharedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Streams a fill to one client from its first byte; a failed fill ends
/// the stream with an error, so the client sees a truncation.
pub(crate) fn from_fill(reader: FillReader) -> ResponseBody {
    let chunks = futures_util::stream::unfold(reader, |mut reader| async move {
        let next = reader.next_chunk().await?;
        let frame = next
            .map(Frame::data)
            .map_err(|failure| Box::new(SharedFailure(failure)) as BoxError);
        Some((frame, reader))
    });
    StreamBody::new(chunks).boxed_unsync()
}

/// Serves a committed entry's chunks without copying them.
pub(crate) fn from_entry(entry: &Arc<CachedResponse>) -> ResponseBody {
    if let [only] = &*entry.body {
        return full(only.clone());
    }
    let entry = entry.clone();
    let chunks =
        (0..entry.body.len()).map(move |i| Ok::<_, BoxError>(Frame::data(entry.body[i].clone())));
    StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync()
}
