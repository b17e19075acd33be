//! One origin response in flight, shared by every reader from its first byte.
//!
//! The writer appends chunks as the origin sends them; readers hold a cursor
//! each and wait for the next chunk. While the response may still be cached
//! ("committable") every chunk is kept, so a reader joining late replays from
//! the start and the writer never waits (memory is bounded by
//! `max_object_bytes`, past which the fill stops being committable). Once not
//! committable, chunks every reader has passed are dropped and the writer
//! waits for the slowest reader when more than [`UNSHARED_WINDOW`] bytes are
//! held: the origin is then read at the clients' pace, with bounded memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{watch, Notify};

use crate::entry::ResponseHead;

/// Why a fill failed, shared by all its readers. The proxy downcasts it to
/// its own error type to pick a status.
pub type FillFailure = Arc<dyn std::error::Error + Send + Sync>;

/// Bytes a non-committable fill holds ahead of its slowest reader.
pub const UNSHARED_WINDOW: u64 = 1024 * 1024;

/// What happened to a pushed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// Keep reading the origin.
    Continue,
    /// Nobody can use the rest of the body: no reader is left and the
    /// response will not be cached. The writer should stop reading.
    Abandoned,
}

#[derive(Debug, Clone)]
enum End {
    Complete,
    Failed(FillFailure),
}

#[derive(Debug)]
struct State {
    head: Option<Arc<ResponseHead>>,
    /// Retained chunks; `chunks[0]` has absolute index `first_index`.
    chunks: VecDeque<Bytes>,
    first_index: usize,
    retained_bytes: u64,
    total_bytes: u64,
    end: Option<End>,
    /// Still eligible to be cached: all chunks are retained.
    committable: bool,
    /// Absolute chunk index each attached reader reads next; `None` = gone.
    cursors: Vec<Option<usize>>,
}

impl State {
    fn active_readers(&self) -> usize {
        self.cursors.iter().flatten().count()
    }

    /// Drops chunks that every reader has passed (never while committable).
    fn trim(&mut self) {
        if self.committable {
            return;
        }
        let min = self
            .cursors
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(self.first_index + self.chunks.len());
        while self.first_index < min {
            let Some(chunk) = self.chunks.pop_front() else {
                break;
            };
            self.retained_bytes -= chunk.len() as u64;
            self.first_index += 1;
        }
    }
}

/// One origin response being fetched, readable by many.
#[derive(Debug)]
pub struct Fill {
    state: Mutex<State>,
    max_object_bytes: u64,
    /// Bumped on every change readers may wait for (head, chunk, end).
    changed: watch::Sender<()>,
    /// Signals the writer that a reader advanced or left.
    consumed: Notify,
}

impl Fill {
    /// Starts a fill that stays committable up to `max_object_bytes` of body.
    pub fn start(max_object_bytes: u64) -> (FillWriter, Arc<Fill>) {
        let (changed, _) = watch::channel(());
        let fill = Arc::new(Fill {
            state: Mutex::new(State {
                head: None,
                chunks: VecDeque::new(),
                first_index: 0,
                retained_bytes: 0,
                total_bytes: 0,
                end: None,
                committable: true,
                cursors: Vec::new(),
            }),
            max_object_bytes,
            changed,
            consumed: Notify::new(),
        });
        (FillWriter { fill: fill.clone() }, fill)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug in this module;
        // the data is still consistent chunk-wise, so keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a reader that starts at the first byte, or `None` when the fill
    /// can no longer replay from the start (it stopped being committable).
    pub fn attach(self: &Arc<Self>) -> Option<FillReader> {
        let mut state = self.lock();
        if !state.committable {
            return None;
        }
        let slot = match state.cursors.iter().position(Option::is_none) {
            Some(free) => {
                state.cursors[free] = Some(0);
                free
            }
            None => {
                state.cursors.push(Some(0));
                state.cursors.len() - 1
            }
        };
        Some(FillReader {
            fill: self.clone(),
            slot,
            next: 0,
            changes: self.changed.subscribe(),
        })
    }

    /// Whether a new reader could still join from the first byte.
    pub fn is_shareable(&self) -> bool {
        self.lock().committable
    }

    /// Body bytes received so far.
    pub fn received_bytes(&self) -> u64 {
        self.lock().total_bytes
    }

    fn notify_readers(&self) {
        self.changed.send_replace(());
    }
}

/// The one writer of a fill. Dropping it before [`FillWriter::finish`] or
/// [`FillWriter::fail`] fails the fill, so no reader ever waits forever.
#[derive(Debug)]
pub struct FillWriter {
    fill: Arc<Fill>,
}

impl FillWriter {
    /// The fill this writer feeds.
    pub fn fill(&self) -> &Arc<Fill> {
        &self.fill
    }

