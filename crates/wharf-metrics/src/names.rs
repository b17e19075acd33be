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

/// Every name of the catalogue, for tests and docs.
pub const ALL: [&str; 13] = [
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
];
