//! The proxy's only way to an origin: resolve, check every address, then connect to one of them.
//!
//! [`GuardedConnector::connect`] resolves the name itself (through [`NameCache`]) and hands
//! [`DestinationPolicy::check_addr`] every resolved address before connecting to any, so the
//! address checked is the address connected to (no DNS rebinding between check and connect).
//! TLS and HTTP are the origin client's (`crate::origin`); no proxy environment variable
//! is read anywhere.
//!
//! Failures are [`ConnectError`]s, which the proxy answers with 403 (refused), 504 (timeout)
//! or 502 (the rest).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use url::Host;
use wharf_upstream::NameCache;

use crate::destination::{DestinationPolicy, Refusal};

/// Connects to origins only at addresses the policy allows.
///
/// It resolves the name itself, checks EVERY resolved address (a name resolving to both public
/// and private addresses is a rebinding attempt and is refused whole), then tries the checked
/// addresses in order until one connects, all within `connect_timeout` (resolution included).
/// IP-literal hosts skip DNS. The stream has `TCP_NODELAY` set.
#[derive(Debug, Clone)]
pub struct GuardedConnector {
    /// The rules every destination is held to.
    policy: Arc<DestinationPolicy>,
    /// Budget for resolution plus connection attempts, across all addresses.
    connect_timeout: Duration,
}

/// Why the connector produced no connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The destination policy refused the host or one of its addresses (→ 403).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Name resolution failed (→ 502).
    #[error("cannot resolve {host}")]
    Resolve {
        /// The name looked up.
        host: String,
        /// The resolver's error.
        source: io::Error,
    },
    /// The name resolved to no address at all (→ 502).
    #[error("{0} resolved to no address")]
    NoAddress(String),
    /// Resolution plus connection attempts took longer than the connect timeout (→ 504).
    #[error("origin {host}: no connection after {after:?}")]
    Timeout {
        /// The origin host (and port).
        host: String,
        /// The connect timeout that ran out.
        after: Duration,
    },
    /// Every address refused the connection; this is the last address tried (→ 502).
    #[error("connect to {addr}")]
    Io {
        /// The address of the last attempt.
        addr: SocketAddr,
        /// The socket error.
        source: io::Error,
    },
}

impl GuardedConnector {
    /// A connector holding every destination to `policy`, giving up after `connect_timeout`.
    pub fn new(policy: Arc<DestinationPolicy>, connect_timeout: Duration) -> Self {
        Self {
            policy,
            connect_timeout,
        }
    }

    /// A TCP connection (with `TCP_NODELAY`) to `host`:`port`, after the policy allowed the
    /// host and every address it resolves to; resolution and connection attempts together
    /// within the connect timeout.
    pub async fn connect(&self, host: Host<&str>, port: u16) -> Result<TcpStream, ConnectError> {
        let name = match &host {
            Host::Ipv6(ip) => format!("[{ip}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        self.policy.check_host(&host, Some(port))?;
        let deadline = Instant::now() + self.connect_timeout;
        let timed_out = || ConnectError::Timeout {
            host: name.clone(),
            after: self.connect_timeout,
        };
        let addrs = timeout_at(deadline, resolve(&host, port))
            .await
            .map_err(|_| timed_out())??;
        check_all(&self.policy, &name, &addrs)?;

        let mut last_error = None;
        for addr in addrs {
            // Connect to ::ffff:a.b.c.d as a.b.c.d: the address checked, in its plain form.
            let addr = SocketAddr::new(addr.ip().to_canonical(), addr.port());
            match timeout_at(deadline, connect_to(addr)).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(stream)) => {
                    tracing::debug!(host = %name, addr = %addr, "origin connected");
                    return Ok(stream);
                }
                Ok(Err(source)) => {
                    tracing::debug!(host = %name, addr = %addr, error = %source, "origin connect failed");
                    last_error = Some(ConnectError::Io { addr, source });
                }
            }
        }
        Err(last_error.unwrap_or(ConnectError::NoAddress(name)))
    }
}

/// The addresses of `host`: the literal itself, or what the system resolver returns (held
/// for a while and shared by concurrent connects: [`NameCache`]).
async fn resolve(host: &Host<&str>, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
    let name = match host {
        Host::Ipv4(ip) => return Ok(vec![SocketAddr::new((*ip).into(), port)]),
        Host::Ipv6(ip) => return Ok(vec![SocketAddr::new((*ip).into(), port)]),
        Host::Domain(name) => *name,
    };
    let addrs: Vec<SocketAddr> = NameCache::system()
        .addresses(name)
        .await
        .map_err(|source| ConnectError::Resolve {
            host: name.to_owned(),
            source,
        })?
        .iter()
        .map(|ip| SocketAddr::new(*ip, port))
        .collect();
    tracing::debug!(host = %name, addrs = ?addrs, "origin resolved");
    Ok(addrs)
}

/// Refuses the whole destination if any address is refused: a name that resolves to public and
/// private addresses at once is a rebinding attempt, whichever address would be tried first.
fn check_all(
    policy: &DestinationPolicy,
    name: &str,
    addrs: &[SocketAddr],
) -> Result<(), ConnectError> {
    if addrs.is_empty() {
        return Err(ConnectError::NoAddress(name.to_owned()));
    }
    for addr in addrs {
        if let Err(refusal) = policy.check_addr(addr.ip()) {
            tracing::debug!(host = %name, addr = %addr, error = %refusal, "origin address refused");
            return Err(refusal.into());
        }
    }
    Ok(())
}

