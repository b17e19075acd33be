//! Every endpoint's status, headers and body; bad parameters.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::json;
use wharf_testbed::{expected_body, stock_price};

use crate::support::{assert_bad_request, client, get, h2c_client, send, start};

#[tokio::test]
async fn fast_is_ok_at_once() {
    let tb = start().await;
    let reply = get(&tb, "/fast").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "ok\n");
    assert_eq!(reply.header("content-length"), Some("3"));
    assert!(reply
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
}

#[tokio::test]
async fn index_lists_the_endpoints() {
    let tb = start().await;
    let reply = get(&tb, "/").await;
    assert_eq!(reply.status, StatusCode::OK);
    for path in [
        "/fast",
        "/slow",
        "/stream",
        "/bytes/N",
        "/truncate",
        "/hits",
        "/stall",
    ] {
        assert!(reply.text().contains(path), "{path}");
    }
}

#[tokio::test]
async fn slow_waits_ms() {
    let tb = start().await;
    let started = Instant::now();
    let reply = get(&tb, "/slow?ms=150").await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.text().contains("150"), "{}", reply.text());
}

#[tokio::test]
async fn bytes_sends_the_pattern_with_cache_headers() {
    let tb = start().await;
    let reply = get(&tb, "/bytes/1000").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], &expected_body(1000)[..]);
    assert_eq!(reply.header("content-length"), Some("1000"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(reply.header("cache-control"), Some("max-age=60"));
    assert_eq!(reply.header("etag"), Some("\"bytes-1000\""));
    assert!(reply.header("last-modified").unwrap().ends_with("GMT"));

    let empty = get(&tb, "/bytes/0").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body.is_empty());
    assert_eq!(empty.header("content-length"), Some("0"));
}

