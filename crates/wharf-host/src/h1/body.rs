//! A request body on an HTTP/1.1 connection: the service's end ([`IncomingBody`]) and the
//! connection's end ([`BodyFeed`]).
//!
//! The connection owns the socket; the body only asks. When the service polls the body and
//! nothing is buffered, the body says it wants data (and wakes the connection if that runs
//! in another task); the connection then reads and decodes one batch from the socket and
//! hands it over. Nothing is read ahead of the service: a slow consumer slows the client
//! down through TCP, and a body nobody reads is never buffered. Bytes cross as `Bytes`
//! split off the connection's read buffer, never copied.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use wharf_http1::chunked::{ChunkedDecoder, Decoded};

use crate::body::BoxError;

/// Why a request body ended badly.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RequestBodyError {
    /// The client closed the connection before the body's declared end.
    #[error("client closed the connection after {received} body bytes{}", expected_text(*.expected))]
    Truncated {
        /// Body bytes received.
        received: u64,
        /// The content-length, when one was declared.
        expected: Option<u64>,
    },
    /// The chunked coding is malformed.
    #[error("malformed chunked request body: {0}")]
    Chunked(&'static str),
    /// Reading from the client failed.
    #[error("reading the request body failed: {0}")]
    Read(String),
}

fn expected_text(expected: Option<u64>) -> String {
    expected.map_or_else(String::new, |len| format!(" of {len}"))
}

