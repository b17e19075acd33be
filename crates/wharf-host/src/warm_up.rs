//! Start-up warm-up (seed 000): before the listeners are bound, a few calls go through a
//! private session on a loopback connection of the host's own making, so that the first
//! client's call does not pay for work a process does once: CPU feature detection (the
//! head parser's SIMD check runs `cpuid`, which traps to the hypervisor on a VM: 30-45 µs
//! here), the first run of the session, parser, dispatch, the host's layers and the
//! services' own code, and each thread's first buffers. The sessions run on the data
//! plane's cores, the threads that will serve TCP calls (every call once per core, the
//! cores side by side): a core's first call otherwise filled its allocator heap and its
//! kept buffers. Callgrind, a fresh process's first calls (pass-through, each on a new
//! connection): 98,588 and 81,731 instructions for each core's first call against ~37,000
//! after, with the warm-up on the main runtime; 57,372 and 37,333 with it on the cores.
//!
//! The warm-up never reaches the services clients call: it calls twins of them (built by
//! whoever builds the services, e.g. `wharf::warm_up`: a proxy that may fetch from a
//! testbed of its own on loopback and nothing else), mounted in a registry of the warm-up's own with
//! its own counters, so nothing of it shows on `/metrics` or `/debug/inflight`. The one
//! trace it leaves is real: the read buffers its sessions used stay as spares
//! (`wharf_read_buffers_total`).
//!
//! Main types: [`WarmUp`] (what to call), [`WarmUpReport`] (what happened);
//! [`crate::HostBuilder::warm_up`] runs it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use wharf_config::{LimitsConfig, ServerConfig};
use wharf_metrics::Metrics;

use crate::accept::Sessions;
use crate::call::Inflight;
use crate::connection::{spawn_plain, SessionLimits, SessionParts};
use crate::cores::Prepared;
use crate::dispatch::Dispatcher;
use crate::registry::Mount;
use crate::server::h2_builder;
use crate::service::HostService;
use crate::services::ServiceSet;

/// How long one warm-up call may take before it is given up (a warm one takes well
/// under a millisecond; start-up must not hang on a warm-up gone wrong).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The path of the call that no twin answers: the host's own 404, through the session.
const UNMOUNTED_PATH: &str = "/.wharf-warm-up/unmounted";
/// Queue room of a twin's bulkhead per chain: the calls of up to 256 cores wait, none is refused.
const QUEUED_PER_CHAIN: usize = 256;

/// The calls of a warm-up and the service twins that answer them.
pub struct WarmUp {
    services: ServiceSet,
    /// Sequences of calls (path and query): each in order, the sequences side by side.
    chains: Vec<Vec<String>>,
}

impl Default for WarmUp {
    fn default() -> Self {
        Self::new()
    }
}

impl WarmUp {
    /// A warm-up with no twins yet. Run as it is, it makes one call that no service
    /// answers (the host's 404), so the session, the parser and the writer run once.
    pub fn new() -> Self {
        Self {
            services: ServiceSet::new(Arc::new(Metrics::new()), Arc::new(Inflight::default())),
            chains: Vec::new(),
        }
    }

    /// The warm-up's own counters: what twins built for it count with.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.services.metrics()
    }

    /// Mounts `twin` with the host's layers (its own bulkhead from `limits`, counters,
    /// tracing, all the warm-up's own) and queues `chains` of calls (path and query) to it:
    /// the calls of a chain go one after another (a cache hit after its fill), chains go
    /// side by side, so the warm-up takes about as long as its longest chain. The twin's
    /// bulkhead gets room for at least one call per chain: the same code runs whatever its
    /// size, and a service configured for one call at a time must not turn the warm-up's
    /// own chains away from each other.
    pub fn mount<C: IntoIterator<Item = String>>(
        &mut self,
        name: &str,
        mount: Mount,
        limits: &LimitsConfig,
        twin: HostService,
        chains: impl IntoIterator<Item = C>,
    ) {
        let chains: Vec<Vec<String>> = chains
            .into_iter()
            .map(|chain| chain.into_iter().collect())
            .collect();
        // Every chain runs once per core, side by side: calls beyond the slots wait in the
        // queue (a warm-up call is never refused for the twin's size).
        let mut limits = limits.clone();
        limits.max_concurrent_calls = limits.max_concurrent_calls.max(chains.len());
        limits.max_queued_calls = limits.max_queued_calls.max(chains.len() * QUEUED_PER_CHAIN);
        limits.queue_timeout = limits.queue_timeout.max(CALL_TIMEOUT);
        self.services.mount(name, mount, &limits, twin);
        self.chains.extend(chains);
    }
}

