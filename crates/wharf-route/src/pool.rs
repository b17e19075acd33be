//! Connections to one backend: the address (TCP, TLS or a Unix socket) and how a new
//! connection is opened. Idle ones are kept by the backend's [`wharf_upstream::IdlePool`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use url::Host;
use wharf_upstream::{Connection, NameCache};

/// Where a backend is reached.
#[derive(Clone)]
pub(crate) enum Address {
    /// `http://host:port`.
    Tcp { host: Host<String>, port: u16 },
    /// `https://host:port`, verified against `name`.
    Tls {
        host: Host<String>,
        port: u16,
        name: ServerName<'static>,
        connector: TlsConnector,
    },
    /// `unix:/path` (the seeds' named pipe).
    Unix(PathBuf),
}

impl std::fmt::Debug for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp { host, port } => write!(f, "tcp {host}:{port}"),
            Address::Tls { host, port, .. } => write!(f, "tls {host}:{port}"),
            Address::Unix(path) => write!(f, "unix {}", path.display()),
        }
    }
}

/// Opens a new connection to `address`.
pub(crate) async fn connect(address: &Address) -> io::Result<Connection> {
    Ok(match address {
        Address::Tcp { host, port } => Connection::new(connect_tcp(host, *port).await?),
        Address::Tls {
            host,
            port,
            name,
            connector,
        } => {
            let tcp = connect_tcp(host, *port).await?;
            Connection::new(connector.connect(name.clone(), tcp).await?)
        }
        Address::Unix(path) => Connection::new(UnixStream::connect(path).await?),
    })
}

/// A TCP connection (with `TCP_NODELAY`) to the first address of `host` that accepts one,
/// in the resolver's order. A name's addresses come from [`NameCache`]: a wave of new
/// connections to a backend makes one lookup, not one blocking thread each.
#[allow(clippy::disallowed_methods)] // backends are configured, not client-supplied: no SSRF guard
async fn connect_tcp(host: &Host<String>, port: u16) -> io::Result<TcpStream> {
    let addresses: Arc<[IpAddr]> = match host {
        Host::Ipv4(ip) => Arc::from([IpAddr::from(*ip)]),
        Host::Ipv6(ip) => Arc::from([IpAddr::from(*ip)]),
        Host::Domain(name) => NameCache::system().addresses(name).await?,
    };
    let mut last_error = None;
    for ip in addresses.iter() {
        match TcpStream::connect(SocketAddr::new(*ip, port)).await {
            Ok(tcp) => {
                tcp.set_nodelay(true)?;
                return Ok(tcp);
            }
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolved to no address"),
        )
    }))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the test's own listener
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[tokio::test]
    async fn backends_are_reached_by_name_and_by_literal() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        for host in ["127.0.0.1", "localhost", "LOCALHOST"] {
            let tcp = connect_tcp(&Host::parse(host).unwrap(), port).await;
            let tcp = tcp.unwrap_or_else(|e| panic!("{host}: {e}"));
            assert!(tcp.nodelay().unwrap(), "{host}: TCP_NODELAY set");
            let (accepted, _) = listener.accept().await.unwrap();
            assert_eq!(accepted.peer_addr().unwrap(), tcp.local_addr().unwrap());
        }
    }

    #[tokio::test]
    async fn a_bracketed_ipv6_literal_is_an_address_not_a_name() {
        // Nothing listens on this port of ::1 (or IPv6 is off): either way the connect is
        // tried, where the name "[::1]" would have failed in the resolver.
        let error = connect_tcp(&Host::parse("[::1]").unwrap(), 9)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::AddrNotAvailable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::HostUnreachable
            ),
            "{error:?}"
        );
    }
}
