//! Dead letters: publishing a message that used up its attempts to the dead-letter
//! subject, and keeping it (`Deliverer::keep_dead_pending`) when the broker does not store
//! that dead letter, so that it is tried again and the backend is never called past
//! `max_deliver`. When to dead-letter is the deliverer's call (`super`).

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use tracing::warn;

use super::{backoff_for, confirm, copy::copy_id, Deliverer, ACK_TIMEOUT};
use crate::headers::{call_headers, header_safe, Identity};
use crate::headers::{DEAD_DELIVERIES_HEADER, DEAD_REASON_HEADER, MESSAGE_ID_HEADER};

impl Deliverer {
    /// Publishes the message to the dead-letter subject with the reason and the `attempts`
    /// made, then terminates it. A dead letter the broker does not store is kept to be tried
    /// again, and the backend is not called again (`keep_dead_pending`).
    pub(super) async fn dead_letter(
        &self,
        message: &Message,
        identity: &Identity,
        attempts: u32,
        reason: &str,
    ) {
        let id = identity.id.as_str();
        match self
            .publish_dead_letter(message, id, attempts, reason)
            .await
        {
            Ok(()) => {
                confirm(message, AckKind::Term, id).await;
                self.metrics.dead_lettered();
                warn!(
                    service = self.service,
                    id,
                    delivered = attempts,
                    reason,
                    subject = self.config.deliver.dead_letter_subject,
                    "message dead-lettered"
                );
            }
            Err(error) => {
                self.metrics.dead_letter_failed();
                self.keep_dead_pending(message, identity, attempts, reason, &error)
                    .await;
            }
        }
    }

    /// Stores the dead letter: the message's body and call headers, its id, `reason` and
    /// `attempts`. `Err` says why the broker did not store it.
    async fn publish_dead_letter(
        &self,
        message: &Message,
        id: &str,
        attempts: u32,
        reason: &str,
    ) -> Result<(), String> {
        let subject = self.config.deliver.dead_letter_subject.clone();
        let mut headers = call_headers(message);
        headers.insert(MESSAGE_ID_HEADER, id);
        headers.insert(DEAD_REASON_HEADER, header_safe(reason).as_str());
        headers.insert(DEAD_DELIVERIES_HEADER, attempts.to_string().as_str());
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
        match published {
            Ok(Ok(_ack)) => Ok(()),
            // No stream captures the subject (it was created elsewhere without it): a core
            // publish still reaches subscribers.
            Ok(Err(error)) if error.kind() == PublishErrorKind::StreamNotFound => {
                self.ready
                    .client
                    .publish_with_headers(subject, headers, message.payload.clone())
                    .await
                    .map_err(|error| format!("core publish failed: {error}"))?;
                match tokio::time::timeout(ACK_TIMEOUT, self.ready.client.flush()).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(format!("core publish not flushed: {error}")),
                    Err(_elapsed) => Err("core publish not flushed in time".to_owned()),
                }
            }
            Ok(Err(error)) => Err(error.to_string()),
            Err(_elapsed) => Err("no acknowledgement in time".to_owned()),
        }
    }

    /// Keeps a message whose dead letter the broker did not store (`error`), so that the
    /// dead letter is tried again later and the backend is never called past `max_deliver`:
    /// - the message is handed back as a dead-letter-pending copy: [`DEAD_PENDING_HEADER`](super::DEAD_PENDING_HEADER)
    ///   holds the reason, [`ATTEMPTS_HEADER`](super::ATTEMPTS_HEADER) the attempts made, and a delivery of that
    ///   copy only tries the dead letter again (`deliver`);
    /// - a copy that is one already is nak'd, to come back after the backoff of its own
    ///   deliveries (at most [`MAX_BACKOFF`](super::MAX_BACKOFF));
    /// - if the copy cannot be stored either, the message is nak'd as it is: nothing is
    ///   lost, and its next delivery makes one attempt past `max_deliver`.
    ///
    /// Why a stored copy and not a count kept in this process: the broker's delivery count
    /// cannot tell a delivery whose dead letter failed from one that made no attempt (a
    /// wharf killed while the backend was down), and only the broker outlives this process.
    /// A message waiting for a nak'd retry is ack-pending with the broker, as every failed
    /// attempt's is, so while dead letters keep failing each such message holds one of the
    /// consumer's `max_ack_pending` (4 × `concurrency`, at least 64) until it is stored.
    async fn keep_dead_pending(
        &self,
        message: &Message,
        identity: &Identity,
        attempts: u32,
        reason: &str,
        error: &str,
    ) {
        let id = identity.id.as_str();
        let backoff = self.config.deliver.backoff;
        if identity.dead_pending.is_some() {
            let deliveries = identity.attempt.saturating_sub(identity.attempts_made);
            let delay = backoff_for(backoff, deliveries);
            warn!(
                service = self.service,
                id,
                error,
                ?delay,
                "dead letter not stored; trying it again later"
            );
            let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            return;
        }
        let copy_id = copy_id(id, "dead-pending", identity.sequence);
        match self
            .store_copy(message, id, copy_id, attempts, Some(reason))
            .await
        {
            Ok(()) => {
                confirm(message, AckKind::Ack, id).await;
                warn!(
                    service = self.service,
                    id, error, "dead letter not stored; the message is kept to try it again later"
                );
            }
            Err(copy_error) => {
                let delay = backoff_for(backoff, attempts);
                warn!(
                    service = self.service,
                    id,
                    error,
                    copy_error,
                    ?delay,
                    "dead letter not stored, nor a copy that keeps it pending; \
                     the message will be delivered again"
                );
                let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }
}
