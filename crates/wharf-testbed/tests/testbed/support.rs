//! Shared helpers: start a testbed, make requests, read JSON.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_testbed::TestbedHandle;

/// Upper bound for anything that should be quick; failures show up as a timeout, not a hang.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub(crate) async fn start() -> TestbedHandle {
    wharf_testbed::spawn("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub(crate) fn h2c_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A whole response.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        assert_eq!(self.header("content-type"), Some("application/json"));
        serde_json::from_slice(&self.body).unwrap()
    }

    pub(crate) fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

pub(crate) async fn get(tb: &TestbedHandle, path: &str) -> Reply {
    send(&client(), tb, Method::GET, path, &[], Bytes::new()).await
}

pub(crate) async fn send(
    client: &HttpClient,
    tb: &TestbedHandle,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    let mut req = Request::builder().method(method).uri(tb.url(path));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).unwrap();
    tokio::time::timeout(PATIENCE, async {
        let resp = client.request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    })
    .await
    .unwrap()
}

/// Asserts a 400 JSON error whose message names `param`.
pub(crate) fn assert_bad_request(reply: &Reply, param: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    let json = reply.json();
    assert_eq!(json["error"], "bad_request", "{json}");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains(param),
        "message {message:?} should name {param}"
    );
}

/// Sends `request` raw and reads until the server closes the connection.
pub(crate) async fn raw_exchange(tb: &TestbedHandle, request: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(tb.addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out))
        .await
        .expect("the server should close the connection")
        .expect("a close, not a reset");
    out
}

/// Splits a raw HTTP/1.1 response into its head (lowercased) and the bytes after it.
pub(crate) fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head")
        + 4;
    (
        String::from_utf8(raw[..end].to_vec())
            .unwrap()
            .to_lowercase(),
        &raw[end..],
    )
}
