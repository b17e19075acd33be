//! Routes (SPEC §4): matching, header rewrite seen by the backend, bodies
//! streamed byte for byte, failover and recovery, balancing, retry safety.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::*;

fn route_table(name: &str, prefix: &str, backends: &[String], extra: &str) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[services.{name}]\ntype = \"route\"\npath_prefix = \"{prefix}\"\nbackends = [{}]\n{extra}\n",
        list.join(", ")
    )
}

fn base(testbed: &TestbedHandle) -> String {
    format!("http://{}", testbed.addr())
}

/// Two testbeds behind one route at `prefix` with balancing `strategy`.
async fn two_backends(prefix: &str, strategy: &str) -> (TestbedHandle, TestbedHandle, RunningHost) {
    let a = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let b = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "two",
        prefix,
        &[base(&a), base(&b)],
        &format!("strategy = \"{strategy}\""),
    ))
    .await;
    (a, b, wharf)
}

fn echoed_header<'a>(echo: &'a serde_json::Value, name: &str) -> Vec<&'a str> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pair| {
            pair[0]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })
        .map(|pair| pair[1].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn backend_sees_rewritten_headers_and_the_path_unchanged() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "echo",
        "/echo",
        &[base(&testbed)],
        "set_headers = { \"x-via\" = \"wharf\" }\nremove_headers = [\"x-internal-token\"]",
    ))
    .await;
    let response = get_with(
        &wharf.url("/echo/deeper?q=1"),
        &[
            ("x-via", "client"),
            ("x-internal-token", "secret"),
            ("x-keep", "yes"),
            ("connection", "keep-alive"),
        ],
    )
    .await;
    // Forwarded as is: the testbed has nothing at /echo/deeper.
    assert_eq!(response.status, 404, "{:?}", response.body);
    let response = get_with(
        &wharf.url("/echo?q=1"),
        &[
            ("x-via", "client"),
            ("x-internal-token", "secret"),
            ("x-keep", "yes"),
            ("x-forwarded-for", "203.0.113.7"),
        ],
    )
    .await;
    assert_eq!(response.status, 200);
    let echo = response.json();
    assert_eq!(echo["uri"], "/echo?q=1");
    assert_eq!(echoed_header(&echo, "x-via"), vec!["wharf"]);
    assert!(echoed_header(&echo, "x-internal-token").is_empty());
    assert_eq!(echoed_header(&echo, "x-keep"), vec!["yes"]);
    assert_eq!(
        echoed_header(&echo, "x-forwarded-for"),
        vec!["203.0.113.7, 127.0.0.1"]
    );
    assert_eq!(echoed_header(&echo, "via"), vec!["1.1 wharf"]);
    assert!(
        response.header("via").contains("wharf"),
        "response via: {:?}",
        response.headers
    );
}

#[tokio::test]
async fn strip_prefix_forwards_the_rest_of_the_path() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "api",
        "/api",
        &[base(&testbed)],
        "strip_prefix = true",
    ))
    .await;
    let response = get(&wharf.url("/api/echo?x=2")).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["uri"], "/echo?x=2");
    assert_eq!(
        get(&wharf.url("/apiecho")).await.status,
        404,
        "prefix must match whole segments"
    );
}

#[tokio::test]
async fn one_mib_bodies_round_trip_byte_for_byte() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table("all", "/", &[base(&testbed)], "")).await;
    let upload: Vec<u8> = (0..1024 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let response = send(
        "POST",
        &wharf.url("/echo"),
        &[],
        Bytes::from(upload.clone()),
    )
    .await;
    assert_eq!(response.status, 200);
    let echo = response.json();
    assert_eq!(echo["body_len"], 1024 * 1024);
    assert_eq!(echo["body"].as_str().unwrap().as_bytes(), upload.as_slice());
    let download = get(&wharf.url("/bytes/1048576")).await;
    assert_eq!(
        download.bytes().as_ref(),
        expected_body(1024 * 1024).as_slice()
    );
}

