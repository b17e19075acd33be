//! Dead letters: publishing a message that used up its attempts to the dead-letter
//! subject, and keeping it when the broker does not store that dead letter, so that it is
//! tried again and the backend is not called past `max_deliver`. When to dead-letter is
//! the deliverer's call (`super`).

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, warn};

use super::copy::copy_id;
use super::{backoff_for, confirm, hold_message, Deliverer, StoreFailure, ACK_TIMEOUT, MAX_HOLD};
use crate::headers::{call_headers, header_safe, Identity};
use crate::headers::{DEAD_DELIVERIES_HEADER, DEAD_REASON_HEADER, MESSAGE_ID_HEADER};
use crate::stop::Stop;

impl Deliverer {
    /// Publishes the message to the dead-letter subject with the reason and the `attempts`
    /// made, then terminates it. A dead letter the broker does not store is kept to be tried
    /// again, and the backend is not called again:
    /// - the message is handed back as a dead-letter-pending copy:
    ///   [`DEAD_PENDING_HEADER`](super::DEAD_PENDING_HEADER) holds the reason,
    ///   [`ATTEMPTS_HEADER`](super::ATTEMPTS_HEADER) the attempts made, and a delivery of
    ///   that copy only tries the dead letter again (`deliver`);
    /// - a copy that is one already is nak'd, to come back after the backoff of its own
    ///   deliveries (at most [`MAX_BACKOFF`](super::MAX_BACKOFF));
    /// - if the copy cannot be stored either (the queue's own stream refuses it too: with
    ///   wharf's stream, which keeps the dead letters, it is the same stream), the message
    ///   is held with in-progress acks and both are tried again after `backoff` doubling up
    ///   to [`MAX_HOLD`]. Unlike a message held for a backend that is down, it gives its
    ///   delivery slot back: the other messages' deliveries are what make room in a full
    ///   stream. If the service stops meanwhile it is nak'd as it is: nothing is lost, and
    ///   its next delivery makes one attempt past `max_deliver`.
    ///
    /// Why a stored copy and not a count kept in this process: the broker's delivery count
    /// cannot tell a delivery whose dead letter failed from one that made no attempt (a
    /// wharf killed while the backend was down), and only the broker outlives this process.
    /// Not covered: wharf killed (or the acknowledgement lost) after the copy is stored and
    /// before the original is acknowledged; the original then comes back unmarked after
    /// `ack_wait`, for one attempt more, beside its copy.
    ///
    /// A copy waiting for its nak'd retry is ack-pending with the broker, as a failed
    /// attempt waiting for its backoff is, and so is a held message: while dead letters keep
    /// failing, such messages take up the consumer's `max_ack_pending` (4 × `concurrency`,
    /// at least 64), and once it is reached the queue's deliveries wait.
    pub(super) async fn dead_letter(
        &self,
        message: &Message,
        identity: &Identity,
        attempts: u32,
        reason: &str,
        (slot, stop): (OwnedSemaphorePermit, &mut Stop),
    ) {
        let id = identity.id.as_str();
        let (backoff, ack_wait) = (self.config.deliver.backoff, self.config.deliver.ack_wait);
        let mut hold = backoff;
        // Given back once the message is held: a held dead letter must not stop the
        // deliveries that could make room for it (a full stream). Held messages stay
        // ack-pending, so the consumer's `max_ack_pending` still bounds them.
        let mut slot = Some(slot);
        loop {
            let error = match self
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
                    return;
                }
                Err(error) => error,
            };
            self.metrics.dead_letter_failed();
            if identity.dead_pending.is_some() {
                let delay = backoff_for(backoff, identity.deliveries);
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
            let copy_error = match self
                .store_copy(message, id, copy_id, attempts, Some(reason))
                .await
            {
                Ok(()) => {
                    confirm(message, AckKind::Ack, id).await;
                    warn!(
                        service = self.service,
                        id,
                        error,
                        "dead letter not stored; the message is kept to try it again later"
                    );
                    return;
                }
                Err(copy_error) => copy_error,
            };
            if slot.take().is_none() {
                debug!(
                    service = self.service,
                    id, error, copy_error, "dead letter still not stored"
                );
            } else {
                warn!(
                    service = self.service,
                    id,
                    error,
                    copy_error,
                    "dead letter not stored, nor a copy that keeps it pending; holding the \
                     message to try again"
                );
            }
            if !hold_message(message, hold, ack_wait, stop).await {
                let _ = message
                    .ack_with(AckKind::Nak(Some(backoff_for(backoff, attempts))))
                    .await;
                return;
            }
            hold = (hold * 2).min(MAX_HOLD);
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
        let stored = self
            .store(
                message,
                subject.clone(),
                publish,
                self.config.publish_timeout,
            )
            .await;
        match stored {
            Ok(()) => Ok(()),
            // No stream captures the subject (it was created elsewhere without it): a core
            // publish still reaches subscribers.
            Err(StoreFailure::Refused(error))
                if error.kind() == PublishErrorKind::StreamNotFound =>
            {
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
            Err(failure) => Err(failure.to_string()),
        }
    }
}
