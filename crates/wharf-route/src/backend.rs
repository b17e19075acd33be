//! One backend of a route: its address and pool, passive health, and the
//! calls it has outstanding.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use url::Url;
use wharf_host::metrics::{Outcome, UpstreamMetrics};
use wharf_upstream::{Connection, PoolLimits, PoolShards, PoolSlot};

use crate::pool::{self, Address};

/// Idle connections kept per backend; beyond it, finished ones are closed.
const MAX_IDLE: usize = 256;
/// How long an idle backend connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often idle connections past their timeout are closed when no call comes.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Consecutive failures after which a backend is skipped for a while.
pub const EJECT_AFTER_FAILURES: u32 = 3;
/// How long an ejected backend is skipped before one call probes it.
pub const EJECT_FOR: Duration = Duration::from_secs(5);

/// Why a backend URL cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("backend {url}: {reason}")]
pub struct BackendError {
    url: String,
    reason: String,
}

/// One backend.
#[derive(Debug)]
pub struct Backend {
    label: String,
    address: Address,
    /// Value for `host` when the client sent none (h2 clients send `:authority`).
    authority: Option<http::HeaderValue>,
    /// Idle keep-alive connections (one key: this backend).
    /// Idle connections, a pool per thread (see `wharf_upstream::PoolShards`).
    pool: PoolShards,
    /// Failures in a row (connect, protocol or timeout); 0 after a success.
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which the backend is skipped.
    ejected_until_ms: AtomicU64,
    epoch: Instant,
    outstanding: AtomicUsize,
    metrics: UpstreamMetrics,
}

impl Backend {
    /// A backend from its configured URL (`http://`, `https://`, `unix:`).
    pub fn new(
        url: &Url,
        tls: &tokio_rustls::TlsConnector,
        metrics: UpstreamMetrics,
    ) -> Result<Self, BackendError> {
        let error = |reason: &str| BackendError {
            url: url.to_string(),
            reason: reason.to_owned(),
        };
        let host = || {
            url.host()
                .map(|host| host.to_owned())
                .ok_or_else(|| error("no host"))
        };
        let port = || url.port_or_known_default().ok_or_else(|| error("no port"));
        let address = match url.scheme() {
            "http" => Address::Tcp {
                host: host()?,
                port: port()?,
            },
            "https" => {
                let host = host()?;
                let name = match &host {
                    url::Host::Domain(domain) => ServerName::try_from(domain.clone())
                        .map_err(|_| error("not a valid TLS server name"))?,
                    url::Host::Ipv4(ip) => ServerName::IpAddress(IpAddr::from(*ip).into()),
                    url::Host::Ipv6(ip) => ServerName::IpAddress(IpAddr::from(*ip).into()),
                };
                Address::Tls {
                    host,
                    port: port()?,
                    name,
                    connector: tls.clone(),
                }
            }
            "unix" => Address::Unix(url.path().into()),
            _ => return Err(error("scheme must be http, https or unix")),
        };
        let authority = url.host_str().and_then(|host| match url.port() {
            Some(port) => http::HeaderValue::from_str(&format!("{host}:{port}")).ok(),
            None => http::HeaderValue::from_str(host).ok(),
        });
        let pool = PoolShards::new(PoolLimits {
            max_idle_per_key: MAX_IDLE,
            max_idle_total: MAX_IDLE,
            idle_timeout: IDLE_TIMEOUT,
            // Routes open connections as calls need them (check_out), unlimited.
            max_connecting_per_key: usize::MAX,
            max_connect_wait: Duration::ZERO,
        });
        pool.sweep_from_first_call(SWEEP_EVERY);
        Ok(Self {
            label: url.as_str().trim_end_matches('/').to_owned(),
            address,
            authority,
            pool,
            failures: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            outstanding: AtomicUsize::new(0),
            metrics,
        })
    }

    /// The configured URL, as used in messages and the `backend` label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `host` header value for requests that carry none.
    pub(crate) fn authority(&self) -> Option<&http::HeaderValue> {
        self.authority.as_ref()
    }

    /// A pooled connection, or a new one, and where it goes back once its response was read.
    pub(crate) async fn connection(&self) -> std::io::Result<(PoolSlot, Connection)> {
        let (slot, idle) = self.pool.here().check_out(&self.label);
        match idle {
            Some(connection) => Ok((slot, connection)),
            None => Ok((slot, pool::connect(&self.address).await?)),
        }
    }

    /// Keeps `count` connections idle in this thread's pool for the calls, opened again as
    /// calls take them for as long as the backend lives (`wharf_upstream::KeptIdle::start`). The route's
    /// `preconnect`, run on each core at start. What went wrong, one line (the first failure
    /// ends the attempt: the next connect would meet the same).
    pub(crate) async fn preconnect(self: &Arc<Self>, count: u32) -> Option<String> {
        let kept = self.pool.here().keep_idle(&self.label, count as usize);
        // The keeper holds the backend weakly: a reload that drops it ends the keeper.
        let backend = Arc::downgrade(self);
        let open = move || {
            let backend = backend.upgrade();
            async move {
                match backend {
                    Some(backend) => pool::connect(&backend.address).await,
                    None => Err(std::io::Error::other("the route was replaced")),
                }
            }
        };
        kept.start(open)
            .await
            .err()
            .map(|failure| format!("backend {}: {failure}", self.label))
    }

    /// A new connection, never a pooled one (after a pooled one turned out closed).
    pub(crate) async fn new_connection(&self) -> std::io::Result<Connection> {
        pool::connect(&self.address).await
    }

    /// Whether the backend should be tried now (not ejected).
    pub fn is_available(&self) -> bool {
        self.now_ms() >= self.ejected_until_ms.load(Ordering::Acquire)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Calls currently using this backend.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    pub(crate) fn call_started(&self) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn call_ended(&self) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }

    /// Records an attempt's outcome: counters and passive health.
    pub(crate) fn record(&self, outcome: Outcome) {
        self.metrics.record(outcome);
        if outcome == Outcome::Ok {
            // Cleared only when set: the cores share this line, and a store on every
            // success would pass it between them on every call.
            if self.failures.load(Ordering::Acquire) != 0 {
                self.failures.store(0, Ordering::Release);
            }
            if self.ejected_until_ms.load(Ordering::Acquire) != 0 {
                self.ejected_until_ms.store(0, Ordering::Release);
            }
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= EJECT_AFTER_FAILURES {
            let until = self.now_ms() + EJECT_FOR.as_millis() as u64;
            self.ejected_until_ms.store(until, Ordering::Release);
            tracing::warn!(backend = %self.label, failures, "backend ejected");
        }
    }
}
