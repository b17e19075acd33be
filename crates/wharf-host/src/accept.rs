//! The accept loop and the sessions it opens: takes a connection from a TCP listener (a
//! core's, or the host's) or the Unix one, within the session slots (`max_connections`, or
//! the open-files budget), counts it as an open session, and starts its task. Binding the
//! listeners and the drain are the server's ([`crate::server`]); what a session does is
//! [`crate::connection`]'s.
//!
//! Main types: [`Acceptor`] (the loop), [`Sessions`] (open sessions, for the gauges, the
//! drain and the open-files ledger), [`SessionGuard`] (one of them).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::warn;
use wharf_limits::descriptors::DescriptorLedger;
use wharf_metrics::SessionMetrics;

use crate::connection::{spawn_plain, spawn_tls, Held, SessionParts};
use crate::steering::OpenSession;

/// Open sessions, for the session gauges and the drain.
pub(crate) struct Sessions {
    open: AtomicUsize,
    /// Notified when the last session closes.
    all_closed: Notify,
    metrics: SessionMetrics,
    /// The process's open-files ledger: every open session may need two descriptors, which
    /// idle upstream connections give back (`wharf_limits::descriptors`).
    ledger: Arc<DescriptorLedger>,
}

impl Sessions {
    pub(crate) fn new(metrics: SessionMetrics) -> Arc<Self> {
        Self::on_ledger(metrics, DescriptorLedger::process())
    }

    /// Sessions counted on `ledger` (a test's own; the host uses the process's).
    fn on_ledger(metrics: SessionMetrics, ledger: Arc<DescriptorLedger>) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            all_closed: Notify::new(),
            metrics,
            ledger,
        })
    }

    pub(crate) fn opened(self: &Arc<Self>) -> SessionGuard {
        let open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        self.metrics.set_active(open);
        self.ledger.session_opened();
        SessionGuard(self.clone())
    }

    /// Sessions open now.
    pub(crate) fn open_now(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Returns once no session is open.
    pub(crate) async fn until_all_closed(&self) {
        loop {
            let closed = self.all_closed.notified();
            if self.open_now() == 0 {
                return;
            }
            closed.await;
        }
    }
}

/// One open session, counted (here and on the open-files ledger) until dropped.
pub(crate) struct SessionGuard(Arc<Sessions>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let sessions = &self.0;
        sessions.ledger.session_closed();
        let open = sessions.open.fetch_sub(1, Ordering::AcqRel) - 1;
        sessions.metrics.set_active(open);
        if open == 0 {
            sessions.all_closed.notify_waiters();
        }
    }
}

/// What an accept loop needs besides its listener: the session slots, and what a session
/// starts with.
pub(crate) struct Acceptor {
    /// One permit per session admitted (`max_connections`, or the open-files budget).
    slots: Arc<Semaphore>,
    sessions: Arc<Sessions>,
    tls: Option<TlsAcceptor>,
    parts: SessionParts,
}

