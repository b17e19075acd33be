//! One backend of a route: its address and pool, passive health, and the
//! calls it has outstanding.
//!
//! - [`Backend`]: the backend, shared by the calls of its route;
//! - [`Probe`]: the one call let through to an ejected backend past its window;
//! - `Lease`: counts a call against its backend, whatever way the call ends.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
/// How long an ejected backend is skipped before one call probes it (the others keep
/// skipping it until the probe's outcome is known).
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
    /// Milliseconds since `epoch` until which the backend is skipped; 0 while it is not
    /// ejected. Past it the backend stays ejected for all calls but its [`Probe`]'s, until
    /// the probe's outcome clears it (a success) or sets it again (a failure).
    ejected_until_ms: AtomicU64,
    /// A call holds the [`Probe`] of this ejected backend; set and cleared only by the
    /// probe's taking and dropping.
    probing: AtomicBool,
    epoch: Instant,
    /// Calls counted against the backend: a [`Lease`] each.
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
            probing: AtomicBool::new(false),
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

    /// Whether the backend takes calls as usual: it is not ejected. An ejected backend
    /// takes one call at a time, its [`Probe`], once its window has passed
    /// ([`Backend::try_probe`]).
    pub fn is_available(&self) -> bool {
        self.ejected_until_ms.load(Ordering::Acquire) == 0
    }

    /// The right to send this call to the ejected backend, when its window has passed and
    /// no other call holds it: one call probes the backend, the others keep skipping it
    /// until the probe's outcome is recorded (`Backend::record`). Before, every call
    /// past the window went to the backend at once, and a still dead backend held each for
    /// the route's timeout. The right is given back when the probe is dropped; a probe
    /// whose call ended without an outcome (its client gone) starts another ejection window
    /// (see [`Probe`]), so the next probe waits for it.
    pub fn try_probe(self: &Arc<Self>) -> Option<Probe> {
        if !self.window_passed() {
            return None;
        }
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let probe = Probe {
            backend: self.clone(),
        };
        // The probe before this one may have failed between the check and the claim: its
        // new window (stored before it let go of the claim) holds off this one.
        self.window_passed().then_some(probe)
    }

    /// Ejected, and the window is over.
    fn window_passed(&self) -> bool {
        let until = self.ejected_until_ms.load(Ordering::Acquire);
        until != 0 && self.now_ms() >= until
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Calls currently using this backend.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Counts a call against the backend until the lease is dropped.
    pub(crate) fn lease(self: &Arc<Self>) -> Lease {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        Lease {
            backend: self.clone(),
        }
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
        // An ejected backend's failure (its probe's, or a last resort's) starts another
        // window whatever the count: a success racing this failure may have zeroed the
        // count after the ejection, and three more probes back to back must not follow.
        let ejected = self.ejected_until_ms.load(Ordering::Acquire) != 0;
        if failures >= EJECT_AFTER_FAILURES || ejected {
            let until = self.now_ms() + EJECT_FOR.as_millis() as u64;
            self.ejected_until_ms.store(until, Ordering::Release);
            tracing::warn!(backend = %self.label, failures, "backend ejected");
        }
    }
}

