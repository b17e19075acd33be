//! The deliverer: pulls messages from the durable consumer, at most `concurrency` at a
//! time, POSTs each to the backend, and records the outcome with the broker.
//!
//! - 2xx: acknowledged (and the acknowledgement confirmed), counted as delivered.
//! - another status, or no answer within `ack_wait`: an attempt used up. Before
//!   `max_deliver` attempts the message is nak'd with a delay of `backoff` doubling per
//!   attempt (at most [`MAX_BACKOFF`]); at `max_deliver` it is published to the dead-letter
//!   subject with the reason, then terminated.
//! - could not connect: the backend is down, which is not the message's fault. The message is
//!   held (kept ours with in-progress acks) and tried again after `backoff`, doubling up to
//!   [`MAX_HOLD`], until the backend is back; the other messages wait in the stream, since
//!   every delivery slot is taken by a held one.
//!
//! Attempts are counted by the broker (a message's delivery count), so they survive a
//! restart. When the service stops, held messages are nak'd at once, so the next deliverer
//! gets them without waiting for `ack_wait`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};
use wharf_config::QueueConfig;
use wharf_metrics::queue::{QueueMetrics, RetryReason};

use crate::backend::{Attempt, Backend};
use crate::broker::Ready;

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
/// Request header carrying the message id to the backend.
pub const MESSAGE_ID_HEADER: &str = "x-wharf-message-id";
/// Request header carrying the attempt number (the broker's delivery count).
pub const DELIVERY_HEADER: &str = "x-wharf-delivery";
/// Dead-letter header: why the message was given up.
pub const DEAD_REASON_HEADER: &str = "x-wharf-dead-reason";
/// Dead-letter header: how many deliveries were made.
pub const DEAD_DELIVERIES_HEADER: &str = "x-wharf-deliveries";

/// Waits until the service stops: its stop sender is dropped (never sent on).
pub(crate) async fn stopped(stop: &mut watch::Receiver<()>) {
    while stop.changed().await.is_ok() {}
}

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
    pub(crate) async fn run(self: Arc<Self>, consumer: PullConsumer, stop: watch::Receiver<()>) {
        tokio::spawn(sample_pending(
            consumer.clone(),
            self.metrics.clone(),
            stop.clone(),
        ));
        let concurrency = self.config.deliver.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let mut stop_pull = stop.clone();
        info!(service = self.service, "queue deliverer started");
        loop {
            let first = tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_closed) => break,
                },
                () = stopped(&mut stop_pull) => break,
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
                        () = stopped(&mut stop_pull) => break,
                    }
                }
            };
            loop {
                let next = tokio::select! {
                    next = messages.next() => next,
                    () = stopped(&mut stop_pull) => None,
                };
                match next {
                    Some(Ok(message)) => {
                        let Some(slot) = batch.pop() else {
                            // More than asked for: hand it back for later.
                            let _ = message.ack_with(AckKind::Nak(None)).await;
                            continue;
                        };
                        tokio::spawn(self.clone().deliver(message, slot, stop.clone()));
                    }
                    Some(Err(error)) => {
                        debug!(service = self.service, error = %error, "pull ended with an error");
                        break;
                    }
                    None => break,
                }
            }
        }
        info!(service = self.service, "queue deliverer stopped");
    }

    /// Delivers one message until it is acknowledged, nak'd for later, dead-lettered, or
    /// (backend down when the service stops) handed back.
    async fn deliver(
        self: Arc<Self>,
        message: Message,
        _slot: OwnedSemaphorePermit,
        mut stop: watch::Receiver<()>,
    ) {
        let (delivered, sequence) = match message.info() {
            Ok(info) => (
                u32::try_from(info.delivered).unwrap_or(1).max(1),
                info.stream_sequence,
            ),
            Err(_) => (1, 0),
        };
        let id = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|id| id.as_str().to_owned())
            .unwrap_or_else(|| format!("seq-{sequence}"));
        if delivered > 1 {
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
                        // Stopping: let the next deliverer have it now.
                        let _ = message.ack_with(AckKind::Nak(None)).await;
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
        let mut headers = async_nats::HeaderMap::new();
        if let Some(original) = &message.headers {
            for (name, values) in original.iter() {
                let name: &str = name.as_ref();
                if name.to_ascii_lowercase().starts_with("nats-") {
                    continue;
                }
                for value in values {
                    headers.append(name, value.as_str());
                }
            }
        }
        headers.insert(MESSAGE_ID_HEADER, id);
        headers.insert(DEAD_REASON_HEADER, header_safe(reason).as_str());
        headers.insert(DEAD_DELIVERIES_HEADER, delivered.to_string().as_str());
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers.clone())
            .message_id(format!("{id}.dead"));
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
}

/// The headers sent to the backend: those stored with the message (not the broker's own
/// `Nats-*`), plus the message id and the attempt number.
fn backend_headers(message: &Message, id: &str, delivered: u32) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(stored) = &message.headers {
        for (name, values) in stored.iter() {
            let name: &str = name.as_ref();
            if name.to_ascii_lowercase().starts_with("nats-") {
                continue;
            }
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                continue;
            };
            for value in values {
                if let Ok(value) = HeaderValue::from_str(value.as_str()) {
                    headers.append(name.clone(), value);
                }
            }
        }
    }
    if let Ok(value) = HeaderValue::from_str(id) {
        headers.insert(MESSAGE_ID_HEADER, value);
    }
    headers.insert(DELIVERY_HEADER, HeaderValue::from(delivered));
    headers
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
    stop: &mut watch::Receiver<()>,
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
            () = stopped(stop) => return false,
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

/// A reason as a header value: one line, printable ASCII, at most 512 bytes.
fn header_safe(reason: &str) -> String {
    reason
        .chars()
        .map(|ch| {
            if ch.is_ascii_graphic() || ch == ' ' {
                ch
            } else {
                '?'
            }
        })
        .take(512)
        .collect()
}

/// Samples `wharf_queue_pending` (not yet delivered + delivered but not yet acknowledged)
/// from the consumer's info until the service stops.
async fn sample_pending(
    mut consumer: PullConsumer,
    metrics: QueueMetrics,
    mut stop: watch::Receiver<()>,
) {
    loop {
        if let Ok(Ok(info)) = tokio::time::timeout(PENDING_EVERY, consumer.info()).await {
            let pending = info
                .num_pending
                .saturating_add(u64::try_from(info.num_ack_pending).unwrap_or(0));
            metrics.set_pending(pending);
        }
        tokio::select! {
            () = tokio::time::sleep(PENDING_EVERY) => {}
            () = stopped(&mut stop) => return,
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

    #[test]
    fn reasons_become_safe_header_values() {
        assert_eq!(
            header_safe("backend answered 500\r\nx: y"),
            "backend answered 500??x: y"
        );
        assert!(HeaderValue::from_str(&header_safe(&"é".repeat(600))).is_ok());
    }
}
