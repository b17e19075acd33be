//! The deliverer: pulls messages from the durable consumer, at most `concurrency` at a
//! time (a message held for its dead letter gives its place back), POSTs each to the
//! backend, and records the outcome with the broker.
//!
//! - 2xx: acknowledged (and the acknowledgement confirmed), counted as delivered.
//! - another status, no answer within `ack_wait`, or a request that failed after
//!   connecting: an attempt used up. Before `max_deliver` attempts the message is nak'd with
//!   a delay of `backoff` doubling per attempt (at most [`MAX_BACKOFF`]); at `max_deliver` it
//!   is published to the dead-letter subject with the reason, then terminated. A dead letter
//!   the broker does not store is kept pending, in a copy whose deliveries try only the dead
//!   letter again, never the backend (`Deliverer::dead_letter`).
//! - could not connect: the backend is down, which is not the message's fault. The message is
//!   held (kept ours with in-progress acks, so the broker does not count a delivery) and
//!   tried again after `backoff`, doubling up to [`MAX_HOLD`], until the backend is back; the
//!   other messages wait in the stream, since every delivery slot is taken by a held one.
//!
//! Attempts are counted durably, with the broker: the attempt number is the message's
//! delivery count (each failed attempt is one nak, so one more delivery) plus
//! [`ATTEMPTS_HEADER`] of the stored copy (absent: 0). A delivery that made no attempt
//! cannot take its count back, so such a message is handed back as a fresh copy instead
//! (`Deliverer::hand_back`): the copy carries the attempts made so far in
//! [`ATTEMPTS_HEADER`], and the broker's count starts again at 1 with it. That happens to a
//! held message when the service stops (so the next deliverer, in this process or another,
//! gets it at once, not after `ack_wait`, and with no attempt used up) and to a message
//! pulled beyond the free slots. A wharf killed without stopping cannot hand back: its held
//! messages come back after `ack_wait` with one delivery counted.
//!
//! Order: a hand-back moves the message to the stream's tail (see `Deliverer::hand_back`).
//! Delivery order was never kept anyway: `concurrency` deliveries run at once, and a failed
//! attempt is retried after its backoff, behind the messages delivered meanwhile.

mod copy;
mod dead_letter;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::Batch;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};
use wharf_config::QueueConfig;
use wharf_metrics::queue::{QueueMetrics, RetryReason};

use crate::backend::{Attempt, Backend};
use crate::broker::Ready;
use crate::stop::{Live, Stop};

use crate::headers::{backend_headers, identify};
pub use crate::headers::{
    ATTEMPTS_HEADER, DEAD_DELIVERIES_HEADER, DEAD_PENDING_HEADER, DEAD_REASON_HEADER,
    DELIVERY_HEADER, MESSAGE_ID_HEADER,
};

/// Longest delay between two attempts of one message.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest pause between two tries while the backend cannot be connected to.
pub const MAX_HOLD: Duration = Duration::from_secs(5);
/// How long one pull request waits for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(1);
/// How often `wharf_queue_pending` is sampled, and the bound of that call.
const PENDING_EVERY: Duration = Duration::from_secs(2);
/// Bound of one acknowledgement round trip.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// What every delivery of one queue service needs.
pub(crate) struct Deliverer {
    pub(crate) service: String,
    pub(crate) config: QueueConfig,
    pub(crate) backend: Backend,
    pub(crate) metrics: QueueMetrics,
    pub(crate) ready: Ready,
}