#[tokio::test]
async fn method_and_header_matching() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "orders",
        "/echo",
        &[base(&testbed)],
        "methods = [\"GET\"]\nmatch_headers = { \"x-tenant\" = \"acme\" }",
    ))
    .await;
    assert_eq!(
        get_with(&wharf.url("/echo"), &[("X-Tenant", "acme")])
            .await
            .status,
        200
    );
    let wrong_tenant = get_with(&wharf.url("/echo"), &[("x-tenant", "other")]).await;
    assert_eq!(wrong_tenant.status, 404);
    assert_eq!(wrong_tenant.json()["error"], "not_found");
    let post = send(
        "POST",
        &wharf.url("/echo"),
        &[("x-tenant", "acme")],
        Bytes::new(),
    )
    .await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), "GET, HEAD");
    assert_eq!(testbed.hits("/echo"), 1);
}

/// Routes sharing a prefix: a request goes to the first route whose conditions hold (the
/// most specific first); when none holds, a route of that prefix answers (405 or 404), never
/// one of a shorter prefix.
#[tokio::test]
async fn routes_sharing_a_prefix_take_requests_by_their_conditions() {
    let acme = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let beta = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let rest = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let acme_route = route_table(
        "acme",
        "/echo",
        &[base(&acme)],
        "match_headers = { \"x-tenant\" = \"acme\" }",
    );
    let beta_route = route_table(
        "beta",
        "/echo",
        &[base(&beta)],
        "methods = [\"GET\"]\nmatch_headers = { \"x-tenant\" = \"beta\" }",
    );
    // The catch-all of /echo is written first and asked last.
    let config = [
        route_table("rest", "/echo", &[base(&rest)], ""),
        acme_route.clone(),
        beta_route.clone(),
    ]
    .concat();
    let wharf = start_wharf(&config).await;
    let hits = || (acme.hits("/echo"), beta.hits("/echo"), rest.hits("/echo"));

    let tenant = |name| [("x-tenant", name)];
    assert_eq!(
        get_with(&wharf.url("/echo"), &tenant("acme")).await.status,
        200
    );
    assert_eq!(hits(), (1, 0, 0));
    assert_eq!(
        get_with(&wharf.url("/echo"), &tenant("beta")).await.status,
        200
    );
    // Allowing GET allows HEAD: the same resource from the same backend.
    let head = send("HEAD", &wharf.url("/echo"), &tenant("beta"), Bytes::new()).await;
    assert_eq!(head.status, 200);
    assert_eq!(hits(), (1, 2, 0));
    // beta takes GETs only: a POST goes to the catch-all, as do other tenants.
    let post = send("POST", &wharf.url("/echo"), &tenant("beta"), Bytes::new()).await;
    assert_eq!(post.status, 200);
    assert_eq!(hits(), (1, 2, 1));
    assert_eq!(
        get_with(&wharf.url("/echo"), &tenant("zeta")).await.status,
        200
    );
    assert_eq!(get(&wharf.url("/echo")).await.status, 200);
    assert_eq!(hits(), (1, 2, 3));
    // HTTP/2 requests are chosen the same way (their fields arrive decoded, not parsed).
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let over_h2 = client
        .request(
            http::Request::get(wharf.url("/echo"))
                .header("x-tenant", "acme")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(over_h2.version(), http::Version::HTTP_2);
    assert_eq!(over_h2.status(), 200);
    assert_eq!(hits(), (2, 2, 3));
    drop(wharf);

    // Without a catch-all of their own, the routes answer for their prefix: the route whose
    // conditions failed only on the method with its 405, else a 404; a route of a shorter
    // prefix never takes what they decline.
    let config = [
        route_table("rest", "/", &[base(&rest)], ""),
        acme_route,
        beta_route,
        route_table(
            "beta_puts",
            "/echo",
            &[base(&beta)],
            "methods = [\"PUT\"]\nmatch_headers = { \"x-tenant\" = \"beta\" }",
        ),
    ]
    .concat();
    let wharf = start_wharf(&config).await;
    let post = send("POST", &wharf.url("/echo"), &tenant("beta"), Bytes::new()).await;
    assert_eq!(post.status, 405);
    // Every method a route of /echo takes this request with (RFC 9110 §15.5.6).
    assert_eq!(post.header("allow"), "GET, HEAD, PUT");
    for (method, who) in [("GET", "zeta"), ("POST", "zeta")] {
        let other = send(method, &wharf.url("/echo"), &tenant(who), Bytes::new()).await;
        assert_eq!(other.status, 404, "{method} {who}");
        assert_eq!(other.json()["error"], "not_found");
    }
    assert_eq!(hits(), (2, 2, 3), "a refused call reached a backend");
    assert_eq!(get(&wharf.url("/fast")).await.status, 200);
    assert_eq!(rest.hits("/fast"), 1, "other paths go to the root's route");
}

/// An HTTP/2 request's `:authority` is its host for routing and rewriting, as an HTTP/1.1
/// request's `Host`: `match_headers` on `host` choose by it, and `remove_headers` removes it.
#[tokio::test]
async fn an_http2_authority_is_the_host_routes_match_and_rewrite() {
    let named = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let rest = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let config = [
        route_table("rest", "/echo", &[base(&rest)], ""),
        route_table(
            "api",
            "/echo",
            &[base(&named)],
            "match_headers = { \"host\" = \"api.example\" }\nremove_headers = [\"host\"]",
        ),
    ]
    .concat();
    let wharf = start_wharf(&config).await;
    // An h2 connection to wharf whose requests name api.example.
    let tcp = tokio::net::TcpStream::connect(wharf.addr).await.unwrap();
    let (mut h2, connection) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut echo_over_h2 = async |authority: &str| {
        let response = h2
            .send_request(
                http::Request::get(format!("http://{authority}/echo"))
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()
    };
    let echo = echo_over_h2("api.example").await;
    assert_eq!((named.hits("/echo"), rest.hits("/echo")), (1, 0));
    // Removed, so the backend gets its own address, as for HTTP/1.1 clients.
    assert_eq!(
        echoed_header(&echo, "host"),
        vec![named.addr().to_string()],
        "{echo}"
    );
    let echo = echo_over_h2("other.example").await;
    assert_eq!((named.hits("/echo"), rest.hits("/echo")), (1, 1));
    assert_eq!(
        echoed_header(&echo, "host"),
        vec!["other.example"],
        "{echo}"
    );
}

#[tokio::test]
async fn round_robin_spreads_calls_evenly() {
    let (a, b, wharf) = two_backends("/fast", "round_robin").await;
    for _ in 0..10 {
        assert_eq!(get(&wharf.url("/fast")).await.status, 200);
    }
    assert_eq!((a.hits("/fast"), b.hits("/fast")), (5, 5));
}

#[tokio::test]
async fn least_outstanding_avoids_the_busy_backend() {
    let (a, b, wharf) = two_backends("/", "least_outstanding").await;
    // Occupy the first backend with a slow call, then fast calls go to b.
    let slow = tokio::spawn(get_owned(wharf.url("/slow?ms=1500")));
    assert!(poll_until(Duration::from_secs(5), || async { a.hits("/slow") == 1 }).await);
    for _ in 0..4 {
        assert_eq!(get(&wharf.url("/fast")).await.status, 200);
    }
    assert_eq!(b.hits("/fast"), 4, "fast calls went to the busy backend");
    assert_eq!(slow.await.unwrap().status, 200);
}

async fn get_owned(url: String) -> TestResponse {
    get(&url).await
}

#[tokio::test]
async fn failover_when_the_primary_dies_and_recovery_when_it_returns() {
    let primary = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let primary_addr = primary.addr();
    let backup = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "orders",
        "/fast",
        &[base(&primary), base(&backup)],
        "strategy = \"failover\"\nretries = 0",
    ))
    .await;
    assert_eq!(get(&wharf.url("/fast")).await.status, 200);
    assert_eq!(primary.hits("/fast"), 1);
    drop(primary);
    for _ in 0..5 {
        assert_eq!(
            get(&wharf.url("/fast")).await.status,
            200,
            "failover to the backup"
        );
    }
    assert_eq!(backup.hits("/fast"), 5);
    let page = String::from_utf8(get(&wharf.admin_url("/metrics")).await.bytes().to_vec()).unwrap();
    let errors = format!(
        "wharf_upstream_requests_total{{service=\"orders\",backend=\"http://{primary_addr}\",outcome=\"error\"}}"
    );
    assert!(
        page.lines()
            .any(|l| l.starts_with(&errors) && !l.ends_with(" 0")),
        "{page}"
    );

    // The primary comes back on the same address: after its ejection
    // period it is probed and takes calls again.
    let revived = spawn_testbed(primary_addr).await.unwrap();
    let back = poll_until(Duration::from_secs(15), || async {
        get(&wharf.url("/fast")).await;
        revived.hits("/fast") > 0
    })
    .await;
    assert!(back, "the primary was never used again");
}

