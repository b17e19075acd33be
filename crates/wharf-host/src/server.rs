//! The host's life: [`HostBuilder`] binds the listeners (service, admin, Unix) and sizes
//! the sessions (`max_connections` within the open-files budget); [`Host::run`] starts the
//! accept loops ([`crate::accept`]) on the data plane's cores ([`crate::cores`]) and, on
//! shutdown, stops accepting and drains the calls in flight within `shutdown_timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, UnixListener};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::info;
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_limits::descriptors::DescriptorLedger;
use wharf_metrics::Metrics;

use crate::accept::{accept_unix, Acceptor, Sessions};
use crate::admin::ReloadHook;
use crate::admin::{self, AdminState};
use crate::call::Inflight;
use crate::connection::{SessionLimits, SessionParts};
use crate::cores;
use crate::dispatch::Dispatcher;
use crate::fd_budget;
use crate::keep_warm::KeepWarm;
use crate::on_cores::{CoreWork, CoreWorkReport};
use crate::registry::Mount;
use crate::service::HostService;
use crate::services::{Reloader, ServiceSet};
use crate::tls::{self, TlsError, TlsFiles};
use crate::warm_up::{Rig, WarmUp, WarmUpReport};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({role})")]
    Bind {
        /// `service` or `admin`.
        role: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The Unix socket could not be bound.
    #[error("cannot listen on unix socket {path}")]
    BindUnix {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The TLS certificate or key could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Collects services, then binds the listeners.
pub struct HostBuilder {
    server: ServerConfig,
    services: ServiceSet,
    metrics: Arc<Metrics>,
    inflight: Arc<Inflight>,
    tls: Option<TlsFiles>,
    unix: Option<PathBuf>,
    /// The data plane's cores, made by the warm-up (which runs its sessions on them) or
    /// else by [`HostBuilder::bind`].
    cores: OnceLock<Vec<cores::Prepared>>,
    /// The warm-up, kept to run again when `keep_warm` is set (see [`crate::keep_warm`]).
    warm_again: OnceLock<Rig>,
}

impl HostBuilder {
    /// A host with the `[server]` settings and no services yet.
    pub fn new(server: ServerConfig) -> Self {
        let metrics = Arc::new(Metrics::new());
        let inflight = Arc::new(Inflight::default());
        Self {
            server,
            services: ServiceSet::new(metrics.clone(), inflight.clone()),
            metrics,
            inflight,
            tls: None,
            unix: None,
            cores: OnceLock::new(),
            warm_again: OnceLock::new(),
        }
    }

    /// Serves the TCP listener over TLS (ALPN h2 and http/1.1).
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Also listens on a Unix socket at `path` (the seeds' named pipe).
    pub fn listen_unix(mut self, path: PathBuf) -> Self {
        self.unix = Some(path);
        self
    }

    /// The services mounted so far.
    pub fn services_mut(&mut self) -> &mut ServiceSet {
        &mut self.services
    }

    /// The host's counters, for services that add their own series.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Makes `service` answer the requests `mount` selects, under `name`,
    /// with the host's qualities around it: its own bulkhead (`limits`),
    /// counters, tracing and `/debug/inflight` entry.
    pub fn mount(
        mut self,
        name: impl Into<String>,
        mount: Mount,
        limits: &LimitsConfig,
        service: HostService,
    ) -> Self {
        self.services.mount(&name.into(), mount, limits, service);
        self
    }

    /// Runs `warm`'s calls through private sessions on the data plane's cores (made here if
    /// they are not yet), so the first client's call finds the code and buffers it needs
    /// warm (seed 000; see [`crate::warm_up`]). Call it before
    /// [`HostBuilder::bind`]: a client that connects once the port is bound must not wait
    /// behind the warm-up. With `keep_warm` set, the same calls run again every period
    /// while the host runs (`server.keep_warm`); without a warm-up, nothing does.
    pub async fn warm_up(&self, warm: WarmUp) -> WarmUpReport {
        let (report, rig) = crate::warm_up::run(
            warm,
            &self.server,
            session_limits(&self.server),
            self.cores(),
        )
        .await;
        if self.server.keep_warm.is_some() {
            // A second warm-up replaces nothing: the first one's calls are kept.
            let _ = self.warm_again.set(rig);
        }
        report
    }

    /// Runs `work` once on each of the data plane's cores (made here if they are not yet),
    /// side by side, and waits until all have finished or `wait` has passed; work not
    /// finished by then goes on in the background. For what the first calls on a core should
    /// find ready: the upstream connections a service opens ahead (see [`crate::on_cores`]).
    /// Call it before [`HostBuilder::bind`], as [`HostBuilder::warm_up`].
    pub async fn on_each_core(&self, work: &CoreWork, wait: Duration) -> CoreWorkReport {
        crate::on_cores::run(&crate::on_cores::homes(self.cores()), work, wait).await
    }

    /// The data plane's cores, made at the first ask.
    fn cores(&self) -> &[cores::Prepared] {
        self.cores.get_or_init(|| prepare_cores(&self.server))
    }

    /// Binds the service and admin listeners (port 0 picks a free port).
    pub async fn bind(mut self) -> Result<Host, HostError> {
        let started = Instant::now();
        let max_sessions =
            fd_budget::session_limit(self.server.max_connections, self.server.splice_bodies);
        // The data plane's cores exist before the port accepts (see `cores`).
        let cores = self
            .cores
            .take()
            .unwrap_or_else(|| prepare_cores(&self.server));
        let listener = bind_tcp(
            "service",
            self.server.listen,
            service_backlog(&self.server),
            true,
        )?;
        let admin = bind_tcp("admin", self.server.admin_listen, 128, false)?;
        let tls = self.tls.as_ref().map(tls::acceptor).transpose()?;
        let unix = self.unix.map(bind_unix).transpose()?;
        self.metrics
            .startup_phase("bind", started.elapsed().as_secs_f64());
        // The reuse counts are process-wide running totals of the per-thread kept stacks
        // (wharf_http1::recycle), taken once per scrape: the read buffers (h1/spare.rs) have
        // series of their own, the other kinds share `wharf_kept_objects_*`.
        let read_buffers = self.metrics.read_buffers();
        let kept_objects = self.metrics.kept_objects(&[
            wharf_http1::recycle::HEADER_MAPS,
            wharf_http1::recycle::EXTENSION_MAPS,
            crate::h1::RESPONSE_HEADS,
        ]);
        self.metrics.set_sampler(
            "reuse",
            Box::new(move || {
                for kind in wharf_http1::recycle::kept_stats() {
                    let (reused, allocated, held) = (kind.reused, kind.allocated, kind.held);
                    if kind.kind == crate::h1::READ_BUFFERS {
                        read_buffers.sample(reused, allocated, held);
                    } else {
                        kept_objects.sample(kind.kind, reused, allocated, held);
                    }
                }
            }),
        );
        // The open-files ledger's loans to idle upstream connections, read at each scrape.
        let idle_upstream = self.metrics.idle_upstream();
        let ledger = DescriptorLedger::process();
        self.metrics.set_sampler(
            "idle_upstream",
            Box::new(move || {
                let stats = ledger.stats();
                let lent = u64::try_from(stats.lent).unwrap_or(u64::MAX);
                idle_upstream.sample(lent, stats.refused, stats.recalled);
            }),
        );
        let sessions = Sessions::new(self.metrics.sessions(max_sessions));
        let session_limits = session_limits(&self.server);
        let warm_again = self.warm_again.into_inner();
        Ok(Host {
            listener,
            cores,
            admin,
            tls,
            unix,
            dispatcher: Arc::new(Dispatcher {
                registry: Arc::new(RwLock::new(Arc::new(self.services.into_registry()))),
                max_header_bytes: self.server.max_header_bytes,
            }),
            admin_state: Arc::new(AdminState::new(
                self.metrics,
                self.inflight,
                self.server.admin_token.as_deref(),
            )),
            sessions,
            session_limits,
            max_sessions,
            warm_again,
            server: self.server,
        })
    }
}

/// The data plane's cores (see `cores`): one per worker of the runtime this runs on.
fn prepare_cores(server: &ServerConfig) -> Vec<cores::Prepared> {
    cores::prepare(
        tokio::runtime::Handle::current().metrics().num_workers(),
        server.busy_poll,
    )
}

/// A host with bound listeners, ready to [`Host::run`].
pub struct Host {
    listener: TcpListener,
    /// The data plane's cores, waiting for [`Host::run`] to give them their listeners.
    cores: Vec<cores::Prepared>,
    admin: TcpListener,
    tls: Option<TlsAcceptor>,
    unix: Option<(UnixListener, PathBuf)>,
    dispatcher: Arc<Dispatcher>,
    admin_state: Arc<AdminState>,
    sessions: Arc<Sessions>,
    session_limits: SessionLimits,
    /// Sessions admitted at once: `max_connections`, or fewer when the
    /// open-files limit cannot hold that many proxied calls (`fd_budget`).
    max_sessions: usize,
    /// The warm-up to run again every `server.keep_warm` (kept only when that is set).
    warm_again: Option<Rig>,
    server: ServerConfig,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Calls still running when the drain ended: `shutdown_timeout` expired, or `cut`
    /// of [`Host::run_until_cut`] resolved.
    pub calls_cut: usize,
    /// The drain was ended by `cut` of [`Host::run_until_cut`] (in `wharf serve`, a second
    /// SIGINT or SIGTERM), not by its sessions closing or `shutdown_timeout`.
    pub cut_short: bool,
    /// What the drain left of `shutdown_timeout`, counted from the shutdown signal: the
    /// time left for work that ends after the host (queue deliverers handing back what
    /// they hold). Zero when the drain was cut short.
    pub shutdown_left: Duration,
}

impl Host {
    /// The service listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// The host's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.admin_state.metrics()
    }

    /// Sets what `POST {admin}/reload` runs (e.g. re-read the config file
    /// and [`Reloader::replace`] the services). Returns false if a hook was
    /// already set.
    pub fn on_reload(&self, hook: ReloadHook) -> bool {
        self.admin_state.set_reload(hook)
    }

    /// The Unix socket listened on, if any.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_ref().map(|(_, path)| path.as_path())
    }

    /// A handle that swaps the host's services while it runs.
    pub fn reloader(&self) -> Reloader {
        Reloader::new(
            self.dispatcher.registry.clone(),
            self.admin_state.metrics().clone(),
            self.admin_state.inflight().clone(),
            crate::on_cores::homes(&self.cores).into(),
        )
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets calls in
    /// flight finish for up to `shutdown_timeout`, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> RunSummary {
        self.run_until_cut(shutdown, std::future::pending()).await
    }

    /// As [`Host::run`], but the drain ends as soon as `cut` resolves, cutting the calls
    /// still in flight: an operator who signals again during a long drain wants out now.
    /// `cut` is polled only during the drain; one that resolved before it ends the drain at
    /// once.
    pub async fn run_until_cut(
        self,
        shutdown: impl Future<Output = ()> + Send,
        cut: impl Future<Output = ()> + Send,
    ) -> RunSummary {
        let Host {
            listener,
            cores: prepared,
            admin,
            tls,
            unix,
            dispatcher,
            admin_state,
            sessions,
            session_limits,
            max_sessions,
            warm_again,
            server,
        } = self;
        let (stop_sessions, session_stop) = watch::channel(false);
        let acceptor = Arc::new(Acceptor::new(
            max_sessions,
            sessions.clone(),
            tls,
            SessionParts {
                h2: Arc::new(h2_builder(&server)),
                dispatcher: dispatcher.clone(),
                stop: session_stop,
                limits: session_limits,
            },
        ));
        let admin_task = tokio::spawn(admin::serve(admin, admin_state.clone()));
        admin_state.set_ready(true);
        let registry = dispatcher
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let services: Vec<&str> = registry.names().collect();
        info!(
            addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            ?services,
            "accepting calls"
        );

        // TCP sessions run on the data plane's cores, one per runtime worker (see `cores`);
        // the loop here serves the Unix listener and watches for shutdown, and accepts TCP
        // itself only if the first core (the one on the host's listener) could not start.
        let (stop_accepting, accepting) = watch::channel(false);
        let (release_cores, cores_released) = watch::channel(false);
        let cores = cores::start(
            prepared,
            &listener,
            service_backlog(&server),
            server.cpu_steering,
            &acceptor,
            &accepting,
            &cores_released,
        );
        // When the first core accepts from its copy of the host's listener (the same
        // socket), the host's own is closed now: registered with this runtime's epoll, it
        // woke this thread, which has nothing to do with it, for every connection that
        // arrived for that core. The core's copy keeps the socket open until it stops.
        let listener = (!cores::on_host_listener(&cores)).then_some(listener);
        let keep_warm = warm_again
            .zip(server.keep_warm)
            .map(|(rig, every)| KeepWarm::start(rig, every));
        acceptor
            .accept_until(
                listener.as_ref(),
                || accept_unix(unix.as_ref()),
                shutdown,
                || None,
            )
            .await;
        let signalled = tokio::time::Instant::now();
        let _ = stop_accepting.send(true);
        drop(keep_warm);
        cores::wait_until_not_accepting(&cores).await;

        admin_state.set_ready(false);
        drop(listener);
        if let Some((unix_listener, path)) = unix {
            drop(unix_listener);
            let _ = std::fs::remove_file(path);
        }
        let in_flight = admin_state.inflight().len();
        info!(in_flight, sessions = sessions.open_now(), "draining");
        let _ = stop_sessions.send(true);
        let drained = tokio::time::timeout(server.shutdown_timeout, sessions.until_all_closed());
        let (calls_cut, cut_short) = tokio::select! {
            // A drain that is over wins over a cut ready at the same time: nothing was cut.
            biased;
            drained = drained => match drained {
                Ok(()) => (0, false),
                Err(_elapsed) => (admin_state.inflight().len(), false),
            },
            () = cut => (admin_state.inflight().len(), true),
        };
        // The cores' sessions are closed, or cut now with their runtimes.
        let _ = release_cores.send(true);
        cores::join(cores).await;
        admin_task.abort();
        info!(calls_cut, cut_short, "stopped");
        RunSummary {
            calls_cut,
            cut_short,
            // Cut short, nothing is left: what runs after the host gets only its minimum.
            shutdown_left: if cut_short {
                Duration::ZERO
            } else {
                server.shutdown_timeout.saturating_sub(signalled.elapsed())
            },
        }
    }
}

/// The time limits of every session, from `[server]`.
fn session_limits(server: &ServerConfig) -> SessionLimits {
    SessionLimits {
        header_read_timeout: server.header_read_timeout,
        idle_timeout: server.idle_timeout,
        splice_bodies: server.splice_bodies,
    }
}

/// The HTTP/2 side (TLS with ALPN h2, or cleartext with prior knowledge);
/// HTTP/1.1 is wharf's own ([`h1`]).
pub(crate) fn h2_builder(server: &ServerConfig) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    // h2 counts 32 bytes more per field than wharf's head size does (RFC 9113
    // §6.5.2); at max_header_bytes itself, a head just over wharf's limit got
    // h2's own empty 431 (or a stream reset a client retries) instead of the
    // JSON 431 `dispatch_h2` answers. 32 more per allowed field (and 8 pseudo-
    // header fields) lets every head wharf would take through to that check,
    // and heads somewhat over it; beyond, h2 refuses them itself. Each stream
    // holds its decoded head, so the margin stays a few KiB.
    let h2_list_limit = server
        .max_header_bytes
        .saturating_add(32 * (wharf_http1::request::MAX_REQUEST_HEADERS + 8));
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(h2_list_limit).unwrap_or(u32::MAX));
    builder
}

