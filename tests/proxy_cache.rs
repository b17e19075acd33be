//! The proxy's cache: miss then hit, bypass, TTLs, what is never cached,
//! and coalescing of concurrent misses.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn miss_then_hit_fetches_the_origin_once() {
    let stack = stack("").await;
    let url = stack.proxy_url("/bytes/5000", Some(60));
    let first = get(&url).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-cache"), "miss");
    assert_eq!(first.bytes().as_ref(), expected_body(5000).as_slice());
    assert!(
        poll_until(Duration::from_secs(5), || async {
            get(&url).await.header("x-cache") == "hit"
        })
        .await,
        "second call is a hit once the fill committed"
    );
    let hit = get(&url).await;
    assert_eq!(hit.header("x-cache"), "hit");
    assert!(
        hit.header("age").parse::<u64>().is_ok(),
        "hit carries age: {:?}",
        hit.headers
    );
    assert_eq!(hit.bytes().as_ref(), expected_body(5000).as_slice());
    assert_eq!(stack.testbed.hits("/bytes/5000"), 1);
}

#[tokio::test]
async fn cache_key_ignores_cache_duration() {
    let stack = stack("").await;
    let first = get(&stack.proxy_url("/bytes/10", Some(60))).await;
    assert_eq!(first.header("x-cache"), "miss");
    let other_duration = get(&stack.proxy_url("/bytes/10", Some(30))).await;
    assert_eq!(other_duration.header("x-cache"), "hit");
    assert_eq!(stack.testbed.hits("/bytes/10"), 1);
}

#[tokio::test]
async fn bypass_never_caches() {
    let stack = stack("").await;
    for duration in [None, Some(0)] {
        let response = get(&stack.proxy_url("/bytes/100", duration)).await;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-cache"), "bypass");
        assert_eq!(response.bytes().len(), 100);
    }
    let after = get(&stack.proxy_url("/bytes/100", Some(0))).await;
    assert_eq!(after.header("x-cache"), "bypass");
    assert_eq!(stack.testbed.hits("/bytes/100"), 3);
}

#[tokio::test]
async fn entry_expires_after_cache_duration() {
    let stack = stack("").await;
    let url = stack.proxy_url("/bytes/64", Some(1));
    assert_eq!(get(&url).await.header("x-cache"), "miss");
    assert_eq!(get(&url).await.header("x-cache"), "hit");
    assert!(
        poll_until(Duration::from_secs(5), || async {
            get(&url).await.header("x-cache") == "miss"
        })
        .await,
        "entry with cacheDuration=1 expires"
    );
    assert_eq!(stack.testbed.hits("/bytes/64"), 2);
}

#[tokio::test]
async fn max_ttl_caps_cache_duration() {
    let stack = stack("max_ttl = \"1s\"").await;
    let url = stack.proxy_url("/bytes/65", Some(86400));
    assert_eq!(get(&url).await.header("x-cache"), "miss");
    assert_eq!(get(&url).await.header("x-cache"), "hit");
    assert!(
        poll_until(Duration::from_secs(5), || async {
            get(&url).await.header("x-cache") == "miss"
        })
        .await,
        "a day's cacheDuration is capped to max_ttl = 1s"
    );
}

#[tokio::test]
async fn relays_listed_headers_only() {
    let stack = stack("").await;
    let path = "/headers?content-type=text%2Fx-test&etag=%22v1%22&last-modified=Sun%2C%2001%20Nov%202026%2000%3A00%3A00%20GMT&cache-control=public%2C%20max-age%3D60&content-encoding=identity&x-secret=1&x-powered-by=origin";
    for duration in [Some(60), None, Some(60)] {
        let response = get(&stack.proxy_url(path, duration)).await;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), "text/x-test");
        assert_eq!(response.header("etag"), "\"v1\"");
        assert_eq!(
            response.header("last-modified"),
            "Sun, 01 Nov 2026 00:00:00 GMT"
        );
        assert_eq!(response.header("cache-control"), "public, max-age=60");
        assert_eq!(response.header("content-encoding"), "identity");
        assert!(
            !response.header("content-length").is_empty()
                || response.header("transfer-encoding") == "chunked"
        );
        assert_eq!(response.header("x-secret"), "", "unlisted header relayed");
        assert_eq!(response.header("x-powered-by"), "");
    }
}