/// What the two ends share. Guarded by a mutex that is only ever held for a few field
/// updates, never across I/O.
#[derive(Debug, Default)]
struct Shared {
    /// Decoded data the service has not taken yet.
    data: VecDeque<Bytes>,
    /// The body's end: `Ok` when complete, `Err` when broken.
    end: Option<Result<(), RequestBodyError>>,
    /// The service is waiting for data.
    want: bool,
    /// Wakes the service when data or the end arrives.
    consumer: Option<Waker>,
    /// Wakes the connection when the service wants data.
    driver: Option<Waker>,
    /// The service dropped its end.
    consumer_gone: bool,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// The request body a service reads.
#[derive(Debug)]
pub struct IncomingBody {
    shared: Arc<Mutex<Shared>>,
    /// Bytes still due for a content-length body (for `size_hint`).
    remaining: Option<u64>,
    /// The end was handed out.
    done: bool,
}

impl Body for IncomingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let mut shared = lock(&self.shared);
        if let Some(data) = shared.data.pop_front() {
            drop(shared);
            if let Some(remaining) = &mut self.remaining {
                *remaining = remaining.saturating_sub(data.len() as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match &shared.end {
            Some(Ok(())) => {
                drop(shared);
                self.done = true;
                return Poll::Ready(None);
            }
            Some(Err(error)) => {
                let error = error.clone();
                drop(shared);
                self.done = true;
                return Poll::Ready(Some(Err(Box::new(error))));
            }
            None => {}
        }
        let newly_wanted = !shared.want;
        shared.want = true;
        if !shared
            .consumer
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            shared.consumer = Some(cx.waker().clone());
        }
        // The connection reads only when asked: wake it unless it is this very task (it
        // looks again after polling us).
        let driver = match &shared.driver {
            Some(driver) if newly_wanted && !driver.will_wake(cx.waker()) => Some(driver.clone()),
            _ => None,
        };
        drop(shared);
        if let Some(driver) = driver {
            driver.wake();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

impl Drop for IncomingBody {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        shared.consumer_gone = true;
        shared.consumer = None;
        shared.data.clear();
    }
}

/// How the rest of the body is delimited on the wire.
#[derive(Debug)]
enum Decoder {
    Length { remaining: u64, expected: u64 },
    Chunked(ChunkedDecoder),
}

/// The connection's end of a request body: decodes from the read buffer into the service's
/// end when asked.
#[derive(Debug)]
pub(crate) struct BodyFeed {
    shared: Arc<Mutex<Shared>>,
    decoder: Decoder,
    received: u64,
    /// `100 Continue` is owed before the first read (the client asked for it).
    continue_owed: bool,
    /// The end (or a failure) was decoded and handed over.
    finished: bool,
}

/// What [`BodyFeed::step`] needs from the connection.
pub(crate) enum FeedStep {
    /// Handed data or the end over (look at the service again).
    Progress,
    /// The service does not want data now.
    Idle,
    /// Send `100 Continue`, then step again.
    SendContinue,
    /// The buffer is empty: read more from the socket, then step again.
    NeedBytes,
    /// Nothing more to do: the body is complete (or failed, or nobody will read it).
    Finished,
}

impl BodyFeed {
    /// A body of exactly `len` bytes (`len` > 0), or chunked when `None`.
    pub(crate) fn new(len: Option<u64>, expect_continue: bool) -> (BodyFeed, IncomingBody) {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let decoder = match len {
            Some(len) => Decoder::Length {
                remaining: len,
                expected: len,
            },
            None => Decoder::Chunked(ChunkedDecoder::new()),
        };
        let feed = BodyFeed {
            shared: shared.clone(),
            decoder,
            received: 0,
            continue_owed: expect_continue,
            finished: false,
        };
        let body = IncomingBody {
            shared,
            remaining: len,
            done: false,
        };
        (feed, body)
    }

    /// Whether the whole body was read off the connection (the next request may follow).
    pub(crate) fn is_complete(&self) -> bool {
        match &self.decoder {
            Decoder::Length { remaining, .. } => *remaining == 0,
            Decoder::Chunked(decoder) => decoder.is_done(),
        }
    }

    /// Whether the end (or a failure) was handed over: nothing more to read for this body.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Body bytes read off the connection so far.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// Registers the connection's waker, for a service that reads from another task.
    pub(crate) fn register(&self, cx: &Context<'_>) {
        let mut shared = lock(&self.shared);
        if !shared
            .driver
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            shared.driver = Some(cx.waker().clone());
        }
    }

    /// The client's 100-continue was answered (or need not be any more).
    pub(crate) fn continue_sent(&mut self) {
        self.continue_owed = false;
    }

    /// One step of feeding from `buf`: decode what is there if the service wants it.
    /// `draining`: the service is done with the body; consume and drop the rest. `me` is the
    /// connection task's waker: a service in the same task is not woken (it is polled again
    /// anyway).
    pub(crate) fn step(&mut self, buf: &mut BytesMut, draining: bool, me: &Waker) -> FeedStep {
        if self.finished {
            return FeedStep::Finished;
        }
        if !draining {
            let shared = lock(&self.shared);
            if shared.consumer_gone {
                return FeedStep::Finished;
            }
            if !shared.want {
                return FeedStep::Idle;
            }
        }
        if self.continue_owed {
            return FeedStep::SendContinue;
        }
        let decoded = match &mut self.decoder {
            Decoder::Length { remaining, .. } => {
                if buf.is_empty() {
                    return FeedStep::NeedBytes;
                }
                let take = usize::try_from(*remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                *remaining -= take as u64;
                let data = buf.split_to(take).freeze();
                let ended = *remaining == 0;
                Ok((Some(data), ended))
            }
            Decoder::Chunked(decoder) => match decoder.decode(buf) {
                Ok(Decoded::Data(data)) => Ok((Some(data), false)),
                Ok(Decoded::End) => Ok((None, true)),
                Ok(Decoded::NeedMore) => return FeedStep::NeedBytes,
                Err(wharf_http1::MessageError::Chunked(why)) => Err(RequestBodyError::Chunked(why)),
                Err(other) => Err(RequestBodyError::Read(other.to_string())),
            },
        };
        match decoded {
            Ok((data, ended)) => {
                if let Some(data) = &data {
                    self.received += data.len() as u64;
                }
                if draining {
                    if ended {
                        self.finished = true;
                    }
                    return FeedStep::Progress;
                }
                self.hand_over(data, ended.then_some(Ok(())), Some(me));
            }
            Err(error) => self.hand_over(None, Some(Err(error)), Some(me)),
        }
        FeedStep::Progress
    }

    /// The client closed (or the read failed) before the body's end.
    pub(crate) fn fail(&mut self, error: Option<std::io::Error>) {
        let error = match error {
            Some(error) => RequestBodyError::Read(error.to_string()),
            None => RequestBodyError::Truncated {
                received: self.received,
                expected: match self.decoder {
                    Decoder::Length { expected, .. } => Some(expected),
                    Decoder::Chunked(_) => None,
                },
            },
        };
        self.hand_over(None, Some(Err(error)), None);
    }

    fn hand_over(
        &mut self,
        data: Option<Bytes>,
        end: Option<Result<(), RequestBodyError>>,
        me: Option<&Waker>,
    ) {
        if end.is_some() {
            self.finished = true;
        }
        let mut shared = lock(&self.shared);
        if let Some(data) = data.filter(|data| !data.is_empty()) {
            shared.data.push_back(data);
        }
        if end.is_some() {
            shared.end = end;
        }
        shared.want = false;
        let consumer = shared.consumer.take();
        drop(shared);
        if let Some(consumer) = consumer {
            if !me.is_some_and(|me| consumer.will_wake(me)) {
                consumer.wake();
            }
        }
    }
}
