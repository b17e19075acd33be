//! Requests to origins: connect through the SSRF guard (or reuse a pooled connection), send
//! `GET`, wait for the response head within `first_byte_timeout`, and map what goes wrong
//! before that head to a [`ProxyError`]. Connections kept open ahead of calls
//! (`preconnect_origins`, `preconnect`) go through the same guard into the same pools.
//!
//! The exchange runs in the calling task ([`wharf_upstream`]): the response body is read from
//! the origin's socket as the client's side polls it, and the connection returns to the pool
//! when the body was read to its end.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use rustls::pki_types::ServerName;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tracing::debug;
use url::Url;
use wharf_config::ProxyConfig;
use wharf_upstream::{
    Checkout, ConnectPermit, Connection, HeadFields, KeepFailure, PoolLimits, PoolShards, PoolSlot,
    ResponseBody,
};

use crate::connector::{ConnectError, GuardedConnector};
use crate::destination::DestinationPolicy;
use crate::error::{error_chain, ProxyError};
use crate::target::{pool_key, Target};

/// Idle keep-alive connections kept per origin. Enough that the connections a burst or a
/// wave of slow calls opened stay for the next calls: with 128, each 2,000-call burst in
/// bench/compare.sh closed ~250 of them on check-in and opened as many anew (connects cost
/// the origin too), and with 512 the fast calls after 1,000 slow ones connected anew where
/// HAProxy's, which keeps every idle connection, reused them (responsiveness fast p99 5.42
/// vs 3.90 ms with 4,096, lower in 9 of 10 rounds). nginx keeps `keepalive` (64 there) per
/// worker. What bounds the pool under load is the open-files ledger: an idle connection is
/// kept only with a descriptor no open session may need, and closed when sessions need it
/// (`wharf_upstream`'s pool). Connections not used for `POOL_IDLE_TIMEOUT` are closed; the
/// sweep gives back idle connections' read buffers, so what stays is a socket and a few
/// dozen bytes each.
pub(crate) const MAX_IDLE_PER_ORIGIN: usize = 4096;
/// Idle keep-alive connections kept over all origins (an open proxy meets many).
pub(crate) const MAX_IDLE_TOTAL: usize = 8192;
/// How long an idle origin connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// New connections opened at once per origin; more calls wait for one of them or for a
/// connection to come back (see `wharf_upstream::IdlePool::acquire`).
pub(crate) const MAX_CONNECTING_PER_ORIGIN: usize = 32;
/// How long a call waits for a connection or a connect slot before it opens one anyway.
const MAX_CONNECT_WAIT: Duration = Duration::from_millis(1);
/// How often idle connections past their timeout are closed when no call comes.
const POOL_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Fetches target URLs over a keep-alive pool of SSRF-checked connections.
#[derive(Clone)]
pub(crate) struct Origin {
    inner: Arc<Inner>,
}

struct Inner {
    connector: GuardedConnector,
    tls: TlsConnector,
    /// Idle origin connections, a pool per thread (see `wharf_upstream::PoolShards`).
    pool: PoolShards,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

impl Origin {
    pub(crate) fn new(config: &ProxyConfig, policy: Arc<DestinationPolicy>) -> Self {
        let pool = PoolShards::new(PoolLimits {
            max_idle_per_key: MAX_IDLE_PER_ORIGIN,
            max_idle_total: MAX_IDLE_TOTAL,
            idle_timeout: POOL_IDLE_TIMEOUT,
            max_connecting_per_key: MAX_CONNECTING_PER_ORIGIN,
            max_connect_wait: MAX_CONNECT_WAIT,
        });
        pool.sweep_from_first_call(POOL_SWEEP_EVERY);
        Self {
            inner: Arc::new(Inner {
                connector: GuardedConnector::new(policy, config.connect_timeout),
                tls: wharf_upstream::tls_connector()
                    .expect("the ring provider supports rustls' default protocol versions"),
                pool,
                connect_timeout: config.connect_timeout,
                first_byte_timeout: config.first_byte_timeout,
            }),
        }
    }

    /// Sends `GET target` and waits for the response head, keeping its header `fields` as
    /// asked: at most `first_byte_timeout` (which includes connecting), and never past
    /// `deadline` (the call's `total_timeout`, which then is what the error reports).
    pub(crate) async fn fetch(
        &self,
        target: &Target,
        fields: HeadFields,
        deadline: Instant,
        total_timeout: Duration,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        let first_byte = Instant::now() + self.inner.first_byte_timeout;
        // One timer for both limits: the sooner one.
        let (due, after) = if deadline < first_byte {
            (deadline, total_timeout)
        } else {
            (first_byte, self.inner.first_byte_timeout)
        };
        match tokio::time::timeout_at(due, self.exchange(target, fields)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ProxyError::OriginTimeout {
                origin: target.label.clone(),
                what: "no response headers",
                after,
            }),
        }
    }

