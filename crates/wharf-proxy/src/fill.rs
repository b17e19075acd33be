//! Drives one origin fetch into a shared fill, and commits it to the cache
//! only when the whole body arrived intact.
//!
//! Runs as its own task, so the fill goes on when the client that started
//! it disconnects (bounded by `max_object_bytes` and `total_timeout`).
//!
//! With a shared (Redis) tier the fill first asks Redis, in one round trip,
//! for the entry or for the key's fill lease. An entry found there feeds the
//! fill instead of the origin (and is promoted into memory), fresh for no
//! longer than this service's `max_ttl` from its store time. A lease held by
//! another instance means that instance is fetching: its lease is renewed for
//! as long as it does, so this fill waits for its entry while the lease lives
//! (bounded by `total_timeout`), and fetches the origin itself if the lease
//! goes without an entry (given back, or expired with a dead holder). A fill
//! that holds the lease writes its committed entry through to Redis in the
//! background, then gives the lease back; one that ends without an entry gives
//! it back at once, so nobody waits for nothing. Redis failing or slow only
//! ever means "fetch from the origin".

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing::{debug, Instrument};
use wharf_cache::shared::Lease;
use wharf_cache::{
    CachedResponse, EntryLimits, FillRegistry, FillWriter, LeaseOutcome, MemoryCache, PushOutcome,
    ResponseHead, SharedTier, WaitOutcome,
};
use wharf_host::metrics::UpstreamMetrics;
use wharf_upstream::HeadFields;

use crate::body::OriginBody;
use crate::error::ProxyError;
use crate::headers::{declared_length, not_cacheable_reason, relayed_headers};
use crate::origin::Origin;
use crate::target::Target;

/// Everything a fill task needs, owned so the task outlives the call.
pub(crate) struct FillJob {
    pub(crate) origin: Origin,
    pub(crate) cache: Arc<MemoryCache>,
    pub(crate) fills: Arc<FillRegistry>,
    /// The checked destination; its URL is the cache key.
    pub(crate) target: Arc<Target>,
    pub(crate) ttl: Duration,
    /// The service's `max_ttl`: an entry read from Redis is fresh for no longer, from its
    /// store time, whatever TTL its writer gave it.
    pub(crate) max_ttl: Duration,
    pub(crate) max_object_bytes: u64,
    pub(crate) total_timeout: Duration,
    pub(crate) upstream_metrics: UpstreamMetrics,
    /// The Redis tier, when configured.
    pub(crate) shared: Option<Arc<SharedTier>>,
    /// TTL of this fill's cross-instance lease (renewed while the fill goes on): how soon
    /// other instances notice that a holder died.
    pub(crate) lease_ttl: Duration,
    /// Set before the head when the body comes from Redis rather than the origin.
    pub(crate) source: Arc<OnceLock<FillSource>>,
}

/// Where a fill's body came from, when not from the origin.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FillSource {
    /// The entry was in Redis (stored then, for `age`).
    Shared {
        /// When the body was complete, on this instance's clock.
        stored_at: Instant,
    },
    /// Another instance fetched it while this one waited on its lease.
    SharedAfterWait,
}

/// What the shared tier says a fill should do.
enum Plan {
    /// Serve this entry.
    Entry(CachedResponse, FillSource),
    /// Fetch the origin, holding the lease if there is one.
    Origin(Option<Lease>),
}

impl FillJob {
    /// Starts the fill in its own task.
    pub(crate) fn spawn(self, writer: FillWriter) {
        let span = tracing::debug_span!("fill", key = %self.target.key());
        tokio::spawn(self.run(writer).instrument(span));
    }

