//! The validated configuration: what the host and the services are built from.
//!
//! Every value here has been parsed into its unit, defaulted and range-checked, so users of
//! these types never re-validate. Field docs give the TOML key, its unit, its default and what
//! happens at the limit; docs/configuration.md is the same reference for operators.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use url::Url;

/// The `[server]` table: listeners, sessions and request-head limits, shared by all services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `listen`: address of the service listener. Default `127.0.0.1:8080`. Port 0 asks the
    /// OS for a free port.
    pub listen: SocketAddr,
    /// `admin_listen`: address of the admin listener (`/metrics`, `/healthz`, `/readyz`,
    /// `/debug/inflight`). Default `127.0.0.1:9901`. Must not take the port of `listen`
    /// (see [`ServerConfig::listeners_collide`]) unless one of them uses port 0.
    pub admin_listen: SocketAddr,
    /// `max_connections`: client connections (sessions) open at once on `listen`; the admin
    /// listener is not counted. Default 10000, range 1..=1000000. At the limit new connections
    /// wait (are not accepted) until one closes, or are refused.
    pub max_connections: usize,
    /// `header_read_timeout`: time allowed to receive a complete request head (slowloris
    /// guard). Default 10s, must be > 0. When it passes the connection is closed.
    pub header_read_timeout: Duration,
    /// `max_header_bytes`: largest request head (request line plus headers), in bytes.
    /// Default 64KiB, range 8KiB..=16MiB. A larger head (or one of more than 128 lines) gets
    /// 431 and the connection is closed.
    pub max_header_bytes: usize,
    /// `idle_timeout`: how long a keep-alive client connection may sit idle between requests.
    /// Default 60s, must be > 0. When it passes the connection is closed.
    pub idle_timeout: Duration,
    /// `shutdown_timeout`: on SIGTERM/SIGINT, how long in-flight calls may run before being
    /// cut. Default 30s; 0 cuts them at once. The process exits 0 either way and logs how many
    /// calls were cut.
    pub shutdown_timeout: Duration,
    /// `cpu_steering`: each core of the data plane takes the new connections whose SYN the
    /// kernel handled on "its" CPU (`SO_INCOMING_CPU` on the core's listener; Linux 6.2 or
    /// later steers reliably), instead of the kernel's hash of the address pair. Default false.
    /// A client thread then talks to one core, as with loopback or sidecar clients whose
    /// threads each keep their connections. When the connections come in over few CPUs (a
    /// NIC with one queue), a core that holds more than 1.5 x its share of the open sessions
    /// (32 or more) at three checks a second apart stops steering and logs a warning: the
    /// hash spreads the new ones. A core whose accepts outrun the others' by 64 within 10 ms
    /// (a burst from few client threads) pauses its steering for 1 s.
    pub cpu_steering: bool,
    /// `busy_poll_us`: how long, in microseconds, a core of the data plane keeps polling its
    /// sockets without blocking after it runs out of work, before it sleeps. Default 0 (off),
    /// at most 10000. A request that arrives within that time finds the core running, which
    /// spares the waker the cost of waking a sleeping CPU (an interrupt, in a virtual
    /// machine through the hypervisor), at the price of a core spinning for the whole time
    /// after every burst of work: for cores the gateway has to itself (HAProxy's
    /// `busy-polling`).
    pub busy_poll: Duration,
    /// `keep_warm`: while wharf runs, its start-up warm-up calls (through the services'
    /// twins, on every core) run again this often, so that the code, memory and kernel paths
    /// a call uses stay resident. Default `None` (off, `"0s"` in the file); otherwise 10ms to
    /// 60s. For hosts that take back memory a process leaves untouched for a second or so
    /// (some micro-VMs): there the first call after an idle gap otherwise pays for every
    /// page it touches (issue 4's lab: 5.5 ms after 10 s idle against 0.8 ms with the pages
    /// kept warm). The price is a few loopback calls per core each idle period; a round is
    /// skipped while calls keep a core busy.
    pub keep_warm: Option<Duration>,
    /// `splice_bodies`: a response body relayed from an upstream's plain socket to a plain
    /// client socket (HTTP/1.1, a stated length) goes by `splice(2)` through a pipe, never
    /// entering user space. Default false: it is read and written. Which is cheaper depends
    /// on the machine (issue 4's lab: splicing took a quarter less of wharf's CPU per
    /// 100 KiB call on an Intel host, more than copying on an AMD one, at 100 KiB and at
    /// 1 MiB, 5 % less on another AMD one where copying still had the higher rate, and
    /// 14 % less at the same rate in one lab on a third), and a spliced body keeps a
    /// same-host origin's pages referenced until the client has read them.
    pub splice_bodies: bool,
    /// `resolve_hold`: how long the addresses a host name of a backend or an origin resolved
    /// to are used after the lookup answered; then the name is looked up again in the
    /// background while connects use the old answer (at most 30 s more, also after failed
    /// lookups: `wharf_upstream::NameCache::KEEP_STALE`). Default 10 s (HAProxy's `hold
    /// valid`); `"0s"` looks the name up again at each connect, which waits for it; at most
    /// 1 h. A name that moves is followed within it.
    pub resolve_hold: Duration,
    /// `tls_cert` and `tls_key`: when both are set, `listen` speaks TLS (ALPN h2 and
    /// http/1.1) with this PEM certificate chain and key. Default: plain TCP. Setting one
    /// without the other is an error; files must exist when the config is checked.
    pub tls: Option<TlsConfig>,
    /// `listen_unix`: an absolute path where the host also listens on a Unix socket (the
    /// seeds' named pipe), plain HTTP. Default: none. A stale socket file at the path is
    /// replaced; any other kind of file there is an error at start.
    pub listen_unix: Option<PathBuf>,
    /// `admin_token`: when set, every admin endpoint but `/healthz` and
    /// `/readyz` requires `authorization: Bearer <token>` (401 otherwise).
    /// Default: none (the admin listener is bound to loopback by default).
    /// At least 16 characters, no whitespace.
    pub admin_token: Option<String>,
}