/// How a warm-up went. A failed call is worth a warning, never a reason not to start:
/// the first client's call then pays for what the warm-up would have done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUpReport {
    /// Calls made.
    pub calls: usize,
    /// The calls that went wrong, with why: `"GET /path: reason"`, once each; a failure
    /// that more calls had (one per core) ends with how many: `" (2 calls)"`. A twin's
    /// call is expected to be answered 2xx, the host's own call (no twins) 404.
    pub failed: Vec<String>,
    /// How long the warm-up took.
    pub elapsed: Duration,
}

/// Runs `warm`'s chains of calls side by side, each call on a new loopback connection
/// served by a private session (the same code as an accepted TCP connection's) over the
/// warm-up's registry: every chain once on each of `cores` (the session on the core's
/// thread), or once on this runtime when there are none. Returns the report and the
/// warm-up ready to run again ([`crate::keep_warm`]).
pub(crate) async fn run(
    warm: WarmUp,
    server: &ServerConfig,
    limits: SessionLimits,
    cores: &[Prepared],
) -> (WarmUpReport, Rig) {
    let rig = Rig::new(warm, server, limits, cores);
    (rig.run().await, rig)
}

/// A warm-up set up to run, as often as asked: the private sessions' parts over the
/// twins' registry, the calls, and the cores they run on.
pub(crate) struct Rig {
    parts: SessionParts,
    sessions: Arc<Sessions>,
    /// One per chain and core: a run's calls all proceed side by side.
    slots: Arc<Semaphore>,
    chains: Vec<Vec<String>>,
    answer: Answer,
    /// Where the sessions run: each core's runtime, or this runtime (`None`).
    homes: Vec<Option<Handle>>,
    /// Kept as long as the rig: a dropped sender would read as "stop" to the sessions.
    _keep_serving: watch::Sender<bool>,
}

impl Rig {
    fn new(warm: WarmUp, server: &ServerConfig, limits: SessionLimits, cores: &[Prepared]) -> Self {
        let WarmUp {
            services,
            mut chains,
        } = warm;
        // Without twins, the one call is the host's own 404; else every call wants a 2xx.
        let answer = if chains.is_empty() {
            chains.push(vec![UNMOUNTED_PATH.to_owned()]);
            Answer::NotFound
        } else {
            Answer::Success
        };
        let homes = crate::on_cores::homes(cores);
        let sessions = Sessions::new(services.metrics().sessions(chains.len() * homes.len()));
        let (keep_serving, stop) = watch::channel(false);
        let parts = SessionParts {
            h2: Arc::new(h2_builder(server)),
            dispatcher: Arc::new(Dispatcher {
                registry: Arc::new(RwLock::new(Arc::new(services.into_registry()))),
                max_header_bytes: server.max_header_bytes,
            }),
            stop,
            limits,
        };
        let slots = Arc::new(Semaphore::new(chains.len() * homes.len()));
        Self {
            parts,
            sessions,
            slots,
            chains,
            answer,
            homes,
            _keep_serving: keep_serving,
        }
    }

    /// How long each core has been busy so far, by its runtime's count (empty when the
    /// calls run on this runtime: there are no cores).
    pub(crate) fn cores_busy(&self) -> Vec<Duration> {
        self.homes
            .iter()
            .flatten()
            .map(|core| core.metrics().worker_total_busy_duration(0))
            .collect()
    }

    /// Every chain once on each core, side by side.
    pub(crate) async fn run(&self) -> WarmUpReport {
        let started = Instant::now();
        let calls = self.chains.iter().map(Vec::len).sum::<usize>() * self.homes.len();
        let chains = self.homes.iter().flat_map(|home| {
            self.chains.iter().map(|chain| Chain {
                calls: chain,
                answer: self.answer,
                home: home.as_ref(),
            })
        });
        let chains = chains.map(|chain| run_chain(chain, &self.parts, &self.sessions, &self.slots));
        let failed = futures_util::future::join_all(chains)
            .await
            .into_iter()
            .flatten()
            .collect();
        WarmUpReport {
            calls,
            failed: once_each(failed, "calls"),
            elapsed: started.elapsed(),
        }
    }
}

