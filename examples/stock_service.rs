//! Seed 002's StockService on wharf: an async service that asks a slow
//! stock backend for a quote and relays it, hosted next to the caching
//! proxy with the same bulkhead, counters, tracing and drain.
//!
//! What it shows, in the order a program embedding wharf does it:
//!
//! 1. a wharf config (here a TOML string: the proxy, allowed to reach only
//!    the testbed) and [`wharf::build_host`], which mounts the proxy exactly
//!    as `wharf serve` does;
//! 2. a service of your own, [`stock_service`]: an async function wrapped by
//!    [`wharf_host::handler`], with its HTTP client pool created once at
//!    start (no warm-up on the first call), its errors answered with
//!    [`wharf_host::error::json_error`] and its progress reported through
//!    the call's [`wharf_host::CallContext`] (`/debug/inflight`, `phase`
//!    events);
//! 3. `HostBuilder::mount` under the name `stock` at the prefix `/stock`,
//!    with the service's own bulkhead ([`stock_limits`]);
//! 4. `bind()`, then `run()` until Ctrl-C, draining calls in flight.
//!
//! A quote call waits on the backend without holding a thread: 25 (or
//! 25 000) slow quotes in flight never slow the proxy's fast calls, which is
//! what seed 002's load test failed to get from WCF 3.5.
//!
//! # Run it
//!
//! ```console
//! $ cargo run -- testbed                      # the seeds' backends on 127.0.0.1:9000
//! $ cargo run --example stock_service         # wharf on 127.0.0.1:8080, admin on 127.0.0.1:9901
//! $ curl -i 'http://127.0.0.1:8080/stock/MSFT?ms=2000'
//! $ curl -i 'http://127.0.0.1:8080/proxy?url=http%3A%2F%2F127.0.0.1%3A9000%2Ffast'
//! $ curl http://127.0.0.1:9901/debug/inflight  # during a slow quote: its phase and age
//! $ curl http://127.0.0.1:9901/metrics         # wharf_calls_total{service="stock",...}
//! ```
//!
//! `--testbed HOST:PORT`, `--listen ADDR` and `--admin-listen ADDR` change
//! the addresses; `RUST_LOG=debug` shows each call's `call` span and phase
//! events (docs/tracing.md). `tests/stock_example.rs` runs this file as a
//! module against a testbed on an ephemeral port.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tracing::{debug, info};
use wharf_config::{Config, ConfigError, LimitsConfig};
use wharf_host::call::enter_phase;
use wharf_host::error::json_error;
use wharf_host::metrics::{Metrics, Outcome, UpstreamMetrics};
use wharf_host::{
    body, handler, HostBuilder, HostService, Mount, Phase, RequestBody, ResponseBody,
};

/// The service's name: its `service` label on /metrics and in traces.
const SERVICE: &str = "stock";
/// Where it is mounted; `/stock/CODE` reaches it.
const PREFIX: &str = "/stock";
/// Longest stock code (the testbed's limit).
const MAX_CODE_LEN: usize = 32;
/// Largest `ms` the testbed accepts.
const MAX_DELAY_MS: u64 = 600_000;
/// Connecting to the backend (TCP) may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The whole backend exchange, head and quote body, may take this long:
/// past it the caller gets 504 and the backend connection is dropped.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle keep-alive connections to the backend are kept this long, so a
/// quote after a quiet spell reuses one instead of paying a new connect.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A quote is a small JSON object; a larger body is a broken backend.
const MAX_QUOTE_BYTES: usize = 64 * 1024;

/// The client that talks to the stock backend: plain HTTP/1.1 with a
/// keep-alive pool, requests without a body.
type BackendClient = Client<HttpConnector, Empty<Bytes>>;

/// Why a quote call failed; each maps to one status and JSON `error` kind.
#[derive(Debug, thiserror::Error)]
enum StockError {
    /// Only GET is served.
    #[error("method {0} is not allowed: the stock service answers GET /stock/CODE")]
    Method(Method),
    /// The path does not name a valid code.
    #[error("{0:?} is not a stock code (1 to 32 of A-Z a-z 0-9 . _ -, e.g. /stock/MSFT)")]
    Code(String),
    /// `ms` is not a delay the backend accepts.
    #[error("ms={0:?} is not a whole number of milliseconds up to 600000")]
    Delay(String),
    /// No response head: connection refused, reset, DNS, ...
    #[error("stock backend {backend} is unreachable: {reason}")]
    Unreachable {
        /// `host:port` of the backend.
        backend: Authority,
        /// The client error's chain, innermost cause last.
        reason: String,
    },
    /// The backend answered, but not with a quote.
    #[error("stock backend {backend} answered {status} instead of a quote")]
    Status {
        /// `host:port` of the backend.
        backend: Authority,
        /// What it answered.
        status: StatusCode,
    },
    /// The quote body broke off or was too large.
    #[error("stock backend {backend}: quote body unreadable: {reason}")]
    Body {
        /// `host:port` of the backend.
        backend: Authority,
        /// Why reading failed.
        reason: String,
    },
    /// No complete quote within [`UPSTREAM_TIMEOUT`].
    #[error("stock backend {backend}: no complete quote after {after:?}")]
    Timeout {
        /// `host:port` of the backend.
        backend: Authority,
        /// The timeout that expired.
        after: Duration,
    },
}

