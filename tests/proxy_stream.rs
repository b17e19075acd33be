//! Streaming through the proxy: first byte forwarded at once, truncations
//! visible and never cached, fills that outlive their first client.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::*;

/// Time from sending to the first body byte, and to the end of the body.
async fn time_first_and_last_byte(url: &str) -> (Duration, Duration, usize) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let start = Instant::now();
    let response = client.get(url.parse().unwrap()).await.unwrap();
    let mut body = response.into_body();
    let mut first = None;
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            if !data.is_empty() && first.is_none() {
                first = Some(start.elapsed());
            }
            len += data.len();
        }
    }
    (first.unwrap(), start.elapsed(), len)
}

#[tokio::test]
async fn first_byte_is_forwarded_before_the_body_ends() {
    let stack = stack("").await;
    // The origin sends its first chunk at 100 ms and the last at 2000 ms:
    // a buffering proxy would deliver the first byte after ~2 s.
    for duration in [Some(60), None] {
        let url = stack.proxy_url(
            "/stream?first_byte_ms=100&total_ms=2000&bytes=50000",
            duration,
        );
        let (first, last, len) = time_first_and_last_byte(&url).await;
        assert_eq!(len, 50000);
        assert!(
            last >= Duration::from_millis(1900),
            "origin pacing not observed: {last:?}"
        );
        assert!(
            first < last / 2,
            "first byte after {first:?} of {last:?} (cacheDuration {duration:?}): body was buffered"
        );
    }
}

#[tokio::test]
async fn truncated_origin_body_is_seen_by_client_and_never_cached() {
    let stack = stack("").await;
    for path in ["/truncate?bytes=3000", "/truncate?bytes=3000&chunked=1"] {
        for duration in [Some(60), Some(60), None] {
            let response = get(&stack.proxy_url(path, duration)).await;
            assert_eq!(response.status, 200, "{path}");
            assert!(
                response.body.is_err(),
                "{path} {duration:?}: truncation looked complete"
            );
            assert_ne!(
                response.header("x-cache"),
                "hit",
                "{path}: truncated body was cached"
            );
        }
    }
    assert_eq!(stack.testbed.hits("/truncate"), 6);
}

#[tokio::test]
async fn coalesced_readers_all_see_an_origin_truncation() {
    let stack = stack("").await;
    // Slow first byte so that all calls join the same fill.
    let url = stack.proxy_url("/truncate?bytes=3000&chunked=1&first_byte_ms=300", Some(60));
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    for call in calls {
        let response = call.await.unwrap();
        assert!(
            response.body.is_err(),
            "a reader saw a clean end: {:?}",
            response.header("x-cache")
        );
    }
    let again = get(&url).await;
    assert_eq!(again.header("x-cache"), "miss");
}

#[tokio::test]
async fn fill_goes_on_when_its_first_client_disconnects() {
    let stack = stack("").await;
    let url = stack.proxy_url(
        "/stream?first_byte_ms=50&total_ms=600&bytes=30000",
        Some(60),
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(response.headers()["x-cache"], "miss");
    let mut body = response.into_body();
    let _first = body.frame().await;
    drop(body);
    drop(client);
    // A follower joins the fill in progress and gets the whole body.
    let follower = get(&url).await;
    assert_eq!(follower.bytes().as_ref(), expected_body(30000).as_slice());
    assert!(matches!(follower.header("x-cache"), "coalesced" | "hit"));
    let later = get(&url).await;
    assert_eq!(later.header("x-cache"), "hit");
    assert_eq!(stack.testbed.hits("/stream"), 1);
}

#[tokio::test]
async fn a_200_mib_pass_through_streams_at_the_clients_pace() {
    // Not a memory benchmark (bench/ does that): checks the body is relayed
    // whole and byte-exact without being cached.
    let stack = stack("").await;
    let len: usize = 8 * 1024 * 1024;
    let url = stack.proxy_url(&format!("/bytes/{len}"), None);
    let response = get(&url).await;
    assert_eq!(response.bytes().len(), len);
    assert!(response
        .bytes()
        .iter()
        .enumerate()
        .step_by(4099)
        .all(|(i, b)| *b == wharf_testbed::pattern_byte(i as u64)));
}

/// The proxy path that fetches `/big/{call}` from `origin` without caching it.
fn uncached_big(origin: std::net::SocketAddr, call: u32) -> String {
    let target = encode(&format!("http://{origin}/big/{call}"));
    format!("/proxy?url={target}&cacheDuration=0")
}

/// The proxy service of the body tests below, with `server.splice_bodies` as given.
fn proxy_with_splice_bodies(splice_bodies: bool) -> String {
    format!(
        "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n",
        server_table(&format!("splice_bodies = {splice_bodies}\n"))
    )
}

#[tokio::test]
async fn large_pass_through_bodies_arrive_whole_over_one_origin_connection() {
    // Past the first read of a response, a pass-through body is copied from the origin's
    // socket to the client's (the default) or, with `server.splice_bodies`, moved between
    // them by splice(2); either way the origin connection goes back to the pool at the
    // body's end, and the bytes are the origin's.
    let body = large_patterned_body();
    for splice_bodies in [false, true] {
        let (origin, accepted) = counting_server(body).await;
        let wharf = start_wharf(&proxy_with_splice_bodies(splice_bodies)).await;
        for i in 0..5 {
            let response = get(&wharf.url(&uncached_big(origin, i))).await;
            let what = format!("splice {splice_bodies}, call {i}");
            assert_body_is(response.bytes(), body, &what);
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "splice {splice_bodies}: each body returned the origin connection for the next call"
        );
    }
}

/// How many pipes process `pid` holds open (its descriptors that are `pipe:[…]`).
fn pipes_held(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("pipe:"))
        .count()
}

#[tokio::test]
async fn bodies_go_through_pipes_only_when_splice_bodies_is_set() {
    // `server.splice_bodies` is the one switch between the two ways of relaying a body: a
    // spliced body leaves its emptied pipe kept for the thread's next one, a copied body
    // makes none. Checked on the built binary, whose descriptors are its own (its stderr
    // to this test is a pipe too, hence the count before the calls).
    let body = large_patterned_body();
    let (origin, _) = counting_server(body).await;
    for splice_bodies in [false, true] {
        let path = config_file(
            &format!("splice-bodies-{splice_bodies}"),
            &proxy_with_splice_bodies(splice_bodies),
        );
        let wharf = WharfProcess::start(&path);
        let before = pipes_held(wharf.pid());
        for i in 0..3 {
            let response = get(&wharf.url(&uncached_big(origin, i))).await;
            let what = format!("splice {splice_bodies}, call {i}");
            assert_body_is(response.bytes(), body, &what);
        }
        let after = pipes_held(wharf.pid());
        wharf.signal("TERM");
        let (status, logs) = wharf.wait().await;
        assert!(status.success(), "{logs}");
        remove_config_file(&path);
        if splice_bodies {
            assert!(
                after > before,
                "spliced bodies kept a pipe: {before} → {after}"
            );
        } else {
            assert_eq!(after, before, "copied bodies opened no pipe");
        }
    }
}