impl ServerConfig {
    /// Whether `listen` and `admin_listen` would take the same port, so that the second
    /// bind fails: the same address, or one a wildcard that covers the other (`0.0.0.0`
    /// covers every IPv4 address; `[::]` every address, as Linux binds it dual-stack unless
    /// `net.ipv6.bindv6only` is set). Port 0 picks a free port: it never collides.
    ///
    /// ```
    /// let mut server = wharf_config::ServerConfig::default();
    /// server.listen = "0.0.0.0:9901".parse()?;
    /// assert!(server.listeners_collide(), "the admin default is 127.0.0.1:9901");
    /// # Ok::<(), std::net::AddrParseError>(())
    /// ```
    pub fn listeners_collide(&self) -> bool {
        listeners_collide(self.listen, self.admin_listen)
    }
}

/// [`ServerConfig::listeners_collide`] for any two addresses.
pub(crate) fn listeners_collide(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    // `[::ffff:127.0.0.1]` binds 127.0.0.1: compare IPv4-mapped addresses as IPv4.
    let canonical = |addr: SocketAddr| SocketAddr::new(addr.ip().to_canonical(), addr.port());
    let (a, b) = (canonical(a), canonical(b));
    let covers = |wildcard: SocketAddr, other: SocketAddr| match wildcard.ip() {
        IpAddr::V4(ip) => ip.is_unspecified() && other.is_ipv4(),
        IpAddr::V6(ip) => ip.is_unspecified(),
    };
    a.ip() == b.ip() || covers(a, b) || covers(b, a)
}

/// The TLS files of the service listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// `tls_cert`: PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// `tls_key`: PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// One `[services.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The table name: letters, digits, `-` and `_`. Used as the `service` label on metrics
    /// and in traces.
    pub name: String,
    /// The service's bulkhead.
    pub limits: LimitsConfig,
    /// The `type` and its keys.
    pub kind: ServiceKind,
}

