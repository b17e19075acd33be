//! Metric names, spelled as SPEC §5 (and dashboards) expect them.

/// Calls of a service being processed.
pub const CALLS_OUTSTANDING: &str = "wharf_calls_outstanding";
/// Calls of a service waiting for a slot.
pub const CALLS_QUEUED: &str = "wharf_calls_queued";
/// (processing + queued) / max_concurrent_calls × 100.
pub const PERCENT_OF_MAX_CALLS: &str = "wharf_percent_of_max_calls";
/// Calls answered, by service and status code.
pub const CALLS_TOTAL: &str = "wharf_calls_total";
/// Call duration histogram.
pub const CALL_DURATION_SECONDS: &str = "wharf_call_duration_seconds";
/// Calls refused by a bulkhead.
pub const THROTTLED_TOTAL: &str = "wharf_throttled_total";
/// Open client connections.
pub const SESSIONS_ACTIVE: &str = "wharf_sessions_active";
/// sessions_active / max_connections × 100.
pub const PERCENT_OF_MAX_SESSIONS: &str = "wharf_percent_of_max_sessions";
/// Proxy calls by cache result.
pub const CACHE_REQUESTS_TOTAL: &str = "wharf_cache_requests_total";
/// Bytes held by a proxy's memory cache.
pub const CACHE_BYTES: &str = "wharf_cache_bytes";
/// Cache evictions.
pub const CACHE_EVICTIONS_TOTAL: &str = "wharf_cache_evictions_total";
/// Upstream requests by outcome.
pub const UPSTREAM_REQUESTS_TOTAL: &str = "wharf_upstream_requests_total";
/// Start-up phase durations.
pub const STARTUP_PHASE_SECONDS: &str = "wharf_startup_phase_seconds";
/// Client read buffers taken by HTTP/1.1 connections, by source: reused (a spare one of the
/// worker thread) or allocated (SPEC §5's buffer reuse statistics).
pub const READ_BUFFERS_TOTAL: &str = "wharf_read_buffers_total";
/// Spare client read buffers held for reuse, over all worker threads (sampled).
pub const READ_BUFFERS_SPARE: &str = "wharf_read_buffers_spare";
/// Other objects the host keeps per worker thread for reuse (header maps, extension maps,
/// response head buffers), taken by kind and source: reused or allocated (sampled).
pub const KEPT_OBJECTS_TOTAL: &str = "wharf_kept_objects_total";
/// Kept objects held for reuse now, by kind, over all worker threads (sampled).
pub const KEPT_OBJECTS_SPARE: &str = "wharf_kept_objects_spare";
/// Descriptors lent to idle upstream connections by the open-files ledger, the pools' spare
/// leases included (sampled).
pub const UPSTREAM_IDLE_DESCRIPTORS: &str = "wharf_upstream_idle_descriptors";
/// Upstream connections closed when their response ended instead of being kept idle, for
/// want of a descriptor no open session may need (sampled).
pub const UPSTREAM_IDLE_REFUSED_TOTAL: &str = "wharf_upstream_idle_refused_total";
/// Idle upstream connections closed to give their descriptor back to sessions (sampled).
pub const UPSTREAM_IDLE_RECALLED_TOTAL: &str = "wharf_upstream_idle_recalled_total";

/// Shared (Redis) cache tier lookups, by result: hit, miss, error, skipped.
pub const SHARED_CACHE_REQUESTS_TOTAL: &str = "wharf_shared_cache_requests_total";
/// Shared cache tier operations that failed, by operation and reason (timeout, error).
pub const SHARED_CACHE_ERRORS_TOTAL: &str = "wharf_shared_cache_errors_total";
/// Shared cache tier operation latency histogram, by operation.
pub const SHARED_CACHE_OP_DURATION_SECONDS: &str = "wharf_shared_cache_op_duration_seconds";
/// Committed fills written through to the shared tier, by outcome: ok, error, skipped.
pub const SHARED_CACHE_WRITES_TOTAL: &str = "wharf_shared_cache_writes_total";
/// Cross-instance fill leases, by result: acquired, held (another instance fetches), error.
pub const SHARED_CACHE_LEASES_TOTAL: &str = "wharf_shared_cache_leases_total";
/// Queue messages published, by outcome: ok, duplicate, error.
pub const QUEUE_PUBLISHED_TOTAL: &str = "wharf_queue_published_total";
/// Queue messages delivered to the backend (2xx, then acknowledged).
pub const QUEUE_DELIVERED_TOTAL: &str = "wharf_queue_delivered_total";
/// Queue delivery attempts that failed and will be retried, by reason: rejected, timeout,
/// unreachable.
pub const QUEUE_RETRIED_TOTAL: &str = "wharf_queue_retried_total";
/// Queue messages sent to the dead-letter subject after `max_deliver` failed attempts.
pub const QUEUE_DEAD_LETTERED_TOTAL: &str = "wharf_queue_dead_lettered_total";
/// Queue dead letters the broker did not store, one per failed try: the message is kept
/// and its dead letter tried again.
pub const QUEUE_DEAD_LETTER_FAILED_TOTAL: &str = "wharf_queue_dead_letter_failed_total";
/// Queue deliveries of a message the broker had delivered before (a possible duplicate).
pub const QUEUE_REDELIVERED_TOTAL: &str = "wharf_queue_redelivered_total";
/// Queue messages accepted but not yet acknowledged by a delivery (sampled).
pub const QUEUE_PENDING: &str = "wharf_queue_pending";

/// Every name of the catalogue, for tests and docs.
pub const ALL: [&str; 30] = [
    CALLS_OUTSTANDING,
    CALLS_QUEUED,
    PERCENT_OF_MAX_CALLS,
    CALLS_TOTAL,
    CALL_DURATION_SECONDS,
    THROTTLED_TOTAL,
    SESSIONS_ACTIVE,
    PERCENT_OF_MAX_SESSIONS,
    CACHE_REQUESTS_TOTAL,
    CACHE_BYTES,
    CACHE_EVICTIONS_TOTAL,
    UPSTREAM_REQUESTS_TOTAL,
    STARTUP_PHASE_SECONDS,
    READ_BUFFERS_TOTAL,
    READ_BUFFERS_SPARE,
    UPSTREAM_IDLE_DESCRIPTORS,
    UPSTREAM_IDLE_REFUSED_TOTAL,
    UPSTREAM_IDLE_RECALLED_TOTAL,
    SHARED_CACHE_REQUESTS_TOTAL,
    SHARED_CACHE_ERRORS_TOTAL,
    SHARED_CACHE_OP_DURATION_SECONDS,
    SHARED_CACHE_WRITES_TOTAL,
    SHARED_CACHE_LEASES_TOTAL,
    QUEUE_PUBLISHED_TOTAL,
    QUEUE_DELIVERED_TOTAL,
    QUEUE_RETRIED_TOTAL,
    QUEUE_DEAD_LETTERED_TOTAL,
    QUEUE_DEAD_LETTER_FAILED_TOTAL,
    QUEUE_REDELIVERED_TOTAL,
    QUEUE_PENDING,
];
