//! Connections to one backend: the address (TCP, TLS or a Unix socket) and how a new
//! connection is opened. Idle ones are kept by the backend's [`wharf_upstream::IdlePool`].

use std::io;
use std::path::PathBuf;

use rustls::pki_types::ServerName;
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use wharf_upstream::Connection;

/// Where a backend is reached.
#[derive(Clone)]
pub(crate) enum Address {
    /// `http://host:port`.
    Tcp { host: String, port: u16 },
    /// `https://host:port`, verified against `name`.
    Tls {
        host: String,
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
#[allow(clippy::disallowed_methods)] // backends are configured, not client-supplied: no SSRF guard
pub(crate) async fn connect(address: &Address) -> io::Result<Connection> {
    Ok(match address {
        Address::Tcp { host, port } => {
            let tcp = TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            Connection::new(tcp)
        }
        Address::Tls {
            host,
            port,
            name,
            connector,
        } => {
            let tcp = TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            Connection::new(connector.connect(name.clone(), tcp).await?)
        }
        Address::Unix(path) => Connection::new(UnixStream::connect(path).await?),
    })
}