impl ServiceConfig {
    /// The `type` as written in the file: `"proxy"` or `"route"`.
    pub fn type_name(&self) -> &'static str {
        self.kind.type_name()
    }
}

/// A service's bulkhead: keys common to every service type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// `max_concurrent_calls`: calls of this service being processed at once. Default 4096
    /// for a proxy, 256 for a route; range 1..=1000000. At the limit further calls queue.
    pub max_concurrent_calls: usize,
    /// `max_queued_calls`: calls waiting for a slot. Default 1024 for a proxy, 64 for a route;
    /// range 0..=1000000. When the queue is full a call gets 503 at once; 0 means no queue.
    pub max_queued_calls: usize,
    /// `queue_timeout`: longest wait in the queue. Default 5s, must be > 0. A call queued for
    /// longer gets 503.
    pub queue_timeout: Duration,
}

/// What a service does, chosen by its `type` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKind {
    /// `type = "proxy"`: the caching URL proxy.
    Proxy(ProxyConfig),
    /// `type = "route"`: forwards matching requests to backends.
    Route(RouteConfig),
    /// `type = "queue"`: one-way calls stored in NATS JetStream, delivered to a backend.
    Queue(QueueConfig),
}

impl ServiceKind {
    /// The `type` as written in the file: `"proxy"` or `"route"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            ServiceKind::Proxy(_) => "proxy",
            ServiceKind::Route(_) => "route",
            ServiceKind::Queue(_) => "queue",
        }
    }
}

/// A `type = "proxy"` service: `GET {path}?url=...&cacheDuration=...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// `path`: the exact request path served. Required; starts with `/`, no query, no
    /// trailing `/` (unless it is `/`). Unique among all services' `path`/`path_prefix`.
    pub path: String,
    /// `cache_max_bytes`: memory-cache bound, in body bytes. Default 256MiB. Entries are evicted to
    /// stay under it; 0 disables caching (then `max_object_bytes` must
    /// be 0 too).
    pub cache_max_bytes: u64,
    /// `max_object_bytes`: largest body that is cached, in bytes. Default 64MiB, at most
    /// `cache_max_bytes`. Larger bodies are streamed to the client and never cached.
    pub max_object_bytes: u64,
    /// `max_ttl`: cap on `cacheDuration`. Default 1d, range 1s..=365d. An entry lives
    /// min(cacheDuration, max_ttl).
    pub max_ttl: Duration,
    /// `allow_private_networks`: when false (the default), loopback, private, link-local,
    /// unique-local, multicast, unspecified, broadcast, CGNAT and documentation destinations
    /// (and `localhost`) are refused with 403.
    pub allow_private_networks: bool,
    /// `allow_hosts`: when non-empty, only these destinations may be fetched; others get 403.
    /// Each is `host` (any port) or `host:port`, normalised as a URL host is (lowercase,
    /// punycode, IPv4 in dotted decimal, IPv6 in brackets), so it compares with
    /// [`url::Url::host_str`] and [`url::Url::port_or_known_default`]. Default empty: any
    /// host that passes the private-network check.
    pub allow_hosts: Vec<String>,
    /// `connect_timeout`: TCP (and TLS) connect to the origin. Default 5s, must be > 0.
    /// When it passes: 504.
    pub connect_timeout: Duration,
    /// `first_byte_timeout`: from request sent to the origin's response head. Default 30s,
    /// must be > 0. When it passes: 504.
    pub first_byte_timeout: Duration,
    /// `total_timeout`: the whole origin exchange, body included. Default 300s, must be > 0.
    /// When it passes mid-body the client sees a truncated response and nothing is cached.
    pub total_timeout: Duration,
    /// `shared_cache`: a second cache tier in Redis shared by several wharf instances,
    /// `redis://host[:port][/db]` (normalised, no TLS). Default absent: memory only. Lookups
    /// go memory, then Redis, then the origin; every Redis operation is bounded (100 ms) and
    /// a failing or slow Redis is skipped, never failing a call.
    pub shared_cache: Option<String>,
    /// `preconnect_origins`: origins (`http://host[:port]` or `https://host[:port]`, no
    /// path) to which `preconnect` connections are kept open and idle on each of the data
    /// plane's cores: opened at start, before the port listens (seed 000: a first call
    /// that also connects), and opened again in the background when calls take them (seed
    /// 002: fast calls behind slow ones that hold every pooled connection). Default empty.
    /// Each must be allowed by `allow_hosts` when that is set; the connections go through
    /// the same private-network check as calls. An origin that cannot be reached is
    /// logged at start, never a reason not to start. A reload that builds the service anew
    /// opens them before the new service takes calls.
    pub preconnect_origins: Vec<Url>,
    /// `preconnect`: connections kept idle to each of `preconnect_origins` on each core.
    /// Default 1, range 1..=1024; an error when `preconnect_origins` is not written.
    pub preconnect: u32,
}

