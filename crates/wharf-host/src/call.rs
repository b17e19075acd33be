//! One call's identity and phase, shared by the layers, the service and
//! `/debug/inflight` ("why is this call slow right now").
//!
//! The trace layer creates a [`CallContext`] per call and puts it in the
//! request's extensions; a service moves it through [`Phase`]s with
//! [`CallContext::enter`], which also emits the phase's tracing event. The
//! phase names are a stable catalogue (docs/tracing.md), like the ETW event
//! names seeds 003 and 004 relied on.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use foldhash::HashMap;
use serde::Serialize;
use wharf_http1::recycle::thread_number;

/// The client's address, in every request's extensions (for
/// `x-forwarded-for` and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// Where a call is. The names are stable: dashboards and log queries use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Dispatched to the service, not yet admitted by its bulkhead.
    Received = 0,
    /// Waiting in the bulkhead's queue for a slot.
    Queued,
    /// Holding a slot: the service is working on it.
    Processing,
    /// The proxy is looking the URL up in its cache.
    CacheLookup,
    /// Waiting for an upstream's response head (connect included).
    UpstreamConnect,
    /// The upstream's response head arrived.
    FirstByte,
    /// The response head went to the client; the body is streaming.
    Body,
    /// The body was fully sent (or the call ended).
    BodyDone,
}

impl Phase {
    const ALL: [Phase; 8] = [
        Phase::Received,
        Phase::Queued,
        Phase::Processing,
        Phase::CacheLookup,
        Phase::UpstreamConnect,
        Phase::FirstByte,
        Phase::Body,
        Phase::BodyDone,
    ];

    /// The stable name (`queued`, `cache_lookup`, `upstream_connect`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Received => "received",
            Phase::Queued => "queued",
            Phase::Processing => "processing",
            Phase::CacheLookup => "cache_lookup",
            Phase::UpstreamConnect => "upstream_connect",
            Phase::FirstByte => "first_byte",
            Phase::Body => "body",
            Phase::BodyDone => "body_done",
        }
    }

    fn from_u8(value: u8) -> Phase {
        Phase::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Phase::BodyDone)
    }
}

/// What is known about one call in flight.
#[derive(Debug)]
struct CallEntry {
    id: u64,
    service: Arc<str>,
    /// Cheap clones: standard methods are inline, a URI shares its bytes.
    method: http::Method,
    target: http::Uri,
    started: Instant,
    phase: AtomicU8,
}

/// A handle on the current call, found in the request's extensions.
#[derive(Debug, Clone)]
pub struct CallContext {
    entry: Arc<CallEntry>,
}

impl CallContext {
    /// The call's id (also the `call_id` tracing field).
    pub fn id(&self) -> u64 {
        self.entry.id
    }

    /// Moves the call to `phase` and emits the phase event (in the span the
    /// caller is in: services run inside the call's span).
    pub fn enter(&self, phase: Phase) {
        self.entry.phase.store(phase as u8, Ordering::Relaxed);
        tracing::debug!(
            phase = phase.as_str(),
            elapsed_ms = self.entry.started.elapsed().as_secs_f64() * 1e3,
            "phase"
        );
    }

    /// As [`CallContext::enter`], the event's parent being `span` (the call's
    /// own): for the host's layers, which run outside the span. Naming the
    /// parent costs nothing when the event is not enabled; entering the span
    /// would cost on every call.
    pub(crate) fn enter_in(&self, span: &tracing::Span, phase: Phase) {
        self.entry.phase.store(phase as u8, Ordering::Relaxed);
        tracing::debug!(
            parent: span,
            phase = phase.as_str(),
            elapsed_ms = self.entry.started.elapsed().as_secs_f64() * 1e3,
            "phase"
        );
    }

    /// The phase the call is in.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.entry.phase.load(Ordering::Relaxed))
    }
}

/// Enters `phase` on the request's call context, if it has one (a service
/// used outside a host has none).
pub fn enter_phase<B>(request: &http::Request<B>, phase: Phase) {
    if let Some(call) = request.extensions().get::<CallContext>() {
        call.enter(phase);
    }
}

/// Shards of the in-flight list. Each thread registers its calls in a shard of its own
/// (by [`thread_number`], so the cores, which call side by side from the start-up warm-up
/// on, get distinct ones): two cores never pass a
/// lock's cache line, or a shared id counter's, back and forth on every call. Measured on
/// this 2-core VM: an atomic add on a line the other CPU writes too costs 30-60 ns, against
/// a few for a line of its own (`docs/pathologies.md`).
const SHARDS: usize = 16;

/// One shard, alone on its cache line(s).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard {
    calls: Mutex<ShardCalls>,
}

/// What a shard's lock guards.
#[derive(Debug, Default)]
struct ShardCalls {
    /// Calls registered here so far; a call's id is this count and the shard's index.
    registered: u64,
    /// id → entry. Maps keep their capacity, so a warm host registers a call without
    /// allocating for the list.
    entries: HashMap<u64, Arc<CallEntry>>,
}