/// One TCP connection attempt to an address already checked.
#[allow(clippy::disallowed_methods)] // the SSRF connector is the one place that connects
async fn connect_to(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests dial their own loopback listeners directly
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn connector(allow_private: bool, allow_hosts: &[&str]) -> GuardedConnector {
        let hosts: Vec<String> = allow_hosts.iter().map(|h| h.to_string()).collect();
        GuardedConnector::new(
            Arc::new(DestinationPolicy::new(allow_private, &hosts)),
            TIMEOUT,
        )
    }

    /// A loopback listener whose accept queue can be inspected without waiting.
    fn listener() -> (TcpListener, u16) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    /// Whether a connection is waiting. A completed connect() has already queued it.
    fn accepted(listener: &TcpListener) -> bool {
        match listener.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("accept: {e}"),
        }
    }

    /// Connects to the host and port of `uri` (an http or https URL).
    async fn call(connector: GuardedConnector, uri: &str) -> Result<TcpStream, ConnectError> {
        let url = url::Url::parse(uri).unwrap();
        let port = url.port_or_known_default().unwrap();
        connector.connect(url.host().unwrap(), port).await
    }

    #[tokio::test]
    async fn refused_destinations_never_connect() {
        let (listener, port) = listener();
        for (host, refusal) in [
            ("127.0.0.1", "loopback"),
            ("127.1", "loopback"),
            ("2130706433", "loopback"),
            ("0x7f.0.0.1", "loopback"),
            ("[::ffff:127.0.0.1]", "ipv4-mapped"),
            ("[::ffff:7f00:1]", "ipv4-mapped"),
            ("[::1]", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("localhost", "local name"),
            ("LOCALHOST.", "local name"),
            ("a.b.localhost", "local name"),
        ] {
            for scheme in ["http", "https"] {
                let uri = format!("{scheme}://{host}:{port}/");
                let err = call(connector(false, &[]), &uri).await.unwrap_err();
                assert!(
                    matches!(&err, ConnectError::Refused(_)) && err.to_string().contains(refusal),
                    "{uri}: {err}"
                );
                assert!(!accepted(&listener), "{uri} reached the listener");
            }
        }
    }

    #[tokio::test]
    async fn allow_private_networks_connects_with_nodelay() {
        let (listener, port) = listener();
        for host in ["127.0.0.1", "127.1", "[::ffff:127.0.0.1]", "localhost"] {
            let uri = format!("http://{host}:{port}/");
            let stream = call(connector(true, &[]), &uri).await.unwrap();
            assert!(stream.nodelay().unwrap(), "{uri}");
            assert!(stream.peer_addr().unwrap().ip().is_loopback());
            assert!(accepted(&listener), "{uri} did not reach the listener");
        }
    }

    #[tokio::test]
    async fn allow_hosts_apply_in_the_connector() {
        let (listener, port) = listener();
        let allowed = format!("127.0.0.1:{port}");
        let uri = format!("http://127.0.0.1:{port}/");
        assert!(call(connector(true, &[&allowed]), &uri).await.is_ok());
        assert!(accepted(&listener));
        let err = call(connector(true, &["127.0.0.1:1"]), &uri)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConnectError::Refused(Refusal::NotAllowed(_))),
            "{err}"
        );
        assert!(!accepted(&listener));
    }

    #[test]
    fn every_resolved_address_is_checked() {
        let policy = DestinationPolicy::new(false, &[]);
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let public = [addr("8.8.8.8:80"), addr("[2606:4700::1111]:80")];
        assert!(check_all(&policy, "rebind.test:80", &public).is_ok());
        for bad in [
            "127.0.0.1:80",
            "10.0.0.1:80",
            "[::1]:80",
            "[fd00::1]:80",
            "[::ffff:a9fe:a9fe]:80",
        ] {
            // Public first, private after: still refused as a whole (DNS rebinding).
            let mixed = [public[0], addr(bad), public[1]];
            let err = check_all(&policy, "rebind.test:80", &mixed).unwrap_err();
            assert!(matches!(err, ConnectError::Refused(_)), "{bad}: {err}");
        }
        assert!(matches!(
            check_all(&policy, "empty.test:80", &[]),
            Err(ConnectError::NoAddress(_))
        ));
        let open = DestinationPolicy::new(true, &[]);
        assert!(check_all(&open, "rebind.test:80", &[addr("127.0.0.1:80")]).is_ok());
    }

    #[tokio::test]
    async fn closed_port_is_an_io_error() {
        let (listener, port) = listener();
        drop(listener);
        let err = call(connector(true, &[]), &format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ConnectError::Io { addr, .. } if addr.port() == port),
            "{err}"
        );
    }

    #[tokio::test]
    async fn connect_timeout_when_the_accept_queue_is_full() {
        // A listener with backlog 0 that never accepts: once its queue is full, Linux drops
        // further SYNs, so a connect hangs. Stays on loopback.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        let mut stalled = false;
        for _ in 0..16 {
            match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => fillers.push(stream),
                Ok(Err(_)) => break,
                Err(_) => {
                    stalled = true;
                    break;
                }
            }
        }
        assert!(
            stalled,
            "Linux stalls a connect to a full backlog; this one did not"
        );
        let after = Duration::from_millis(300);
        let connector = GuardedConnector::new(Arc::new(DestinationPolicy::new(true, &[])), after);
        let err = call(connector, &format!("http://{addr}/"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ConnectError::Timeout { after: a, .. } if *a == after),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("origin {addr}: no connection after 300ms")
        );
    }
}