/// The methods a route with `methods` takes: those, and HEAD when GET is one (a HEAD is a
/// GET without the body, RFC 9110 §9.3.2; nginx's `limit_except` does the same). Empty:
/// any method. The one statement of the rule, for the route's matcher and for `wharf
/// check`'s hidden-route rule.
pub fn methods_taken(methods: &[Method]) -> Vec<Method> {
    let mut taken = methods.to_vec();
    if taken.contains(&Method::GET) && !taken.contains(&Method::HEAD) {
        taken.push(Method::HEAD);
    }
    taken
}

/// How specific a route's conditions are, from its `match_headers` count and whether it
/// has `methods`: routes sharing a prefix are asked highest first. Each header counts more
/// than a method list, so a route for `x-tenant: acme` is asked before one for GET only,
/// which is asked before one with no condition. The one statement of the order, for the
/// host's choice and for `wharf check`'s hidden-route rule.
pub fn route_rank(match_headers: usize, has_methods: bool) -> usize {
    2 * match_headers + usize::from(has_methods)
}

/// A `type = "route"` service: matching requests go to `backends`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// `path_prefix`: requests whose path starts with this, on whole segments (`/orders`
    /// matches `/orders` and `/orders/1`, not `/ordersx`). Required; starts with `/`, no
    /// query, no trailing `/` (unless it is `/`). Not the path of another service, except
    /// other routes': routes may share a prefix when each has conditions (`methods`,
    /// `match_headers`) that take requests the others asked before it do not. The host asks
    /// them by specificity (each `match_headers` entry counts two, a `methods` list one),
    /// then in file order, and a request goes to the first whose conditions hold; never on
    /// to a route of a shorter prefix.
    pub path_prefix: String,
    /// `strip_prefix`: remove `path_prefix` from the forwarded path (`/orders/1` → `/1`,
    /// `/orders` → `/`). Default false: the path is forwarded unchanged.
    pub strip_prefix: bool,
    /// `methods`: the methods matched, uppercased. Default empty: any method. The route
    /// takes HEAD too when GET is listed.
    pub methods: Vec<Method>,
    /// `match_headers`: headers that must all be present with exactly these values (names are
    /// case-insensitive, stored lowercase). Default empty: no header condition.
    pub match_headers: Vec<(HeaderName, HeaderValue)>,
    /// `backends`: where calls go. Required, non-empty, no duplicates. Each is
    /// `http://host[:port]` or `https://host[:port]` (a trailing `/` at most; no path, query,
    /// fragment or credentials) or `unix:/absolute/socket/path`.
    pub backends: Vec<Url>,
    /// `strategy`: how a backend is picked. Default [`Strategy::Failover`].
    pub strategy: Strategy,
    /// `set_headers`: request headers set before forwarding, replacing any value the client
    /// sent. Default empty. Framing and hop-by-hop headers (`connection`, `content-length`,
    /// `transfer-encoding`, `te`, `trailer`, `upgrade`, `keep-alive`, `proxy-connection`) are
    /// refused.
    pub set_headers: Vec<(HeaderName, HeaderValue)>,
    /// `remove_headers`: request headers removed before forwarding. Default empty. The same
    /// framing and hop-by-hop headers as for `set_headers` are refused, as is a name also in
    /// `set_headers`.
    pub remove_headers: Vec<HeaderName>,
    /// `timeout`: from request sent until the backend's response head. Default 10s, must be
    /// greater than 0. When it passes the attempt fails (retried if allowed), finally 504.
    pub timeout: Duration,
    /// `retries`: further attempts after a failed one; only for idempotent
    /// methods or when no byte was sent upstream. Default 1, range 0..=10.
    pub retries: u32,
    /// `preconnect`: connections kept open and idle to each backend on each of the data
    /// plane's cores: opened at start, before the port listens (seed 000: a first call
    /// that also connects), and opened again in the background when calls take them (seed
    /// 002: fast calls behind slow ones). Default 0: none. Range 0..=1024. A backend that
    /// cannot be reached is logged at start, never a reason not to start. A reload that
    /// builds the service anew opens them before the new service takes calls.
    pub preconnect: u32,
}

