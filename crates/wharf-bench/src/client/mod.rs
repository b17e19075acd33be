//! The lean HTTP/1.1 client every scenario uses: `Endpoint`, `Conn`, [`CallError`].
//!
//! An `Endpoint` is a target URL resolved once, before anything is timed, with its request
//! bytes serialised up front (`endpoint.rs`): a call on a plain URL writes shared bytes; a
//! `{n}` template formats its number into the pieces around it (and the scenarios that know
//! their calls in advance build all requests before the clock starts).
//!
//! A `Conn` is one TCP connection (with `TCP_NODELAY`) and one reused read buffer. A call runs
//! entirely in the caller's task, with no connection task, channel or per-call allocation:
//! one write of the request, then reads until the response is complete (`response.rs`: the
//! head parsed with `httparse`, 1xx skipped, the body framed by `Content-Length`, chunked
//! encoding (`chunked.rs`) or the close, read through the buffer and dropped, or a long
//! `Content-Length` body's rest dropped in the kernel unread). The scenarios'
//! client thus costs little CPU per call, so it is not what limits a fast target (issue 4).
//! `Conn` keeps its connection for keep-alive calls while the server allows it;
//! `fresh_call` opens one for a single call, and `stamped_fresh_call` (`stamped.rs`) one whose
//! request leaves within the connect and whose response's arrival the kernel stamps. Only `http://` is spoken: TLS set-up is not what
//! these scenarios measure, and requests are GETs without a body.
//!
//! Every failure is a [`CallError`]: connect errors, timeouts, non-2xx statuses, socket
//! errors and broken responses ([`ResponseError`]) alike. Scenarios count them; none is ever
//! taken for a fast response.

mod chunked;
mod endpoint;
mod response;
mod stamped;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub(crate) use endpoint::{Endpoint, Req};
pub use response::ResponseError;
use response::ResponseReader;
pub(crate) use stamped::{stamped_fresh_call, stamping_on, StampingOn};

/// The placeholder replaced by the call's sequence number in a URL template.
pub const CALL_NUMBER: &str = "{n}";

/// Why one call failed. Each one is counted as an error, never as a response.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The TCP connection could not be made (refused, unreachable, out of ports or files).
    #[error("connect to {addr}")]
    Connect {
        /// The address tried.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// No complete response (headers and whole body) within the per-call timeout.
    #[error("no complete response within {0:?}")]
    Timeout(Duration),
    /// The response's status was not 2xx (its body was read all the same).
    #[error("status {0}")]
    Status(StatusCode),
    /// The socket failed (reset, broken pipe) while sending the request or reading the
    /// response.
    #[error("connection failed while {during}")]
    Io {
        /// `sending the request` or `reading the response`.
        during: &'static str,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The response was malformed or cut short (closed early, bad head or chunked framing).
    #[error("broken response")]
    Response(#[from] ResponseError),
    /// The task running the call ended without a result (a bug, or the runtime shutting down).
    #[error("call task ended without a result")]
    Lost,
}

impl CallError {
    /// `Display` of this error and of each of its sources, joined by `": "`.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

/// One open HTTP/1.1 connection, reused for keep-alive calls. Dropping it closes it.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    reader: ResponseReader,
    /// Whether the next call may use the connection: cleared when a call starts, set again
    /// only when its response ended cleanly and allowed reuse (so a call cut short by a
    /// timeout leaves it unusable).
    reusable: bool,
}

impl Conn {
    /// A connection on `stream`, ready for its first call.
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            reader: ResponseReader::new(),
            reusable: true,
        }
    }

    /// Sends `req` and reads the whole response body; `Ok` only for a 2xx status.
    ///
    /// A non-2xx response is read to its end too, so the connection stays usable.
    pub(crate) async fn call(&mut self, req: Req) -> Result<(), CallError> {
        self.reusable = false;
        self.stream
            .write_all(req.as_bytes())
            .await
            .map_err(|source| CallError::Io {
                during: "sending the request",
                source,
            })?;
        let response = self.reader.read(&mut self.stream).await?;
        self.reusable = response.reusable;
        if response.status.is_success() {
            Ok(())
        } else {
            Err(CallError::Status(response.status))
        }
    }

    /// Whether the connection cannot carry another call: the last response (or its failure)
    /// ended it, or the server closed it or sent something unasked since.
    pub(crate) fn is_closed(&self) -> bool {
        if !self.reusable {
            return true;
        }
        // A non-blocking look at the socket: nothing to read is the only good answer. (A
        // syscall only when the runtime saw it readable; then it also spares the read that
        // would have found it empty after the next write.)
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }
}

