//! Accepting connections and running hyper on them: [`spawn`], [`serve`], [`TestbedHandle`].
//!
//! One accept loop; each connection runs in its own task with hyper-util's auto builder
//! (HTTP/1.1 with keep-alive, or h2c when the client opens with the HTTP/2 preface) and
//! `TCP_NODELAY`. Connection tasks live in a `JoinSet`, so stopping the loop can end them:
//! [`serve`] lets them finish their calls for up to [`SHUTDOWN_GRACE`], and dropping a
//! [`TestbedHandle`] aborts them at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::routes::{handle, State};

/// How long [`serve`] lets open connections finish their calls after `shutdown` resolves
/// before it cuts them: 1 s (a `/slow` call of 6 s is cut).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Pause after an accept error (e.g. out of file descriptors) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running testbed; dropping it stops the server.
///
/// Dropping aborts the accept loop and every open connection (in-flight responses are cut),
/// and frees the port.
#[derive(Debug)]
pub struct TestbedHandle {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl TestbedHandle {
    /// The address the testbed listens on (the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` followed by `path_and_query`, e.g. `url("/bytes/10")`.
    ///
    /// An unspecified bind address (`0.0.0.0`, `::`) is written as loopback, so the URL can be
    /// fetched.
    pub fn url(&self, path_and_query: &str) -> String {
        let mut addr = self.addr;
        match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
            IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
            _ => {}
        }
        format!("http://{addr}{path_and_query}")
    }

    /// Requests seen so far for exactly `path` (no query), e.g. `hits("/bytes/10")`; read
    /// in-process, without HTTP. Requests to `/hits` are not counted.
    pub fn hits(&self, path: &str) -> u64 {
        self.state.hits.get(path)
    }

    /// Requests seen so far for all paths together (`/hits` excluded).
    pub fn total_hits(&self) -> u64 {
        self.state.hits.total()
    }

    /// Forgets all counts, like `DELETE /hits`.
    pub fn reset_hits(&self) {
        self.state.hits.reset();
    }
}

impl Drop for TestbedHandle {
    fn drop(&mut self) {
        // Dropping the serve task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

/// Listen backlog: the floor of bench/compare.sh's burst scenario is 2,000 connects at once
/// straight to the testbed, and 1,000 slow calls start together in the responsiveness one.
/// With tokio's default (1024) the kernel drops the SYNs past it and those clients retry a
/// second later, which measured the backlog instead of the floor. The kernel caps it at
/// `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listener for [`serve`] on `addr` (port 0 picks a free port), with
/// [`LISTEN_BACKLOG`] and SO_REUSEADDR (a restart does not wait for TIME_WAIT sockets).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `addr` (port 0 allowed) and serves in a spawned tokio task.
///
/// The listener is bound when this returns, so connections made right away are accepted.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let testbed = wharf_testbed::spawn("127.0.0.1:0".parse().expect("a valid address")).await?;
/// assert!(testbed.url("/fast").starts_with("http://127.0.0.1:"));
/// assert_eq!(testbed.total_hits(), 0);
/// # Ok(())
/// # }
/// ```
pub async fn spawn(addr: SocketAddr) -> io::Result<TestbedHandle> {
    let listener = bind(addr)?;
    let addr = listener.local_addr()?;
    let state = Arc::new(State::default());
    let task = tokio::spawn(accept_loop(
        listener,
        Arc::clone(&state),
        std::future::pending(),
        Duration::ZERO,
    ));
    Ok(TestbedHandle { addr, state, task })
}

/// Serves on an already-bound listener until `shutdown` resolves (used by the CLI).
///
/// Then it stops accepting, lets open connections finish their calls for up to
/// [`SHUTDOWN_GRACE`] (idle keep-alive connections close at once), cuts the rest and returns.
/// Accept errors are logged and retried, never returned; the `Result` is for future use.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    accept_loop(
        listener,
        Arc::new(State::default()),
        shutdown,
        SHUTDOWN_GRACE,
    )
    .await;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) {
    let builder = Arc::new(builder());
    // Flips to true once: connections then shut down gracefully.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(
                        stream,
                        Arc::clone(&builder),
                        Arc::clone(&state),
                        stop_rx.clone(),
                    ));
                }
                Err(error) => {
                    warn!(error = %error, "testbed accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        debug!(
            cut = connections.len(),
            "testbed connections cut at shutdown"
        );
    }
    connections.shutdown().await;
}

/// The hyper-util auto builder: HTTP/1.1 with keep-alive, and h2c.
///
/// Not `pipeline_flush(true)`: in hyper 1.x it switches the connection to the flattening
/// write strategy (every body byte copied into one `Vec`) and skips flushes while request
/// bytes are buffered, which let one slow reader of `/bytes/104857600` hold the whole
/// 100 MiB body in memory. The default vectored strategy queues the static pattern slices.
fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().keep_alive(true);
    builder
}

async fn serve_connection(
    stream: TcpStream,
    builder: Arc<auto::Builder<TokioExecutor>>,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    // Small responses must not wait for Nagle's algorithm.
    if let Err(error) = stream.set_nodelay(true) {
        debug!(error = %error, "testbed set_nodelay failed");
    }
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(&state, req).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // The guard `wait_for` returns is not `Send`: drop it inside.
    let stopped = async {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopped => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        // Clients vanishing and `/truncate` aborting are both expected here.
        debug!(error = %error, "testbed connection ended with an error");
    }
}