/// How a route picks a backend (`strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `"failover"`: the first healthy backend in list order; the rest are backups.
    Failover,
    /// `"round_robin"`: healthy backends in turn.
    RoundRobin,
    /// `"least_outstanding"`: the healthy backend with the fewest calls in flight.
    LeastOutstanding,
}

impl Strategy {
    /// Every strategy, in the order error messages list them.
    pub const ALL: [Strategy; 3] = [
        Strategy::Failover,
        Strategy::RoundRobin,
        Strategy::LeastOutstanding,
    ];

    /// The spelling in the config file (`"round_robin"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Failover => "failover",
            Strategy::RoundRobin => "round_robin",
            Strategy::LeastOutstanding => "least_outstanding",
        }
    }
}

/// The `[telemetry]` table: log lines on stderr and trace export. The binary installs the
/// tracing subscriber from it; nothing here acts on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `log_format`: how log lines are written on stderr. Default [`LogFormat::Pretty`].
    /// The `--log-format` flag, when given, overrides it.
    pub log_format: LogFormat,
    /// `log_level`: which events are logged, as `tracing-subscriber` `EnvFilter` directives
    /// (`"info"`, `"warn,wharf_proxy=debug"`). Default `"info"`; checked when the file is
    /// loaded. The `RUST_LOG` environment variable, when set (and valid), replaces it. It
    /// filters log lines only: exported traces always carry every call span and its phases.
    pub log_level: String,
    /// `otlp_endpoint`: base URL of an OTLP/HTTP collector (`http` or `https`, e.g.
    /// `http://127.0.0.1:4318`); spans are posted as protobuf to `{otlp_endpoint}/v1/traces`
    /// in batches, off the call path. Default none: no trace export. No credentials, query or
    /// fragment; a path is kept as a prefix (a collector behind a reverse proxy). When the
    /// collector is slow or down, spans queue up to a bound and the excess is dropped; calls
    /// never wait for it.
    pub otlp_endpoint: Option<Url>,
    /// `service_name`: the `service.name` resource attribute of exported spans. Default
    /// `"wharf"`; must not be empty.
    pub service_name: String,
    /// `sample_ratio`: the share of traces exported, chosen by trace id, from 0.0 (none) to
    /// 1.0 (every call, the default). Used only with `otlp_endpoint`. Never NaN.
    pub sample_ratio: f64,
}

// `sample_ratio` is validated to lie in 0.0..=1.0, so it is never NaN and `==` is total.
impl Eq for TelemetryConfig {}

/// How log lines are written (`telemetry.log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogFormat {
    /// `"pretty"`: human-readable lines.
    Pretty,
    /// `"json"`: one JSON object per line.
    Json,
}

impl LogFormat {
    /// Every format, in the order error messages list them.
    pub const ALL: [LogFormat; 2] = [LogFormat::Pretty, LogFormat::Json];

