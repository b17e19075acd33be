//! The shared cache tier: committed responses kept in Redis, so that several wharf instances
//! behind a load balancer serve what any of them fetched (SPEC §8).
//!
//! [`SharedTier`] is what the proxy calls. It never fails and never stalls a call: every
//! Redis round trip is bounded by [`SharedTierConfig::op_timeout`] (100 ms by default); an
//! error or timeout is counted, the tier is skipped for that call, and for
//! [`SharedTierConfig::rest_after_failure`] (1 s) further operations are skipped at once
//! (counted as `skipped`) instead of each paying the timeout. After the rest the next
//! operation tries again; the redis crate's `ConnectionManager` reconnects underneath.
//! Failures are also logged (`failures.rs`): a warning at the first, then at most one every
//! [`FAILURE_WARN_EVERY`] with the count since the last, and a line when the tier works
//! again, so that a tier that never works (a wrong URL or database) is not silent.
//!
//! An entry read from Redis is fresh for the writer's TTL, but never longer than the
//! reader's own `max_ttl` ([`EntryLimits`]) from the time it was stored: instances with
//! different `max_ttl`s each keep their own bound, as their memory tiers do. Its age is
//! measured on Redis's clock, not the instances': the meta value is written with the TTL
//! left, and a reader reads its `PTTL` with it (in one step), so the age is the TTL less
//! what Redis has left. Instances whose clocks disagree serve an entry for as long, with
//! the same `age`.
//!
//! Layout of one entry under cache key `K` (the `{K}` hash tag keeps an entry's keys in one
//! cluster slot; the prefix, [`KEY_PREFIX`], names the layout):
//! - `wharf2:{K}:m` — the meta value (`codec.rs`): status, relayed headers, body length, chunk
//!   count, TTL and the chunk-key version. Written last, so a reader that finds it finds the
//!   chunks too; it expires with the entry's TTL, as the memory entry does.
//! - `wharf2:{K}:c:VERSION:I` — body chunk `I` of [`SharedTierConfig::chunk_bytes`] (256 KiB),
//!   so no side holds a big body in one value; kept a little longer than the meta value so
//!   that a reader who saw the meta just before it expired still finds every chunk. A new
//!   version per write keeps two writers of one key from mixing chunks.
//! - `wharf2:{K}:l` — the fill lease: `SET NX PX` by the instance that fetches `K` from the
//!   origin, so that instances missing `K` at the same time make one origin request between
//!   them ([`SharedTier::lookup_or_lease`], [`SharedTier::wait`]).
//!
//! Deciding what is cacheable, and serving, stay with the proxy.

mod codec;
mod failures;
mod lease;

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};
use tracing::{debug, info, warn};
use wharf_metrics::shared::{
    SharedCacheMetrics, SharedFailure, SharedLookup, SharedOp, SharedWrite,
};

use crate::entry::{CachedResponse, ResponseHead};
use codec::Meta;
pub use failures::FAILURE_WARN_EVERY;
use failures::{FailureLog, Recovered};
pub use lease::{Lease, LeaseOutcome, WaitOutcome};

/// Default bound of one Redis round trip.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_millis(100);
/// Default size of one body chunk value.
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;
/// Chunks fetched or stored per round trip.
const CHUNKS_PER_TRIP: usize = 4;
/// How much longer chunk values live than their meta value.
const CHUNK_GRACE: Duration = Duration::from_secs(10);

/// How the shared tier is reached and bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTierConfig {
    /// `redis://host:port[/db]` (no TLS).
    pub url: String,
    /// Bound of every Redis round trip. Default 100 ms. Past it the tier is skipped.
    pub op_timeout: Duration,
    /// Size of one body chunk value. Default 256 KiB.
    pub chunk_bytes: usize,
    /// After a failure, how long operations are skipped without trying. Default 1 s.
    pub rest_after_failure: Duration,
    /// While another instance holds the lease, how often to look for its entry. Default 25 ms.
    pub poll_interval: Duration,
}

impl SharedTierConfig {
    /// The defaults for a Redis at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            op_timeout: DEFAULT_OP_TIMEOUT,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            rest_after_failure: Duration::from_secs(1),
            poll_interval: Duration::from_millis(25),
        }
    }
}