/// Counts a call against its backend (`least_outstanding`) from the sending of its request
/// until the end of its response body. The count goes down when the lease is dropped, so
/// exactly once whatever way the call ends: a failure, a timeout, the body's end, or the
/// call itself dropped while it waits for the backend (its client gone). Before, only the
/// ways the call returned ended it, and each abandoned call counted for ever.
pub(crate) struct Lease {
    backend: Arc<Backend>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The one call let through to an ejected backend whose window has passed
/// ([`Backend::try_probe`]). Its outcome, recorded as any call's, clears the ejection or
/// starts another window. Dropped without an outcome (its call cancelled, its client
/// gone), it starts another window itself: else the next call would probe at once, and
/// clients that give up before the route's timeout would keep one call on a dead backend
/// at all times.
#[derive(Debug)]
pub struct Probe {
    backend: Arc<Backend>,
}

impl Probe {
    /// The backend probed.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let backend = &self.backend;
        let until = backend.ejected_until_ms.load(Ordering::Acquire);
        let now = backend.now_ms();
        // Still past its window: no outcome was recorded (a success clears it, a failure
        // moves it on).
        if until != 0 && now >= until {
            let _ = backend.ejected_until_ms.compare_exchange(
                until,
                now + EJECT_FOR.as_millis() as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        backend.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use wharf_config::Strategy;
    use wharf_host::metrics::Metrics;

    use super::*;
    use crate::balance::{Balancer, Order};

    /// A backend never connected to, whose clock started a minute ago (so that a window can
    /// be made to have passed: [`window_over`]).
    fn backend(name: &str) -> Arc<Backend> {
        let tls = wharf_upstream::tls_connector().unwrap();
        let url = Url::parse(&format!("http://{name}.test")).unwrap();
        let mut backend = Backend::new(&url, &tls, Metrics::new().upstream("r", name)).unwrap();
        backend.epoch = Instant::now().checked_sub(Duration::from_secs(60)).unwrap();
        Arc::new(backend)
    }

    fn eject(backend: &Backend) {
        for _ in 0..EJECT_AFTER_FAILURES {
            backend.record(Outcome::Error);
        }
        assert!(!backend.is_available());
    }

    /// Ends the backend's ejection window (it stays ejected).
    fn window_over(backend: &Backend) {
        backend.ejected_until_ms.store(1, Ordering::Release);
    }

    fn labels(order: &Order) -> Vec<&str> {
        order
            .backends
            .iter()
            .map(|backend| backend.label())
            .collect()
    }

    #[tokio::test]
    async fn past_its_window_an_ejected_backend_takes_one_call_not_all() {
        let (dead, live) = (backend("dead"), backend("live"));
        let balancer = Balancer::new(Strategy::Failover);
        let backends = [dead.clone(), live.clone()];
        eject(&dead);
        let within = balancer.order(&backends);
        assert!(within.probe.is_none());
        assert_eq!(labels(&within), ["http://live.test", "http://dead.test"]);

        window_over(&dead);
        // Ten calls at once: the first probes the backend, the others skip it.
        let orders: Vec<Order> = (0..10).map(|_| balancer.order(&backends)).collect();
        let probing: Vec<&Order> = orders.iter().filter(|o| o.probe.is_some()).collect();
        assert_eq!(probing.len(), 1, "one call probes");
        assert_eq!(labels(probing[0]), ["http://dead.test", "http://live.test"]);
        assert!(Arc::ptr_eq(
            probing[0].probe.as_ref().unwrap().backend(),
            &dead
        ));
        for order in orders.iter().filter(|o| o.probe.is_none()) {
            assert_eq!(labels(order), ["http://live.test", "http://dead.test"]);
        }
        drop(orders);

        // A probe dropped without an outcome (its call cancelled) starts another window
        // rather than handing the probe to the next call at once; past it, it is given back.
        let order = balancer.order(&backends);
        assert!(
            order.probe.is_none(),
            "probed again at once after a cancelled probe"
        );
        window_over(&dead);
        let order = balancer.order(&backends);
        assert!(
            order.probe.is_some(),
            "the dropped probe was not given back"
        );
        // It fails: the backend is skipped for another window.
        dead.record(Outcome::Timeout);
        drop(order);
        let order = balancer.order(&backends);
        assert!(order.probe.is_none(), "probed again within the new window");
        assert_eq!(labels(&order), ["http://live.test", "http://dead.test"]);

        // The next probe succeeds: every call may use the backend again.
        window_over(&dead);
        let order = balancer.order(&backends);
        assert!(order.probe.is_some());
        dead.record(Outcome::Ok);
        drop(order);
        assert!(dead.is_available());
        for _ in 0..3 {
            let order = balancer.order(&backends);
            assert!(order.probe.is_none());
            assert_eq!(labels(&order), ["http://dead.test", "http://live.test"]);
        }
    }

    #[tokio::test]
    async fn a_healthy_primary_keeps_failover_calls_off_a_dead_backup() {
        let (primary, backup) = (backend("primary"), backend("backup"));
        let balancer = Balancer::new(Strategy::Failover);
        let backends = [primary.clone(), backup.clone()];
        eject(&backup);
        window_over(&backup);
        // A backup is for when the primary fails: no call probes it meanwhile.
        for _ in 0..3 {
            let order = balancer.order(&backends);
            assert!(order.probe.is_none(), "a call probed the backup");
            assert_eq!(
                labels(&order),
                ["http://primary.test", "http://backup.test"]
            );
        }
        // Balancing strategies do probe it: it takes its share once it answers.
        let balancer = Balancer::new(Strategy::RoundRobin);
        let order = balancer.order(&backends);
        assert!(order.probe.is_some());
        assert_eq!(labels(&order)[0], "http://backup.test");
    }

    #[tokio::test]
    async fn a_failure_of_an_ejected_backend_starts_a_window_whatever_the_count() {
        let dead = backend("dead");
        eject(&dead);
        // A success that raced the ejection zeroed the count; the backend stays ejected.
        dead.failures.store(0, Ordering::Release);
        window_over(&dead);
        let probe = dead.try_probe().unwrap();
        dead.record(Outcome::Error);
        drop(probe);
        assert!(
            dead.try_probe().is_none(),
            "probed again within the new window"
        );
    }

    #[tokio::test]
    async fn a_probe_is_not_taken_from_a_backend_ejected_again_meanwhile() {
        let dead = backend("dead");
        eject(&dead);
        window_over(&dead);
        let probe = dead.try_probe().unwrap();
        assert!(dead.try_probe().is_none(), "a second probe at once");
        dead.record(Outcome::Error);
        drop(probe);
        assert!(dead.try_probe().is_none(), "a probe within the new window");
    }
}