impl StockError {
    /// The status and JSON `error` kind the caller gets, and how the backend
    /// exchange counts in `wharf_upstream_requests_total` (`None`: the
    /// backend was not called).
    fn classify(&self) -> (StatusCode, &'static str, Option<Outcome>) {
        match self {
            StockError::Method(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None),
            StockError::Code(_) | StockError::Delay(_) => {
                (StatusCode::BAD_REQUEST, "bad_request", None)
            }
            StockError::Unreachable { .. }
            | StockError::Status { .. }
            | StockError::Body { .. } => {
                (StatusCode::BAD_GATEWAY, "bad_gateway", Some(Outcome::Error))
            }
            StockError::Timeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "gateway_timeout",
                Some(Outcome::Timeout),
            ),
        }
    }
}

/// The state every quote call shares, built once at start.
struct StockBackend {
    /// `host:port` of the stock backend (plain HTTP).
    authority: Authority,
    /// Pooled keep-alive connections to it; cloning shares the pool.
    client: BackendClient,
    /// `wharf_upstream_requests_total{service="stock",backend=...}`.
    upstream: UpstreamMetrics,
}

/// Seed 002's StockService as a [`HostService`]: `GET /stock/CODE?ms=N`
/// asks `http://{testbed}/stock/CODE?ms=N` for a quote and relays its JSON
/// (200, `application/json`). A bad code or `ms` is 400 and never reaches
/// the backend; an unreachable or misbehaving backend is 502, a slow one
/// 504 after [`UPSTREAM_TIMEOUT`].
///
/// The client and its connection pool are created here, at start: the first
/// call pays only its TCP connect, never a lazy set-up (seed 000). While a
/// call waits for the backend it is a parked future, not a blocked thread.
/// Backend exchanges are counted in `metrics` under the backend's address.
pub(crate) fn stock_service(testbed: Authority, metrics: &Metrics) -> HostService {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    // An IP literal (the testbed's usual address) is used as is; a host
    // name goes through the resolver's blocking pool on each new connection.
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(connector);
    let backend = Arc::new(StockBackend {
        upstream: metrics.upstream(SERVICE, testbed.as_str()),
        authority: testbed,
        client,
    });
    handler(move |request: Request<RequestBody>| {
        let backend = backend.clone();
        async move {
            match backend.quote(&request).await {
                Ok(response) => response,
                Err(error) => {
                    let (status, kind, outcome) = error.classify();
                    if let Some(outcome) = outcome {
                        backend.upstream.record(outcome);
                    }
                    debug!(error = %error, status = status.as_u16(), "quote failed");
                    json_error(status, kind, &error.to_string())
                }
            }
        }
    })
}

impl StockBackend {
    /// One quote call, from request to relayed quote.
    async fn quote(
        &self,
        request: &Request<RequestBody>,
    ) -> Result<Response<ResponseBody>, StockError> {
        if request.method() != Method::GET {
            return Err(StockError::Method(request.method().clone()));
        }
        let code = stock_code(request.uri().path())?;
        let delay_ms = delay_ms(request.uri().query())?;
        let uri = self.uri(code, delay_ms)?;

        // Until the backend's response head: `upstream_connect` in
        // /debug/inflight, which is where a slow quote spends its time.
        enter_phase(request, Phase::UpstreamConnect);
        let exchange = async {
            let mut backend_request = Request::new(Empty::new());
            *backend_request.uri_mut() = uri;
            let response = self
                .client
                .request(backend_request)
                .await
                .map_err(|error| StockError::Unreachable {
                    backend: self.authority.clone(),
                    reason: error_chain(&error),
                })?;
            enter_phase(request, Phase::FirstByte);
            let status = response.status();
            if status != StatusCode::OK {
                return Err(StockError::Status {
                    backend: self.authority.clone(),
                    status,
                });
            }
            // The quote is tiny: read it whole (bounded) so that a body
            // that breaks off becomes a clean 502, not a truncated 200.
            Limited::new(response.into_body(), MAX_QUOTE_BYTES)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .map_err(|error| StockError::Body {
                    backend: self.authority.clone(),
                    reason: error_chain(error.as_ref()),
                })
        };
        let quote = tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
            .await
            .map_err(|_elapsed| StockError::Timeout {
                backend: self.authority.clone(),
                after: UPSTREAM_TIMEOUT,
            })??;
        self.upstream.record(Outcome::Ok);
        debug!(code, bytes = quote.len(), "quote relayed");

        let mut response = Response::new(body::full(quote));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // A quote is a moment's price: never let a cache in between keep it.
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(response)
    }