/// What this instance accepts from the shared tier, whoever wrote the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLimits {
    /// Largest body, in bytes (the proxy's `max_object_bytes`); a bigger entry is a miss.
    pub max_bytes: u64,
    /// Longest freshness from the entry's store time (the proxy's `max_ttl`): an entry is
    /// served for the lesser of its writer's TTL and this, and is a miss once it is older.
    pub max_ttl: Duration,
}

/// The shared tier could not be set up (a bad URL; an unreachable Redis is not an error).
#[derive(Debug, thiserror::Error)]
#[error("shared cache {url:?}: {source}")]
pub struct SharedTierError {
    /// The URL as configured, its credentials hidden ([`wharf_config::redacted_url`]).
    pub url: String,
    /// What the redis crate said.
    pub source: RedisError,
}

/// Why an operation did not run to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpError {
    /// Not tried: resting after a failure.
    Skipped,
    /// Failed or timed out (counted).
    Failed,
}

impl OpError {
    /// How a lookup that ended so is counted.
    fn lookup(self) -> SharedLookup {
        match self {
            OpError::Skipped => SharedLookup::Skipped,
            OpError::Failed => SharedLookup::Error,
        }
    }
}

/// The Redis tier of one proxy service. Cheap to share (`Arc`); every method is bounded in
/// time and reports failure as "no help", never as an error to the caller.
pub struct SharedTier {
    connection: ConnectionManager,
    config: SharedTierConfig,
    /// `config.url` with its credentials hidden, for logs.
    url_for_logs: String,
    metrics: SharedCacheMetrics,
    /// Time origin of `rest_until_ms`.
    clock: Instant,
    /// Operations are skipped until this many ms after `clock` (set on failure).
    rest_until_ms: AtomicU64,
    /// Source of lease tokens and chunk versions.
    random: RandomState,
    /// Makes every token distinct even if the hasher repeats.
    sequence: AtomicU64,
    /// Guards the rate of failure warnings (see `failures.rs`).
    failures: FailureLog,
}

impl std::fmt::Debug for SharedTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTier")
            .field("url", &self.url_for_logs)
            .field("op_timeout", &self.config.op_timeout)
            .finish_non_exhaustive()
    }
}

