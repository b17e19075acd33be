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
//! Each core accepts from a listener of its own: the first core from a copy of the host's
//! (bound with `SO_REUSEPORT`), every other from one it binds to the same address, so the
//! kernel spreads new connections evenly over the cores, as nginx's `reuseport` and
//! HAProxy's default do. (One socket watched by every core's epoll left the spread to
//! whichever core woke first: 2:1 in a measured run.) The host then closes its own
//! descriptor of the first core's socket: its runtime's epoll watched it too, and woke one
//! of its threads for nothing at every connection for that core. `SO_REUSEPORT` also lets
//! another process of the same user bind the service address while wharf runs: the same
//! as those gateways.
//! The multi-threaded runtime keeps the rest: the admin listener, the Unix listener,
//! background tasks, and TCP too if no core could be started.
//!
//! The threads and their runtimes are made before the service port listens ([`prepare`], from
//! the start-up warm-up, which runs its sessions on them, or else from `HostBuilder::bind`),
//! and given their listeners when the host runs ([`start`]): a client that connects as soon
//! as the port accepts finds a core's thread waiting and warm, not one still being created
//! (0.4-0.7 ms after the port listened for the first core, up to 3 ms for the second,
//! traced in stop 22).
//!
//! Main items: [`prepare`], [`start`], [`on_host_listener`], [`wait_until_not_accepting`],
//! [`join`].

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tracing::warn;

use crate::accept::Acceptor;
use crate::busy_poll;
use crate::server::bind_tcp;
use crate::steering::{self, Balance, CoreBalance};

/// Blocking-pool threads of a core are kept this long when idle (as the main runtime's,
/// `src/main.rs`): a call after an idle gap finds one ready (seed 001).
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(24 * 3600);

/// A running core: its thread, and a signal that it stopped accepting.
pub(crate) struct Core {
    index: usize,
    thread: JoinHandle<()>,
    not_accepting: watch::Receiver<bool>,
}

/// A core's thread and runtime, made and waiting for its listener ([`start`]). Dropped
/// without being started, its thread ends.
pub(crate) struct Prepared {
    index: usize,
    /// The core's runtime, for registering its listener with the core's own epoll.
    handle: tokio::runtime::Handle,
    thread: JoinHandle<()>,
    start: oneshot::Sender<Start>,
}