/// A backend that answers one call on one connection and then goes away while
/// wharf holds that connection in its pool: the listener is already closed, and
/// the next request on the connection is read and left unanswered (a clean close).
async fn a_backend_that_dies_after_one_call() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        drop(listener);
        let mut buf = [0u8; 4096];
        let mut read_head = async |stream: &mut tokio::net::TcpStream| {
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            true
        };
        if !read_head(&mut stream).await {
            return;
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await;
        read_head(&mut stream).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_pooled_connection_found_closed_with_its_backend_gone_fails_over_without_retries() {
    // With `retries = 0` a request that reached a backend is not sent again. This one
    // never reached one: its pooled connection was closed before any answer and the
    // backend refuses new ones, so the backup takes it, as for a refused connect.
    let primary = a_backend_that_dies_after_one_call().await;
    let backup = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "orders",
        "/fast",
        &[primary, base(&backup)],
        "strategy = \"failover\"\nretries = 0",
    ))
    .await;
    let first = get(&wharf.url("/fast")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.bytes().as_ref(), b"ok");
    assert_eq!(
        get(&wharf.url("/fast")).await.status,
        200,
        "failover to the backup"
    );
    assert_eq!(backup.hits("/fast"), 1);
}

#[tokio::test]
async fn all_backends_down_gives_502() {
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let wharf = start_wharf(&route_table("r", "/x", &[format!("http://{dead}")], "")).await;
    let response = get(&wharf.url("/x")).await;
    assert_eq!(response.status, 502);
    assert_eq!(response.json()["error"], "bad_gateway");
}

