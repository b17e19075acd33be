//! Built-in defaults and limits: the values used when a key is left out, and the ranges keys
//! must stay in. Durations and sizes are spelled as in the file so that error messages can
//! quote them (`(e.g. "1d")`); src/default.toml and docs/configuration.md repeat these values
//! and a test keeps the former in step.

/// `server.listen`.
pub(crate) const LISTEN: &str = "127.0.0.1:8080";
/// `server.admin_listen`.
pub(crate) const ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// `server.max_connections`.
pub(crate) const MAX_CONNECTIONS: u64 = 10_000;
/// `server.header_read_timeout`.
pub(crate) const HEADER_READ_TIMEOUT: &str = "10s";
/// `server.max_header_bytes`.
pub(crate) const MAX_HEADER_BYTES: &str = "64KiB";
/// `server.idle_timeout`.
pub(crate) const IDLE_TIMEOUT: &str = "60s";
/// `server.shutdown_timeout`.
pub(crate) const SHUTDOWN_TIMEOUT: &str = "30s";
/// `server.busy_poll_us` (off).
pub(crate) const BUSY_POLL_US: u64 = 0;
/// The largest `server.busy_poll_us`: 10 ms of spinning after every burst of work.
pub(crate) const MAX_BUSY_POLL_US: u64 = 10_000;
/// `server.keep_warm` (off).
pub(crate) const KEEP_WARM: &str = "0s";
/// The shortest `server.keep_warm` other than off: each round is a few loopback calls per
/// core, which more often than this would cost more than the pages it keeps warm.
pub(crate) const MIN_KEEP_WARM: &str = "10ms";
/// The longest `server.keep_warm`: pages left a minute are cold on the hosts it is for.
pub(crate) const MAX_KEEP_WARM: &str = "60s";
/// `server.resolve_hold`: HAProxy's resolvers hold a valid answer as long by default, and
/// `getaddrinfo` says nothing of a record's TTL.
pub(crate) const RESOLVE_HOLD: &str = "10s";
/// The longest `server.resolve_hold`: a name that moves is followed within it.
pub(crate) const MAX_RESOLVE_HOLD: &str = "1h";

/// `queue_timeout`, every service type.
pub(crate) const QUEUE_TIMEOUT: &str = "5s";
/// `max_concurrent_calls` of a proxy.
pub(crate) const PROXY_MAX_CONCURRENT_CALLS: u64 = 4096;
/// `max_queued_calls` of a proxy.
pub(crate) const PROXY_MAX_QUEUED_CALLS: u64 = 1024;
/// `max_concurrent_calls` of a route.
pub(crate) const ROUTE_MAX_CONCURRENT_CALLS: u64 = 256;
/// `max_queued_calls` of a route.
pub(crate) const ROUTE_MAX_QUEUED_CALLS: u64 = 64;

/// Proxy `cache_max_bytes`.
pub(crate) const CACHE_MAX_BYTES: &str = "256MiB";
/// Proxy `max_object_bytes`.
pub(crate) const MAX_OBJECT_BYTES: &str = "64MiB";
/// Proxy `max_ttl`.
pub(crate) const MAX_TTL: &str = "1d";
/// Proxy `connect_timeout`.
pub(crate) const CONNECT_TIMEOUT: &str = "5s";
/// Proxy `first_byte_timeout`.
pub(crate) const FIRST_BYTE_TIMEOUT: &str = "30s";
/// Proxy `total_timeout`.
pub(crate) const TOTAL_TIMEOUT: &str = "300s";

/// `max_concurrent_calls` of a queue (publishes in flight).
pub(crate) const QUEUE_MAX_CONCURRENT_CALLS: u64 = 1024;
/// `max_queued_calls` of a queue.
pub(crate) const QUEUE_MAX_QUEUED_CALLS: u64 = 1024;
/// Queue `nats_url`.
pub(crate) const NATS_URL: &str = "nats://127.0.0.1:4222";
/// Queue `forward_headers`.
pub(crate) const FORWARD_HEADERS: [&str; 5] = [
    "content-type",
    "content-encoding",
    "x-request-id",
    "traceparent",
    "tracestate",
];
/// Queue `publish_timeout`.
pub(crate) const PUBLISH_TIMEOUT: &str = "5s";
/// Queue `deliver.max_deliver`.
pub(crate) const MAX_DELIVER: u64 = 5;
/// Largest `deliver.max_deliver`.
pub(crate) const MAX_DELIVER_LIMIT: u64 = 1000;
/// Queue `deliver.backoff`.
pub(crate) const BACKOFF: &str = "500ms";
/// Queue `deliver.concurrency`.
pub(crate) const CONCURRENCY: u64 = 16;
/// Largest `deliver.concurrency`.
pub(crate) const MAX_CONCURRENCY: u64 = 10_000;
/// Queue `deliver.ack_wait`.
pub(crate) const ACK_WAIT: &str = "30s";

/// Route `timeout`.
pub(crate) const ROUTE_TIMEOUT: &str = "10s";
/// Route `retries`.
pub(crate) const RETRIES: u64 = 1;
/// Largest `preconnect` (a route's per backend, a proxy's per listed origin): idle
/// connections kept per upstream and core. Each holds a descriptor here and one at the
/// upstream; the open-files budget bounds them further.
pub(crate) const MAX_PRECONNECT: u64 = 1024;
/// A proxy's `preconnect` when `preconnect_origins` lists origins.
pub(crate) const PROXY_PRECONNECT: u64 = 1;

/// `telemetry.log_format`.
pub(crate) const LOG_FORMAT: &str = "pretty";
/// `telemetry.log_level`.
pub(crate) const LOG_LEVEL: &str = "info";
/// `telemetry.service_name`.
pub(crate) const SERVICE_NAME: &str = "wharf";
/// `telemetry.sample_ratio`.
pub(crate) const SAMPLE_RATIO: f64 = 1.0;
/// `telemetry.otlp_endpoint` as shown in examples and messages (absent by default).
pub(crate) const OTLP_ENDPOINT_EXAMPLE: &str = "http://127.0.0.1:4318";
/// The OTLP/HTTP path of traces, appended to `telemetry.otlp_endpoint`.
pub(crate) const OTLP_TRACES_PATH: &str = "/v1/traces";

/// Largest `retries`.
pub(crate) const MAX_RETRIES: u64 = 10;
/// Largest connection, call and queue count: far beyond one host's reach, far below the
/// point where semaphores and counters overflow.
pub(crate) const MAX_COUNT: u64 = 1_000_000;
/// Longest duration: keeps `Instant + duration` from overflowing anywhere.
pub(crate) const MAX_DURATION: &str = "365d";
/// Smallest `max_header_bytes`: room for any reasonable request head (and hyper's minimum read
/// buffer on the HTTP/2 side, which panics below 8192).
pub(crate) const MIN_HEADER_BYTES: &str = "8KiB";
/// Largest `max_header_bytes`.
pub(crate) const MAX_HEADER_BYTES_LIMIT: &str = "16MiB";