/// The failures once each, in the order first seen, with how many `what` (calls, cores) had
/// each when more than one did (the same call fails alike on every core).
pub(crate) fn once_each(failed: Vec<String>, what: &str) -> Vec<String> {
    let mut counted: Vec<(String, usize)> = Vec::new();
    for failure in failed {
        match counted.iter_mut().find(|(seen, _)| *seen == failure) {
            Some((_, count)) => *count += 1,
            None => counted.push((failure, 1)),
        }
    }
    counted
        .into_iter()
        .map(|(failure, count)| match count {
            1 => failure,
            _ => format!("{failure} ({count} {what})"),
        })
        .collect()
}

/// The status a warm-up call should get.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// A twin's: any 2xx.
    Success,
    /// The host's own, when no twin is mounted.
    NotFound,
}

impl Answer {
    fn accepts(self, status: u16) -> bool {
        match self {
            Answer::Success => (200..300).contains(&status),
            Answer::NotFound => status == 404,
        }
    }
}

/// One chain of calls, and where its sessions run.
struct Chain<'a> {
    calls: &'a [String],
    answer: Answer,
    /// The core whose runtime runs the sessions; `None`: this runtime.
    home: Option<&'a Handle>,
}

/// The calls of one chain, in order; returns what went wrong.
async fn run_chain(
    chain: Chain<'_>,
    parts: &SessionParts,
    sessions: &Arc<Sessions>,
    slots: &Arc<Semaphore>,
) -> Vec<String> {
    let mut failed = Vec::new();
    for path in chain.calls {
        let call = one_call(parts, sessions, slots, path, chain.home);
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(status)) if chain.answer.accepts(status) => {}
            Ok(Ok(status)) => failed.push(format!("GET {path}: status {status}")),
            Ok(Err(error)) => failed.push(format!("GET {path}: {error}")),
            Err(_elapsed) => failed.push(format!("GET {path}: no response after {CALL_TIMEOUT:?}")),
        }
    }
    failed
}

/// One call on a new loopback connection: its server side is handed to a session as an
/// accepted connection would be, on `home`'s runtime if given; returns the response's
/// status.
async fn one_call(
    parts: &SessionParts,
    sessions: &Arc<Sessions>,
    slots: &Arc<Semaphore>,
    path: &str,
    home: Option<&Handle>,
) -> std::io::Result<u16> {
    let (mut client, server, peer) = connected_pair().await?;
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let held = (sessions.opened(), slot, None);
    match home {
        Some(handle) => {
            // The socket moves to the core's own epoll, and the session is spawned there.
            let server = server.into_std()?;
            let _entered = handle.enter();
            spawn_plain(
                parts.clone(),
                TcpStream::from_std(server)?,
                Some(peer),
                held,
            );
        }
        None => spawn_plain(parts.clone(), server, Some(peer), held),
    }
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: wharf-warm-up\r\nconnection: close\r\n\r\n");
    client.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    client.read_to_end(&mut response).await?;
    status_of(&response).ok_or_else(|| {
        let start = String::from_utf8_lossy(&response[..response.len().min(40)]).into_owned();
        std::io::Error::other(format!("no HTTP/1.1 status line in {start:?}"))
    })
}

/// A connected pair of TCP streams over loopback: (client side, server side, client
/// address). The listener is made for this one call and closed after it, so that no
/// listener of the warm-up outlives its calls (keep-warm runs them for the process's life),
/// and calls side by side never take each other's connections. A connection from anyone
/// else that reaches it meanwhile is closed, never served.
async fn connected_pair() -> std::io::Result<(TcpStream, TcpStream, SocketAddr)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let (client, accepted) = tokio::join!(TcpSocket::new_v4()?.connect(addr), listener.accept());
    let client = client?;
    let ours = client.local_addr()?;
    let (mut server, mut peer) = accepted?;
    while peer != ours {
        drop(server);
        (server, peer) = listener.accept().await?;
    }
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server, peer))
}

/// The status code of an HTTP/1.1 response, from its first line.
fn status_of(response: &[u8]) -> Option<u16> {
    let rest = response.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.1 404 Not Found\r\n"), Some(404));
        assert_eq!(status_of(b"HTTP/1.0 200 OK\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 2"), None);
        assert_eq!(status_of(b""), None);
    }

    #[tokio::test]
    async fn a_pair_is_its_own_two_ends_and_leaves_no_listener_behind() {
        let (client, server, peer) = connected_pair().await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(server.peer_addr().unwrap(), client.local_addr().unwrap());
        let listened_on = client.peer_addr().unwrap();
        let refused = TcpSocket::new_v4().unwrap().connect(listened_on).await;
        assert_eq!(
            refused.map(|_| ()).map_err(|error| error.kind()),
            Err(std::io::ErrorKind::ConnectionRefused),
            "the call's listener is still open"
        );
    }
}