    /// `http://{backend}/stock/{code}?ms={delay_ms}`.
    fn uri(&self, code: &str, delay_ms: Option<u64>) -> Result<Uri, StockError> {
        let path_and_query = match delay_ms {
            Some(ms) => format!("/stock/{code}?ms={ms}"),
            // Without `ms` the backend takes its own default (seed 002's 6 s).
            None => format!("/stock/{code}"),
        };
        Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            // The code and delay are checked, so this is not expected.
            .map_err(|error| StockError::Unreachable {
                backend: self.authority.clone(),
                reason: error.to_string(),
            })
    }
}

/// The `CODE` of `/stock/CODE`: 1 to 32 of `A-Z a-z 0-9 . _ -`, which is
/// also what makes it safe to put in the backend's path as is.
fn stock_code(path: &str) -> Result<&str, StockError> {
    let code = path
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or("");
    let valid = (1..=MAX_CODE_LEN).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(code)
    } else {
        Err(StockError::Code(code.to_owned()))
    }
}

/// The `ms` query parameter, if given: how long the backend should take.
fn delay_ms(query: Option<&str>) -> Result<Option<u64>, StockError> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("ms="))
    else {
        return Ok(None);
    };
    match value.parse::<u64>() {
        Ok(ms) if ms <= MAX_DELAY_MS && value.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(ms)),
        _ => Err(StockError::Delay(value.to_owned())),
    }
}

/// `error` and its causes, joined with `: ` (hyper's client errors say
/// little at the top: the useful part, e.g. "connection refused", is the
/// innermost cause).
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The stock service's bulkhead. A waiting quote holds a slot (a counter),
/// never a thread, so the limit can be as high as the proxy's: it bounds
/// memory and backend connections, not threads.
pub(crate) fn stock_limits() -> LimitsConfig {
    LimitsConfig {
        max_concurrent_calls: 4096,
        max_queued_calls: 1024,
        queue_timeout: Duration::from_secs(5),
    }
}

/// The wharf config of the example: the listeners, and the caching proxy at
/// `/proxy` allowed to fetch from the testbed only (it refuses loopback and
/// private addresses unless told otherwise: SSRF guard). Port 0 picks a free
/// port. The stock service is not in the file: it is mounted in code.
pub(crate) fn config(
    testbed: &Authority,
    listen: SocketAddr,
    admin_listen: SocketAddr,
) -> Result<Config, ConfigError> {
    let toml = format!(
        r#"
[server]
listen = "{listen}"
admin_listen = "{admin_listen}"

[services.proxy]
type = "proxy"
path = "/proxy"
allow_private_networks = true
allow_hosts = ["{testbed}"]
"#
    );
    Config::from_toml_str(&toml, "examples/stock_service.rs")
}

/// The host: every service of `config` (the proxy) plus the stock service
/// at `/stock`, each behind its own bulkhead.
pub(crate) fn build_host(
    config: &Config,
    testbed: Authority,
) -> Result<HostBuilder, wharf::BuildError> {
    let host = wharf::build_host(config)?;
    let stock = stock_service(testbed, host.metrics());
    Ok(host.mount(
        SERVICE,
        Mount::Prefix(PREFIX.into()),
        &stock_limits(),
        stock,
    ))
}

/// Flags of the example.
#[derive(Debug, clap::Parser)]
#[command(about = "seed 002's StockService, hosted by wharf next to the proxy")]
#[allow(dead_code)] // unused where tests/stock_example.rs includes this file
struct Args {
    /// The stock backend, `host:port` (`cargo run -- testbed` listens on
    /// 127.0.0.1:9000).
    #[arg(long, default_value = "127.0.0.1:9000")]
    testbed: Authority,
    /// The service listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The admin listener (/metrics, /debug/inflight, /healthz, /readyz).
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin_listen: SocketAddr,
}

#[allow(dead_code)] // unused where tests/stock_example.rs includes this file
fn main() -> anyhow::Result<()> {
    use clap::Parser as _;

    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // As `wharf serve` (src/main.rs): every worker thread exists from the
    // start, and blocking-pool threads (name resolution) are kept for a day
    // rather than tokio's 10 s, so nothing ramps up under a burst or after
    // an idle spell (seeds 001 and 002).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .build()?;
    runtime.block_on(run(args))
}

/// Builds, binds and serves until Ctrl-C.
#[allow(dead_code)] // unused where tests/stock_example.rs includes this file
async fn run(args: Args) -> anyhow::Result<()> {
    let config = config(&args.testbed, args.listen, args.admin_listen)?;
    let host = build_host(&config, args.testbed.clone())?.bind().await?;
    info!(
        addr = %host.local_addr(),
        admin = %host.admin_addr(),
        testbed = %args.testbed,
        "stock service listening: GET /stock/CODE?ms=N, GET /proxy?url=..."
    );
    let summary = host
        .run(async {
            if let Err(error) = tokio::signal::ctrl_c().await {
                // Without a handler, Ctrl-C keeps its default: end the process.
                tracing::warn!(error = %error, "cannot watch Ctrl-C; serving until killed");
                std::future::pending::<()>().await;
            }
        })
        .await;
    info!(calls_cut = summary.calls_cut, "stopped");
    Ok(())
}