impl Prepared {
    /// The core's runtime: a task spawned on it runs on the core's thread while the core
    /// waits for its start (the start-up warm-up's sessions do).
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

/// What a prepared core is started with.
struct Start {
    listener: TcpListener,
    /// With `server.cpu_steering`: the core's watch on its share of the open sessions.
    steering: Option<CoreBalance>,
    acceptor: Arc<Acceptor>,
    accepting: watch::Receiver<bool>,
    released: watch::Receiver<bool>,
    stopped_accepting: watch::Sender<bool>,
}

/// Makes `count` cores' threads and runtimes, each waiting for [`start`]. A core whose
/// runtime or thread cannot be made is logged and left out (see [`start`]).
/// With a non-zero `busy_poll`, each core keeps polling that long after it runs out of work
/// before it sleeps (see `busy_poll`).
pub(crate) fn prepare(count: usize, busy_poll: Duration) -> Vec<Prepared> {
    (0..count)
        .filter_map(|index| {
            spawn(index, busy_poll)
                .map_err(|error| left_out(index, &error))
                .ok()
        })
        .collect()
}

/// Starts the `prepared` cores accepting from `listener` until `accepting` turns true; each
/// then serves its sessions until `released` turns true (after the host's drain). With
/// `cpu_steering`, each core's listener takes the connections whose SYN came in on its CPU
/// (see `steering`); the listener's socket is shared with the host's. A core
/// whose listener cannot be made is logged and left out: the caller accepts on the host's
/// listener itself when the first core is not started ([`on_host_listener`]).
pub(crate) fn start(
    prepared: Vec<Prepared>,
    listener: &TcpListener,
    backlog: u32,
    cpu_steering: bool,
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
    let steering = cpu_steering.then(|| {
        let cores = prepared
            .iter()
            .map(|core| core.index + 1)
            .max()
            .unwrap_or(0);
        (steering::cpus_for(cores), Balance::new(cores))
    });
    prepared
        .into_iter()
        .filter_map(|core| {
            let source = if core.index == 0 {
                listener_copy(listener).map(Source::Copy)
            } else {
                Ok(Source::Bind(address, backlog))
            };
            // Registered here, with the core's runtime, so that a core either runs with its
            // listener or is not started.
            let registered = source.and_then(|source| {
                let _entered = core.handle.enter();
                source.listen()
            });
            let listener = match registered {
                Ok(listener) => listener,
                Err(error) => {
                    left_out(core.index, &error);
                    return None;
                }
            };
            let steering = steering.as_ref().and_then(|(cpus, balance)| {
                let cpu = cpus.get(core.index).copied().flatten()?;
                match steering::steer_listener(&listener, cpu) {
                    Ok(()) => Some(balance.core(core.index, cpu)),
                    Err(error) => {
                        warn!(core = core.index, cpu, error = %error, "cannot steer connections by CPU (server.cpu_steering); the kernel's hash spreads them");
                        None
                    }
                }
            });
            let (stopped_accepting, not_accepting) = watch::channel(false);
            let start = Start {
                listener,
                steering,
                acceptor: acceptor.clone(),
                accepting: accepting.clone(),
                released: released.clone(),
                stopped_accepting,
            };
            if core.start.send(start).is_err() {
                warn!(core = core.index, "a core's thread ended before it was started; the others serve its share of connections");
                return None;
            }
            Some(Core {
                index: core.index,
                thread: core.thread,
                not_accepting,
            })
        })
        .collect()
}

/// Logs that core `index` could not be made or started: the others serve its connections.
fn left_out(index: usize, error: &std::io::Error) {
    warn!(core = index, error = %error, "cannot start a core; the others serve its share of connections");
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

/// One core's thread: its runtime, waiting to be started; then its accept loop, then its
/// sessions until released.
fn spawn(index: usize, busy_poll: Duration) -> std::io::Result<Prepared> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().thread_keep_alive(BLOCKING_KEEP_ALIVE);
    if !busy_poll.is_zero() {
        builder.on_thread_park(move || busy_poll::before_park(busy_poll));
    }
    let runtime = builder.build()?;
    let handle = runtime.handle().clone();
    let (start, started) = oneshot::channel::<Start>();
    let thread = std::thread::Builder::new()
        .name(format!("wharf-core-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                if !busy_poll.is_zero() {
                    tokio::spawn(busy_poll::spin());
                }
                // Never started (the host was dropped before it ran): nothing to serve.
                let Ok(Start {
                    listener,
                    mut steering,
                    acceptor,
                    mut accepting,
                    mut released,
                    stopped_accepting,
                }) = started.await
                else {
                    return;
                };
                // The accept loop is a task of its own, not the future `block_on` polls: a
                // wake of that future writes the runtime's eventfd even from its own thread
                // (one system call for about every third connection of a burst), a task's
                // wake is a push onto the run queue.
                tokio::spawn(async move {
                    let stop = async {
                        let _ = accepting.wait_for(|stop| *stop).await;
                    };
                    let on_tcp_accept = || {
                        let (open, steering_on) = steering.as_mut()?.accepted_on(&listener, index);
                        if !steering_on {
                            steering = None;
                        }
                        Some(open)
                    };
                    acceptor
                        .accept_until(Some(&listener), std::future::pending, stop, on_tcp_accept)
                        .await;
                    drop(listener);
                    let _ = stopped_accepting.send(true);
                });
                // Sessions run on this runtime: keep driving them through the drain.
                let _ = released.wait_for(|released| *released).await;
            });
            // Dropping the runtime here cuts what the drain left.
        })?;
    Ok(Prepared {
        index,
        handle,
        thread,
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_cores_wait_for_their_start_and_end_when_dropped() {
        let prepared = prepare(2, Duration::ZERO);
        assert_eq!(prepared.len(), 2);
        std::thread::sleep(Duration::from_millis(50));
        for core in &prepared {
            assert!(
                !core.thread.is_finished(),
                "core {} did not wait",
                core.index
            );
            assert_eq!(
                core.thread.thread().name(),
                Some(format!("wharf-core-{}", core.index).as_str())
            );
        }
        // A host dropped before it ran: its cores' start senders go, and their threads end.
        let threads: Vec<JoinHandle<()>> = prepared.into_iter().map(|core| core.thread).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while threads.iter().any(|thread| !thread.is_finished()) {
            assert!(
                std::time::Instant::now() < deadline,
                "a never-started core's thread still runs 5 s after its host was dropped"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for thread in threads {
            assert!(
                thread.join().is_ok(),
                "a never-started core's thread panicked"
            );
        }
    }
}
