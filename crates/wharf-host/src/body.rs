//! The response body type every service returns, and small constructors.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

/// The error a streamed response body may end with. Ending with an error
/// makes the host abort the response (close the connection, or omit the
/// chunked terminator), which is how a truncated origin body reaches the
/// client as a truncation.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: fixed bytes or a stream of chunks.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding exactly `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> ResponseBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

pin_project_lite::pin_project! {
    /// A response body that holds `guard` until the body ends, fails or is
    /// dropped (client gone): how a call's slot, counters and in-flight
    /// entry last exactly as long as its response.
    pub struct GuardedBody<G> {
        #[pin]
        inner: ResponseBody,
        guard: Option<G>,
    }
}

impl<G> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            this.guard.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Makes `response`'s body hold `guard` until it is done.
pub fn guard_body<G: Send + 'static>(
    response: http::Response<ResponseBody>,
    guard: G,
) -> http::Response<ResponseBody> {
    response.map(|inner| {
        GuardedBody {
            inner,
            guard: Some(guard),
        }
        .boxed_unsync()
    })
}
