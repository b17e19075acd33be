//! Every error the proxy returns is JSON `{"error", "message"}` with the
//! status SPEC §3 lists.

use std::time::Duration;

use crate::support::*;

fn assert_json_error(response: &TestResponse, status: u16, kind: &str) {
    assert_eq!(response.status, status, "{:?}", response.body);
    assert_eq!(response.header("content-type"), "application/json");
    let json = response.json();
    assert_eq!(json["error"], kind, "{json}");
    assert!(!json["message"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn bad_requests_get_400() {
    let stack = stack("").await;
    let target = encode(&stack.testbed.url("/fast"));
    for query in [
        "/proxy".to_owned(),
        "/proxy?cacheDuration=5".to_owned(),
        format!("/proxy?url={target}&cacheDuration=abc"),
        format!("/proxy?url={target}&cacheDuration=-5"),
        "/proxy?url=%E0%A4%A".to_owned(),
        "/proxy?url=not%20a%20url".to_owned(),
    ] {
        assert_json_error(&get(&stack.wharf.url(&query)).await, 400, "bad_request");
    }
    let message = get(&stack
        .wharf
        .url(&format!("/proxy?url={target}&cacheDuration=abc")))
    .await
    .json();
    assert!(message["message"]
        .as_str()
        .unwrap()
        .contains("cacheDuration"));
}

#[tokio::test]
async fn refused_destination_gets_403() {
    let wharf = start_wharf("[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n").await;
    let response = get(&wharf.url("/proxy?url=http%3A%2F%2F127.0.0.1%2F")).await;
    assert_json_error(&response, 403, "forbidden");
}

#[tokio::test]
async fn unknown_path_gets_404() {
    let stack = stack("").await;
    assert_json_error(
        &get(&stack.wharf.url("/nothing-here")).await,
        404,
        "not_found",
    );
    assert_json_error(
        &get(&stack.wharf.url("/proxy/extra")).await,
        404,
        "not_found",
    );
}

#[tokio::test]
async fn oversized_request_head_gets_431() {
    let stack = stack("").await;
    let big = "x".repeat(70 * 1024);
    let response = get_with(&stack.proxy_url("/fast", None), &[("x-big", &big)]).await;
    assert_json_error(&response, 431, "headers_too_large");
}

#[tokio::test]
async fn unreachable_origin_gets_502() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let wharf = start_wharf(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n",
    )
    .await;
    for duration in ["0", "60"] {
        let url = wharf.url(&format!(
            "/proxy?url={}&cacheDuration={duration}",
            encode(&format!("http://127.0.0.1:{port}/x"))
        ));
        let response = get(&url).await;
        assert_json_error(&response, 502, "bad_gateway");
        // The message names the origin once, whichever path failed (a
        // fill's failure is copied to each of its readers).
        let message = response.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with(&format!("origin http://127.0.0.1:{port}: ")),
            "cacheDuration={duration}: {message}"
        );
        assert_eq!(message.matches("origin").count(), 1, "{message}");
    }
}

#[tokio::test]
async fn slow_origin_gets_504() {
    let stack = stack("first_byte_timeout = \"200ms\"").await;
    for duration in [None, Some(60)] {
        let response = get(&stack.proxy_url("/slow?ms=3000", duration)).await;
        assert_json_error(&response, 504, "gateway_timeout");
    }
}

#[tokio::test]
async fn origin_stalling_mid_body_is_cut_at_total_timeout() {
    let stack = stack("total_timeout = \"500ms\"").await;
    for duration in [None, Some(60)] {
        let started = std::time::Instant::now();
        let response = get(&stack.proxy_url("/stall?bytes=1000&ms=5000", duration)).await;
        assert_eq!(response.status, 200);
        assert!(response.body.is_err(), "a stalled body looked complete");
        assert!(started.elapsed() < Duration::from_secs(4));
    }
    let again = get(&stack.proxy_url("/stall?bytes=1000&ms=5000", Some(60))).await;
    assert_ne!(again.header("x-cache"), "hit");
}

#[tokio::test]
async fn non_get_methods_get_405() {
    let stack = stack("").await;
    let response = raw_exchange(
        stack.wharf.addr,
        format!("POST /proxy?url={} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n", encode(&stack.testbed.url("/fast"))).as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");
    assert!(text.contains("method_not_allowed"), "{text}");
    assert!(text.contains("\r\nallow: GET, HEAD\r\n"), "{text}");
}

#[tokio::test]
async fn head_is_served_like_get_without_a_body() {
    let stack = stack("").await;
    let target = encode(&stack.testbed.url("/bytes/1024"));
    // Twice on one connection: the second head must start right after the
    // first, so no body bytes may follow a HEAD answer.
    let head = format!("HEAD /proxy?url={target}&cacheDuration=60 HTTP/1.1\r\nhost: x\r\n\r\n");
    let request = format!(
        "{head}{}",
        head.replace("host: x\r\n", "host: x\r\nconnection: close\r\n")
    );
    let response = raw_exchange(stack.wharf.addr, request.as_bytes(), Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&response);
    let answers: Vec<&str> = text
        .split("HTTP/1.1 ")
        .filter(|part| !part.is_empty())
        .collect();
    assert_eq!(answers.len(), 2, "{text}");
    // The HEAD's miss filled the cache: the second finds the entry, or the
    // fill if it has not committed yet.
    for (answer, x_cache) in answers.iter().zip([&["miss"][..], &["hit", "coalesced"]]) {
        assert!(answer.starts_with("200 OK\r\n"), "{text}");
        assert!(answer.contains("\r\ncontent-length: 1024\r\n"), "{text}");
        assert!(
            x_cache
                .iter()
                .any(|value| answer.contains(&format!("\r\nx-cache: {value}\r\n"))),
            "{text}"
        );
        assert!(
            answer.ends_with("\r\n\r\n"),
            "a body followed a HEAD answer: {text}"
        );
    }
    // Pass-through too.
    let bypass =
        format!("HEAD /proxy?url={target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let response = raw_exchange(stack.wharf.addr, bypass.as_bytes(), Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("\r\nx-cache: bypass\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\n"),
        "a body followed a HEAD answer: {text}"
    );
}
