//! The origin client's connector: resolves, checks every address, then connects to one of them.
//!
//! [`GuardedConnector`] is a `tower::Service<http::Uri>` for hyper-util's legacy client. It does
//! its own name resolution and hands [`DestinationPolicy::check_addr`] every resolved address
//! before connecting to any, so the address checked is the address connected to (no DNS
//! rebinding between check and connect). TLS is left to hyper-rustls, which wraps it
//! ([`origin_client`] builds that stack); no proxy environment variable is read anywhere.
//!
//! Failures are [`ConnectError`]s; [`find_connect_error`] digs one out of a client error so the
//! proxy can answer 403 (refused), 504 (timeout) or 502 (the rest).

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use url::Host;

use crate::destination::{DestinationPolicy, Refusal};

/// How long an idle pooled origin connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

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
    /// The URI has no usable scheme or host (→ 502; the proxy builds URIs from checked URLs).
    #[error("bad origin uri: {0}")]
    BadUri(String),
}

impl GuardedConnector {
    /// A connector holding every destination to `policy`, giving up after `connect_timeout`.
    pub fn new(policy: Arc<DestinationPolicy>, connect_timeout: Duration) -> Self {
        Self {
            policy,
            connect_timeout,
        }
    }

    async fn connect(self, uri: Uri) -> Result<TokioIo<TcpStream>, ConnectError> {
        let (host, port) = target_of(&uri)?;
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
                    return Ok(TokioIo::new(stream));
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

/// The host and port a URI designates (default port from the scheme).
fn target_of(uri: &Uri) -> Result<(Host<String>, u16), ConnectError> {
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        Some(other) => return Err(ConnectError::BadUri(format!("{uri}: scheme {other:?}"))),
        None => return Err(ConnectError::BadUri(format!("{uri}: no scheme"))),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| ConnectError::BadUri(format!("{uri}: no host")))?;
    // The same WHATWG host parser as `parse_target`: numeric spellings become addresses here
    // too, so a name handed to DNS is never an address in disguise.
    let host = Host::parse(host).map_err(|e| ConnectError::BadUri(format!("{uri}: {e}")))?;
    Ok((host, uri.port_u16().unwrap_or(default_port)))
}

/// The addresses of `host`: the literal itself, or what the system resolver returns.
#[allow(clippy::disallowed_methods)] // the SSRF connector is the one place that resolves
async fn resolve(host: &Host<String>, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
    let name = match host {
        Host::Ipv4(ip) => return Ok(vec![SocketAddr::new((*ip).into(), port)]),
        Host::Ipv6(ip) => return Ok(vec![SocketAddr::new((*ip).into(), port)]),
        Host::Domain(name) => name,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
        .await
        .map_err(|source| ConnectError::Resolve {
            host: name.clone(),
            source,
        })?
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

impl tower::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// Walks an error's source chain and returns the [`ConnectError`] inside, if any.
///
/// The hyper-util client (and hyper-rustls) wrap connector errors; the proxy maps
/// [`ConnectError::Refused`] to 403, [`ConnectError::Timeout`] to 504 and the rest to 502.
pub fn find_connect_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a ConnectError> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<ConnectError>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// The proxy's origin client: http and https (rustls, ring, webpki roots) over a
/// [`GuardedConnector`], HTTP/1.1, with requests that carry no body.
pub type OriginClient = Client<hyper_rustls::HttpsConnector<GuardedConnector>, Empty<Bytes>>;

/// Idle keep-alive connections kept per origin. Without a bound, a burst
/// of slow calls (1000 in bench/compare.sh) leaves hundreds of idle
/// sockets behind and later pass-through calls measured at half the rate;
/// nginx keeps 64 per worker.
pub const MAX_IDLE_PER_ORIGIN: usize = 128;

/// Builds the [`OriginClient`]: keep-alive pool on (idle connections kept 90 s, at most
/// [`MAX_IDLE_PER_ORIGIN`] per origin), every new connection made by a [`GuardedConnector`]
/// holding to `policy`.
pub fn origin_client(policy: Arc<DestinationPolicy>, connect_timeout: Duration) -> OriginClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .expect("the ring provider supports rustls' default protocol versions")
        .https_or_http()
        .enable_http1()
        .wrap_connector(GuardedConnector::new(policy, connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .pool_max_idle_per_host(MAX_IDLE_PER_ORIGIN)
        .build(connector)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests dial their own loopback listeners directly
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

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

    async fn call(
        connector: GuardedConnector,
        uri: &str,
    ) -> Result<TokioIo<TcpStream>, ConnectError> {
        connector.oneshot(uri.parse().unwrap()).await
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
            assert!(stream.inner().nodelay().unwrap(), "{uri}");
            assert!(stream.inner().peer_addr().unwrap().ip().is_loopback());
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
    async fn bad_uris() {
        for uri in ["ftp://example.com/", "/relative", "unix://x/"] {
            let err = call(connector(true, &[]), uri).await.unwrap_err();
            assert!(matches!(err, ConnectError::BadUri(_)), "{uri}: {err}");
        }
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

    #[tokio::test]
    async fn client_errors_carry_the_refusal() {
        let (listener, port) = listener();
        let policy = Arc::new(DestinationPolicy::new(false, &[]));
        let plain: Client<GuardedConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
            .build(GuardedConnector::new(policy.clone(), TIMEOUT));
        let origin = origin_client(policy, TIMEOUT);
        for uri in [
            format!("http://127.0.0.1:{port}/"),
            format!("https://127.0.0.1:{port}/"),
            format!("http://localhost:{port}/"),
        ] {
            let uri: Uri = uri.parse().unwrap();
            let errors = [
                origin.get(uri.clone()).await.unwrap_err(),
                plain.get(uri.clone()).await.unwrap_err(),
            ];
            for err in errors {
                let found = find_connect_error(&err);
                assert!(
                    matches!(found, Some(ConnectError::Refused(_))),
                    "{uri}: {err:?}"
                );
            }
            assert!(!accepted(&listener));
        }
        let other = io::Error::other("unrelated");
        assert!(find_connect_error(&other).is_none());
    }

    #[tokio::test]
    async fn origin_client_fetches_from_an_allowed_origin() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "request cut short");
                request.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        let client = origin_client(Arc::new(DestinationPolicy::new(true, &[])), TIMEOUT);
        let response = client
            .get(format!("http://{addr}/x?y=1").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let request = server.await.unwrap();
        assert!(request.starts_with("GET /x?y=1 HTTP/1.1\r\n"), "{request}");
    }
}
