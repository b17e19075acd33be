//! Bulkheads: each service gets its own call slots and its own bounded
//! queue, so one service saturated by slow calls never delays another.
//!
//! A call takes a slot at once when one is free; otherwise it waits in a
//! FIFO queue of at most `max_queued` calls for at most `queue_timeout`.
//! Beyond the queue it is rejected at once. The slot is a [`CallPermit`]
//! that frees itself when dropped, however the call ends (response done,
//! client gone, error, timeout).
//!
//! This crate only counts and waits; turning a rejection into a 503 and
//! holding the permit until the response body ends is the host's job.
//!
//! The other limit kept here is process-wide: [`descriptors`], the open-files
//! ledger that lets idle upstream connections use only the descriptors
//! sessions leave free.

pub mod descriptors;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a call was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throttled {
    /// Every slot was busy and the queue was full.
    QueueFull,
    /// The call waited `queue_timeout` without getting a slot.
    QueueTimeout,
}

/// Call slots plus a bounded, timed queue for one service.
#[derive(Debug)]
pub struct Bulkhead {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    max_queued: usize,
    queue_timeout: Duration,
    counts: Counts,
}

/// Live counts, readable at any time (for counters and /debug). Calls holding a slot are
/// not counted here: they are the slots the semaphore has out, and a count of its own would
/// be two more writes per call to a line both cores share.
#[derive(Debug, Default)]
struct Counts {
    /// Calls waiting for a slot.
    queued: AtomicUsize,
    /// Calls rejected since start (queue full or queue timeout).
    throttled: AtomicU64,
}

/// A snapshot of a bulkhead's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkheadStats {
    /// Calls holding a slot.
    pub processing: usize,
    /// Calls waiting for a slot.
    pub queued: usize,
    /// Calls rejected since start.
    pub throttled: u64,
    /// The configured number of slots.
    pub max_concurrent: usize,
}

impl BulkheadStats {
    /// (processing + queued) / max_concurrent × 100, as seed 004's
    /// PercentOfMaxCalls: over 100 means calls are queuing.
    pub fn percent_of_max_calls(&self) -> f64 {
        (self.processing + self.queued) as f64 * 100.0 / self.max_concurrent.max(1) as f64
    }
}

impl Bulkhead {
    /// `max_concurrent` slots (at least 1), a queue of `max_queued`, and
    /// the longest a queued call waits.
    pub fn new(max_concurrent: usize, max_queued: usize, queue_timeout: Duration) -> Self {
        let max_concurrent = max_concurrent.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            max_queued,
            queue_timeout,
            counts: Counts::default(),
        }
    }

    /// Takes a free slot now, if there is one (no queueing).
    pub fn try_acquire(&self) -> Option<CallPermit> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        Some(self.admitted(slot))
    }

    /// Takes a slot, waiting in the queue if needed.
    pub async fn acquire(&self) -> Result<CallPermit, Throttled> {
        if let Some(permit) = self.try_acquire() {
            return Ok(permit);
        }
        // Boxed: the wait (a semaphore waiter and a timer) is the rare path, and would
        // otherwise make every call's future carry it.
        Box::pin(self.queue()).await
    }

    /// Waits in the queue for a slot, within `queue_timeout`.
    async fn queue(&self) -> Result<CallPermit, Throttled> {
        let waiting = self.counts.queued.fetch_add(1, Ordering::AcqRel) + 1;
        // Leaves the queue however the wait ends, also when the caller's
        // future is dropped because the client went away.
        let _in_queue = QueueSpot(&self.counts);
        if waiting > self.max_queued {
            self.counts.throttled.fetch_add(1, Ordering::Relaxed);
            return Err(Throttled::QueueFull);
        }
        match tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(self.admitted(slot)),
            // The semaphore is never closed; treat it like a timeout anyway.
            Ok(Err(_)) | Err(_) => {
                self.counts.throttled.fetch_add(1, Ordering::Relaxed);
                Err(Throttled::QueueTimeout)
            }
        }
    }

    fn admitted(&self, slot: OwnedSemaphorePermit) -> CallPermit {
        CallPermit { _slot: slot }
    }

    /// The counts right now.
    pub fn stats(&self) -> BulkheadStats {
        BulkheadStats {
            processing: self
                .max_concurrent
                .saturating_sub(self.slots.available_permits()),
            queued: self.counts.queued.load(Ordering::Acquire),
            throttled: self.counts.throttled.load(Ordering::Relaxed),
            max_concurrent: self.max_concurrent,
        }
    }

    /// How long a queued call may wait; also a fair `retry-after` hint.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }
}

struct QueueSpot<'a>(&'a Counts);

impl Drop for QueueSpot<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One call slot; dropping it frees the slot.
#[derive(Debug)]
pub struct CallPermit {
    _slot: OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admits_queues_then_rejects() {
        let bulkhead = Arc::new(Bulkhead::new(2, 1, Duration::from_secs(60)));
        let a = bulkhead.acquire().await.unwrap();
        let _b = bulkhead.acquire().await.unwrap();
        let queued = tokio::spawn({
            let bulkhead = bulkhead.clone();
            async move { bulkhead.acquire().await.map(|_| ()) }
        });
        while bulkhead.stats().queued == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(bulkhead.acquire().await.unwrap_err(), Throttled::QueueFull);
        let stats = bulkhead.stats();
        assert_eq!((stats.processing, stats.queued, stats.throttled), (2, 1, 1));
        assert_eq!(stats.percent_of_max_calls(), 150.0);
        drop(a);
        queued.await.unwrap().unwrap();
        let stats = bulkhead.stats();
        assert_eq!((stats.processing, stats.queued), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn queued_call_times_out() {
        let bulkhead = Bulkhead::new(1, 5, Duration::from_millis(500));
        let _held = bulkhead.acquire().await.unwrap();
        assert_eq!(
            bulkhead.acquire().await.unwrap_err(),
            Throttled::QueueTimeout
        );
        assert_eq!(bulkhead.stats().queued, 0);
        assert_eq!(bulkhead.stats().throttled, 1);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_queue() {
        let bulkhead = Bulkhead::new(1, 5, Duration::from_secs(60));
        let _held = bulkhead.acquire().await.unwrap();
        let wait = bulkhead.acquire();
        let _ = tokio::time::timeout(Duration::from_millis(20), wait).await;
        assert_eq!(bulkhead.stats().queued, 0);
    }
}
