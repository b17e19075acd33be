//! Giving a message up: after `max_deliver` attempts it is published to the dead-letter
//! subject with the reason, and only once that is stored is it terminated. The deliverer
//! (`deliver`) decides when; this module publishes and records the outcome.
//!
//! The backend is never called more than `max_deliver` times for one message, and nothing is
//! lost when the dead letter cannot be stored (no stream captures the subject, the stream
//! refuses it, no acknowledgement in time):
//!
//! - the message is not terminated nor acknowledged (that would lose it), but nak'd with
//!   the retry delay of its attempt count (`backoff` doubling, at most
//!   [`MAX_BACKOFF`](crate::deliver::MAX_BACKOFF)), and a WARN names the service, the message
//!   and why;
//! - its next delivery counts one attempt more than `max_deliver`, and a delivery whose
//!   attempt is past `max_deliver` does not call the backend: it only publishes the dead
//!   letter again ([`Deliverer::dead_letter_only`]). So until the dead letter is stored,
//!   only the dead letter is retried, with a growing delay, and the delivery slot is free
//!   meanwhile for other messages.
//!
//! The state is the broker's delivery count, so this holds across restarts and for a
//! message whose last attempt's outcome was never recorded (a wharf killed during it). Such
//! a later dead letter cannot give the failed attempt's reason (it was not stored), and says
//! so. A dead letter is published at least once: its `Nats-Msg-Id` is `{id}/dead`, so a
//! repeat within the stream's duplicate window is stored once.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use tracing::warn;

use crate::deliver::{backoff_for, confirm, Deliverer};
use crate::headers::{call_headers, header_safe};
use crate::headers::{DEAD_DELIVERIES_HEADER, DEAD_REASON_HEADER, MESSAGE_ID_HEADER};

impl Deliverer {
    /// Dead-letters a message whose attempt `delivered` is past `max_deliver`, without
    /// calling the backend: every attempt it had was used (its dead letter could not be
    /// published then, or its outcome was never recorded).
    pub(crate) async fn dead_letter_only(&self, message: &Message, id: &str, delivered: u32) {
        let max_deliver = self.config.deliver.max_deliver;
        let reason = format!(
            "{max_deliver} attempts used up (the last failure's reason was not kept: its dead \
             letter could not be published, or its outcome was not recorded)"
        );
        self.dead_letter(message, id, delivered, &reason).await;
    }

    /// Publishes the message to the dead-letter subject with the reason, then terminates it.
    /// `delivered` is the attempt count of this delivery (`max_deliver` or more). If the dead
    /// letter cannot be published, the message is kept: nak'd for a later delivery, which
    /// publishes the dead letter again without calling the backend (see the module doc).
    pub(crate) async fn dead_letter(
        &self,
        message: &Message,
        id: &str,
        delivered: u32,
        reason: &str,
    ) {
        let subject = self.config.deliver.dead_letter_subject.as_str();
        // At most `max_deliver` attempts reached the backend, however many deliveries it
        // took to store the dead letter.
        let attempts = delivered.min(self.config.deliver.max_deliver);
        if let Err(error) = self
            .publish_dead_letter(message, id, attempts, reason)
            .await
        {
            let retry_in = backoff_for(self.config.deliver.backoff, delivered);
            warn!(
                service = self.service,
                id,
                subject,
                error,
                ?retry_in,
                "dead letter not published; message kept, only its dead letter will be tried again"
            );
            let _ = message.ack_with(AckKind::Nak(Some(retry_in))).await;
            return;
        }
        confirm(message, AckKind::Term, id).await;
        self.metrics.dead_lettered();
        warn!(
            service = self.service,
            id,
            delivered = attempts,
            reason,
            subject,
            "message dead-lettered"
        );
    }

    /// Publishes the dead letter and waits for the stream that captures the subject to
    /// store it. `Err`: why it is not stored.
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
            .headers(headers)
            // '/' is never in a client's id (`publish::client_id`): no client's message
            // can share this id within the stream's duplicate window.
            .message_id(format!("{id}/dead"));
        let jetstream = &self.ready.jetstream;
        let timeout = self.config.publish_timeout;
        let published = tokio::time::timeout(timeout, async {
            jetstream
                .send_publish(subject.clone(), publish)
                .await?
                .await
        })
        .await;
        match published {
            Ok(Ok(_ack)) => Ok(()),
            // No stream captures the subject (the queue's stream was made beforehand
            // without it): a plain publish would reach only whoever listens right now, so the
            // message would be terminated with its dead letter perhaps seen by no one.
            Ok(Err(error)) if error.kind() == PublishErrorKind::StreamNotFound => Err(format!(
                "no stream captures {subject}: add it to a stream's subjects"
            )),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_elapsed) => Err(format!(
                "no acknowledgement from the broker after {timeout:?}"
            )),
        }
    }
}