impl Deliverer {
    /// Pulls and delivers until the service stops.
    pub(crate) async fn run(self: Arc<Self>, consumer: PullConsumer, stop: Stop) {
        let _live = Live::new();
        tokio::spawn(sample_pending(
            consumer.clone(),
            self.metrics.clone(),
            stop.clone(),
        ));
        let concurrency = self.config.deliver.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let mut stop_pull = stop.clone();
        // Dropped once the last pull request has ended: deliveries hand held messages back
        // only then (see `end_pull`).
        let (pulling, pull_ended) = watch::channel(());
        info!(service = self.service, "queue deliverer started");
        loop {
            // Biased, stop first: once stopped, a free slot must not open another pull
            // (it could take back a copy just handed back, and so on until `within`).
            let first = tokio::select! {
                biased;
                () = stop_pull.stopped() => break,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_closed) => break,
                },
            };
            let mut batch = vec![first];
            while batch.len() < concurrency {
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => batch.push(slot),
                    Err(_) => break,
                }
            }
            let pulled = consumer
                .batch()
                .max_messages(batch.len())
                .expires(PULL_EXPIRES)
                .messages()
                .await;
            let mut messages = match pulled {
                Ok(messages) => messages,
                Err(error) => {
                    debug!(service = self.service, error = %error, "pull failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(PULL_EXPIRES) => continue,
                        () = stop_pull.stopped() => break,
                    }
                }
            };
            loop {
                let next = tokio::select! {
                    biased;
                    () = stop_pull.stopped() => {
                        self.end_pull(&mut messages).await;
                        None
                    }
                    next = messages.next() => next,
                };
                match next {
                    Some(Ok(message)) => {
                        let Some(slot) = batch.pop() else {
                            // More than asked for: hand it back for later, unattempted.
                            self.hand_back(&message).await;
                            continue;
                        };
                        let live = Live::new();
                        tokio::spawn(self.clone().deliver(
                            message,
                            slot,
                            (stop.clone(), pull_ended.clone()),
                            live,
                        ));
                    }
                    Some(Err(error)) => {
                        debug!(service = self.service, error = %error, "pull ended with an error");
                        break;
                    }
                    None => break,
                }
            }
        }
        drop(pulling);
        info!(service = self.service, "queue deliverer stopped");
    }

    /// Waits (at most twice [`PULL_EXPIRES`]) for the open pull request to end, then hands
    /// back what it still brought. Until it ends the broker may send it messages, also one
    /// just handed back: dropped unread, that one would stay with this deliverer, which is
    /// going away, until `ack_wait`.
    async fn end_pull(&self, messages: &mut Batch) {
        let mut arrived = Vec::new();
        let _ = tokio::time::timeout(PULL_EXPIRES * 2, async {
            while let Some(next) = messages.next().await {
                if let Ok(message) = next {
                    arrived.push(message);
                }
            }
        })
        .await;
        for message in arrived {
            self.hand_back(&message).await;
        }
    }

    /// Delivers one message until it is acknowledged, nak'd for later, dead-lettered, or
    /// (backend down when the service stops) handed back.
    async fn deliver(
        self: Arc<Self>,
        message: Message,
        slot: OwnedSemaphorePermit,
        (mut stop, mut pull_ended): (Stop, watch::Receiver<()>),
        _live: Live,
    ) {
        let identity = identify(&message);
        if let Some(reason) = &identity.dead_pending {
            // Every attempt was made before this copy was stored: only its dead letter is
            // left to store.
            let attempts = identity.attempts_made;
            self.dead_letter(&message, &identity, attempts, reason, (slot, &mut stop))
                .await;
            return;
        }
        // `delivered`: the attempt this delivery makes (`x-wharf-delivery`), counted against
        // `max_deliver`.
        let (id, delivered) = (identity.id.as_str(), identity.attempt());
        if identity.redelivered() {
            self.metrics.redelivered();
        }
        let headers = backend_headers(&message, id, delivered);
        let ack_wait = self.config.deliver.ack_wait;
        let mut hold = self.config.deliver.backoff;
        loop {
            let attempt = with_progress(
                &message,
                ack_wait,
                self.backend
                    .post(message.payload.clone(), headers.clone(), ack_wait),
            )
            .await;
            let reason = match attempt {
                Attempt::Delivered => {
                    confirm(&message, AckKind::Ack, id).await;
                    self.metrics.delivered();
                    debug!(service = self.service, id, delivered, "message delivered");
                    return;
                }
                Attempt::Unreachable(why) => {
                    self.metrics.retried(RetryReason::Unreachable);
                    debug!(
                        service = self.service,
                        id,
                        error = why,
                        "backend unreachable; holding the message"
                    );
                    if !hold_message(&message, hold, ack_wait, &mut stop).await {
                        // Stopping: let the next deliverer have it now, no attempt used;
                        // once this deliverer's last pull request cannot take it back.
                        let _ = tokio::time::timeout(PULL_EXPIRES * 3, async {
                            while pull_ended.changed().await.is_ok() {}
                        })
                        .await;
                        self.hand_back(&message).await;
                        return;
                    }
                    hold = (hold * 2).min(MAX_HOLD);
                    continue;
                }
                Attempt::Timeout(_) => (RetryReason::Timeout, attempt.reason()),
                Attempt::Rejected(_) | Attempt::Failed(_) => {
                    (RetryReason::Rejected, attempt.reason())
                }
            };
            let (retry_reason, reason) = reason;
            if delivered >= self.config.deliver.max_deliver {
                self.dead_letter(&message, &identity, delivered, &reason, (slot, &mut stop))
                    .await;
            } else {
                self.metrics.retried(retry_reason);
                let delay = backoff_for(self.config.deliver.backoff, delivered);
                debug!(
                    service = self.service,
                    id,
                    delivered,
                    reason,
                    ?delay,
                    "delivery failed; retrying later"
                );
                let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            }
            return;
        }
    }
}

