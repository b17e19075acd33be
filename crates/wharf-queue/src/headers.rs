//! The headers of a queued message: those stored with it (the call's, the broker's `Nats-*`
//! and wharf's own [`ATTEMPTS_HEADER`] and [`DEAD_PENDING_HEADER`]), those sent with each
//! delivery to the backend, and
//! those of a dead letter; and who a delivered message is ([`Identity`]). The deliverer
//! (`deliver`) decides what to do with a message; this module only reads and writes its
//! headers.

use async_nats::jetstream::Message;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Request header carrying the message id to the backend.
pub const MESSAGE_ID_HEADER: &str = "x-wharf-message-id";
/// Request header carrying the attempt number (1 for the first attempt; a delivery while the
/// backend was down is none).
pub const DELIVERY_HEADER: &str = "x-wharf-delivery";
/// Stored header of a handed-back copy: the attempts made on the message before the copy
/// was stored. Never sent to the backend; never taken from a client (the config refuses
/// `x-wharf-*` names in `forward_headers`).
pub const ATTEMPTS_HEADER: &str = "x-wharf-attempts-made";
/// Stored header of a dead-letter-pending copy: its attempts are all used up and its dead
/// letter, with this reason, could not be stored yet. A delivery of such a copy only tries
/// the dead letter again, never the backend. Written by wharf only, like [`ATTEMPTS_HEADER`].
pub const DEAD_PENDING_HEADER: &str = "x-wharf-dead-pending";
/// Dead-letter header: why the message was given up.
pub const DEAD_REASON_HEADER: &str = "x-wharf-dead-reason";
/// Dead-letter header: how many deliveries were made.
pub const DEAD_DELIVERIES_HEADER: &str = "x-wharf-deliveries";

/// The headers stored with `message` that belong to the call (not [`internal_header`]s).
pub(crate) fn call_headers(message: &Message) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(original) = &message.headers {
        for (name, values) in original.iter() {
            let name: &str = name.as_ref();
            if internal_header(name) {
                continue;
            }
            for value in values {
                headers.append(name, value.as_str());
            }
        }
    }
    headers
}

/// The headers sent to the backend: those stored with the message (not the broker's own
/// `Nats-*` nor wharf's [`ATTEMPTS_HEADER`] and [`DEAD_PENDING_HEADER`]), plus the message
/// id and the attempt number.
pub(crate) fn backend_headers(message: &Message, id: &str, delivered: u32) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(stored) = &message.headers {
        for (name, values) in stored.iter() {
            let name: &str = name.as_ref();
            if internal_header(name) {
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

/// Headers stored with a message that are not the call's own: the broker's `Nats-*`,
/// [`ATTEMPTS_HEADER`] and [`DEAD_PENDING_HEADER`].
fn internal_header(name: &str) -> bool {
    // Compared in place: this runs for every stored header of every delivery.
    name.get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("nats-"))
        || name.eq_ignore_ascii_case(ATTEMPTS_HEADER)
        || name.eq_ignore_ascii_case(DEAD_PENDING_HEADER)
}

/// Who a delivered message is and which attempt this delivery is.
pub(crate) struct Identity {
    /// The message id: the stored [`MESSAGE_ID_HEADER`] (a handed-back copy), else its
    /// `Nats-Msg-Id`, else `seq-N` (published by something other than wharf).
    pub(crate) id: String,
    /// The stream sequence of this stored copy (0 if the broker's reply subject is not
    /// understood).
    pub(crate) sequence: u64,
    /// The attempts made before this stored copy ([`ATTEMPTS_HEADER`]; 0 for an original).
    pub(crate) attempts_made: u32,
    /// The broker's count of deliveries of this stored copy, this one included (at least 1).
    pub(crate) deliveries: u32,
    /// The reason of the dead letter still to be stored ([`DEAD_PENDING_HEADER`]): set on
    /// a copy whose attempts are all used up.
    pub(crate) dead_pending: Option<String>,
}

pub(crate) fn identify(message: &Message) -> Identity {
    let (delivered, sequence) = match message.info() {
        Ok(info) => (
            u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1),
            info.stream_sequence,
        ),
        Err(_) => (1, 0),
    };
    let id = stored_header(message, MESSAGE_ID_HEADER)
        .or_else(|| stored_header(message, async_nats::header::NATS_MESSAGE_ID))
        .unwrap_or_else(|| format!("seq-{sequence}"));
    // Written by wharf only (`publish` never stores it from a client); unreadable: 0.
    let attempts_made = stored_header(message, ATTEMPTS_HEADER)
        .and_then(|made| made.parse::<u32>().ok())
        .unwrap_or(0);
    Identity {
        id,
        sequence,
        attempts_made,
        deliveries: delivered,
        dead_pending: stored_header(message, DEAD_PENDING_HEADER),
    }
}

impl Identity {
    /// The attempt this delivery makes: `attempts_made` + the broker's delivery count.
    pub(crate) fn attempt(&self) -> u32 {
        self.attempts_made.saturating_add(self.deliveries)
    }

    /// Whether the broker delivered this copy before.
    pub(crate) fn redelivered(&self) -> bool {
        self.deliveries > 1
    }
}

/// The value of header `name` stored with `message`.
pub(crate) fn stored_header(
    message: &Message,
    name: impl async_nats::header::IntoHeaderName,
) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(name))
        .map(|value| value.as_str().to_owned())
}

/// A reason as a header value: one line, printable ASCII, at most 512 bytes.
pub(crate) fn header_safe(reason: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_become_safe_header_values() {
        assert_eq!(
            header_safe("backend answered 500\r\nx: y"),
            "backend answered 500??x: y"
        );
        assert!(HeaderValue::from_str(&header_safe(&"é".repeat(600))).is_ok());
    }
}