#[tokio::test]
async fn redirects_are_relayed_not_followed() {
    let stack = stack("").await;
    let response = get(&stack.proxy_url("/redirect?to=%2Ffast", Some(60))).await;
    assert_eq!(response.status, 302);
    assert_eq!(response.header("location"), "/fast");
    assert_eq!(stack.testbed.hits("/fast"), 0, "the redirect was followed");
}

#[tokio::test]
async fn uncacheable_responses_are_fetched_every_time() {
    let stack = stack("max_object_bytes = \"1KiB\"").await;
    let cases = [
        "/headers?cache-control=no-store",
        "/headers?cache-control=private%2C%20max-age%3D60",
        "/headers?set-cookie=session%3Dabc",
        "/status/404",
        "/status/500",
        "/bytes/2048",
    ];
    for path in cases {
        let url = stack.proxy_url(path, Some(60));
        let first = get(&url).await;
        first.bytes();
        assert_eq!(first.header("x-cache"), "miss", "{path}");
        let second = get(&url).await;
        second.bytes();
        assert_eq!(second.header("x-cache"), "miss", "{path} was cached");
        assert_eq!(first.status, second.status, "{path}");
    }
    assert_eq!(stack.testbed.hits("/headers"), 6);
    assert_eq!(stack.testbed.hits("/status/404"), 2);
    assert_eq!(stack.testbed.hits("/bytes/2048"), 2);
    assert!(stack.testbed.total_hits() >= 12);
}

#[tokio::test]
async fn oversized_chunked_body_streams_whole_but_is_not_cached() {
    let stack = stack("max_object_bytes = \"4KiB\"").await;
    let url = stack.proxy_url("/stream?first_byte_ms=0&total_ms=50&bytes=20000", Some(60));
    for _ in 0..2 {
        let response = get(&url).await;
        assert_eq!(response.header("x-cache"), "miss");
        assert_eq!(response.bytes().as_ref(), expected_body(20000).as_slice());
    }
    assert_eq!(stack.testbed.hits("/stream"), 2);
}

#[tokio::test]
async fn twenty_concurrent_misses_make_one_origin_request() {
    let stack = stack("").await;
    let url = stack.proxy_url(
        "/stream?first_byte_ms=300&total_ms=800&bytes=100000",
        Some(60),
    );
    let calls: Vec<_> = (0..20)
        .map(|_| tokio::spawn(get_owned(url.clone())))
        .collect();
    let mut misses = 0;
    for call in calls {
        let response = call.await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.bytes().as_ref(), expected_body(100000).as_slice());
        match response.header("x-cache") {
            "miss" => misses += 1,
            "coalesced" | "hit" => {}
            other => panic!("unexpected x-cache {other}"),
        }
    }
    assert_eq!(misses, 1);
    assert_eq!(stack.testbed.hits("/stream"), 1);
}

async fn get_owned(url: String) -> TestResponse {
    get(&url).await
}

/// Four pass-through calls to `origin` through a wharf under `ulimit -n open_files`: the
/// origin connections they opened, and the wharf's /metrics page after them. Checks that
/// each call is answered and that the start warned about the lowered session count.
async fn four_calls_under_ulimit(
    config: &std::path::Path,
    origin: std::net::SocketAddr,
    accepted: &std::sync::atomic::AtomicUsize,
    open_files: u64,
) -> (usize, String) {
    accepted.store(0, std::sync::atomic::Ordering::SeqCst);
    let wharf = WharfProcess::start_with_open_files(config, open_files);
    for i in 0..4 {
        let target = encode(&format!("http://{origin}/item/{i}"));
        let response = get(&wharf.url(&format!("/proxy?url={target}&cacheDuration=0"))).await;
        assert_eq!(response.status, 200, "ulimit -n {open_files}, call {i}");
        assert_eq!(response.bytes().as_ref(), b"pooled");
    }
    let connections = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let page = get(&format!("http://{}/metrics", wharf.admin)).await;
    let page = String::from_utf8_lossy(page.bytes()).into_owned();
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    assert!(
        logs.contains("max_connections is above what the open-files limit allows"),
        "the start warns that the limit lowers the sessions: {logs}"
    );
    (connections, page)
}

