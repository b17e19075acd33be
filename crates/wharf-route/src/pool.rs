//! Connections to one backend: TCP, TLS or a Unix socket, HTTP/1.1 with
//! keep-alive, and the idle connections kept for reuse.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tracing::debug;

use crate::body::ForwardBody;

/// Idle connections kept per backend; beyond it, finished ones are closed.
const MAX_IDLE: usize = 256;

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

/// A TLS client config with the webpki roots and the ring provider.
pub(crate) fn tls_connector() -> Result<TlsConnector, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Idle connections of one backend.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<Vec<SendRequest<ForwardBody>>>,
}

impl Pool {
    /// A ready idle connection, if any (closed ones are dropped on the way).
    pub(crate) fn take_idle(&self) -> Option<SendRequest<ForwardBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|connection| !connection.is_closed());
        // Most recently used first: its socket is the least likely to have
        // been closed by the backend's idle timer. One still finishing its
        // last exchange stays for later.
        let ready = idle.iter().rposition(SendRequest::is_ready)?;
        Some(idle.swap_remove(ready))
    }

    /// Keeps a connection whose last response was read to the end.
    pub(crate) fn put(&self, connection: SendRequest<ForwardBody>) {
        if connection.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(connection);
        }
    }
}

/// Opens a new HTTP/1.1 connection to `address`.
pub(crate) async fn connect(address: &Address) -> io::Result<SendRequest<ForwardBody>> {
    let stream = match address {
        Address::Tcp { host, port } => {
            let tcp = TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            Stream::Tcp(tcp)
        }
        Address::Tls {
            host,
            port,
            name,
            connector,
        } => {
            let tcp = TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            Stream::Tls(Box::new(connector.connect(name.clone(), tcp).await?))
        }
        Address::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
    };
    let (send, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            debug!(error = %error, "backend connection ended with error");
        }
    });
    Ok(send)
}

/// A connected socket of any kind.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
