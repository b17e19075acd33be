//! The backend's response body on its way back to the client, which counts
//! the call against its backend until it ends (the connection itself goes
//! back to the pool only when the body was read to the end, see
//! [`wharf_upstream::ResponseBody`]). Past the bytes read with the head, a
//! body of a stated length goes from the backend's socket to the client's by
//! `splice(2)` where both are plain sockets and `server.splice_bodies` is on
//! ([`SpliceBody`]), as the proxy's pass-through bodies do.

use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wharf_host::body::{BoxError, SpliceBody};
use wharf_upstream::ResponseBody as UpstreamBody;

use crate::backend::Lease;

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
/// is complete. The body itself may live on past its end: the host's writer keeps it until
/// the last bytes it holds (buffered, or in its splice pipe) reach a client that reads
/// slowly, and hyper stops polling a body that says it has ended. So the lease ends with the
/// last frame or spliced byte, not with a `None` or a 0 that may never be asked for, nor
/// with the drop: a slow client does not keep its backend counted as busy.
fn release_at_end(lease: &mut Option<Lease>, body: &UpstreamBody, stopped: bool) {
    if stopped || body.is_end_stream() {
        lease.take();
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::os::fd::AsFd;
    use std::pin::pin;
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;
    use wharf_host::metrics::Metrics;
    use wharf_upstream::{FieldEdits, RequestHead};

    use super::*;
    use crate::backend::Backend;

    /// A backend that answers one request with a 5-byte body, sent with the head or, with
    /// `body_later`, once `body_later` fires; it then holds the connection open.
    async fn one_response_backend(body_later: Option<oneshot::Receiver<()>>) -> url::Url {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 4096];
            let mut read = 0;
            while !request[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                read += socket.read(&mut request[read..]).await.unwrap();
            }
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
            match body_later {
                None => socket
                    .write_all(&[&head[..], b"hello"].concat())
                    .await
                    .unwrap(),
                Some(later) => {
                    socket.write_all(head).await.unwrap();
                    let _ = later.await;
                    socket.write_all(b"hello").await.unwrap();
                }
            }
            let _ = socket.read(&mut request).await;
        });
        url
    }

    /// One call to `url`'s backend: its relayed body (holding the lease) and the backend.
    async fn relayed_call(url: &url::Url) -> (RelayBody, Arc<Backend>) {
        let metrics = Metrics::new();
        let tls = wharf_upstream::tls_connector().unwrap();
        let backend = Arc::new(Backend::new(url, &tls, metrics.upstream("r", "b")).unwrap());
        let (slot, connection) = backend.connection().await.unwrap();
        let lease = backend.lease();
        let headers = http::HeaderMap::new();
        let head = RequestHead {
            method: &http::Method::GET,
            target: "/",
            headers: &headers,
            edits: FieldEdits::NONE,
            response_fields: wharf_upstream::HeadFields::All,
        };
        let response = connection
            .send(head, pin!(wharf_host::body::empty()), Some(slot))
            .await
            .unwrap();
        (RelayBody::new(response.into_body(), lease), backend)
    }

    #[tokio::test]
    async fn the_backend_stops_counting_the_call_at_the_last_frame_not_at_the_drop() {
        let url = one_response_backend(None).await;
        let (relay, backend) = relayed_call(&url).await;
        let mut relay = pin!(relay);
        assert_eq!(backend.outstanding(), 1);
        let frame = poll_fn(|cx| relay.as_mut().poll_frame(cx)).await;
        let data = frame.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data.as_ref(), b"hello");
        // The body is still held (as a writer waiting for a slow client holds it).
        assert_eq!(
            backend.outstanding(),
            0,
            "the call still counts after its last frame"
        );
    }

    #[tokio::test]
    async fn the_backend_stops_counting_the_call_at_the_last_spliced_byte_not_at_the_drop() {
        let (send_body, body_later) = oneshot::channel();
        let url = one_response_backend(Some(body_later)).await;
        let (relay, backend) = relayed_call(&url).await;
        let mut relay = pin!(relay);
        assert!(relay.can_splice(), "nothing of the body came with the head");
        send_body.send(()).unwrap();
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        let mut moved = 0;
        while moved < 5 {
            let step = poll_fn(|cx| relay.as_mut().poll_splice_to(cx, write_end.as_fd(), 64));
            moved += step.await.unwrap();
        }
        let mut spliced = [0; 5];
        rustix::io::read(&read_end, &mut spliced).unwrap();
        assert_eq!(&spliced, b"hello");
        assert_eq!(
            backend.outstanding(),
            0,
            "the call still counts after its last byte"
        );
    }
}
