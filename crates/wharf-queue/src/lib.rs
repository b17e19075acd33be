//! The `queue` service type (SPEC §8): one-way ("datagram") calls that survive a backend
//! being down, stored durably in NATS JetStream and delivered to the backend with retries.
//!
//! - `publish`: `POST {path}` stores the body as one JetStream message
//!   (file storage) and answers 202 `{"id": ...}` only once the broker acknowledged it; the
//!   id is the message's `Nats-Msg-Id`, so a repeated publish of one id is stored once.
//! - [`deliver`]: a durable pull consumer, created at start, feeds the deliverer, which POSTs
//!   each message to `deliver.backend` with `x-wharf-message-id` and acknowledges it only
//!   after a 2xx; failed attempts are retried with growing delays and, after
//!   `max_deliver`, published to the dead-letter subject and terminated (a dead letter the
//!   broker does not store is tried again, not the backend, save the cases
//!   `deliver::Deliverer::dead_letter` lists).
//! - `broker`: connecting and setting the stream and consumer up, with
//!   the JetStream API of nats-server 2.9.
//!
//! The service starts connecting when it is built and stops its deliverer when it is
//! dropped (a reload replaced it) or when the process ends ([`stop_deliverers`], after the
//! host has drained). Delivery is at least once: a message whose outcome was not recorded
//! is delivered again, with the same id.
//! Listeners, bulkheads and call counters come from `wharf-host`.

mod backend;
mod broker;
pub mod deliver;
pub mod error;
mod headers;
mod publish;
mod stop;

use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Request, Response};
use tokio::sync::watch;
use tracing::{debug, Instrument};
use wharf_config::QueueConfig;
use wharf_host::error::json_error;
use wharf_host::{handler, HostService, RequestBody, ResponseBody};
use wharf_metrics::queue::QueueMetrics;
use wharf_metrics::Metrics;

pub use error::QueueError;
pub use stop::stop_deliverers;

use crate::backend::Backend;
use crate::broker::Ready;
use crate::deliver::Deliverer;
use crate::publish::ReadyState;
use crate::stop::Stop;

/// A `queue` service: the publish endpoint and, in the background, its deliverer.
#[derive(Clone)]
pub struct QueueService {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: QueueConfig,
    pub(crate) metrics: QueueMetrics,
    /// `Some` once connected and the stream and consumer exist.
    pub(crate) ready: ReadyState,
    /// Dropped with the service: the start-up task, the deliverer and every delivery see
    /// it close and stop (held messages are handed back to the broker).
    _stop: watch::Sender<()>,
}

impl QueueService {
    /// Builds queue `name`: its counters exist from now, and connecting to the broker,
    /// creating the stream and the durable consumer, and delivering start now in the
    /// background (never lazily on the first call). Must be called within a tokio runtime.
    pub fn new(name: &str, config: &QueueConfig, metrics: &Metrics) -> Self {
        let connect_timeout = (config.deliver.ack_wait / 2).min(Duration::from_secs(5));
        let backend = Backend::new(config.deliver.backend.as_str(), connect_timeout);
        let queue_metrics = metrics.queue(name);
        let (ready_tx, ready) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(());
        let span = tracing::info_span!("queue", service = name);
        tokio::spawn(
            start(
                name.to_owned(),
                config.clone(),
                backend,
                queue_metrics.clone(),
                ready_tx,
                Stop::new(stop_rx),
            )
            .instrument(span),
        );
        Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                metrics: queue_metrics,
                ready,
                _stop: stop,
            }),
        }
    }

    /// Whether the broker is connected and the stream and consumer are set up.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.borrow().is_some()
    }

    /// The service for [`wharf_host::HostBuilder::mount`] (an exact mount at `path`).
    pub fn into_host_service(self) -> HostService {
        handler(move |request: Request<RequestBody>| {
            let inner = self.inner.clone();
            async move { inner.call(request).await }
        })
    }
}

impl Inner {
    async fn call(&self, request: Request<RequestBody>) -> Response<ResponseBody> {
        match self.publish(request).await {
            Ok(response) => response,
            Err(error) => {
                debug!(error = %error, status = error.status().as_u16(), "publish refused or failed");
                let mut response = json_error(error.status(), error.kind(), &error.to_string());
                if matches!(error, QueueError::Method(_)) {
                    response
                        .headers_mut()
                        .insert(header::ALLOW, HeaderValue::from_static("POST"));
                }
                if error.retryable() {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                }
                response
            }
        }
    }
}

/// Connects, sets the stream and consumer up (retrying), then delivers until stopped.
async fn start(
    name: String,
    config: QueueConfig,
    backend: Backend,
    metrics: QueueMetrics,
    ready_tx: watch::Sender<Option<Ready>>,
    mut stop: Stop,
) {
    let ready = tokio::select! {
        ready = broker::connect(&name, &config) => ready,
        () = stop.stopped() => return,
    };
    let Some(consumer) = broker::set_up(&ready, &name, &config, &mut stop).await else {
        return;
    };
    ready_tx.send_replace(Some(ready.clone()));
    let deliverer = Arc::new(Deliverer {
        service: name,
        config,
        backend,
        metrics,
        ready,
    });
    deliverer.run(consumer, stop).await;
}