#[tokio::test]
async fn a_post_whose_body_was_sent_is_never_retried_but_a_get_is() {
    let a = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let b = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "slow",
        "/slow",
        &[base(&a), base(&b)],
        "timeout = \"300ms\"\nretries = 1",
    ))
    .await;
    let started = Instant::now();
    let post = send(
        "POST",
        &wharf.url("/slow?ms=2000"),
        &[],
        Bytes::from_static(b"order #1"),
    )
    .await;
    assert_eq!(post.status, 504);
    assert_eq!(post.json()["error"], "gateway_timeout");
    assert!(poll_until(Duration::from_secs(3), || async { a.hits("/slow") == 1 }).await);
    assert_eq!(b.hits("/slow"), 0, "a POST whose body was sent was retried");
    assert!(started.elapsed() < Duration::from_secs(2));

    let get_response = get(&wharf.url("/slow?ms=2000")).await;
    assert_eq!(get_response.status, 504);
    assert!(
        poll_until(Duration::from_secs(3), || async { b.hits("/slow") == 1 }).await,
        "the idempotent GET was not retried"
    );
}

/// A GET with an HTTP/2 prior-knowledge client.
async fn get_over_http2(url: &str) -> http::Response<hyper::body::Incoming> {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    client
        .request(
            http::Request::get(url)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn http2_prior_knowledge_clients_are_served() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table("all", "/", &[base(&testbed)], "")).await;
    let response = get_over_http2(&wharf.url("/echo")).await;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["uri"], "/echo");
    // The client's :authority, as an HTTP/1.1 client's Host is passed (RFC 9113 §8.3.1),
    // not the backend's address.
    assert_eq!(
        echoed_header(&echo, "host"),
        vec![wharf.addr.to_string()],
        "{echo}"
    );
}

