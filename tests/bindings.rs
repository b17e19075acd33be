//! Ways in: HTTP/1.1 and HTTP/2 over TLS (ALPN) and over a Unix socket.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use wharf_config::Config;

use crate::support::*;

/// A self-signed certificate for 127.0.0.1/localhost, written as PEM files.
struct TestCert {
    dir: std::path::PathBuf,
    der: rustls::pki_types::CertificateDer<'static>,
}

fn test_cert(name: &str) -> TestCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir = std::env::temp_dir().join(format!("wharf-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    TestCert {
        dir,
        der: cert.der().clone(),
    }
}

fn client_config(cert: &TestCert) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[tokio::test]
async fn tls_clients_are_served_over_http1_and_http2() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let cert = test_cert("ok");
    let server = server_table(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.dir.join("cert.pem").display().to_string(),
        cert.dir.join("key.pem").display().to_string(),
    ));
    let toml = format!(
        "{server}[services.all]\ntype = \"route\"\npath_prefix = \"/\"\nbackends = [\"http://{}\"]\n",
        testbed.addr()
    );
    let wharf = start_wharf(&toml).await;
    let url = format!("https://localhost:{}/echo", wharf.addr.port());
    for (http2, version) in [
        (false, http::Version::HTTP_11),
        (true, http::Version::HTTP_2),
    ] {
        let client = https_client(&cert, http2);
        let response = client.get(url.parse().unwrap()).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), version, "ALPN did not pick {version:?}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(echo["uri"], "/echo");
    }
    // A plain-HTTP client on the TLS port gets no answer, only a closed connection.
    let plain = raw_exchange(
        wharf.addr,
        b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n",
        std::time::Duration::from_secs(3),
    )
    .await;
    assert!(!String::from_utf8_lossy(&plain).contains("200 OK"));
}

/// A client of TLS with `cert` trusted, speaking only HTTP/2 or only HTTP/1.1.
fn https_client(
    cert: &TestCert,
    http2: bool,
) -> Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<Bytes>,
> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(cert))
        .https_only();
    let connector = if http2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    };
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector)
}

/// A pass-through call's origin fields and a hit's stored ones travel as wire lines to the
/// HTTP/1.1 writer; the HTTP/2 server writes from the header map: both must give the client
/// the same fields.
#[tokio::test]
async fn relayed_and_cached_fields_reach_http1_and_http2_clients() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let cert = test_cert("relay");
    let server = server_table(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.dir.join("cert.pem").display().to_string(),
        cert.dir.join("key.pem").display().to_string(),
    ));
    let toml = format!(
        "{server}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n"
    );
    let wharf = start_wharf(&toml).await;
    let origin = testbed.url("/headers?etag=%22v7%22&content-type=text%2Fx-relay&x-secret=1");
    let url = format!(
        "https://localhost:{}/proxy?url={}",
        wharf.addr.port(),
        encode(&origin)
    );
    for http2 in [false, true] {
        let response = https_client(&cert, http2)
            .get(url.parse().unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "http2: {http2}");
        let headers = response.headers();
        assert_eq!(headers["etag"], "\"v7\"", "http2: {http2}");
        assert_eq!(headers["content-type"], "text/x-relay", "http2: {http2}");
        assert_eq!(headers["x-cache"], "bypass", "http2: {http2}");
        assert!(headers.get("x-secret").is_none(), "http2: {http2}");
        assert_eq!(headers.get_all("date").iter().count(), 1, "http2: {http2}");
        let declared = headers
            .get("content-length")
            .map(|value| value.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(!body.is_empty());
        assert_eq!(
            declared,
            Some(body.len().to_string()),
            "the length comes from the body, http2: {http2}"
        );
    }
    // A cache hit's fields are kept as lines too (once per entry): the same for both.
    let cached = format!("{url}&cacheDuration=60");
    for (http2, expected) in [(false, "miss"), (false, "hit"), (true, "hit")] {
        let response = https_client(&cert, http2)
            .get(cached.parse().unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "http2: {http2}");
        let headers = response.headers();
        assert_eq!(headers["x-cache"], expected, "http2: {http2}");
        assert_eq!(headers["etag"], "\"v7\"", "http2: {http2}");
        assert_eq!(headers["content-type"], "text/x-relay", "http2: {http2}");
        assert!(headers.get("x-secret").is_none(), "http2: {http2}");
        assert_eq!(headers.get_all("date").iter().count(), 1, "http2: {http2}");
        if expected == "hit" {
            assert_eq!(headers["x-cache-tier"], "memory", "http2: {http2}");
            assert!(headers.contains_key("age"), "http2: {http2}");
        }
        let declared = headers
            .get("content-length")
            .map(|value| value.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(declared, Some(body.len().to_string()), "http2: {http2}");
    }
}

#[tokio::test]
async fn a_key_that_does_not_match_stops_the_start_with_the_reason() {
    let cert = test_cert("mismatch");
    let other = test_cert("other");
    let toml = server_table(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.dir.join("cert.pem").display().to_string(),
        other.dir.join("key.pem").display().to_string(),
    ));
    let config = Config::from_toml_str(&toml, "tls.toml").unwrap();
    let error = match wharf::build_host(&config).unwrap().bind().await {
        Ok(_) => panic!("a mismatched key was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("tls"), "{error}");
}

#[tokio::test]
async fn unix_socket_listener_serves_calls() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("wharf-listen-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("wharf.sock");
    let server = server_table(&format!(
        "listen_unix = {:?}\n",
        socket.display().to_string()
    ));
    let toml = format!(
        "{server}[services.all]\ntype = \"route\"\npath_prefix = \"/\"\nbackends = [\"http://{}\"]\n",
        testbed.addr()
    );
    let wharf = start_wharf(&toml).await;
    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("/echo")
        .header("host", "wharf")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["uri"], "/echo");
    // No client IP over a Unix socket: no x-forwarded-for is invented.
    assert!(!echo.to_string().contains("x-forwarded-for"), "{echo}");
    let summary = wharf.stop().await;
    assert_eq!(summary.calls_cut, 0);
    assert!(!socket.exists(), "the socket file was left behind");
}
