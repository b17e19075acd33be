//! Drives one origin fetch into a shared fill, and commits it to the cache
//! only when the whole body arrived intact.
//!
//! Runs as its own task, so the fill goes on when the client that started
//! it disconnects (bounded by `max_object_bytes` and `total_timeout`).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use tracing::{debug, Instrument};
use url::Url;
use wharf_cache::{
    CachedResponse, FillRegistry, FillWriter, MemoryCache, PushOutcome, ResponseHead,
};
use wharf_host::metrics::UpstreamMetrics;

use crate::body::OriginBody;
use crate::error::ProxyError;
use crate::headers::{declared_length, not_cacheable_reason, relayed_headers};
use crate::origin::{origin_label, Origin};

/// Everything a fill task needs, owned so the task outlives the call.
pub(crate) struct FillJob {
    pub(crate) origin: Origin,
    pub(crate) cache: Arc<MemoryCache>,
    pub(crate) fills: Arc<FillRegistry>,
    pub(crate) key: String,
    pub(crate) target: Url,
    pub(crate) ttl: Duration,
    pub(crate) max_object_bytes: u64,
    pub(crate) total_timeout: Duration,
    pub(crate) upstream_metrics: UpstreamMetrics,
}

impl FillJob {
    /// Starts the fill in its own task.
    pub(crate) fn spawn(self, writer: FillWriter) {
        let span = tracing::debug_span!("fill", key = %self.key);
        tokio::spawn(self.run(writer).instrument(span));
    }

    async fn run(self, writer: FillWriter) {
        let fill = writer.fill().clone();
        let deadline = tokio::time::Instant::now() + self.total_timeout;
        let origin = origin_label(&self.target);
        let outcome = tokio::time::timeout_at(deadline, self.fetch_into(&writer, deadline)).await;
        match outcome {
            Ok(Ok(Some(head))) => {
                if let Some(chunks) = writer.finish() {
                    let entry =
                        CachedResponse::new(head, chunks, std::time::Instant::now(), self.ttl);
                    debug!(
                        bytes = entry.body_len,
                        ttl_s = self.ttl.as_secs(),
                        "fill committed"
                    );
                    // Insert before unregistering: a call arriving in
                    // between finds either the fill or the entry.
                    self.cache.insert(self.key.clone(), Arc::new(entry));
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => {
                debug!(error = %error, "fill failed");
                writer.fail(Arc::new(error));
            }
            Err(_elapsed) => {
                debug!("fill timed out");
                writer.fail(Arc::new(ProxyError::OriginTimeout {
                    origin,
                    what: "body not complete",
                    after: self.total_timeout,
                }));
            }
        }
        self.fills.remove(&self.key, &fill);
    }

    /// Fetches and streams the body into the fill. `Ok(Some(head))`: the
    /// body is complete; `Ok(None)`: stopped early with nobody to serve.
    async fn fetch_into(
        &self,
        writer: &FillWriter,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Arc<ResponseHead>>, ProxyError> {
        let fetched = self.origin.fetch(&self.target).await;
        self.upstream_metrics
            .record(crate::service::upstream_outcome(&fetched));
        let response = fetched?;
        let (parts, incoming) = response.into_parts();
        let reason = not_cacheable_reason(parts.status, &parts.headers, self.max_object_bytes);
        if let Some(reason) = reason {
            debug!(reason, "response not cacheable");
        }
        let expected_len = declared_length(&parts.headers);
        let head = Arc::new(ResponseHead {
            status: parts.status,
            headers: relayed_headers(&parts.headers),
        });
        writer.set_head(head.clone(), reason.is_none());
        if reason.is_some() {
            // Later calls must not wait on a fill they cannot join.
            self.fills.remove(&self.key, writer.fill());
        }
        let origin = origin_label(&self.target);
        let body = OriginBody::new(incoming, origin.clone(), deadline, self.total_timeout);
        tokio::pin!(body);
        let mut received = 0u64;
        let mut was_committable = reason.is_none();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue; // trailers: not relayed
            };
            received += data.len() as u64;
            if writer.push(data).await == PushOutcome::Abandoned {
                debug!(received, "no reader left for an uncacheable body; stopped");
                return Ok(None);
            }
            if was_committable && !writer.is_committable() {
                was_committable = false;
                self.fills.remove(&self.key, writer.fill());
            }
        }
        if let Some(expected) = expected_len.filter(|&expected| expected != received) {
            return Err(ProxyError::OriginBody {
                origin,
                received,
                message: format!("content-length was {expected}"),
            });
        }
        Ok(Some(head))
    }
}