    /// The spelling in the config file (`"json"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Pretty => "pretty",
            LogFormat::Json => "json",
        }
    }
}

/// How a queue authenticates to NATS, from its `nats_url`. `Debug` shows no secret.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    /// `nats://user:password@host`: NATS user and password authentication.
    UserPassword {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// `nats://token@host`: NATS token authentication.
    Token(String),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"***")
                .finish(),
            Self::Token(_) => f.debug_tuple("Token").field(&"***").finish(),
        }
    }
}

/// A `type = "queue"` service: `POST {path}` stores the body in a JetStream stream and
/// answers 202 once the broker acknowledged it; a durable consumer delivers it to a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// `path`: the exact request path served. Required; as a proxy `path`, unique among all
    /// services.
    pub path: String,
    /// `nats_url`: the NATS server, `nats://[user:password@|token@]host[:port]`, or
    /// `tls://...` to require TLS (the broker's certificate verified against
    /// `nats_ca_file`, else the system's roots), kept here normalised and without its user
    /// information (so it can be logged), which is in `nats_credentials`. Default
    /// `nats://127.0.0.1:4222`. Until it is connected publishes get 503 and nothing is
    /// delivered, and wharf keeps trying; once connected the client reconnects by itself.
    pub nats_url: String,
    /// How to authenticate to the broker, from `nats_url`'s user information
    /// (percent-decoded); `None`: no authentication.
    pub nats_credentials: Option<NatsCredentials>,
    /// `nats_ca_file`: PEM file of the certificates that verify the broker's (instead of the
    /// system's roots): a private CA, or the broker's self-signed certificate if it is not
    /// marked as a CA. Only with a `tls://` `nats_url`; checked at load to hold X.509
    /// certificates only, read again by the client at every connect. Default none.
    pub nats_ca_file: Option<std::path::PathBuf>,
    /// `stream`: the JetStream stream, created at start if absent (file storage, work-queue
    /// retention, capturing `subject` and `deliver.dead_letter_subject`). Required; letters,
    /// digits, `-` and `_`.
    pub stream: String,
    /// `subject`: where messages are published and consumed from. Required; dot-separated
    /// tokens, no wildcards.
    pub subject: String,
    /// `forward_headers`: request headers stored with the body and sent to the backend,
    /// lowercase. Default `["content-type", "content-encoding", "x-request-id",
    /// "traceparent", "tracestate"]`. `content-type` is always kept.
    pub forward_headers: Vec<http::HeaderName>,
    /// `publish_timeout`: longest wait for the broker's acknowledgement. Default 5s, must be
    /// greater than 0. When it passes the client gets 503 (the message may still have been
    /// stored; a retry with the same `x-wharf-message-id` is de-duplicated).
    pub publish_timeout: Duration,
    /// The `deliver` sub-table: how messages reach the backend.
    pub deliver: DeliverConfig,
}

/// The `deliver` sub-table of a queue service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverConfig {
    /// `backend`: where each message is POSTed, `http(s)://host[:port][/path]`. Required.
    pub backend: Url,
    /// `max_deliver`: attempts (backend answers other than 2xx, or no answer in time) before
    /// the message goes to the dead-letter subject. Default 5, range 1..=1000. A backend that
    /// cannot be connected to at all does not use up attempts: the message is held and
    /// retried until it is back.
    pub max_deliver: u32,
    /// `backoff`: delay before the second attempt, doubling for each further one (capped at
    /// 1 minute). Default 500ms, must be > 0.
    pub backoff: Duration,
    /// `dead_letter_subject`: where a message goes, with the reason, after `max_deliver`
    /// failed attempts. Default `{subject}.dead`; must differ from `subject`.
    pub dead_letter_subject: String,
    /// `concurrency`: deliveries in flight at once. Default 16, range 1..=10000.
    pub concurrency: usize,
    /// `ack_wait`: how long the broker waits for a delivery's outcome before giving the
    /// message to another consumer; also the time bound of one attempt. Default 30s, at
    /// least 1s.
    pub ack_wait: Duration,
}
