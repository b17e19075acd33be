//! Helpers for integration tests: hosts and testbeds on ephemeral
//! 127.0.0.1 ports, a plain HTTP client that reports truncated bodies as
//! errors, a server that answers with canned raw bytes, and bounded polling
//! instead of fixed sleeps.
//!
//! Tests build what `wharf serve` builds (`wharf::build_host`) and hand it
//! to [`spawn_host`]; this crate knows the host, not the services.

// A test client dials the servers it started: clippy.toml's connect rules are for wharf's
// way to its upstreams.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use wharf_host::{Host, HostBuilder, Reloader, RunSummary};

pub use wharf_testbed::{expected_body, spawn as spawn_testbed, TestbedHandle};

/// A host serving in a background task until [`RunningHost::stop`] or drop.
pub struct RunningHost {
    /// The service listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin_addr: SocketAddr,
    /// Swaps the host's services (live reload).
    pub reloader: Reloader,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<RunSummary>>,
}

impl RunningHost {
    /// `http://ADDR` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `http://ADMIN` + `path`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr, path)
    }

    /// Signals shutdown and waits for the drain to finish.
    pub async fn stop(mut self) -> RunSummary {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let task = self.task.take().expect("the task is only taken by stop");
        task.await.expect("the host task does not panic")
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Binds `builder` (its config should use port 0) and serves it.
pub async fn spawn_host(builder: HostBuilder) -> RunningHost {
    let host = builder
        .bind()
        .await
        .expect("test host binds port 0 on 127.0.0.1");
    spawn_bound(host)
}

/// Serves an already bound host (after, e.g., setting its reload hook).
pub fn spawn_bound(host: Host) -> RunningHost {
    let (addr, admin_addr) = (host.local_addr(), host.admin_addr());
    let reloader = host.reloader();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(host.run(async move {
        let _ = rx.await;
    }));
    RunningHost {
        addr,
        admin_addr,
        reloader,
        shutdown: Some(tx),
        task: Some(task),
    }
}

/// A response read to its end.
#[derive(Debug)]
pub struct TestResponse {
    /// Status code.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The body, or the error that cut it short (a truncation).
    pub body: Result<Bytes, String>,
}

impl TestResponse {
    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The complete body; panics (test failure) on a truncated one.
    pub fn bytes(&self) -> &Bytes {
        match &self.body {
            Ok(bytes) => bytes,
            Err(error) => panic!("body truncated: {error}"),
        }
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.bytes()).expect("body is JSON")
    }
}

/// Sends `method url` with `headers` and `body` on a fresh connection and
/// reads the response to its end.
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Bytes) -> TestResponse {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(body))
        .expect("test request is valid");
    let response = client
        .request(request)
        .await
        .expect("request gets a response head");
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|error| format!("{error:?}"));
    TestResponse {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// `GET url` on a fresh connection, with extra request headers.
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> TestResponse {
    send("GET", url, headers, Bytes::new()).await
}

/// `GET url` on a fresh connection.
pub async fn get(url: &str) -> TestResponse {
    get_with(url, &[]).await
}

/// Sends raw bytes on a new connection and reads until the peer closes or
/// `timeout` passes; returns what was read.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to test server");
    stream.write_all(request).await.expect("write raw request");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(timeout, stream.read_to_end(&mut out)).await;
    out
}

/// What a [`canned_server`] does with a connection after answering a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAnswer {
    /// Answers every further request head on it the same way.
    KeepAlive,
    /// Closes it cleanly (FIN, not a reset).
    Close,
}

/// A running [`canned_server`]: its address, and the connections it accepted.
#[derive(Debug, Clone)]
pub struct CannedServer {
    /// The listener's address.
    pub addr: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CannedServer {
    /// `http://ADDR` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// TCP connections accepted so far (to check connection reuse).
    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A server on 127.0.0.1:0 that answers each request head (requests without a body)
/// with `response`, written as it is: for answers no real server would give, or fields
/// a test needs in a given form.
pub async fn canned_server(response: &'static [u8], after: AfterAnswer) -> CannedServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the canned server");
    let addr = listener.local_addr().expect("the canned server's address");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    while let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                        read.drain(..end + 4);
                        if stream.write_all(response).await.is_err() || after == AfterAnswer::Close
                        {
                            return;
                        }
                    }
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    CannedServer { addr, accepted }
}

/// A raw HTTP/1.1 response cut into its status line, its `(name, value)` field lines
/// (names in lower case, values trimmed, in order) and the bytes after the head.
pub fn split_response(raw: &[u8]) -> (String, Vec<(String, String)>, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8(raw[..end].to_vec()).expect("a UTF-8 response head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default().to_owned();
    let fields = lines
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("no colon in field line {line:?}"));
            (name.to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    (status, fields, raw[end + 4..].to_vec())
}

/// The values of the fields named `name` (lower case) among `fields`, in order.
pub fn values_of<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(field, _)| field == name)
        .map(|(_, value)| value.as_str())
        .collect()
}

/// Polls `check` every 10 ms until it returns true or `limit` passes;
/// returns whether it became true.
pub async fn poll_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Percent-encodes a URL for the proxy's `url` parameter.
pub fn encode(url: &str) -> String {
    let mut out = String::with_capacity(url.len() * 3);
    for byte in url.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