    async fn exchange(
        &self,
        target: &Target,
        fields: HeadFields,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        // Matched on a temporary, not a named local: a local would keep its storage (88
        // bytes) in this future's state through every await below. A new connection's
        // exchange is boxed for the same reason: the match's temporary lives through it.
        let pool = self.inner.pool.here();
        let checkout = match pool.try_acquire(target.pool_key()) {
            Some(checkout) => checkout,
            // Every connect slot busy, nothing idle: wait for either. Boxed, and freed once
            // it has its answer: the wait's state (a timer, a wake-up) would otherwise stay
            // in every call's future for the whole exchange (+0.6 KiB per call in flight).
            None => Box::pin(pool.acquire(target.pool_key())).await,
        };
        let (slot, connection) = match checkout {
            Checkout::Idle(slot, connection) => (slot, connection),
            Checkout::Connect(slot, permit) => {
                return Box::pin(self.exchange_fresh(target, fields, slot, Some(permit))).await
            }
        };
        // The outcome is taken apart in the same statement: a `Result` kept in a local would
        // stay in this future's state (264 bytes for every call in flight) across the retry.
        let failure = match connection
            .send_encoded(&target.request, Some(slot.clone()))
            .keeping(fields)
            .await
        {
            Ok(response) => return Ok(response),
            Err(failure) => failure,
        };
        if !failure.stale {
            return Err(self.unavailable(target, &failure.error));
        }
        // The origin closed a pooled connection while it was idle: a GET goes again, once,
        // on a new connection (a new one is never stale). Boxed: it is rare.
        debug!(origin = %target.label, error = %failure.error, "pooled origin connection was closed; reconnecting");
        drop(failure);
        Box::pin(self.exchange_fresh(target, fields, slot, None)).await
    }

    /// The exchange on a new connection; `permit` (one of the origin's connect slots) is
    /// given back as soon as the connection is open or has failed. A retry after a stale
    /// pooled connection opens its connection without one: it is rare, and must not wait.
    async fn exchange_fresh(
        &self,
        target: &Target,
        fields: HeadFields,
        slot: PoolSlot,
        permit: Option<ConnectPermit>,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        // Connecting is boxed: resolving and the TLS handshake hold a lot of state, which
        // every call's future would otherwise carry, also while it waits on its answer.
        let connected = Box::pin(self.connect(&target.url)).await;
        drop(permit);
        let connection = connected?;
        connection
            .send_encoded(&target.request, Some(slot))
            .keeping(fields)
            .await
            .map_err(|failure| self.unavailable(target, &failure.error))
    }

    /// Keeps `count` connections to `origin` (`scheme://host[:port]`, checked as a call's
    /// would be) idle in this thread's pool for the calls there, opened again as calls take
    /// them for as long as the service lives (`wharf_upstream::KeptIdle::start`). A service's
    /// `preconnect_origins`, run on each core at start. What went wrong, one line.
    pub(crate) async fn preconnect(&self, origin: &Url, count: u32) -> Option<String> {
        let kept = self
            .inner
            .pool
            .here()
            .keep_idle(pool_key(origin), count as usize);
        // The keeper holds the service weakly: a reload that drops it ends the keeper.
        let service = Arc::downgrade(&self.inner);
        let target = origin.clone();
        let open = move || {
            let service = service.upgrade();
            let target = target.clone();
            async move {
                match service {
                    Some(inner) => Origin { inner }.connect(&target).await,
                    None => Err(ProxyError::OriginUnavailable {
                        origin: origin_label(&target),
                        message: "the service was replaced".to_owned(),
                    }),
                }
            }
        };
        kept.start(open).await.err().map(|failure| match failure {
            KeepFailure::Open(error) => error.to_string(),
            KeepFailure::NoRoom(no_room) => format!("{}: {no_room}", origin_label(origin)),
        })
    }

    fn unavailable(&self, target: &Target, error: &wharf_upstream::UpstreamError) -> ProxyError {
        ProxyError::OriginUnavailable {
            origin: target.label.clone(),
            message: error_chain(error),
        }
    }

    /// A new connection to the target's origin: through the guard, then TLS for https.
    async fn connect(&self, target: &Url) -> Result<Connection, ProxyError> {
        let host = target.host().ok_or_else(|| ProxyError::OriginUnavailable {
            origin: origin_label(target),
            message: "url has no host".to_owned(),
        })?;
        let port = target.port_or_known_default().unwrap_or(80);
        let tcp = self
            .inner
            .connector
            .connect(host.clone(), port)
            .await
            .map_err(|error| self.connect_error(target, &error))?;
        if target.scheme() != "https" {
            return Ok(Connection::new(tcp));
        }
        let bare = target
            .host_str()
            .unwrap_or("")
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name =
            ServerName::try_from(bare.to_owned()).map_err(|_| ProxyError::OriginUnavailable {
                origin: origin_label(target),
                message: format!("{bare:?} is not a valid TLS server name"),
            })?;
        let tls = self.inner.tls.connect(name, tcp).await.map_err(|error| {
            ProxyError::OriginUnavailable {
                origin: origin_label(target),
                message: format!("tls handshake: {}", error_chain(&error)),
            }
        })?;
        Ok(Connection::new(tls))
    }

    fn connect_error(&self, target: &Url, error: &ConnectError) -> ProxyError {
        match error {
            ConnectError::Refused(refusal) => ProxyError::Refused {
                host: target.host_str().unwrap_or("").to_owned(),
                source: refusal.clone(),
            },
            ConnectError::Timeout { .. } => ProxyError::OriginTimeout {
                origin: origin_label(target),
                what: "no connection",
                after: self.inner.connect_timeout,
            },
            other => ProxyError::OriginUnavailable {
                origin: origin_label(target),
                message: error_chain(other),
            },
        }
    }
}

/// `scheme://host:port` of a target, for messages and logs.
pub(crate) fn origin_label(target: &Url) -> String {
    format!(
        "{}://{}:{}",
        target.scheme(),
        target.host_str().unwrap_or(""),
        target.port_or_known_default().unwrap_or(0)
    )
}