#[tokio::test]
async fn unix_socket_backend() {
    let dir = std::env::temp_dir().join(format!("wharf-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("backend.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let text = format!("unix says hi to {}", request.uri());
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(text),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let wharf = start_wharf(&route_table(
        "pipe",
        "/pipe",
        &[format!("unix:{}", socket.display())],
        "",
    ))
    .await;
    let response = get(&wharf.url("/pipe/x")).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    assert_eq!(response.bytes().as_ref(), b"unix says hi to /pipe/x");
}

#[tokio::test]
async fn sequential_calls_reuse_one_backend_connection() {
    let (backend, accepted) = counting_server(b"pooled").await;
    let wharf = start_wharf(&route_table("r", "/x", &[format!("http://{backend}")], "")).await;
    for _ in 0..20 {
        let response = get(&wharf.url("/x")).await;
        assert_eq!(response.bytes().as_ref(), b"pooled");
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "each call opened its own backend connection"
    );
}

#[tokio::test]
async fn large_bodies_arrive_whole_over_one_backend_connection() {
    // Past the first read of a response, a routed body is copied from the backend's socket
    // to the client's (the default) or, with `server.splice_bodies`, moved between them by
    // splice(2), as the proxy's pass-through bodies are; either way the backend connection
    // goes back to the pool at the body's end, and the bytes are the backend's.
    let body = large_patterned_body();
    for splice_bodies in [false, true] {
        let (backend, accepted) = counting_server(body).await;
        let wharf = start_wharf(&format!(
            "{}{}",
            server_table(&format!("splice_bodies = {splice_bodies}\n")),
            route_table("big", "/big", &[format!("http://{backend}")], "")
        ))
        .await;
        for i in 0..5 {
            let response = get(&wharf.url(&format!("/big/{i}"))).await;
            let what = format!("splice {splice_bodies}, call {i}");
            assert_eq!(response.status, 200, "{what}");
            assert_body_is(response.bytes(), body, &what);
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "splice {splice_bodies}: each body returned the backend connection for the next call"
        );
    }
}

#[tokio::test]
async fn a_large_body_cut_short_is_a_visible_truncation_and_frees_its_backend() {
    // least_outstanding keeps configuration order on ties: while a call counts against
    // `a`, the next goes to `b`. A body that ends (whole, or cut short past the part read
    // with the head) must stop counting against its backend.
    let (a, b, wharf) = two_backends("/", "least_outstanding").await;
    let fast_calls_go_to_a = |step: &'static str| {
        let wharf = &wharf;
        let (a, b) = (&a, &b);
        async move {
            let before = a.hits("/fast");
            for _ in 0..3 {
                assert_eq!(get(&wharf.url("/fast")).await.status, 200);
            }
            assert_eq!(
                (a.hits("/fast") - before, b.hits("/fast")),
                (3, 0),
                "after {step}, the call still counted against its backend"
            );
        }
    };
    let whole = get(&wharf.url("/bytes/300000")).await;
    assert_eq!(whole.bytes().as_ref(), expected_body(300_000).as_slice());
    assert_eq!(a.hits("/bytes/300000"), 1);
    fast_calls_go_to_a("a whole body").await;
    // Declares 600,000 bytes, sends 300,000, then the backend aborts the response.
    let cut = get(&wharf.url("/truncate?bytes=300000")).await;
    assert_eq!(cut.status, 200);
    assert!(cut.body.is_err(), "the truncation looked complete");
    assert_eq!(a.hits("/truncate"), 1);
    fast_calls_go_to_a("a body cut short").await;
}

/// wharf with a route `/r` to a backend that answers `answer` as written; `request` sent
/// raw on a connection of its own. Returns wharf and the response, split.
async fn through_a_route(
    answer: &'static [u8],
    request: &[u8],
) -> (RunningHost, (String, Vec<(String, String)>, Vec<u8>)) {
    let backend = canned_server(answer, AfterAnswer::KeepAlive).await;
    let wharf = start_wharf(&route_table("r", "/r", &[backend.url("")], "")).await;
    let raw = raw_exchange(wharf.addr, request, Duration::from_secs(5)).await;
    (wharf, split_response(&raw))
}

#[tokio::test]
async fn a_backend_answer_loses_its_hop_by_hop_fields_and_gains_via_after_the_backend_s() {
    let (wharf, (status, fields, body)) = through_a_route(
        b"HTTP/1.1 200 OK\r\n\
          Content-Type: text/plain\r\n\
          Connection: keep-alive, X-Hop\r\n\
          X-Hop: secret\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Authenticate: Basic\r\n\
          Upgrade: h2c\r\n\
          Via: 1.1 backend\r\n\
          X-Kept: Yes\r\n\
          Date: Mon, 01 Jan 2024 00:00:00 GMT\r\n\
          Content-Length: 5\r\n\
          \r\n\
          hello",
        b"GET /r/x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, b"hello");
    assert_eq!(values_of(&fields, "content-type"), ["text/plain"]);
    assert_eq!(values_of(&fields, "x-kept"), ["Yes"]);
    assert_eq!(values_of(&fields, "content-length"), ["5"]);
    // The backend's date, not a second one of wharf's.
    assert_eq!(
        values_of(&fields, "date"),
        ["Mon, 01 Jan 2024 00:00:00 GMT"]
    );
    // Each hop appends: the backend's entry first.
    assert_eq!(values_of(&fields, "via"), ["1.1 backend", "1.1 wharf"]);
    for hop_by_hop in ["x-hop", "keep-alive", "proxy-authenticate", "upgrade"] {
        assert!(
            values_of(&fields, hop_by_hop).is_empty(),
            "{hop_by_hop}: {fields:?}"
        );
    }
    // wharf's own connection option for this client, not the backend's.
    assert_eq!(values_of(&fields, "connection"), ["close"]);

    // The same answer to an HTTP/2 client, whose server writes from a map.
    let response = get_over_http2(&wharf.url("/r/x")).await;
    assert_eq!(response.version(), http::Version::HTTP_2);
    let headers = response.headers().clone();
    let via: Vec<_> = headers.get_all("via").iter().collect();
    assert_eq!(via, ["1.1 backend", "1.1 wharf"], "{headers:?}");
    assert_eq!(headers["x-kept"], "Yes");
    assert!(headers.get("x-hop").is_none(), "{headers:?}");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.as_ref(), b"hello");
}

#[tokio::test]
async fn a_head_answer_keeps_the_length_the_backend_stated() {
    let (_wharf, (status, fields, body)) = through_a_route(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: application/zip\r\n\r\n",
        b"HEAD /r/archive HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(values_of(&fields, "content-length"), ["1234"], "{fields:?}");
    assert_eq!(values_of(&fields, "content-type"), ["application/zip"]);
    assert!(body.is_empty(), "a HEAD answer has no body: {body:?}");
}

/// Reads from `stream` until a request head is complete; the head's text and the bytes read
/// past it.
async fn read_request_head(stream: &mut tokio::net::TcpStream) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut read = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&read[..end]).into_owned();
            return (head, read[end + 4..].to_vec());
        }
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the request head ended early: {read:?}");
        read.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn an_expect_100_continue_post_reaches_the_backend_whole_and_without_the_expectation() {
    // wharf answers the client's expectation itself (RFC 9110 §10.1.1): the backend gets the
    // body without being asked for a `100 Continue` that would look like the start of its
    // answer. Before, the call waited for the route's timeout and ended with 504.
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "echo",
        "/echo",
        &[base(&testbed)],
        "timeout = \"3s\"",
    ))
    .await;
    let upload: Vec<u8> = (0..300 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let response = send(
        "POST",
        &wharf.url("/echo"),
        &[("expect", "100-continue")],
        Bytes::from(upload.clone()),
    )
    .await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    let echo = response.json();
    assert_eq!(echo["body_len"], upload.len());
    assert!(
        echo["body"].as_str().unwrap().as_bytes() == upload.as_slice(),
        "the body's bytes"
    );
    assert!(
        echoed_header(&echo, "expect").is_empty(),
        "the expectation went upstream: {}",
        echo["headers"]
    );
}