/// `fut` bounded by `timeout`: a late call is a [`CallError::Timeout`].
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(CallError::Timeout(timeout)))
}

/// One call on the keep-alive connection in `conn`, opening one first if there is none or the
/// server closed it (the connect is then part of the call), bounded by `timeout`.
///
/// After a failure other than a non-2xx status the connection is dropped, so the next call
/// starts afresh.
pub(crate) async fn keep_alive_call(
    conn: &mut Option<Conn>,
    endpoint: &Endpoint,
    req: Req,
    timeout: Duration,
) -> Result<(), CallError> {
    let result = bounded(timeout, async {
        let open = match conn.take() {
            Some(c) if !c.is_closed() => c,
            _ => endpoint.connect().await?,
        };
        conn.insert(open).call(req).await
    })
    .await;
    if matches!(result, Err(ref e) if !matches!(e, CallError::Status(_))) {
        *conn = None;
    }
    result
}

/// One call on a connection of its own (connect, request, whole body), bounded by `timeout`.
pub(crate) async fn fresh_call(
    endpoint: &Endpoint,
    req: Req,
    timeout: Duration,
) -> Result<(), CallError> {
    bounded(timeout, async {
        let mut conn = endpoint.connect().await?;
        conn.call(req).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// What a scripted server does after its last response.
    #[derive(Clone, Copy)]
    enum Then {
        /// Keeps the connection open (for a while).
        Hold,
        /// Closes it.
        Close,
        /// Sends bytes nobody asked for.
        Babble,
    }

    /// A server for one connection: each request head gets the next of `responses`, then
    /// `then`. Returns the endpoint to call it.
    async fn server(responses: Vec<&'static [u8]>, then: Then) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for response in responses {
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut buf = [0u8; 1024];
                    let n = socket.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                }
                seen.clear();
                socket.write_all(response).await.unwrap();
            }
            match then {
                Then::Hold => tokio::time::sleep(Duration::from_secs(10)).await,
                Then::Close => {}
                Then::Babble => {
                    socket.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        });
        Endpoint::resolve("t", &url).await.unwrap()
    }

    /// Whether `conn` reads as closed within 5 s (polled: the close arrives on its own time).
    async fn closes(conn: &Conn) -> bool {
        for _ in 0..500 {
            if conn.is_closed() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    #[tokio::test]
    async fn keeps_the_connection_while_the_server_allows() {
        let not_found = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        let last = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
        let ep = server(vec![OK, not_found, last], Then::Hold).await;
        let mut conn = ep.connect().await.unwrap();
        conn.call(ep.request(0)).await.unwrap();
        assert!(!conn.is_closed());
        let err = conn.call(ep.request(1)).await.unwrap_err();
        assert!(
            matches!(err, CallError::Status(StatusCode::NOT_FOUND)),
            "{err:?}"
        );
        assert!(!conn.is_closed(), "a non-2xx response keeps the connection");
        conn.call(ep.request(2)).await.unwrap();
        assert!(conn.is_closed(), "connection: close");
    }

    #[tokio::test]
    async fn sees_the_server_close_an_idle_connection() {
        let ep = server(vec![OK], Then::Close).await;
        let mut conn = ep.connect().await.unwrap();
        conn.call(ep.request(0)).await.unwrap();
        assert!(closes(&conn).await);
        // keep_alive_call then opens a new one: refused here, as nothing listens any more.
        let mut slot = Some(conn);
        let err = keep_alive_call(&mut slot, &ep, ep.request(1), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Connect { .. }), "{err:?}");
        assert!(slot.is_none());
    }

    #[tokio::test]
    async fn bytes_nobody_asked_for_end_the_connection() {
        let ep = server(vec![OK], Then::Babble).await;
        let mut conn = ep.connect().await.unwrap();
        conn.call(ep.request(0)).await.unwrap();
        assert!(closes(&conn).await);
    }

    #[tokio::test]
    async fn a_call_cut_short_leaves_the_connection_unusable() {
        let ep = server(
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc"],
            Then::Hold,
        )
        .await;
        let mut conn = ep.connect().await.unwrap();
        let result = bounded(Duration::from_millis(100), conn.call(ep.request(0))).await;
        assert!(matches!(result, Err(CallError::Timeout(_))), "{result:?}");
        assert!(conn.is_closed());
    }

    #[tokio::test]
    async fn closed_port_is_a_connect_error() {
        // Bind then drop: the port is free and refuses connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let ep = Endpoint::resolve("t", &format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap();
        let err = fresh_call(&ep, ep.request(0), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Connect { .. }), "{err:?}");
        assert!(err.chain().contains("refused"), "{}", err.chain());
    }
}
