//! The lean HTTP/1.1 client every scenario uses: `Endpoint`, `Conn`, [`CallError`].
//!
//! An `Endpoint` is a target URL resolved once, before anything is timed: the socket address,
//! the `Host` header and the origin-form request target are built up front, so a call costs a
//! `Uri` clone (a reference-count increment), one small header map and whatever hyper needs.
//! A URL may be a template: `{n}` is replaced by the call's sequence number (to make every
//! proxied URL distinct, for instance); then each request target is formatted, and the
//! scenarios that know their calls in advance build all requests before the clock starts.
//!
//! Connections are opened as a real client opens them: TCP connect (with `TCP_NODELAY`), an
//! HTTP/1.1 handshake on it, the connection driven by its own task. `Conn` keeps it for
//! keep-alive calls; `fresh_call` opens one for a single call. A call ends when the whole
//! body has been read (and dropped: nothing is kept). Only `http://` is spoken: TLS set-up is
//! not what these scenarios measure.
//!
//! Every failure is a [`CallError`]: connect errors, timeouts, non-2xx statuses and broken
//! responses alike. Scenarios count them; none is ever taken for a fast response.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, HOST, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::BenchError;

/// The request type every scenario sends: a GET without a body.
pub(crate) type Req = Request<Empty<Bytes>>;

/// The placeholder replaced by the call's sequence number in a URL template.
pub const CALL_NUMBER: &str = "{n}";

/// `user-agent` of every request.
const AGENT: HeaderValue = HeaderValue::from_static("wharf-bench");

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
    /// The HTTP exchange broke: handshake, closed connection, malformed or truncated response.
    #[error("http exchange failed")]
    Http(#[source] hyper::Error),
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

/// How the request target is made for call number `n`.
#[derive(Debug)]
enum RequestTarget {
    /// The same origin-form target for every call.
    Fixed(Uri),
    /// Pieces of the origin-form target around each `{n}`.
    Numbered(Vec<String>),
}

/// A target URL resolved and pre-built for calls.
#[derive(Debug)]
pub(crate) struct Endpoint {
    url: String,
    addr: SocketAddr,
    host: HeaderValue,
    target: RequestTarget,
}

impl Endpoint {
    /// Parses `url` (an `http://` URL, `{n}` allowed in its path and query) and resolves its
    /// host once. `target` names the target in errors.
    pub(crate) async fn resolve(target: &str, url: &str) -> Result<Endpoint, BenchError> {
        let bad = |why: &str| BenchError::Url {
            target: target.to_owned(),
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let probe: Uri = url
            .replace(CALL_NUMBER, "0")
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        match probe.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(bad("https is not supported, use http://")),
            _ => return Err(bad("not an http:// URL")),
        }
        let authority = probe.authority().ok_or_else(|| bad("no host"))?;
        let with_one: Uri = url
            .replace(CALL_NUMBER, "1")
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        if with_one.authority() != Some(authority) {
            return Err(bad("{n} is allowed in the path and query only"));
        }
        if authority.as_str().contains('@') {
            return Err(bad("user:password@ is not supported"));
        }
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(80);
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = tokio::net::lookup_host((bare_host, port))
            .await
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
            })
            .map_err(|source| BenchError::Resolve {
                target: target.to_owned(),
                host: host.to_owned(),
                source,
            })?;
        let host_header =
            HeaderValue::from_str(authority.as_str()).map_err(|_| bad("host header"))?;
        // The origin form: everything after the authority.
        let after_scheme = url.find("://").map_or(url, |i| &url[i + 3..]);
        let rest = match after_scheme.find(['/', '?', '#']) {
            Some(i) if after_scheme[i..].starts_with('/') => after_scheme[i..].to_owned(),
            Some(i) => format!("/{}", &after_scheme[i..]),
            None => "/".to_owned(),
        };
        let rest = rest.split('#').next().unwrap_or("/");
        let request_target = if rest.contains(CALL_NUMBER) {
            RequestTarget::Numbered(rest.split(CALL_NUMBER).map(str::to_owned).collect())
        } else {
            RequestTarget::Fixed(
                rest.parse()
                    .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?,
            )
        };
        Ok(Endpoint {
            url: url.to_owned(),
            addr,
            host: host_header,
            target: request_target,
        })
    }

    /// The URL (template) as given.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The address calls connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The request for call number `n` (`n` only matters for a template with `{n}`).
    pub(crate) fn request(&self, n: u64) -> Req {
        let uri = match &self.target {
            RequestTarget::Fixed(uri) => uri.clone(),
            RequestTarget::Numbered(parts) => {
                let mut text =
                    String::with_capacity(parts.iter().map(String::len).sum::<usize>() + 20);
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        text.push_str(&n.to_string());
                    }
                    text.push_str(part);
                }
                Uri::try_from(text).expect("digits in place of {n} keep a checked URI valid")
            }
        };
        let mut req = Request::new(Empty::new());
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(USER_AGENT, AGENT);
        req
    }

    /// Opens a new connection: TCP connect, then the HTTP/1.1 handshake.
    pub(crate) async fn connect(&self) -> Result<Conn, CallError> {
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(|source| CallError::Connect {
                addr: self.addr,
                source,
            })?;
        // Small requests must leave at once, as a browser's do.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(CallError::Http)?;
        tokio::spawn(async move {
            // Errors surface on the request side; this only drives the socket.
            let _ = connection.await;
        });
        Ok(Conn { sender })
    }
}

/// One open HTTP/1.1 connection, reused for keep-alive calls. Dropping it closes it.
#[derive(Debug)]
pub(crate) struct Conn {
    sender: SendRequest<Empty<Bytes>>,
}

impl Conn {
    /// Sends `req` and reads the whole response body; `Ok` only for a 2xx status.
    ///
    /// A non-2xx response is read to its end too, so the connection stays usable.
    pub(crate) async fn call(&mut self, req: Req) -> Result<(), CallError> {
        self.sender.ready().await.map_err(CallError::Http)?;
        let response = self
            .sender
            .send_request(req)
            .await
            .map_err(CallError::Http)?;
        let status = response.status();
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            frame.map_err(CallError::Http)?;
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(CallError::Status(status))
        }
    }

    /// Whether the server (or an error) closed the connection.
    pub(crate) fn is_closed(&self) -> bool {
        self.sender.is_closed()
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
    use super::*;

    #[tokio::test]
    async fn builds_origin_form_requests_with_host() {
        let ep = Endpoint::resolve("t", "http://127.0.0.1:9/a/b?x=1&n={n}#frag")
            .await
            .unwrap();
        let req = ep.request(42);
        assert_eq!(req.uri().to_string(), "/a/b?x=1&n=42");
        assert_eq!(req.headers()[HOST], "127.0.0.1:9");
        assert_eq!(ep.addr().port(), 9);
        let fixed = Endpoint::resolve("t", "http://127.0.0.1").await.unwrap();
        assert_eq!(fixed.request(0).uri().to_string(), "/");
        assert_eq!(fixed.addr().port(), 80);
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_call() {
        for url in [
            "https://127.0.0.1/",
            "ftp://127.0.0.1/",
            "127.0.0.1:80/x",
            "http://127.0.0.{n}/",
            "http://u:p@127.0.0.1/",
            "not a url",
        ] {
            let result = Endpoint::resolve("t", url).await;
            assert!(
                matches!(result, Err(BenchError::Url { .. })),
                "{url}: {result:?}"
            );
        }
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