#[tokio::test]
async fn a_backend_that_sends_100_continue_unasked_still_gets_the_whole_body() {
    // RFC 9110 §15.2: a client must parse a 1xx it did not ask for. An interim answer while
    // the request body is still coming is not the backend answering: the body goes on.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LEN: usize = 256 * 1024;
    const FIRST: usize = 16 * 1024;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = format!("http://{}", listener.local_addr().unwrap());
    let (continued, continue_sent) = tokio::sync::oneshot::channel();
    let (delivered, body_received) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let (head, mut body) = read_request_head(&mut stream).await;
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("content-length: {LEN}")),
            "{head}"
        );
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        let _ = continued.send(());
        let mut buf = [0u8; 16 * 1024];
        while body.len() < LEN {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the body ended at {} bytes", body.len());
            body.extend_from_slice(&buf[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nreceived")
            .await
            .unwrap();
        let _ = delivered.send(body);
        // Held open until wharf closes it.
        let _ = stream.read(&mut buf).await;
    });
    let wharf = start_wharf(&route_table("up", "/up", &[backend], "timeout = \"3s\"")).await;
    let upload: Vec<u8> = (0..LEN).map(|i| b'a' + (i % 26) as u8).collect();
    // The client holds the rest of its body until the backend's interim answer is out, so
    // that wharf sees it while the body is pending.
    let mut client = tokio::net::TcpStream::connect(wharf.addr).await.unwrap();
    let head = format!(
        "POST /up/x HTTP/1.1\r\nhost: a\r\ncontent-length: {LEN}\r\nconnection: close\r\n\r\n"
    );
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(&upload[..FIRST]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), continue_sent)
        .await
        .expect("the backend got the request head")
        .unwrap();
    client.write_all(&upload[FIRST..]).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut raw))
        .await
        .expect("wharf answered and closed")
        .unwrap();
    let (status, _fields, body) = split_response(&raw);
    assert_eq!(
        status,
        "HTTP/1.1 200 OK",
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert_eq!(body, b"received");
    let received = body_received.await.unwrap();
    assert_body_is(&received, &upload, "the body the backend got");
}