    async fn run(self, writer: FillWriter) {
        let fill = writer.fill().clone();
        // One bound for the whole fill: waiting on another instance's lease and then
        // fetching the origin itself must not take total_timeout each.
        let deadline = tokio::time::Instant::now() + self.total_timeout;
        let mut lease = match self.plan(deadline).await {
            Plan::Entry(entry, source) => {
                self.serve_entry(writer, entry, source).await;
                self.fills.remove(self.target.key(), &fill);
                return;
            }
            Plan::Origin(lease) => lease,
        };
        let outcome =
            tokio::time::timeout_at(deadline, self.fetch_into(&writer, deadline, &mut lease)).await;
        match outcome {
            Ok(Ok(Some(head))) => {
                if let Some(chunks) = writer.finish() {
                    let entry = Arc::new(CachedResponse::new(
                        head,
                        chunks,
                        std::time::Instant::now(),
                        self.ttl,
                    ));
                    debug!(
                        bytes = entry.body_len,
                        ttl_s = self.ttl.as_secs(),
                        "fill committed"
                    );
                    // Insert before unregistering: a call arriving in
                    // between finds either the fill or the entry.
                    self.cache
                        .insert(self.target.key().to_owned(), entry.clone());
                    self.write_through(entry, lease.take());
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
                    origin: self.target.label.clone(),
                    what: "body not complete",
                    after: self.total_timeout,
                }));
            }
        }
        self.release(&mut lease);
        self.fills.remove(self.target.key(), &fill);
    }

    /// Asks the shared tier (if any) whether to serve its entry, wait for another
    /// instance's, or fetch the origin. Waiting lasts while the other instance's lease
    /// lives (it renews it while it fetches), until the fill's `deadline` plus a round
    /// trip; an origin fetch after it gets what is left of that deadline.
    async fn plan(&self, deadline: tokio::time::Instant) -> Plan {
        let Some(shared) = &self.shared else {
            return Plan::Origin(None);
        };
        let limits = EntryLimits {
            max_bytes: self.max_object_bytes,
            max_ttl: self.max_ttl,
        };
        let mut waited = false;
        loop {
            match shared
                .lookup_or_lease(self.target.key(), self.lease_ttl, limits)
                .await
            {
                LeaseOutcome::Found(entry) => {
                    let source = if waited {
                        FillSource::SharedAfterWait
                    } else {
                        FillSource::Shared {
                            stored_at: entry.stored_at,
                        }
                    };
                    return Plan::Entry(entry, source);
                }
                LeaseOutcome::Acquired(lease) => return Plan::Origin(Some(lease)),
                LeaseOutcome::Skip => return Plan::Origin(None),
                LeaseOutcome::Held => {}
            }
            waited = true;
            match shared.wait(self.target.key(), limits, deadline).await {
                WaitOutcome::Found(entry) => {
                    debug!("entry fetched by another instance");
                    return Plan::Entry(entry, FillSource::SharedAfterWait);
                }
                // The other fetch ended without an entry: take the lease ourselves.
                WaitOutcome::LeaseFree if tokio::time::Instant::now() < deadline => {}
                WaitOutcome::LeaseFree | WaitOutcome::GiveUp => {
                    debug!("no entry from the instance holding the lease; fetching");
                    return Plan::Origin(None);
                }
            }
        }
    }

    /// Feeds an entry read from Redis to the fill's readers and promotes it into memory.
    async fn serve_entry(&self, writer: FillWriter, entry: CachedResponse, source: FillSource) {
        let _ = self.source.set(source);
        let chunks = match entry.body.chunks() {
            Ok(chunks) => chunks,
            Err(error) => {
                // Its readers see a failed fill (an error answer), never a short body.
                writer.fail(Arc::new(error));
                return;
            }
        };
        writer.set_head(entry.head.clone(), true);
        for chunk in chunks.iter() {
            // Committable (the entry is within max_object_bytes): push never waits.
            writer.push(chunk.clone()).await;
        }
        if writer.finish().is_some() {
            debug!(bytes = entry.body_len, "shared entry promoted into memory");
            self.cache
                .insert(self.target.key().to_owned(), Arc::new(entry));
        }
    }

    /// Writes a committed entry to Redis in the background (never delaying a reader), then
    /// gives the lease back.
    fn write_through(&self, entry: Arc<CachedResponse>, lease: Option<Lease>) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let key = self.target.key().to_owned();
        tokio::spawn(
            async move {
                shared.put(&key, &entry).await;
                if let Some(lease) = lease {
                    shared.release(lease).await;
                }
            }
            .in_current_span(),
        );
    }

    /// Gives the lease back in the background, once this fill will not produce an entry.
    fn release(&self, lease: &mut Option<Lease>) {
        let (Some(shared), Some(lease)) = (self.shared.clone(), lease.take()) else {
            return;
        };
        tokio::spawn(async move { shared.release(lease).await }.in_current_span());
    }

    /// Fetches and streams the body into the fill. `Ok(Some(head))`: the
    /// body is complete; `Ok(None)`: stopped early with nobody to serve.
    async fn fetch_into(
        &self,
        writer: &FillWriter,
        deadline: tokio::time::Instant,
        lease: &mut Option<Lease>,
    ) -> Result<Option<Arc<ResponseHead>>, ProxyError> {
        let fetched = self
            .origin
            .fetch(&self.target, HeadFields::All, deadline, self.total_timeout)
            .await;
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
            // Later calls must not wait on a fill they cannot join, nor other instances
            // on an entry that will not come.
            self.fills.remove(self.target.key(), writer.fill());
            self.release(lease);
        }
        let body = OriginBody::new(incoming, self.target.clone(), deadline, self.total_timeout);
        tokio::pin!(body);
        let mut received = 0u64;
        let mut was_committable = reason.is_none();
        while let Some(frame) = body.as_mut().next_frame().await {
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
                self.fills.remove(self.target.key(), writer.fill());
                self.release(lease);
            }
        }
        if let Some(expected) = expected_len.filter(|&expected| expected != received) {
            return Err(ProxyError::OriginBody {
                origin: self.target.label.clone(),
                received,
                message: format!("content-length was {expected}"),
            });
        }
        Ok(Some(head))
    }
}