/// The calls in flight on a host.
#[derive(Debug)]
pub struct Inflight {
    shards: [Arc<Shard>; SHARDS],
}

impl Default for Inflight {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Arc::default()),
        }
    }
}

/// One row of `/debug/inflight`.
#[derive(Debug, Clone, Serialize)]
pub struct InflightCall {
    /// Call id.
    pub id: u64,
    /// Service name.
    pub service: String,
    /// HTTP method.
    pub method: String,
    /// Request target (path and query).
    pub target: String,
    /// Current phase name.
    pub phase: &'static str,
    /// Milliseconds since the call was dispatched.
    pub age_ms: u64,
}

impl Inflight {
    /// Registers a call that `started` then in the calling thread's shard; it leaves the
    /// list when the guard drops. Ids are unique per host: the shard's count of calls, then
    /// the shard's index.
    pub(crate) fn begin(
        &self,
        service: Arc<str>,
        method: &http::Method,
        target: &http::Uri,
        started: Instant,
    ) -> (CallContext, InflightGuard) {
        let index = thread_number() % SHARDS;
        let shard = &self.shards[index];
        let mut calls = lock(shard);
        calls.registered += 1;
        let id = calls.registered * SHARDS as u64 + index as u64;
        let entry = Arc::new(CallEntry {
            id,
            service,
            method: method.clone(),
            target: target.clone(),
            started,
            phase: AtomicU8::new(Phase::Received as u8),
        });
        calls.entries.insert(id, entry.clone());
        drop(calls);
        let guard = InflightGuard {
            shard: shard.clone(),
            id,
        };
        (CallContext { entry }, guard)
    }

    /// The calls in flight now, oldest first.
    pub fn snapshot(&self) -> Vec<InflightCall> {
        let now = Instant::now();
        let mut entries: Vec<Arc<CallEntry>> = self
            .shards
            .iter()
            .flat_map(|shard| lock(shard).entries.values().cloned().collect::<Vec<_>>())
            .collect();
        entries.sort_unstable_by_key(|entry| (entry.started, entry.id));
        entries
            .iter()
            .map(|entry| InflightCall {
                id: entry.id,
                service: entry.service.to_string(),
                method: entry.method.to_string(),
                target: entry
                    .target
                    .path_and_query()
                    .map_or_else(|| entry.target.to_string(), |pq| pq.as_str().to_owned()),
                phase: Phase::from_u8(entry.phase.load(Ordering::Relaxed)).as_str(),
                age_ms: now.saturating_duration_since(entry.started).as_millis() as u64,
            })
            .collect()
    }

    /// Number of calls in flight.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).entries.len())
            .sum()
    }

    /// Whether no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A shard's calls, locked (a panic elsewhere while holding it leaves a usable map).
fn lock(shard: &Shard) -> std::sync::MutexGuard<'_, ShardCalls> {
    shard.calls.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes its call from the in-flight list when dropped.
#[derive(Debug)]
pub(crate) struct InflightGuard {
    /// The shard the call is in (its thread's: only that thread touches this count).
    shard: Arc<Shard>,
    id: u64,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        lock(&self.shard).entries.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_calls_oldest_first_with_their_phase() {
        let inflight = Arc::new(Inflight::default());
        let uri: http::Uri = "/proxy?url=x".parse().unwrap();
        let (first, first_guard) =
            inflight.begin("a".into(), &http::Method::GET, &uri, Instant::now());
        let (_second, second_guard) =
            inflight.begin("b".into(), &http::Method::POST, &uri, Instant::now());
        first.enter(Phase::UpstreamConnect);
        let rows = inflight.snapshot();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].service.as_str(), rows[0].phase),
            ("a", "upstream_connect")
        );
        assert_eq!((rows[1].service.as_str(), rows[1].phase), ("b", "received"));
        assert_eq!(rows[0].target, "/proxy?url=x");
        drop(first_guard);
        assert_eq!(inflight.snapshot()[0].service, "b");
        drop(second_guard);
        assert!(inflight.is_empty());
    }

    #[test]
    fn calls_of_other_threads_get_other_ids_and_leave_from_their_own_shards() {
        let inflight = Arc::new(Inflight::default());
        let uri: http::Uri = "/x".parse().unwrap();
        // Each thread's first call, and the guard dropped on another thread than its own.
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let inflight = inflight.clone();
                let uri = uri.clone();
                std::thread::spawn(move || {
                    inflight.begin("s".into(), &http::Method::GET, &uri, Instant::now())
                })
                .join()
                .unwrap()
            })
            .collect();
        let mut ids: Vec<u64> = inflight.snapshot().iter().map(|row| row.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 4, "ids: {ids:?}");
        drop(calls);
        assert!(inflight.is_empty());
    }
}