#[tokio::test]
async fn a_client_gone_before_the_answer_stops_counting_against_its_backend() {
    // least_outstanding keeps configuration order on ties: once nothing counts against `a`,
    // calls go to `a`. A call whose client left while it waited for `a`'s answer must stop
    // counting against `a` (before, it counted for ever and `b` took every call).
    use tokio::io::AsyncWriteExt;
    let (a, b, wharf) = two_backends("/", "least_outstanding").await;
    let mut client = tokio::net::TcpStream::connect(wharf.addr).await.unwrap();
    client
        .write_all(b"GET /slow?ms=1500 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(
        poll_until(Duration::from_secs(3), || async { a.hits("/slow") == 1 }).await,
        "the slow call reached a"
    );
    drop(client);
    let freed = poll_until(Duration::from_secs(3), || async {
        assert_eq!(get(&wharf.url("/fast")).await.status, 200);
        a.hits("/fast") > 0
    })
    .await;
    assert!(freed, "the abandoned call still counts against a");
    let (a_before, b_before) = (a.hits("/fast"), b.hits("/fast"));
    for _ in 0..3 {
        assert_eq!(get(&wharf.url("/fast")).await.status, 200);
    }
    assert_eq!(
        (a.hits("/fast") - a_before, b.hits("/fast") - b_before),
        (3, 0),
        "calls are balanced again"
    );
}

/// A backend that accepts connections and never answers on them; with the count of
/// connections it accepted.
async fn a_backend_that_never_answers() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>)
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(stream);
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn one_call_probes_a_backend_past_its_ejection_window_not_every_call() {
    let (dead, accepted) = a_backend_that_never_answers().await;
    let accepted = || accepted.load(std::sync::atomic::Ordering::SeqCst);
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table(
        "r",
        "/fast",
        &[dead, base(&testbed)],
        "strategy = \"failover\"\ntimeout = \"300ms\"",
    ))
    .await;
    let batch = || {
        let calls = (0..10).map(|_| get_owned(wharf.url("/fast")));
        futures_util::future::join_all(calls)
    };
    // Three timeouts in a row eject the silent backend.
    for _ in 0..3 {
        get(&wharf.url("/fast")).await;
    }
    assert!(poll_until(Duration::from_secs(1), || async { accepted() == 3 }).await);
    batch().await;
    assert_eq!(accepted(), 3, "an ejected backend was tried");
    // Past the window (5 s), concurrent calls: exactly one probes the backend.
    let probed = poll_until(Duration::from_secs(10), || async {
        batch().await;
        accepted() > 3
    })
    .await;
    assert!(probed, "the backend was never probed");
    assert_eq!(accepted(), 4, "more than one call probed the backend");
    // The probe failed: the backend is skipped for another window.
    batch().await;
    assert_eq!(
        accepted(),
        4,
        "calls went to the backend whose probe failed"
    );
}

/// A path with a dot segment is refused before any route matches it: the
/// `/echo` route must not carry `/echo/../hits` to the backend's `/hits`.
#[tokio::test]
async fn paths_with_dot_segments_are_refused_not_forwarded() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&route_table("echo", "/echo", &[base(&testbed)], "")).await;
    for path in [
        "/echo/../hits",
        "/echo/%2e%2E/hits",
        "/echo/./x",
        "/echo/.%2e",
        "/echo/x%2f..%2fhits",
        "/echo/..;/hits",
    ] {
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let reply = raw_exchange(wharf.addr, request.as_bytes(), Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(&reply);
        assert!(text.starts_with("HTTP/1.1 400 "), "{path}: {text}");
        assert!(text.contains("\"bad_request\""), "{path}: {text}");
    }
    assert_eq!(
        testbed.hits("/hits"),
        0,
        "a dot segment reached the backend"
    );
    // Dots inside a segment are a name like any other.
    let request = "GET /echo/..x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let reply = raw_exchange(wharf.addr, request.as_bytes(), Duration::from_secs(5)).await;
    assert!(!String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 400 "));
    assert_eq!(testbed.hits("/echo/..x"), 1);
}