impl Acceptor {
    /// An accept loop's shared state: `max_sessions` slots, counted on `sessions`, each
    /// session started with `parts` (and over TLS when `tls` is set).
    pub(crate) fn new(
        max_sessions: usize,
        sessions: Arc<Sessions>,
        tls: Option<TlsAcceptor>,
        parts: SessionParts,
    ) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_sessions)),
            sessions,
            tls,
            parts,
        }
    }

    /// Accepts connections (from `listener`, and from what `unix` gives) until `stop`, calling
    /// `on_tcp_accept` for each TCP connection taken (a core's steering watch): what it
    /// returns is held by the session until it ends.
    pub(crate) async fn accept_until<U>(
        &self,
        listener: Option<&TcpListener>,
        unix: impl Fn() -> U,
        stop: impl Future<Output = ()>,
        mut on_tcp_accept: impl FnMut() -> Option<OpenSession>,
    ) where
        U: Future<Output = std::io::Result<UnixStream>>,
    {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                () = self.accept_one(listener, unix(), &mut on_tcp_accept) => {}
            }
        }
    }

    /// Accepts one connection (from `listener`, or from `unix`), takes a session slot for
    /// it and starts its session on the runtime this runs on. Beyond the slots, new
    /// connections wait in the kernel's backlog, and each accept loop holds at most the one
    /// it accepted until a slot frees. (The slot is taken after the accept: with a listener
    /// per core, a loop holding a slot while its own queue is empty would keep it from a
    /// connection queued at another core.)
    async fn accept_one(
        &self,
        listener: Option<&TcpListener>,
        unix: impl Future<Output = std::io::Result<UnixStream>>,
        on_tcp_accept: &mut impl FnMut() -> Option<OpenSession>,
    ) {
        let tcp = async {
            match listener {
                Some(listener) => listener.accept().await,
                None => std::future::pending().await,
            }
        };
        let accepted = tokio::select! {
            accepted = tcp => accepted.map(|(stream, peer)| Accepted::Tcp(stream, peer)),
            accepted = unix => accepted.map(Accepted::Unix),
        };
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and friends: back off briefly instead of spinning.
                warn!(error = %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                return;
            }
        };
        let on_core = match accepted {
            Accepted::Tcp(..) => on_tcp_accept(),
            Accepted::Unix(_) => None,
        };
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            return std::future::pending().await; // the semaphore is never closed
        };
        let held: Held = (self.sessions.opened(), slot, on_core);
        let parts = self.parts.clone();
        match accepted {
            Accepted::Tcp(stream, peer) => {
                // Linux gives accepted sockets the listener's TCP_NODELAY (set in bind_tcp):
                // one system call less per connection (issue 4's burst).
                #[cfg(not(target_os = "linux"))]
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(peer = %peer, error = %error, "cannot set TCP_NODELAY");
                }
                match &self.tls {
                    Some(tls) => spawn_tls(parts, tls.clone(), stream, peer, held),
                    None => spawn_plain(parts, stream, Some(peer), held),
                }
            }
            Accepted::Unix(stream) => spawn_plain(parts, stream, None, held),
        }
    }
}

/// A connection just accepted.
enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Unix(UnixStream),
}

/// Accepts on the Unix listener, or never when there is none.
pub(crate) async fn accept_unix(
    unix: Option<&(UnixListener, PathBuf)>,
) -> std::io::Result<UnixStream> {
    match unix {
        Some((listener, _)) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_metrics::Metrics;

    /// An idle pool's stand-in: holds `held` lent descriptors and gives them back.
    struct IdleStandIn {
        ledger: Arc<DescriptorLedger>,
        held: std::sync::Mutex<usize>,
    }

    impl wharf_limits::descriptors::Lender for IdleStandIn {
        fn recall(&self, wanted: usize) -> usize {
            let mut held = self.held.lock().unwrap();
            let given = wanted.min(*held);
            *held -= given;
            self.ledger.give_back(given);
            given
        }
    }

    #[test]
    fn an_opening_session_takes_its_descriptors_back_from_idle_connections() {
        let ledger = DescriptorLedger::unlimited();
        ledger.set_limit(Some(110), 10);
        assert!(ledger.lend(100), "no session open: all 100 may be lent");
        let idle = Arc::new(IdleStandIn {
            ledger: ledger.clone(),
            held: std::sync::Mutex::new(100),
        });
        let lender: Arc<dyn wharf_limits::descriptors::Lender> = idle.clone();
        ledger.register(Arc::downgrade(&lender));
        let sessions = Sessions::on_ledger(Metrics::new().sessions(10), ledger.clone());

        let guards: Vec<_> = (0..3).map(|_| sessions.opened()).collect();
        assert_eq!(
            *idle.held.lock().unwrap(),
            94,
            "two descriptors per session"
        );
        assert_eq!(ledger.overdrawn(), 0);
        drop(guards);
        assert!(
            ledger.lend(6),
            "closed sessions leave their descriptors to lend"
        );
        assert!(!ledger.lend(1));
    }
}
