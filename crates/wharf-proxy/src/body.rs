//! Response bodies the proxy streams: straight from an origin (with the
//! total deadline), from a fill in progress, or from a cache entry.

use std::future::Future;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, StreamBody};
use tokio::time::{Instant, Sleep};
use wharf_cache::{CachedResponse, FillFailure, FillReader, StoredBody};
use wharf_host::body::{full, BoxError, ResponseBody, SpliceBody};
use wharf_upstream::{ResponseBody as UpstreamBody, UpstreamError};

use crate::error::{error_chain, ProxyError};
use crate::target::Target;

pin_project_lite::pin_project! {
    /// An origin body relayed as it arrives, failing once `deadline` passes
    /// so a stalled origin ends in a visible truncation, not a hang.
    pub(crate) struct OriginBody {
        #[pin]
        inner: UpstreamBody,
        #[pin]
        deadline: Sleep,
        target: Arc<Target>,
        total_timeout: Duration,
        received: u64,
        // The first frame, read ahead by `read_first_frame`; handed out first.
        ahead: Option<Frame<Bytes>>,
        // The body ended during the read-ahead.
        ended: bool,
    }
}

impl OriginBody {
    pub(crate) fn new(
        inner: UpstreamBody,
        target: Arc<Target>,
        deadline: Instant,
        total_timeout: Duration,
    ) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep_until(deadline),
            target,
            total_timeout,
            received: 0,
            ahead: None,
            ended: false,
        }
    }

    /// Reads the first frame ahead (kept for the first poll), so that a body
    /// broken before its first byte fails here, while the call can still
    /// answer with a 502/504: once the response is handed to hyper, a body
    /// that fails at its first poll makes hyper close the connection without
    /// writing the head at all.
    pub(crate) async fn read_first_frame(mut self: Pin<&mut Self>) -> Result<(), ProxyError> {
        let frame = self.as_mut().next_frame().await;
        let this = self.project();
        match frame {
            Some(Ok(frame)) => *this.ahead = Some(frame),
            Some(Err(error)) => return Err(error),
            None => *this.ended = true,
        }
        Ok(())
    }
}

impl OriginBody {
    /// The next frame, or why the origin's body broke (the fill's reading, which wants the
    /// error as it is rather than boxed for a client).
    pub(crate) async fn next_frame(
        mut self: Pin<&mut Self>,
    ) -> Option<Result<Frame<Bytes>, ProxyError>> {
        std::future::poll_fn(|cx| self.as_mut().poll_origin_frame(cx)).await
    }

    /// The next frame, or why the origin's body broke.
    fn poll_origin_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        let this = self.project();
        if let Some(frame) = this.ahead.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if *this.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        *this.received += data.len() as u64;
                    }
                    Some(Ok(frame))
                }
                Some(Err(error)) => Some(Err(broken(this.target, *this.received, &error))),
                None => None,
            });
        }
        ready!(this.deadline.poll(cx));
        Poll::Ready(Some(Err(incomplete(this.target, *this.total_timeout))))
    }
}

impl Body for OriginBody {
    type Data = Bytes;
    // Boxed already, so the relayed body needs no adapter (and no second box) around it.
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.poll_origin_frame(cx)
            .map(|frame| frame.map(|frame| frame.map_err(|error| Box::new(error) as BoxError)))
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let ahead = self
            .ahead
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |data| data.len() as u64);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + ahead);
        }
        hint.set_lower(hint.lower() + ahead);
        hint
    }
}

impl SpliceBody for OriginBody {
    fn can_splice(&self) -> bool {
        self.ahead.is_none() && !self.ended && self.inner.can_splice()
    }

    /// The origin socket's next bytes into `pipe`, under the same deadline as frames.
    fn poll_splice_to(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let this = self.project();
        if let Poll::Ready(moved) = this.inner.get_mut().poll_splice_to(cx, pipe, max) {
            return Poll::Ready(match moved {
                Ok(moved) => {
                    *this.received += moved as u64;
                    Ok(moved)
                }
                Err(error) => {
                    Err(Box::new(broken(this.target, *this.received, &error)) as BoxError)
                }
            });
        }
        ready!(this.deadline.poll(cx));
        Poll::Ready(Err(
            Box::new(incomplete(this.target, *this.total_timeout)) as BoxError
        ))
    }
}

/// The origin's body broke after `received` bytes (read as frames or spliced).
fn broken(target: &Target, received: u64, error: &UpstreamError) -> ProxyError {
    ProxyError::OriginBody {
        origin: target.label.clone(),
        received,
        message: error_chain(error),
    }
}

/// The origin's body was not complete within the call's `total_timeout`.
fn incomplete(target: &Target, total_timeout: Duration) -> ProxyError {
    ProxyError::OriginTimeout {
        origin: target.label.clone(),
        what: "body not complete",
        after: total_timeout,
    }
}

/// An origin body, boxed already, for the client: spliced from the origin's socket to the
/// client's where both are plain sockets and `server.splice_bodies` is on (see
/// [`SpliceBody`]), read as frames elsewhere.
pub(crate) fn relay(body: Pin<Box<OriginBody>>) -> ResponseBody {
    ResponseBody::spliced(body)
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

/// Streams a fill to one client from its first byte (`first`, already read
/// from `reader`, then the rest); a failed fill ends the stream with an
/// error, so the client sees a truncation.
pub(crate) fn from_fill(first: Option<Bytes>, reader: FillReader) -> ResponseBody {
    let first = first.map(|chunk| Ok::<_, BoxError>(Frame::data(chunk)));
    let rest = futures_util::stream::unfold(reader, |mut reader| async move {
        let next = reader.next_chunk().await?;
        let frame = next
            .map(Frame::data)
            .map_err(|failure| Box::new(SharedFailure(failure)) as BoxError);
        Some((frame, reader))
    });
    ResponseBody::from(
        StreamBody::new(futures_util::stream::iter(first).chain(rest)).boxed_unsync(),
    )
}

/// Serves a committed entry's body without copying it: its chunks, or its sealed file (which
/// the host hands to a plain socket with `sendfile`).
pub(crate) fn from_entry(entry: &Arc<CachedResponse>) -> ResponseBody {
    let chunks = match &entry.body {
        StoredBody::File(file) => return ResponseBody::file(file.clone(), file.len()),
        StoredBody::Chunks(chunks) => chunks,
    };
    // One chunk (most entries): only its count is taken, not the list's too; both are
    // shared by every core's hits on the entry.
    if let [only] = &**chunks {
        return full(only.clone());
    }
    let chunks = chunks.clone();
    let chunks = (0..chunks.len()).map(move |i| Ok::<_, BoxError>(Frame::data(chunks[i].clone())));
    ResponseBody::from(StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync())
}

#[cfg(test)]
mod tests {
    /// Every sealed file the cache may open is a descriptor the host kept out of its
    /// session budget.
    #[test]
    fn the_host_reserves_a_descriptor_for_every_sealed_cache_body() {
        assert_eq!(
            wharf_cache::MAX_SEALED_FILES as u64,
            wharf_host::SEALED_BODY_FDS
        );
    }
}