impl SharedTier {
    /// Sets up the tier for `config.url`. Connects lazily (in the background, on first use):
    /// a Redis that is down at start is not an error, the tier is skipped until it is up.
    /// Must be called within a tokio runtime.
    pub fn new(
        config: SharedTierConfig,
        metrics: SharedCacheMetrics,
    ) -> Result<Arc<Self>, SharedTierError> {
        let url_for_logs = wharf_config::redacted_url(&config.url);
        let error = |source| SharedTierError {
            url: url_for_logs.clone(),
            source,
        };
        let client = redis::Client::open(config.url.as_str()).map_err(error)?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.op_timeout.max(Duration::from_millis(250))))
            // Our own bound (`run`) fires first; this one only frees the connection's slot.
            .set_response_timeout(Some(config.op_timeout * 2))
            // Reconnection is paced by the rest period below, not by a long retry loop that
            // every waiting operation would sit behind.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let connection = ConnectionManager::new_lazy_with_config(client, manager).map_err(error)?;
        Ok(Arc::new(Self {
            connection,
            config,
            url_for_logs,
            metrics,
            clock: Instant::now(),
            rest_until_ms: AtomicU64::new(0),
            random: RandomState::new(),
            sequence: AtomicU64::new(0),
            failures: FailureLog::default(),
        }))
    }

    /// The configuration in force.
    pub fn config(&self) -> &SharedTierConfig {
        &self.config
    }

    /// Looks `key` up; `None` on a miss, an entry outside `limits`, or any failure. A plain
    /// read without the fill lease, for tests that check what is stored: the proxy reads
    /// through [`SharedTier::lookup_or_lease`] and [`SharedTier::wait`].
    #[cfg(test)]
    pub async fn get(&self, key: &str, limits: EntryLimits) -> Option<CachedResponse> {
        let keys = Keys::new(key);
        let mut connection = self.connection.clone();
        let meta = self
            .run(SharedOp::Get, async {
                // MULTI: the TTL left is the meta value's, not a later writer's.
                redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg(&keys.meta)
                    .cmd("PTTL")
                    .arg(&keys.meta)
                    .query_async::<(Option<Vec<u8>>, i64)>(&mut connection)
                    .await
            })
            .await;
        let found = match meta {
            Ok((Some(meta), pttl)) => self
                .read_entry(&keys, &meta, pttl, limits)
                .await
                .map(Read::usable),
            Ok((None, _)) => Ok(None),
            Err(error) => Err(error),
        };
        self.count_lookup(&found);
        found.ok().flatten()
    }

    /// Writes a committed entry through to Redis: chunks first, the meta value last, with
    /// the entry's remaining TTL. Meant to run in the background; bounded per round trip.
    pub async fn put(&self, key: &str, entry: &CachedResponse) {
        let outcome = self.try_put(key, entry).await;
        self.metrics.write(match outcome {
            Ok(true) => SharedWrite::Ok,
            Ok(false) => return, // expired already: nothing to share
            Err(OpError::Skipped) => SharedWrite::Skipped,
            Err(OpError::Failed) => SharedWrite::Error,
        });
    }

    async fn try_put(&self, key: &str, entry: &CachedResponse) -> Result<bool, OpError> {
        // The entry's TTL left, in ms, as of the call: read before the chunks and again
        // before the meta value, since the chunks' round trips take time.
        let left_ms = || {
            let left = entry.expires_at.saturating_duration_since(Instant::now());
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
        };
        let chunks_left_ms = left_ms();
        if chunks_left_ms == 0 {
            return Ok(false);
        }
        let total_ttl = entry.expires_at.saturating_duration_since(entry.stored_at);
        let keys = Keys::new(key);
        let version = self.unique_id();
        let chunk_ttl_ms = chunks_left_ms.saturating_add(CHUNK_GRACE.as_millis() as u64);
        let body = entry.body.chunks().map_err(|error| {
            warn!(error = %error, "reading a cached body for the shared tier failed");
            OpError::Failed
        })?;
        let chunks = rechunk(&body, self.config.chunk_bytes.max(1));
        for (trip, group) in chunks.chunks(CHUNKS_PER_TRIP).enumerate() {
            let mut pipe = redis::pipe();
            for (i, chunk) in group.iter().enumerate() {
                let index = trip * CHUNKS_PER_TRIP + i;
                pipe.cmd("SET")
                    .arg(keys.chunk(&version, index))
                    .arg(chunk.as_ref())
                    .arg("PX")
                    .arg(chunk_ttl_ms)
                    .ignore();
            }
            let mut connection = self.connection.clone();
            self.run(SharedOp::Put, async {
                pipe.query_async::<()>(&mut connection).await
            })
            .await?;
        }
        let meta = Meta {
            status: entry.head.status,
            headers: entry.head.headers.clone(),
            body_len: entry.body_len,
            chunks: u32::try_from(chunks.len()).unwrap_or(u32::MAX),
            ttl_ms: u64::try_from(total_ttl.as_millis()).unwrap_or(u64::MAX),
            version,
        }
        .encode();
        // What is left now, after the chunks' round trips: readers take the entry's age
        // from the meta value's expiry, so it must be the memory entry's to the ms.
        let meta_left_ms = left_ms();
        if meta_left_ms == 0 {
            return Ok(false);
        }
        let mut connection = self.connection.clone();
        self.run(SharedOp::Put, async {
            redis::cmd("SET")
                .arg(&keys.meta)
                .arg(meta)
                .arg("PX")
                .arg(meta_left_ms)
                .query_async::<()>(&mut connection)
                .await
        })
        .await?;
        Ok(true)
    }

    /// Reads the chunks a meta value names, given the meta value's `PTTL` read with it.
    async fn read_entry(
        &self,
        keys: &Keys,
        meta: &[u8],
        pttl: i64,
        limits: EntryLimits,
    ) -> Result<Read, OpError> {
        let Some(meta) = Meta::decode(meta) else {
            debug!("shared cache: unreadable meta value, treated as a miss");
            return Ok(Read::Replaceable);
        };
        // The age is as of the meta value's read: the chunks' round trips below must not
        // make the entry look younger than Redis counts it.
        let read_at = Instant::now();
        let Some(age) = meta.age(pttl) else {
            return Ok(Read::Replaceable);
        };
        if meta.body_len > limits.max_bytes {
            return Ok(Read::TooBig);
        }
        // The writer capped its TTL with its own max_ttl; this reader's may be shorter.
        // Measured from the store time, like the memory tier's, so the entry and its
        // promoted memory copy stop being served once they are older than either.
        let ttl = Duration::from_millis(meta.ttl_ms).min(limits.max_ttl);
        if age >= ttl {
            return Ok(Read::Replaceable);
        }
        let count = usize::try_from(meta.chunks).unwrap_or(usize::MAX);
        let plausible = (meta.body_len == 0 && count == 0)
            || (count > 0 && meta.body_len.div_ceil(count as u64) <= 64 << 20);
        if !plausible {
            return Ok(Read::Replaceable);
        }
        let mut body = Vec::with_capacity(count);
        let mut received = 0u64;
        for first in (0..count).step_by(CHUNKS_PER_TRIP) {
            let last = (first + CHUNKS_PER_TRIP).min(count);
            let mut pipe = redis::pipe();
            for index in first..last {
                pipe.cmd("GET").arg(keys.chunk(&meta.version, index));
            }
            let mut connection = self.connection.clone();
            let values = self
                .run(SharedOp::Get, async {
                    pipe.query_async::<Vec<Value>>(&mut connection).await
                })
                .await?;
            for value in values {
                let Value::BulkString(chunk) = value else {
                    debug!("shared cache: chunk missing, treated as a miss");
                    return Ok(Read::Replaceable);
                };
                received += chunk.len() as u64;
                body.push(Bytes::from(chunk));
            }
        }
        if received != meta.body_len || body.len() != count {
            return Ok(Read::Replaceable);
        }
        let head = Arc::new(ResponseHead {
            status: meta.status,
            headers: meta.headers.clone(),
        });
        // An age this process's clock cannot go back to (just started): count from the read,
        // shortening the lifetime by that age so the entry still expires on time.
        let (stored_at, ttl) = match read_at.checked_sub(age) {
            Some(stored_at) => (stored_at, ttl),
            None => (read_at, ttl.saturating_sub(age)),
        };
        Ok(Read::Entry(CachedResponse::new(head, body, stored_at, ttl)))
    }

    /// Runs one Redis round trip within the op timeout, with its latency and failure
    /// counted; skipped (`OpError::Skipped`) while the tier rests after a failure.
    async fn run<T>(
        &self,
        op: SharedOp,
        future: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, OpError> {
        if self.resting() {
            return Err(OpError::Skipped);
        }
        self.run_now(op, future).await
    }

    /// As [`SharedTier::run`], even while the tier rests: for lease renewals, which a rest
    /// (one second after any failure on the tier) would otherwise skip until a short lease
    /// lapses and another instance fetches the origin too.
    async fn run_now<T>(
        &self,
        op: SharedOp,
        future: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, OpError> {
        let started = Instant::now();
        let outcome = tokio::time::timeout(self.config.op_timeout, future).await;
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(Ok(value)) => {
                self.metrics.op(op, seconds, None);
                if let Some(recovered) = self.failures.success() {
                    self.log_recovery(recovered);
                }
                Ok(value)
            }
            Ok(Err(error)) => {
                let failure = if error.is_timeout() {
                    SharedFailure::Timeout
                } else {
                    SharedFailure::Error
                };
                self.metrics.op(op, seconds, Some(failure));
                self.log_failure(op, &error);
                self.rest();
                Err(OpError::Failed)
            }
            Err(_elapsed) => {
                self.metrics.op(op, seconds, Some(SharedFailure::Timeout));
                let error = format!("no answer within {:?}", self.config.op_timeout);
                self.log_failure(op, &error);
                self.rest();
                Err(OpError::Failed)
            }
        }
    }

    /// Logs a failed operation: every one at debug, and a warning when [`FailureLog`] says
    /// one is due (the first failure, then at most one every [`FAILURE_WARN_EVERY`]).
    fn log_failure(&self, op: SharedOp, error: &dyn std::fmt::Display) {
        debug!(
            url = %self.url_for_logs,
            op = op.as_str(),
            error = %error,
            "shared cache operation failed; tier skipped"
        );
        if let Some(failures) = self.failures.failure(Instant::now()) {
            warn!(
                url = %self.url_for_logs,
                op = op.as_str(),
                error = %error,
                failures,
                "shared cache failing; tier skipped until it answers"
            );
        }
    }

    fn log_recovery(&self, recovered: Recovered) {
        info!(
            url = %self.url_for_logs,
            failures = recovered.unreported,
            "shared cache answers again"
        );
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn resting(&self) -> bool {
        self.now_ms() < self.rest_until_ms.load(Ordering::Relaxed)
    }

    fn rest(&self) {
        let rest = u64::try_from(self.config.rest_after_failure.as_millis()).unwrap_or(u64::MAX);
        self.rest_until_ms
            .store(self.now_ms().saturating_add(rest), Ordering::Relaxed);
    }

    #[cfg(test)]
    fn count_lookup<T>(&self, found: &Result<Option<T>, OpError>) {
        self.metrics.lookup(match found {
            Ok(Some(_)) => SharedLookup::Hit,
            Ok(None) => SharedLookup::Miss,
            Err(error) => error.lookup(),
        });
    }

    /// 128 random-ish bits as hex: a per-process random hasher keyed with a counter.
    fn unique_id(&self) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        let high = self.random.hash_one((n, std::process::id(), 0u8));
        let low = self
            .random
            .hash_one((n, self.clock.elapsed().as_nanos(), 1u8));
        format!("{high:016x}{low:016x}")
    }
}

