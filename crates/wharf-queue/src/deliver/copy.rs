//! Stored copies of a delivered message: the hand-back of a message this delivery did not
//! attempt, and the dead-letter-pending copy (`super::dead_letter`). A copy goes to the tail
//! of the queue's stream with the attempts made so far, under a message id of its own.

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{AckKind, Message};
use tracing::debug;

use super::{confirm, Deliverer, ACK_TIMEOUT};
use crate::headers::{call_headers, header_safe, identify};
use crate::headers::{ATTEMPTS_HEADER, DEAD_PENDING_HEADER, MESSAGE_ID_HEADER};

impl Deliverer {
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
    /// (the deliverer's module doc), so a nak would use up an attempt the backend never saw: with
    /// `max_deliver = 2`, a message held at SIGTERM would be dead-lettered after one 500
    /// (tests/queue.rs `a_message_held_at_sigterm_is_handed_back_at_once_with_no_attempt_used`).
    /// Keeping its place would need a second durable count, of the deliveries that made no
    /// attempt (e.g. a key-value bucket keyed by stream sequence).
    pub(crate) async fn hand_back(&self, message: &Message) {
        let identity = identify(message);
        let id = identity.id.as_str();
        // A dead-letter-pending copy keeps its attempts and its reason: its deliveries are
        // no attempts.
        let (made, dead_pending) = match &identity.dead_pending {
            Some(reason) => (identity.attempts_made, Some(reason.as_str())),
            None => (identity.attempt().saturating_sub(1), None),
        };
        let copy_id = copy_id(id, "copy", identity.sequence);
        match self
            .store_copy(message, id, copy_id, made, dead_pending)
            .await
        {
            // A duplicate is an earlier hand-back of this copy: stored all the same.
            Ok(()) => {
                confirm(message, AckKind::Ack, id).await;
                debug!(
                    service = self.service,
                    id,
                    attempts_made = made,
                    "message handed back"
                );
            }
            Err(error) => {
                debug!(
                    service = self.service,
                    id, error, "copy not stored; nak'ing the message"
                );
                confirm(message, AckKind::Nak(None), id).await;
            }
        }
    }

    /// Stores a copy of `message` at the tail of the queue's stream, under the message id
    /// `copy_id`: its body and call headers, its id in [`MESSAGE_ID_HEADER`], `attempts_made`
    /// in [`ATTEMPTS_HEADER`] and, for a dead-letter-pending copy, the reason in
    /// [`DEAD_PENDING_HEADER`]. A duplicate (the same copy stored before) counts as stored.
    /// `Err` says why the broker did not store it.
    pub(super) async fn store_copy(
        &self,
        message: &Message,
        id: &str,
        copy_id: String,
        attempts_made: u32,
        dead_pending: Option<&str>,
    ) -> Result<(), String> {
        let mut headers = call_headers(message);
        headers.insert(MESSAGE_ID_HEADER, id);
        headers.insert(ATTEMPTS_HEADER, attempts_made.to_string().as_str());
        if let Some(reason) = dead_pending {
            headers.insert(DEAD_PENDING_HEADER, header_safe(reason).as_str());
        }
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers)
            .message_id(copy_id);
        self.store(
            message,
            self.config.subject.clone(),
            publish,
            self.config.publish_timeout.min(ACK_TIMEOUT),
        )
        .await
        .map_err(|failure| failure.to_string())
    }
}

/// The message id of a stored copy of message `id`, made by `purpose` ("copy" for a
/// hand-back, "dead-pending") from the stored copy at stream `sequence`.
///
/// Not the message's own id: within the duplicate window the broker would drop the copy as
/// a repeat of it, and the message would be lost when acknowledged. Unique to this stored
/// copy and purpose, and the same if storing it is repeated. '/' is never in a client's id
/// (`publish::client_id`), so no client's message can take it first (a client's
/// `order.57` would have made the hand-back of `order`, stored at 57, a "duplicate", and
/// the original was acknowledged: lost).
pub(super) fn copy_id(id: &str, purpose: &str, sequence: u64) -> String {
    match sequence {
        0 => format!("{id}/{purpose}/{}", nuid::next()),
        sequence => format!("{id}/{purpose}/{sequence}"),
    }
}
