//! The data plane's cores: one thread per runtime worker, each with a single-threaded tokio
//! runtime of its own, accepting from the shared listening socket. A TCP session stays on
//! the core that accepted it, with everything it spawns, as in nginx's and HAProxy's
//! worker model.
//!
//! Why: on the work-stealing runtime, whichever worker polls the I/O driver is woken for a
//! socket and runs the task it wakes, so one call moves between threads several times and
//! every move costs cache misses and atomics. Side by side on issue 4's 2-core machine
//! (1 KiB pass-through, 64 connections, no pinning), two one-worker wharf processes served
//! 94-96k req/s against 70-76k for one two-worker process; nginx 92-98k.
//!
//! Each core accepts from a listener of its own: the first core from the host's (bound
//! with `SO_REUSEPORT`), every other from one it binds to the same address, so the kernel
//! spreads new connections evenly over the cores, as nginx's `reuseport` and HAProxy's
//! default do. (One socket watched by every core's epoll left the spread to whichever core
//! woke first: 2:1 in a measured run.) `SO_REUSEPORT` also lets another process of the
//! same user bind the service address while wharf runs: the same as those gateways.
//! The multi-threaded runtime keeps the rest: the admin listener, the Unix listener,
//! background tasks, and TCP too if no core could be started.
//!
//! Main items: [`start`], [`on_host_listener`], [`wait_until_not_accepting`], [`join`].

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::warn;

use crate::server::{bind_tcp, Acceptor};

/// Blocking-pool threads of a core are kept this long when idle (as the main runtime's,
/// `src/main.rs`): a call after an idle gap finds one ready (seed 001).
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(24 * 3600);

/// A running core: its thread, and a signal that it stopped accepting.
pub(crate) struct Core {
    index: usize,
    thread: JoinHandle<()>,
    not_accepting: watch::Receiver<bool>,
}

/// Starts `count` cores accepting from `listener` until `accepting` turns true; each then
/// serves its sessions until `released` turns true (after the host's drain). Cores that
/// cannot be started are logged and left out: the caller accepts on the host's listener
/// itself when the first did not start ([`on_host_listener`]).
pub(crate) fn start(
    count: usize,
    listener: &TcpListener,
    backlog: u32,
    acceptor: &Arc<Acceptor>,
    accepting: &watch::Receiver<bool>,
    released: &watch::Receiver<bool>,
) -> Vec<Core> {
    let address = match listener.local_addr() {
        Ok(address) => address,
        Err(error) => {
            warn!(error = %error, "the service listener has no address; no cores");
            return Vec::new();
        }
    };
    (0..count)
        .filter_map(|index| {
            let source = if index == 0 {
                listener_copy(listener).map(Source::Copy)
            } else {
                Ok(Source::Bind(address, backlog))
            };
            let started = source.and_then(|source| {
                spawn(
                    index,
                    source,
                    acceptor.clone(),
                    accepting.clone(),
                    released.clone(),
                )
            });
            match started {
                Ok(core) => Some(core),
                Err(error) => {
                    warn!(core = index, error = %error, "cannot start a core; the others serve its share of connections");
                    None
                }
            }
        })
        .collect()
}

/// Whether a core accepts from the host's own listener (else the caller must: the kernel
/// gives that socket its share of the connections).
pub(crate) fn on_host_listener(cores: &[Core]) -> bool {
    cores.iter().any(|core| core.index == 0)
}

/// Waits until every core has stopped accepting and closed its copy of the listener.
pub(crate) async fn wait_until_not_accepting(cores: &[Core]) {
    for core in cores {
        let mut not_accepting = core.not_accepting.clone();
        // An error means the core's thread ended: it accepts nothing either.
        let _ = not_accepting.wait_for(|stopped| *stopped).await;
    }
}

/// Waits for the cores' threads to end (after `released`).
pub(crate) async fn join(cores: Vec<Core>) {
    for core in cores {
        let thread = core.thread;
        if let Ok(Err(_panic)) = tokio::task::spawn_blocking(move || thread.join()).await {
            warn!("a core's thread panicked");
        }
    }
}

/// Where a core's listener comes from.
enum Source {
    /// A duplicate of the host's listener (registered with the core's own epoll).
    Copy(StdListener),
    /// A listener of its own, bound to the host's address with this backlog.
    Bind(SocketAddr, u32),
}

impl Source {
    /// The listener, registered with the runtime entered.
    fn listen(self) -> std::io::Result<TcpListener> {
        match self {
            Source::Copy(copy) => TcpListener::from_std(copy),
            Source::Bind(address, backlog) => {
                bind_tcp("service", address, backlog, true).map_err(std::io::Error::other)
            }
        }
    }
}

/// A duplicate of the listening socket, for another runtime's epoll.
fn listener_copy(listener: &TcpListener) -> std::io::Result<StdListener> {
    use std::os::fd::AsFd;
    let copy = StdListener::from(listener.as_fd().try_clone_to_owned()?);
    // The duplicate shares the original's open file, non-blocking already; said again
    // since tokio requires it.
    copy.set_nonblocking(true)?;
    Ok(copy)
}

/// One core's thread: its runtime, its accept loop, then its sessions until released.
fn spawn(
    index: usize,
    source: Source,
    acceptor: Arc<Acceptor>,
    mut accepting: watch::Receiver<bool>,
    mut released: watch::Receiver<bool>,
) -> std::io::Result<Core> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()?;
    // Registered here, so that a core either runs with its listener or is not started.
    let listener = {
        let _entered = runtime.enter();
        source.listen()?
    };
    let (stopped_accepting, not_accepting) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name(format!("wharf-core-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                // The accept loop is a task of its own, not the future `block_on` polls: a
                // wake of that future writes the runtime's eventfd even from its own thread
                // (one system call for about every third connection of a burst), a task's
                // wake is a push onto the run queue.
                tokio::spawn(async move {
                    let stop = async {
                        let _ = accepting.wait_for(|stop| *stop).await;
                    };
                    acceptor
                        .accept_until(Some(&listener), std::future::pending, stop)
                        .await;
                    drop(listener);
                    let _ = stopped_accepting.send(true);
                });
                // Sessions run on this runtime: keep driving them through the drain.
                let _ = released.wait_for(|released| *released).await;
            });
            // Dropping the runtime here cuts what the drain left.
        })?;
    Ok(Core {
        index,
        thread,
        not_accepting,
    })
}