/// `backoff` doubled for each attempt after the first, at most [`MAX_BACKOFF`].
pub(crate) fn backoff_for(backoff: Duration, delivered: u32) -> Duration {
    let doublings = delivered.saturating_sub(1).min(20);
    backoff.saturating_mul(1u32 << doublings).min(MAX_BACKOFF)
}

/// Runs `attempt`, telling the broker every `ack_wait / 2` that the message is still being
/// worked on, so it is not given to another consumer meanwhile.
async fn with_progress<T>(
    message: &Message,
    ack_wait: Duration,
    attempt: impl std::future::Future<Output = T>,
) -> T {
    let every = (ack_wait / 2).max(Duration::from_millis(100));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            outcome = &mut attempt => return outcome,
            _ = ticks.tick() => {
                let _ = message.ack_with(AckKind::Progress).await;
            }
        }
    }
}

/// Keeps a message for `pause` (the backend is down, or its dead letter cannot be stored),
/// with in-progress acks; `false` if the service stopped.
async fn hold_message(
    message: &Message,
    pause: Duration,
    ack_wait: Duration,
    stop: &mut Stop,
) -> bool {
    let until = tokio::time::Instant::now() + pause;
    let slice = (ack_wait / 2).max(Duration::from_millis(100));
    loop {
        let _ = message.ack_with(AckKind::Progress).await;
        let now = tokio::time::Instant::now();
        if now >= until {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until.min(now + slice)) => {}
            () = stop.stopped() => return false,
        }
    }
}

/// Why the broker did not store a message the deliverer published ([`Deliverer::store`]).
#[derive(Debug)]
enum StoreFailure {
    /// The publish failed: the broker's error, or the client's (its own timeout, a
    /// connection lost).
    Refused(PublishError),
    /// No acknowledgement within the bound.
    NoAnswer,
}

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(error) => write!(f, "{error}"),
            Self::NoAnswer => f.write_str("no acknowledgement in time"),
        }
    }
}

impl Deliverer {
    /// Publishes `publish` to `subject` and waits for the broker's acknowledgement, at most
    /// `bound`, on behalf of the delivery of `message` (a dead letter or a copy of it). The
    /// broker is told that `message` is in progress first (the time since the last such
    /// ack is not known here) and every `ack_wait / 2` meanwhile: `bound` may be longer
    /// than `ack_wait`, and the broker must not hand `message` to another delivery then.
    async fn store(
        &self,
        message: &Message,
        subject: String,
        publish: PublishMessage,
        bound: Duration,
    ) -> Result<(), StoreFailure> {
        let _ = message.ack_with(AckKind::Progress).await;
        let jetstream = &self.ready.jetstream;
        let published = with_progress(
            message,
            self.config.deliver.ack_wait,
            tokio::time::timeout(bound, async {
                jetstream.send_publish(subject, publish).await?.await
            }),
        )
        .await;
        match published {
            Ok(Ok(_ack)) => Ok(()),
            Ok(Err(error)) => Err(StoreFailure::Refused(error)),
            Err(_elapsed) => Err(StoreFailure::NoAnswer),
        }
    }
}

/// Records an outcome and waits for the broker to confirm it (bounded). An unconfirmed ack
/// means the message may be delivered again, with the same id.
async fn confirm(message: &Message, kind: AckKind, id: &str) {
    match tokio::time::timeout(ACK_TIMEOUT, message.double_ack_with(kind)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            warn!(id, error = %error, "outcome not confirmed by the broker; may be delivered again")
        }
        Err(_) => warn!(id, "outcome not confirmed in time; may be delivered again"),
    }
}

/// Samples `wharf_queue_pending` (not yet delivered + delivered but not yet acknowledged)
/// from the consumer's info until the service stops.
async fn sample_pending(mut consumer: PullConsumer, metrics: QueueMetrics, mut stop: Stop) {
    loop {
        if let Ok(Ok(info)) = tokio::time::timeout(PENDING_EVERY, consumer.info()).await {
            let pending = info
                .num_pending
                .saturating_add(u64::try_from(info.num_ack_pending).unwrap_or(0));
            metrics.set_pending(pending);
        }
        tokio::select! {
            () = tokio::time::sleep(PENDING_EVERY) => {}
            () = stop.stopped() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_and_is_capped() {
        let base = Duration::from_millis(500);
        assert_eq!(backoff_for(base, 1), base);
        assert_eq!(backoff_for(base, 2), Duration::from_secs(1));
        assert_eq!(backoff_for(base, 4), Duration::from_secs(4));
        assert_eq!(backoff_for(base, 30), MAX_BACKOFF);
        assert_eq!(backoff_for(base, u32::MAX), MAX_BACKOFF);
    }
}
