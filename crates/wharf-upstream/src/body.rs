//! A response body read from its connection as it is polled.
//!
//! [`ResponseBody`] owns the connection while the body streams. Data frames are split off the
//! read buffer without copying. When the body's end has been read (content-length reached,
//! last chunk and trailers seen, or EOF for a close-delimited body) the connection goes back
//! to its pool if the response allowed it and nothing unexpected follows; a body dropped
//! before its end closes the connection, so no stray bytes ever reach the next request. An
//! end that comes early (EOF inside a content-length or chunked body) is an error, never a
//! normal end: the caller turns it into a visible truncation.

use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::connection::Connection;
use crate::error::UpstreamError;
use crate::pool::PoolSlot;
use wharf_http1::chunked::{ChunkedDecoder, Decoded};
use wharf_http1::response::Framing;

/// Where the body's framing stands.
#[derive(Debug)]
enum Progress {
    /// This many bytes of a content-length body are still due (of `expected`).
    Length { remaining: u64, expected: u64 },
    /// A chunked body.
    Chunked(ChunkedDecoder),
    /// Until EOF.
    UntilClose,
    /// The end was read (or the body failed).
    Ended,
}

/// An upstream response's body. `Data` frames are `Bytes`; the error says what broke.
#[derive(Debug)]
pub struct ResponseBody {
    /// The connection, until the body ended or failed.
    connection: Option<Connection>,
    progress: Progress,
    /// Body bytes handed out so far.
    received: u64,
    /// Whether the response allows the connection to carry another request.
    keep_alive: bool,
    /// Where the connection goes when the body is complete.
    slot: Option<PoolSlot>,
}

impl ResponseBody {
    pub(crate) fn new(
        connection: Connection,
        framing: Framing,
        keep_alive: bool,
        slot: Option<PoolSlot>,
    ) -> Self {
        let progress = match framing {
            Framing::Empty | Framing::Length(0) => Progress::Ended,
            Framing::Length(len) => Progress::Length {
                remaining: len,
                expected: len,
            },
            Framing::Chunked => Progress::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => Progress::UntilClose,
        };
        let mut body = Self {
            connection: Some(connection),
            progress,
            received: 0,
            keep_alive,
            slot,
        };
        if matches!(body.progress, Progress::Ended) {
            // A body that is over before it starts is never polled: release now.
            body.finish();
        }
        body
    }

    /// Body bytes handed out so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Whether the rest of the body can be moved with [`ResponseBody::poll_splice_to`]: a
    /// body of a stated length, bytes of it still due, none of them read into user space
    /// yet (those come as frames first), on a plain socket.
    pub fn can_splice(&self) -> bool {
        matches!(self.progress, Progress::Length { remaining, .. } if remaining > 0)
            && self
                .connection
                .as_ref()
                .is_some_and(|connection| connection.buf.is_empty() && connection.io.can_splice())
    }

    /// Moves up to `max` of the body's next bytes from its socket into `pipe` (empty and
    /// non-blocking) with `splice(2)`, never past the body's end; how many it moved, 0 once
    /// the body is complete. At the end the connection goes back to its pool, as after
    /// frames; an EOF before the end is [`UpstreamError::Truncated`]. Only when
    /// [`ResponseBody::can_splice`] said so: otherwise it moves nothing (0), or ends the
    /// body with an error when body bytes were already read into its buffer.
    pub fn poll_splice_to(
        &mut self,
        cx: &mut Context<'_>,
        pipe: BorrowedFd<'_>,
        max: usize,
    ) -> Poll<Result<usize, UpstreamError>> {
        let Progress::Length {
            remaining,
            expected,
        } = &mut self.progress
        else {
            return Poll::Ready(Ok(0));
        };
        let expected = *expected;
        let Some(connection) = self.connection.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        if !connection.buf.is_empty() {
            return Poll::Ready(Err(self.abandon(UpstreamError::Read(
                std::io::Error::other("spliced while body bytes were buffered"),
            ))));
        }
        let len = usize::try_from(*remaining).unwrap_or(usize::MAX).min(max);
        match connection.io.poll_splice_to(cx, pipe, len) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(0)) => {
                let received = self.received;
                Poll::Ready(Err(self.abandon(UpstreamError::Truncated {
                    received,
                    expected: Some(expected),
                })))
            }
            Poll::Ready(Ok(moved)) => {
                connection.body_spliced();
                *remaining -= moved as u64;
                let done = *remaining == 0;
                self.received += moved as u64;
                if done {
                    self.finish();
                }
                Poll::Ready(Ok(moved))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(self.abandon(UpstreamError::Read(error)))),
        }
    }

    /// The body broke: the connection is closed; the error is returned.
    fn abandon(&mut self, error: UpstreamError) -> UpstreamError {
        self.progress = Progress::Ended;
        self.connection = None;
        error
    }

    /// The end was read: the connection goes back to the pool, or is closed.
    fn finish(&mut self) {
        self.progress = Progress::Ended;
        let Some(connection) = self.connection.take() else {
            return;
        };
        // Bytes after the end of the message were never asked for: the connection is out of
        // step with the upstream and is closed.
        if self.keep_alive && connection.buf.is_empty() {
            if let Some(slot) = self.slot.take() {
                slot.check_in(connection);
            }
        }
    }

    /// The body broke while read as frames: the connection is closed.
    fn fail(&mut self, error: UpstreamError) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        Poll::Ready(Some(Err(self.abandon(error))))
    }

    fn data(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        self.received += data.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        loop {
            let Some(connection) = this.connection.as_mut() else {
                return Poll::Ready(None);
            };
            match &mut this.progress {
                Progress::Ended => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Progress::Length {
                    remaining,
                    expected,
                } => {
                    if !connection.buf.is_empty() {
                        let take = usize::try_from(*remaining)
                            .unwrap_or(usize::MAX)
                            .min(connection.buf.len());
                        let data = connection.buf.split_to(take).freeze();
                        *remaining -= take as u64;
                        if *remaining == 0 {
                            // The last bytes: release before the caller stops polling (hyper
                            // does once `is_end_stream` says so).
                            this.finish();
                        }
                        return this.data(data);
                    }
                    let expected = *expected;
                    match connection.poll_read_more(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(0)) => {
                            let received = this.received;
                            return this.fail(UpstreamError::Truncated {
                                received,
                                expected: Some(expected),
                            });
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(error)) => return this.fail(UpstreamError::Read(error)),
                    }
                }
                Progress::Chunked(decoder) => match decoder.decode(&mut connection.buf) {
                    Ok(Decoded::Data(data)) => return this.data(data),
                    Ok(Decoded::End) => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => match connection.poll_read_more(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(0)) => {
                            let received = this.received;
                            return this.fail(UpstreamError::Truncated {
                                received,
                                expected: None,
                            });
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(error)) => return this.fail(UpstreamError::Read(error)),
                    },
                    Err(error) => return this.fail(error.into()),
                },
                Progress::UntilClose => {
                    if !connection.buf.is_empty() {
                        let data = connection.buf.split().freeze();
                        return this.data(data);
                    }
                    match connection.poll_read_more(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(0)) => {
                            this.keep_alive = false;
                            this.finish();
                            return Poll::Ready(None);
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(error)) => return this.fail(UpstreamError::Read(error)),
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.progress, Progress::Ended)
    }

    fn size_hint(&self) -> SizeHint {
        match self.progress {
            Progress::Length { remaining, .. } => SizeHint::with_exact(remaining),
            Progress::Ended => SizeHint::with_exact(0),
            Progress::Chunked(_) | Progress::UntilClose => SizeHint::default(),
        }
    }
}
