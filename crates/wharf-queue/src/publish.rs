//! `POST {path}`: the body (with `content-type` and the `forward_headers`) becomes one
//! JetStream message; the client gets 202 `{"id": ...}` only once the broker acknowledged it.

use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;
use wharf_host::body::full;
use wharf_host::{RequestBody, ResponseBody};
use wharf_metrics::queue::PublishOutcome;

use crate::broker::Ready;
use crate::deliver::MESSAGE_ID_HEADER;
use crate::error::QueueError;
use crate::Inner;

/// Largest body before the broker has told its own `max_payload` (NATS's default).
const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// Room kept in `max_payload` for the message's headers.
const HEADER_ROOM: usize = 4 * 1024;

impl Inner {
    /// Publishes one call.
    pub(crate) async fn publish(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<ResponseBody>, QueueError> {
        if request.method() != Method::POST {
            return Err(QueueError::Method(request.method().clone()));
        }
        let id = match request.headers().get(MESSAGE_ID_HEADER) {
            Some(value) => client_id(value)?,
            None => nuid::next().to_string(),
        };
        let mut headers = async_nats::HeaderMap::new();
        // The config refuses `nats-*` and `x-wharf-*` names here: a client cannot steer the
        // broker or pose as the deliverer's own count of attempts.
        for name in &self.config.forward_headers {
            for value in request.headers().get_all(name) {
                // NATS headers are text; a value that is not is left out.
                if let Ok(value) = value.to_str() {
                    headers.append(name.as_str(), value);
                }
            }
        }
        let deadline = tokio::time::Instant::now() + self.config.publish_timeout;
        let ready = self.wait_ready(deadline).await?;
        let server_max = ready.client.server_info().max_payload;
        let limit = if server_max == 0 {
            DEFAULT_MAX_PAYLOAD
        } else {
            server_max
        }
        .saturating_sub(HEADER_ROOM);
        let body = read_body(request.into_body(), limit).await?;
        let publish = PublishMessage::build()
            .payload(body)
            .headers(headers)
            .message_id(&id);
        let stream = &self.config.stream;
        let acked = tokio::time::timeout_at(deadline, async {
            ready
                .jetstream
                .send_publish(self.config.subject.clone(), publish)
                .await?
                .await
        })
        .await;
        let ack = match acked {
            Ok(Ok(ack)) => ack,
            Ok(Err(error)) => {
                self.metrics.published(PublishOutcome::Error);
                return Err(QueueError::Publish {
                    stream: stream.clone(),
                    reason: error.to_string(),
                });
            }
            Err(_elapsed) => {
                self.metrics.published(PublishOutcome::Error);
                return Err(QueueError::Timeout {
                    stream: stream.clone(),
                    after: self.config.publish_timeout,
                });
            }
        };
        self.metrics.published(if ack.duplicate {
            PublishOutcome::Duplicate
        } else {
            PublishOutcome::Ok
        });
        let body = serde_json::json!({ "id": id }).to_string();
        let mut response = Response::new(full(body));
        *response.status_mut() = StatusCode::ACCEPTED;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }

    /// The connected broker, waiting (until `deadline`) while it is being set up.
    async fn wait_ready(&self, deadline: tokio::time::Instant) -> Result<Ready, QueueError> {
        let mut ready = self.ready.clone();
        let found = tokio::time::timeout_at(deadline, async {
            loop {
                if let Some(ready) = ready.borrow_and_update().clone() {
                    return Some(ready);
                }
                if ready.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(ready)) => Ok(ready),
            _ => {
                self.metrics.published(PublishOutcome::Error);
                Err(QueueError::NotReady {
                    stream: self.config.stream.clone(),
                    // `nats_url` carries no credentials (the config keeps them apart).
                    reason: format!(
                        "no stream and consumer set up on {} within {:?}",
                        self.config.nats_url, self.config.publish_timeout
                    ),
                })
            }
        }
    }
}

/// A client-chosen id: 1 to 128 of letters, digits, `-`, `_`, `.` and `:`.
fn client_id(value: &HeaderValue) -> Result<String, QueueError> {
    let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let valid = (1..=128).contains(&text.len())
        && text
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.' | ':'));
    if valid {
        Ok(text)
    } else {
        Err(QueueError::BadId(text))
    }
}

/// Reads the whole body, refusing one over `limit` bytes.
async fn read_body(body: RequestBody, limit: usize) -> Result<Bytes, QueueError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(QueueError::TooLarge { limit })
        }
        Err(error) => Err(QueueError::Body(error.to_string())),
    }
}

/// The ready-state channel: `None` until the stream and consumer are set up.
pub(crate) type ReadyState = watch::Receiver<Option<Ready>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids() {
        for good in ["a", "order-17", "2026:11:22.x_y", &"x".repeat(128)] {
            assert_eq!(
                client_id(&HeaderValue::from_str(good).unwrap()).unwrap(),
                good
            );
        }
        for bad in ["", "a b", "a/b", "ü", &"x".repeat(129)] {
            let value = HeaderValue::from_bytes(bad.as_bytes()).unwrap();
            assert!(client_id(&value).is_err(), "{bad:?}");
        }
    }
}