#[tokio::test]
async fn bytes_answers_if_none_match_with_304() {
    let tb = start().await;
    let client = client();
    for tag in [
        "\"bytes-10\"",
        "W/\"bytes-10\"",
        "\"other\", \"bytes-10\"",
        "*",
    ] {
        let reply = send(
            &client,
            &tb,
            Method::GET,
            "/bytes/10",
            &[("if-none-match", tag)],
            Bytes::new(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_MODIFIED, "{tag}");
        assert!(reply.body.is_empty());
        assert_eq!(reply.header("etag"), Some("\"bytes-10\""));
    }
    let reply = send(
        &client,
        &tb,
        Method::GET,
        "/bytes/10",
        &[("if-none-match", "\"bytes-11\"")],
        Bytes::new(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn stock_quotes_after_the_delay() {
    let tb = start().await;
    let started = Instant::now();
    let reply = get(&tb, "/stock/MSFT?ms=100").await;
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(reply.status, StatusCode::OK);
    let quote = reply.json();
    assert_eq!(quote["code"], "MSFT");
    assert_eq!(quote["price"].as_f64().unwrap(), stock_price("MSFT"));
    let time = quote["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
}

#[tokio::test]
async fn echo_returns_the_request() {
    let tb = start().await;
    let reply = send(
        &client(),
        &tb,
        Method::POST,
        "/echo?x=1",
        &[("x-dup", "one"), ("x-other", "o"), ("x-dup", "two")],
        Bytes::from_static(b"hello \xff"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let echo = reply.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["uri"], "/echo?x=1");
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["body"], "hello \u{fffd}");
    assert_eq!(echo["body_len"], 7);
    let headers: Vec<(String, String)> = serde_json::from_value(echo["headers"].clone()).unwrap();
    let mine: Vec<_> = headers
        .iter()
        .filter(|(name, _)| name.starts_with("x-"))
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert_eq!(mine, [("x-dup", "one"), ("x-dup", "two"), ("x-other", "o")]);
    assert!(headers.iter().any(|(name, _)| name == "host"));
}

#[tokio::test]
async fn echo_over_h2c() {
    let tb = start().await;
    let client = h2c_client();
    let reply = send(
        &client,
        &tb,
        Method::PUT,
        "/echo",
        &[],
        Bytes::from_static(b"body"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let echo = reply.json();
    assert_eq!(echo["version"], "HTTP/2.0");
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["body"], "body");
    let fast = send(&client, &tb, Method::GET, "/fast", &[], Bytes::new()).await;
    assert_eq!(fast.text(), "ok\n");
}

#[tokio::test]
async fn status_answers_with_that_code() {
    let tb = start().await;
    for code in [
        200u16, 201, 301, 302, 307, 400, 404, 418, 500, 502, 503, 504, 599,
    ] {
        let reply = get(&tb, &format!("/status/{code}")).await;
        assert_eq!(reply.status.as_u16(), code);
        assert_eq!(reply.json(), json!({ "status": code }));
        let location = reply.header("location");
        assert_eq!(
            location,
            (300..400).contains(&code).then_some("/fast"),
            "{code}"
        );
    }
    for code in [204u16, 304] {
        let reply = get(&tb, &format!("/status/{code}")).await;
        assert_eq!(reply.status.as_u16(), code);
        assert!(reply.body.is_empty());
        assert_eq!(reply.header("location"), None, "{code}: not a redirect");
    }
}

#[tokio::test]
async fn headers_sets_response_headers() {
    let tb = start().await;
    let reply = get(
        &tb,
        "/headers?cache-control=no-store&set-cookie=a%3Db&x-a=1&x-a=2",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "ok\n");
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(reply.header("set-cookie"), Some("a=b"));
    let xa: Vec<_> = reply.headers.get_all("x-a").iter().collect();
    assert_eq!(xa, ["1", "2"]);
    assert!(reply
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));

    let typed = get(&tb, "/headers?content-type=application/json").await;
    assert_eq!(typed.headers.get_all("content-type").iter().count(), 1);
    assert_eq!(typed.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn redirect_points_where_asked() {
    let tb = start().await;
    let reply = get(&tb, "/redirect?to=http%3A%2F%2F127.0.0.1%3A1%2Fx").await;
    assert_eq!(reply.status, StatusCode::FOUND);
    assert_eq!(reply.header("location"), Some("http://127.0.0.1:1/x"));
    let reply = get(&tb, "/redirect?to=/fast&code=307").await;
    assert_eq!(reply.status, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(reply.header("location"), Some("/fast"));
}

#[tokio::test]
async fn unknown_path_is_404_json() {
    let tb = start().await;
    for path in ["/nope", "/fast/", "/bytes", "/status"] {
        let reply = get(&tb, path).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        let json = reply.json();
        assert_eq!(json["error"], "not_found");
        assert!(json["message"].as_str().unwrap().contains(path));
    }
}

#[tokio::test]
async fn bad_parameters_are_400_naming_the_parameter() {
    let tb = start().await;
    let cases = [
        ("/slow?ms=abc", "ms"),
        ("/slow?ms=-5", "ms"),
        ("/slow?ms=600001", "ms"),
        ("/slow?ms=99999999999999999999999", "ms"),
        ("/bytes/abc", "/bytes/N"),
        ("/bytes/-1", "/bytes/N"),
        ("/bytes/1.5", "/bytes/N"),
        ("/bytes/99999999999999999999", "/bytes/N"),
        ("/stock/MSFT?ms=x", "ms"),
        ("/stock/bad%20code", "/stock/CODE"),
        ("/stock/ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456", "/stock/CODE"),
        ("/status/100", "/status/CODE"),
        ("/status/600", "/status/CODE"),
        ("/status/abc", "/status/CODE"),
        ("/status/", "/status/CODE"),
        ("/stream?first_byte_ms=x", "first_byte_ms"),
        ("/stream?first_byte_ms=2000&total_ms=1000", "total_ms"),
        ("/stream?bytes=lots", "bytes"),
        ("/stream?chunks=0", "chunks"),
        ("/truncate?bytes=x", "bytes"),
        ("/truncate?chunked=maybe", "chunked"),
        ("/stall?ms=x", "ms"),
        ("/stall?bytes=x", "bytes"),
        ("/delay-headers?ms=x", "ms"),
        ("/delay-headers?bytes=x", "bytes"),
        ("/headers?content-length=5", "content-length"),
        ("/headers?transfer-encoding=chunked", "transfer-encoding"),
        ("/headers?bad%20name=1", "bad name"),
        ("/headers?x-a=line%0Abreak", "x-a"),
        ("/redirect", "to"),
        ("/redirect?to=/fast&code=304", "code"),
        ("/redirect?to=/fast&code=200", "code"),
    ];
    for (path, param) in cases {
        let reply = get(&tb, path).await;
        assert_bad_request(&reply, param);
    }
}

#[tokio::test]
async fn hits_counts_requests_per_path() {
    let tb = start().await;
    for _ in 0..3 {
        get(&tb, "/fast").await;
    }
    get(&tb, "/bytes/5").await;
    get(&tb, "/slow?ms=1").await;
    get(&tb, "/nope").await;
    assert_eq!(tb.hits("/fast"), 3);
    assert_eq!(tb.hits("/bytes/5"), 1);
    assert_eq!(tb.hits("/slow"), 1, "the query is not part of the path");
    assert_eq!(tb.hits("/echo"), 0);
    assert_eq!(tb.total_hits(), 6);

    let reply = get(&tb, "/hits").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({ "/fast": 3, "/bytes/5": 1, "/slow": 1, "/nope": 1 })
    );
    assert_eq!(tb.total_hits(), 6, "/hits itself is not counted");

    let client = client();
    let refused = send(&client, &tb, Method::POST, "/hits", &[], Bytes::new()).await;
    assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused.json()["error"], "method_not_allowed");

    let reset = send(&client, &tb, Method::DELETE, "/hits", &[], Bytes::new()).await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT);
    assert_eq!(tb.total_hits(), 0);
    assert_eq!(get(&tb, "/hits").await.json(), json!({}));
    get(&tb, "/fast").await;
    assert_eq!(tb.hits("/fast"), 1);
    tb.reset_hits();
    assert_eq!(tb.hits("/fast"), 0);
}
