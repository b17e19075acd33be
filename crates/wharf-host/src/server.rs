//! Listeners and sessions: accepts connections within `max_connections`,
//! serves HTTP/1.1 and h2c on each, dispatches calls to services, and
//! drains on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tracing::{debug, info, warn, Instrument};
use wharf_config::ServerConfig;

use crate::admin::{self, AdminState};
use crate::body::ResponseBody;
use crate::error::json_error;
use crate::registry::{Mount, Mounted, Registry};
use crate::service::HostService;

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
}

/// Collects services, then binds the listeners.
pub struct HostBuilder {
    server: ServerConfig,
    registry: Registry,
}

impl HostBuilder {
    /// A host with the `[server]` settings and no services yet.
    pub fn new(server: ServerConfig) -> Self {
        Self {
            server,
            registry: Registry::default(),
        }
    }

    /// Makes `service` answer the requests `mount` selects, under `name`.
    pub fn mount(mut self, name: impl Into<String>, mount: Mount, service: HostService) -> Self {
        let mounted = Mounted {
            name: name.into(),
            service,
        };
        self.registry.insert(mount, mounted);
        self
    }

    /// Binds the service and admin listeners (port 0 picks a free port).
    pub async fn bind(self) -> Result<Host, HostError> {
        let bind = |role, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| HostError::Bind { role, addr, source })
        };
        let listener = bind("service", self.server.listen).await?;
        let admin = bind("admin", self.server.admin_listen).await?;
        Ok(Host {
            listener,
            admin,
            shared: Arc::new(Shared {
                registry: self.registry,
                max_header_bytes: self.server.max_header_bytes,
                calls_in_flight: AtomicUsize::new(0),
            }),
            server: self.server,
            admin_state: Arc::new(AdminState::default()),
        })
    }
}

/// What every connection task needs, shared read-only (plus one counter).
struct Shared {
    registry: Registry,
    max_header_bytes: usize,
    /// Calls whose response future has not finished; reported at shutdown.
    calls_in_flight: AtomicUsize,
}

/// A host with bound listeners, ready to [`Host::run`].
pub struct Host {
    listener: TcpListener,
    admin: TcpListener,
    shared: Arc<Shared>,
    server: ServerConfig,
    admin_state: Arc<AdminState>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Calls still running when `shutdown_timeout` expired.
    pub calls_cut: usize,
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

    /// Serves until `shutdown` resolves, then stops accepting, lets calls in
    /// flight finish for up to `shutdown_timeout`, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> RunSummary {
        let Host {
            listener,
            admin,
            shared,
            server,
            admin_state,
        } = self;
        let services: Vec<&str> = shared.registry.names().collect();
        info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), ?services, "accepting calls");
        let builder = connection_builder(&server);
        let graceful = GracefulShutdown::new();
        let sessions = Arc::new(Semaphore::new(server.max_connections));
        let admin_task = tokio::spawn(serve_admin(admin, admin_state.clone()));
        admin_state.ready.store(true, Ordering::Release);

        tokio::pin!(shutdown);
        loop {
            // Take a session slot before accepting: beyond max_connections,
            // new connections wait in the kernel's backlog.
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = sessions.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => break,
                },
            };
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        warn!(error = %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let connection = serve_connection(&builder, stream, peer, shared.clone());
            let watched = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(error) = watched.await {
                    debug!(peer = %peer, error = %error, "connection ended with error");
                }
                drop(permit);
            });
        }

        admin_state.ready.store(false, Ordering::Release);
        drop(listener);
        info!(
            in_flight = shared.calls_in_flight.load(Ordering::Relaxed),
            "draining"
        );
        let drained = tokio::time::timeout(server.shutdown_timeout, graceful.shutdown()).await;
        let calls_cut = match drained {
            Ok(()) => 0,
            Err(_elapsed) => shared.calls_in_flight.load(Ordering::Relaxed),
        };
        admin_task.abort();
        info!(calls_cut, "stopped");
        RunSummary { calls_cut }
    }
}

fn connection_builder(server: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .keep_alive(true)
        // hyper answers 431 itself past its buffer; below that the
        // dispatcher checks max_header_bytes and answers with JSON.
        .max_buf_size(server.max_header_bytes.max(8 * 1024) + 16 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(server.max_header_bytes.min(u32::MAX as usize) as u32);
    builder
}

fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
) -> impl hyper_util::server::graceful::GracefulConnection<Error = crate::body::BoxError> {
    if let Err(error) = stream.set_nodelay(true) {
        debug!(peer = %peer, error = %error, "cannot set TCP_NODELAY");
    }
    let service = hyper::service::service_fn(move |request| dispatch(shared.clone(), request));
    builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .into_owned()
}

/// Routes one call to its service, after the host's own checks.
async fn dispatch(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let head_bytes = request_head_bytes(&request);
    if head_bytes > shared.max_header_bytes {
        return Ok(json_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!(
                "request head is {head_bytes} bytes, over max_header_bytes ({})",
                shared.max_header_bytes
            ),
        ));
    }
    let Some(mounted) = shared.registry.find(request.uri().path()) else {
        return Ok(json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no service at {}", request.uri().path()),
        ));
    };
    let span = tracing::info_span!(
        "call",
        service = %mounted.name,
        method = %request.method(),
        target = %request.uri(),
    );
    let service = mounted.service.clone();
    shared.calls_in_flight.fetch_add(1, Ordering::Relaxed);
    let _in_flight = InFlight(&shared.calls_in_flight);
    service.oneshot(request).instrument(span).await
}

/// Decrements the in-flight count however the call ends (also when the
/// client goes away and the future is dropped).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Size of the request line and headers as sent (approximately, for h2).
fn request_head_bytes<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len()
        + request
            .uri()
            .path_and_query()
            .map_or(1, |pq| pq.as_str().len())
        + 12;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    line + headers
}

async fn serve_admin(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(error = %error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = admin::respond(&state, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(peer = %peer, error = %error, "admin connection ended with error");
            }
        });
    }
}
