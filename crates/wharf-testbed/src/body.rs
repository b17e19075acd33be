//! Response bodies: a whole small buffer, or slices of the pattern released on a schedule.
//!
//! [`TestbedBody`] is the one body type every endpoint answers with, so no response is boxed.
//! A [`Schedule`] says when which bytes of the pattern become due (all at once for `/bytes`,
//! spread out for `/stream`, in two halves for `/stall`) and how the body ends: normally, or
//! with a [`BodyError`] that makes hyper abort the connection (HTTP/1) or reset the stream
//! (HTTP/2), which is how `/truncate` cuts a body short.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{sleep_until, Instant, Sleep};

use crate::pattern::pattern_slice;

/// How long a truncated body waits after its last byte before failing.
///
/// hyper drops its unwritten buffer when a body fails, and it flushes that buffer whenever the
/// body is pending: one pause makes the bytes already produced reach the socket (as long as
/// the client keeps reading) before the connection is cut.
const ABORT_PAUSE: Duration = Duration::from_millis(50);

/// The error a body yields on purpose to cut its response short.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// `/truncate` sent what it meant to and now aborts the response.
    #[error("body cut on purpose after {sent} bytes")]
    Truncated {
        /// Body bytes produced before the cut.
        sent: u64,
    },
}

/// Bytes of the pattern that become due `at` after the response was built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    /// Delay from the start of the response.
    pub(crate) at: Duration,
    /// Number of pattern bytes released at that time.
    pub(crate) len: u64,
}

/// How a scheduled body ends once all its segments are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// End of stream: the response is complete.
    Finish,
    /// A [`BodyError`]: hyper aborts the connection or stream.
    Abort,
}

/// When a pattern body releases its bytes, and how it ends.
#[derive(Debug)]
pub(crate) struct Schedule {
    segments: Vec<Segment>,
    ending: Ending,
    /// Advertise the exact length to hyper (sets `content-length` when the handler did not).
    exact: bool,
}

impl Schedule {
    /// `len` bytes at once, with a known length.
    pub(crate) fn immediate(len: u64) -> Self {
        Self {
            segments: vec![Segment {
                at: Duration::ZERO,
                len,
            }],
            ending: Ending::Finish,
            exact: true,
        }
    }

    /// The given segments (in time order) and ending; the length is announced as exact only if
    /// `exact` and the body finishes normally.
    pub(crate) fn new(segments: Vec<Segment>, ending: Ending, exact: bool) -> Self {
        Self {
            segments,
            ending,
            exact: exact && ending == Ending::Finish,
        }
    }
}

/// The body of every testbed response.
#[derive(Debug)]
pub(crate) struct TestbedBody(Kind);

#[derive(Debug)]
enum Kind {
    /// One buffer, sent as one frame (`None` once sent, or from the start when empty).
    Full(Option<Bytes>),
    /// Pattern bytes on a schedule (boxed: the timer makes it large).
    Pattern(Box<PatternBody>),
}

impl TestbedBody {
    /// No body.
    pub(crate) fn empty() -> Self {
        Self(Kind::Full(None))
    }

    /// One buffer.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        if bytes.is_empty() {
            Self::empty()
        } else {
            Self(Kind::Full(Some(bytes)))
        }
    }

    /// Pattern bytes as `schedule` says, timed from now.
    pub(crate) fn pattern(schedule: Schedule) -> Self {
        let total: u64 = schedule.segments.iter().map(|s| s.len).sum();
        Self(Kind::Pattern(Box::new(PatternBody {
            start: Instant::now(),
            exact_len: schedule.exact.then_some(total),
            segments: schedule.segments,
            next_segment: 0,
            pos: 0,
            due: 0,
            ending: schedule.ending,
            sleep: None,
            abort_at: None,
            done: false,
        })))
    }
}

impl Body for TestbedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().0 {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Pattern(body) => body.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Pattern(body) => body.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Pattern(body) => match body.exact_len {
                Some(total) => SizeHint::with_exact(total - body.pos),
                None => SizeHint::default(),
            },
        }
    }
}

/// State of a scheduled pattern body.
#[derive(Debug)]
struct PatternBody {
    /// Segment delays count from here.
    start: Instant,
    segments: Vec<Segment>,
    /// Index of the first segment not yet released.
    next_segment: usize,
    /// Index in the pattern of the next byte to send (= bytes sent so far).
    pos: u64,
    /// Bytes released but not yet sent.
    due: u64,
    ending: Ending,
    /// Total length, when it is announced to hyper.
    exact_len: Option<u64>,
    /// Timer for the next segment or the abort, created on first need and then reset.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When an `Abort` ending fires (set once the last byte has been produced).
    abort_at: Option<Instant>,
    /// The last frame (or error) was returned.
    done: bool,
}

impl PatternBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            if self.due > 0 {
                let chunk = pattern_slice(self.pos, self.due);
                let n = chunk.len() as u64;
                self.pos += n;
                self.due -= n;
                // Say "end of stream" with the last frame, so hyper ends the response in the
                // same write instead of polling once more.
                self.done = self.due == 0
                    && self.next_segment == self.segments.len()
                    && self.ending == Ending::Finish;
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if let Some(segment) = self.segments.get(self.next_segment).copied() {
                if !segment.at.is_zero() {
                    ready!(self.wait_until(self.start + segment.at, cx));
                }
                self.next_segment += 1;
                self.due = segment.len;
                continue;
            }
            match self.ending {
                Ending::Finish => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Ending::Abort => {
                    let at = *self
                        .abort_at
                        .get_or_insert_with(|| Instant::now() + ABORT_PAUSE);
                    ready!(self.wait_until(at, cx));
                    self.done = true;
                    return Poll::Ready(Some(Err(BodyError::Truncated { sent: self.pos })));
                }
            }
        }
    }

    fn wait_until(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::pattern::{expected_body, CHUNK};

    #[tokio::test]
    async fn immediate_body_is_the_pattern_in_chunks() {
        let len = 3 * CHUNK as u64 + 17;
        let mut body = TestbedBody::pattern(Schedule::immediate(len));
        assert_eq!(body.size_hint().exact(), Some(len));
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= CHUNK);
            got.extend_from_slice(&data);
        }
        assert_eq!(got, expected_body(len));
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn abort_ending_yields_an_error_after_the_bytes() {
        let schedule = Schedule::new(
            vec![Segment {
                at: Duration::ZERO,
                len: 10,
            }],
            Ending::Abort,
            true,
        );
        let mut body = TestbedBody::pattern(schedule);
        assert_eq!(
            body.size_hint().exact(),
            None,
            "aborting bodies hide their length"
        );
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), 10);
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, BodyError::Truncated { sent: 10 }));
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn full_body_is_one_frame() {
        let mut body = TestbedBody::full(&b"ok\n"[..]);
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "ok\n"
        );
        assert!(body.is_end_stream());
        assert!(TestbedBody::full(Bytes::new()).is_end_stream());
    }
}