    /// Publishes the response head; `committable` says whether the proxy's
    /// policy allows caching this response at all.
    pub fn set_head(&self, head: Arc<ResponseHead>, committable: bool) {
        {
            let mut state = self.fill.lock();
            state.head = Some(head);
            state.committable &= committable;
            state.trim();
        }
        self.fill.notify_readers();
    }

    /// Appends one body chunk, waiting for slow readers when the fill is not
    /// committable and holds more than [`UNSHARED_WINDOW`].
    pub async fn push(&self, chunk: Bytes) -> PushOutcome {
        {
            let mut state = self.fill.lock();
            state.total_bytes += chunk.len() as u64;
            if state.total_bytes > self.fill.max_object_bytes {
                state.committable = false;
            }
            state.retained_bytes += chunk.len() as u64;
            state.chunks.push_back(chunk);
            state.trim();
        }
        self.fill.notify_readers();
        loop {
            // Register interest before checking, so a reader's advance
            // between the check and the wait is not lost.
            let consumed = self.fill.consumed.notified();
            {
                let mut state = self.fill.lock();
                if state.committable {
                    return PushOutcome::Continue;
                }
                state.trim();
                if state.active_readers() == 0 {
                    return PushOutcome::Abandoned;
                }
                if state.retained_bytes <= UNSHARED_WINDOW {
                    return PushOutcome::Continue;
                }
            }
            consumed.await;
        }
    }

    /// Whether the body still qualifies for caching.
    pub fn is_committable(&self) -> bool {
        self.fill.lock().committable
    }

    /// Whether any reader is attached.
    pub fn has_readers(&self) -> bool {
        self.fill.lock().active_readers() > 0
    }

    /// Ends the fill normally. Returns the whole body when it is still
    /// committable, for the caller to store.
    pub fn finish(self) -> Option<Vec<Bytes>> {
        let body = {
            let mut state = self.fill.lock();
            state.end = Some(End::Complete);
            state
                .committable
                .then(|| state.chunks.iter().cloned().collect())
        };
        self.fill.notify_readers();
        body
    }

    /// Ends the fill with an error every reader will see.
    pub fn fail(self, failure: FillFailure) {
        self.fail_in_place(failure);
    }

    fn fail_in_place(&self, failure: FillFailure) {
        {
            let mut state = self.fill.lock();
            if state.end.is_some() {
                return;
            }
            state.end = Some(End::Failed(failure));
            state.committable = false;
        }
        self.fill.notify_readers();
    }
}

impl Drop for FillWriter {
    fn drop(&mut self) {
        self.fail_in_place(Arc::new(Abandoned));
    }
}

/// The writer went away without finishing (its task was cancelled).
#[derive(Debug, thiserror::Error)]
#[error("origin fetch abandoned before the body was complete")]
pub struct Abandoned;

/// One reader of a fill: the head, then every chunk from the first.
#[derive(Debug)]
pub struct FillReader {
    fill: Arc<Fill>,
    slot: usize,
    next: usize,
    changes: watch::Receiver<()>,
}

impl FillReader {
    /// Waits for the response head, or the failure that came before it.
    pub async fn head(&mut self) -> Result<Arc<ResponseHead>, FillFailure> {
        loop {
            self.changes.borrow_and_update();
            {
                let state = self.fill.lock();
                if let Some(head) = &state.head {
                    return Ok(head.clone());
                }
                if let Some(End::Failed(failure)) = &state.end {
                    return Err(failure.clone());
                }
                if let Some(End::Complete) = &state.end {
                    return Err(Arc::new(Abandoned));
                }
            }
            if self.changes.changed().await.is_err() {
                return Err(Arc::new(Abandoned));
            }
        }
    }

    /// The next body chunk; `None` after a complete body, `Some(Err)` when
    /// the origin failed: a failed fill never ends like a complete one.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, FillFailure>> {
        loop {
            self.changes.borrow_and_update();
            {
                let mut state = self.fill.lock();
                if let Some(offset) = self.next.checked_sub(state.first_index) {
                    if let Some(chunk) = state.chunks.get(offset).cloned() {
                        self.next += 1;
                        state.cursors[self.slot] = Some(self.next);
                        let wake_writer = !state.committable;
                        drop(state);
                        if wake_writer {
                            self.fill.consumed.notify_one();
                        }
                        return Some(Ok(chunk));
                    }
                } else {
                    // Chunks are only trimmed below every cursor, ours included.
                    return Some(Err(Arc::new(Abandoned)));
                }
                match &state.end {
                    Some(End::Complete) => return None,
                    Some(End::Failed(failure)) => return Some(Err(failure.clone())),
                    None => {}
                }
            }
            if self.changes.changed().await.is_err() {
                return Some(Err(Arc::new(Abandoned)));
            }
        }
    }
}

impl Drop for FillReader {
    fn drop(&mut self) {
        {
            let mut state = self.fill.lock();
            state.cursors[self.slot] = None;
            state.trim();
        }
        self.fill.consumed.notify_one();
    }
}

#[cfg(test)]
mod tests;