#[tokio::test]
async fn idle_origin_connections_use_only_descriptors_no_session_may_need() {
    // The open-files ledger (wharf_limits::descriptors): with `ulimit -n` at the reserve
    // (256 without `server.splice_bodies`) + 2, the one session admitted may need both
    // descriptors, so an origin connection whose response has ended is closed, not kept,
    // and every call connects.
    // With 12 more, a returned connection is kept beside the few sessions open (a call's
    // own, and the previous call's until its close is read) and the calls reuse it: one
    // connection per core's pool at most.
    let (origin, accepted) = counting_server(b"pooled").await;
    let config = config_file(
        "open-files-ledger",
        &format!(
            "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n",
            server_table("")
        ),
    );
    let refused = |page: &str| sample(page, "wharf_upstream_idle_refused_total").unwrap_or(-1.0);

    let (connections, page) = four_calls_under_ulimit(&config, origin, &accepted, 258).await;
    assert_eq!(
        connections, 4,
        "ulimit -n 258: no origin connection is kept"
    );
    let refused_258 = refused(&page);
    assert!(
        refused_258 >= 4.0,
        "each refusal is on /metrics: {refused_258}"
    );

    let (connections, page) = four_calls_under_ulimit(&config, origin, &accepted, 270).await;
    assert_eq!(refused(&page), 0.0, "ulimit -n 270: nothing refused");
    let lent = sample(&page, "wharf_upstream_idle_descriptors").unwrap_or(0.0);
    assert!(
        lent >= 1.0,
        "the kept connection's descriptor is lent: {lent}"
    );
    assert!(
        connections <= 2,
        "ulimit -n 270: {connections} origin connections for four calls"
    );
    remove_config_file(&config);
}

#[tokio::test]
async fn the_splice_pipes_are_reserved_only_when_splicing_is_on() {
    // Under `ulimit -n 1000` the start admits (1000 - reserve) / 2 sessions and says how many:
    // 372 with the reserve of 256, 308 when `server.splice_bodies` adds its 64 pipes (128).
    for (splice_bodies, sessions) in [(false, 372), (true, 308)] {
        let config = config_file(
            &format!("splice-reserve-{splice_bodies}"),
            &server_table(&format!("splice_bodies = {splice_bodies}\n")),
        );
        let wharf = WharfProcess::start_with_open_files(&config, 1000);
        wharf.signal("TERM");
        let (status, logs) = wharf.wait().await;
        assert!(status.success(), "{logs}");
        let warning = logs
            .lines()
            .find(|line| line.contains("max_connections is above what the open-files limit"))
            .unwrap_or_else(|| panic!("no warning about the lowered sessions: {logs}"));
        assert!(
            warning.contains(&format!("\"sessions\":{sessions}")),
            "splice_bodies = {splice_bodies}: expected {sessions} sessions in {warning}"
        );
        remove_config_file(&config);
    }
}

#[tokio::test]
async fn warm_calls_reuse_the_upstream_connection() {
    let (origin, accepted) = counting_server(b"pooled").await;
    let wharf = start_wharf(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n",
    )
    .await;
    for i in 0..10 {
        // Distinct URLs with cacheDuration: every call is a miss.
        let target = encode(&format!("http://{origin}/item/{i}"));
        let response = get(&wharf.url(&format!("/proxy?url={target}&cacheDuration=60"))).await;
        assert_eq!(response.bytes().as_ref(), b"pooled");
        let bypass = get(&wharf.url(&format!("/proxy?url={target}"))).await;
        assert_eq!(bypass.bytes().as_ref(), b"pooled");
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sequential calls to one origin should share one pooled connection"
    );
}