/// The service listener's accept queue: a burst of new connections must fit it. With
/// tokio's default backlog (1024) a burst of 2000 connects loses SYNs and the clients
/// retry after a second (seed 002's ramp-up, in the kernel). The kernel caps it at
/// net.core.somaxconn.
pub(crate) fn service_backlog(server: &ServerConfig) -> u32 {
    u32::try_from(server.max_connections)
        .unwrap_or(u32::MAX)
        .clamp(1024, 65535)
}

/// Binds a TCP listener with `backlog` pending connections (SO_REUSEADDR,
/// so a restart does not wait for TIME_WAIT sockets), with TCP_NODELAY, which Linux
/// passes on to every accepted socket (responses are written whole; Nagle's algorithm
/// would only hold their last segment back). With `reuse_port` (the service listener),
/// the data plane's cores bind listeners of their own to the same address, and the kernel
/// spreads new connections over them (`cores`).
pub(crate) fn bind_tcp(
    role: &'static str,
    addr: SocketAddr,
    backlog: u32,
    reuse_port: bool,
) -> Result<TcpListener, HostError> {
    let error = |source| HostError::Bind { role, addr, source };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(error)?;
    socket.set_reuseaddr(true).map_err(error)?;
    if reuse_port {
        socket.set_reuseport(true).map_err(error)?;
    }
    socket.set_nodelay(true).map_err(error)?;
    socket.bind(addr).map_err(error)?;
    socket.listen(backlog).map_err(error)
}

/// Binds a Unix socket, replacing a stale socket file (never another kind
/// of file).
fn bind_unix(path: PathBuf) -> Result<(UnixListener, PathBuf), HostError> {
    use std::os::unix::fs::FileTypeExt;
    let error = |source| HostError::BindUnix {
        path: path.clone(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(&path).map_err(error)?;
        }
    }
    let listener = UnixListener::bind(&path).map_err(error)?;
    Ok((listener, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The accept loop relies on this instead of setting TCP_NODELAY per connection.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listeners_nodelay() {
        let listener = bind_tcp("service", "127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = TcpSocket::new_v4().unwrap().connect(addr);
        let (client, accepted) = tokio::join!(connect, listener.accept());
        let _client = client.unwrap();
        let (server_side, _) = accepted.unwrap();
        assert!(server_side.nodelay().unwrap());
    }

    #[test]
    fn the_sessions_splice_bodies_as_the_config_says() {
        for splice_bodies in [false, true] {
            let server = ServerConfig {
                splice_bodies,
                ..ServerConfig::default()
            };
            assert_eq!(session_limits(&server).splice_bodies, splice_bodies);
        }
    }
}