/// The start of every key, naming the entry layout. A new layout takes a new prefix
/// (`wharf2`: the meta value without the writer's store time), so that during a rolling
/// upgrade the two versions keep their entries and leases apart: each serves its own hits
/// and makes one fetch per key, rather than each taking the other's entry for garbage,
/// fetching without a lease and overwriting it.
const KEY_PREFIX: &str = "wharf2";

/// What reading an entry found, for this instance.
#[derive(Debug)]
enum Read {
    /// An entry to serve.
    Entry(CachedResponse),
    /// None this instance can serve, but its fetch would store one it can: the entry is
    /// older than this instance's `max_ttl`, expired, unreadable, or lost a chunk (Redis
    /// evicts the big chunk values before their small meta value). A fetch to replace it
    /// is coalesced like a miss's, under the lease.
    Replaceable,
    /// None this instance can serve, and its fetch would store none: the body is over its
    /// `max_bytes`. Fetched without the lease, which would only serialise such fetches.
    TooBig,
}

#[cfg(test)]
impl Read {
    /// The entry, if there is one to serve.
    fn usable(self) -> Option<CachedResponse> {
        match self {
            Read::Entry(entry) => Some(entry),
            Read::Replaceable | Read::TooBig => None,
        }
    }
}

/// The Redis keys of one cache key.
struct Keys {
    meta: String,
    lease: String,
    /// `wharf2:{K}:c:` — followed by `VERSION:I`.
    chunk_prefix: String,
}

impl Keys {
    fn new(key: &str) -> Self {
        Self {
            meta: format!("{KEY_PREFIX}:{{{key}}}:m"),
            lease: format!("{KEY_PREFIX}:{{{key}}}:l"),
            chunk_prefix: format!("{KEY_PREFIX}:{{{key}}}:c:"),
        }
    }

    fn chunk(&self, version: &str, index: usize) -> String {
        format!("{}{version}:{index}", self.chunk_prefix)
    }
}

/// The body regrouped into values of `size` bytes (the last may be shorter). A body chunk
/// that already has exactly that size is shared, not copied.
fn rechunk(body: &[Bytes], size: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for piece in body {
        let mut piece = piece.clone();
        while !piece.is_empty() {
            if current.is_empty() && piece.len() >= size {
                out.push(piece.split_to(size));
                continue;
            }
            let take = (size - current.len()).min(piece.len());
            current.extend_from_slice(&piece.split_to(take));
            if current.len() == size {
                out.push(Bytes::from(std::mem::take(&mut current)));
            }
        }
    }
    if !current.is_empty() {
        out.push(Bytes::from(current));
    }
    out
}

#[cfg(test)]
mod tests;
