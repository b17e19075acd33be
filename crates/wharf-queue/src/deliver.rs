//! The deliverer: pulls messages from the durable consumer, at most `concurrency` at a
//! time, POSTs each to the backend, and records the outcome with the broker.
//!
//! - 2xx: acknowledged (and the acknowledgement confirmed), counted as delivered.
//! - another status, no answer within `ack_wait`, or a request that failed after
//!   connecting: an attempt used up. Before `max_deliver` attempts the message is nak'd with
//!   a delay of `backoff` doubling per attempt (at most [`MAX_BACKOFF`]); at `max_deliver` it
//!   is published to the dead-letter subject with the reason, then terminated.
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

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::Batch;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::PublishErrorKind;
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

use crate::headers::{backend_headers, call_headers, header_safe, identify, Identity};
pub use crate::headers::{
    ATTEMPTS_HEADER, DEAD_DELIVERIES_HEADER, DEAD_REASON_HEADER, DELIVERY_HEADER, MESSAGE_ID_HEADER,
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
        _slot: OwnedSemaphorePermit,
        (mut stop, mut pull_ended): (Stop, watch::Receiver<()>),
        _live: Live,
    ) {
        // `delivered`: the attempt this delivery makes (`x-wharf-delivery`), counted against
        // `max_deliver`.
        let Identity {
            id,
            attempt: delivered,
            redelivered,
            ..
        } = identify(&message);
        if redelivered {
            self.metrics.redelivered();
        }
        let headers = backend_headers(&message, &id, delivered);
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
                    confirm(&message, AckKind::Ack, &id).await;
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
                self.dead_letter(&message, &id, delivered, &reason).await;
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

    /// Publishes the message to the dead-letter subject with the reason, then terminates it.
    /// If the dead letter cannot be published the message is nak'd and tried again later:
    /// nothing is dropped.
    async fn dead_letter(&self, message: &Message, id: &str, delivered: u32, reason: &str) {
        let subject = self.config.deliver.dead_letter_subject.clone();
        let mut headers = call_headers(message);
        headers.insert(MESSAGE_ID_HEADER, id);
        headers.insert(DEAD_REASON_HEADER, header_safe(reason).as_str());
        headers.insert(DEAD_DELIVERIES_HEADER, delivered.to_string().as_str());
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers.clone())
            // '/' is never in a client's id (`publish::client_id`): no client's message
            // can share this id within the stream's duplicate window.
            .message_id(format!("{id}/dead"));
        let jetstream = &self.ready.jetstream;
        let published = tokio::time::timeout(self.config.publish_timeout, async {
            jetstream
                .send_publish(subject.clone(), publish)
                .await?
                .await
        })
        .await;
        let stored = match published {
            Ok(Ok(_ack)) => true,
            // No stream captures the subject (it was created elsewhere without it): a core
            // publish still reaches subscribers.
            Ok(Err(error)) if error.kind() == PublishErrorKind::StreamNotFound => {
                let sent = self
                    .ready
                    .client
                    .publish_with_headers(subject.clone(), headers, message.payload.clone())
                    .await
                    .is_ok();
                sent && tokio::time::timeout(ACK_TIMEOUT, self.ready.client.flush())
                    .await
                    .is_ok_and(|flushed| flushed.is_ok())
            }
            Ok(Err(error)) => {
                warn!(service = self.service, id, error = %error, "dead letter not published");
                false
            }
            Err(_elapsed) => false,
        };
        if !stored {
            let delay = backoff_for(self.config.deliver.backoff, delivered);
            let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            return;
        }
        confirm(message, AckKind::Term, id).await;
        self.metrics.dead_lettered();
        warn!(
            service = self.service,
            id, delivered, reason, subject, "message dead-lettered"
        );
    }

    /// Hands `message`, which this delivery did not attempt, back to the broker without
    /// using up an attempt: stores a copy (same body and headers) with its id in
    /// [`MESSAGE_ID_HEADER`] and the attempts made so far in [`ATTEMPTS_HEADER`], then
    /// acknowledges this one. If the copy cannot be stored, the message is nak'd instead:
    /// nothing is lost, and the next delivery counts one attempt more.
    ///
    /// Order: the copy is a new message at the stream's tail, with a new stream sequence
    /// (the same id). Another deliverer can take it at once, but only after every message
    /// that was waiting in the stream when it was stored (e.g. those published while it
    /// was held), and before every message published after it. Messages nak'd for a retry
    /// come back when their delay ends, wherever the copy is.
    ///
    /// Why a copy and not a nak in place, which would keep the sequence and the place
    /// (the broker redelivers a nak'd message before the messages behind it): the broker
    /// counts every delivery, a nak'd one too, and has no way to give a message back
    /// without counting one (nats-server 2.9: nak, or `ack_wait` running out; a message
    /// nak'd with no delay comes back first, with delivered = 2). Attempts are that count
    /// (module doc), so a nak would use up an attempt the backend never saw: with
    /// `max_deliver = 2`, a message held at SIGTERM would be dead-lettered after one 500
    /// (tests/queue.rs `a_message_held_at_sigterm_is_handed_back_at_once_with_no_attempt_used`).
    /// Keeping its place would need a second durable count, of the deliveries that made no
    /// attempt (e.g. a key-value bucket keyed by stream sequence).
    pub(crate) async fn hand_back(&self, message: &Message) {
        let Identity {
            id,
            sequence,
            attempt,
            ..
        } = identify(message);
        let made = attempt.saturating_sub(1);
        let mut headers = call_headers(message);
        headers.insert(MESSAGE_ID_HEADER, id.as_str());
        headers.insert(ATTEMPTS_HEADER, made.to_string().as_str());
        // Not the message's own id: within the duplicate window the broker would drop the
        // copy as a repeat of it, and the message would be lost when acknowledged below.
        // Unique to this stored copy, and the same if handing it back is repeated. '/' is
        // never in a client's id (`publish::client_id`), so no client's message can take
        // it first (a client's `order.57` would have made the hand-back of `order`, stored
        // at 57, a "duplicate", and the original was acknowledged: lost).
        let copy_id = match sequence {
            0 => format!("{id}/copy/{}", nuid::next()),
            sequence => format!("{id}/copy/{sequence}"),
        };
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers)
            .message_id(copy_id);
        let jetstream = &self.ready.jetstream;
        let published = tokio::time::timeout(self.config.publish_timeout.min(ACK_TIMEOUT), async {
            jetstream
                .send_publish(self.config.subject.clone(), publish)
                .await?
                .await
        })
        .await;
        match published {
            // A duplicate is an earlier hand-back of this copy: stored all the same.
            Ok(Ok(_ack)) => {
                confirm(message, AckKind::Ack, &id).await;
                debug!(
                    service = self.service,
                    id,
                    attempts_made = made,
                    "message handed back"
                );
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "no acknowledgement in time".to_owned(),
                };
                debug!(
                    service = self.service,
                    id, error, "copy not stored; nak'ing the message"
                );
                confirm(message, AckKind::Nak(None), &id).await;
            }
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

/// Keeps a message for `pause` while the backend is down; `false` if the service stopped.
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
