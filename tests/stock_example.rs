//! examples/stock_service.rs (seed 002's StockService) against the testbed:
//! quotes relayed, errors as JSON, the call visible in /debug/inflight and
//! /metrics, and seed 002's load test in small: fast calls never wait
//! behind slow ones.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::Authority;
use http::StatusCode;

use crate::support::*;

#[path = "../examples/stock_service.rs"]
mod stock;

/// The example's host (proxy + stock service) on ephemeral ports, with
/// `backend` as its stock backend.
async fn start_example(backend: SocketAddr) -> RunningHost {
    let authority: Authority = backend.to_string().parse().unwrap();
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = stock::config(&authority, any_port, any_port).unwrap();
    spawn_host(stock::build_host(&config, authority).unwrap()).await
}

async fn testbed_and_example() -> (TestbedHandle, RunningHost) {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_example(testbed.addr()).await;
    (testbed, wharf)
}

/// The rows of /debug/inflight that belong to the stock service.
async fn stock_calls_in_flight(wharf: &RunningHost) -> Vec<serde_json::Value> {
    let rows = get(&wharf.admin_url("/debug/inflight")).await.json();
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|row| row["service"] == "stock")
        .cloned()
        .collect()
}

/// Polls /metrics until it has `line` (counters are recorded when the
/// response body is done, just after the client has read it).
async fn metrics_show(wharf: &RunningHost, line: &str) -> bool {
    poll_until(Duration::from_secs(2), || async {
        get(&wharf.admin_url("/metrics"))
            .await
            .bytes()
            .split(|&b| b == b'\n')
            .any(|l| l == line.as_bytes())
    })
    .await
}

#[tokio::test]
async fn quote_is_relayed_as_json_and_counted() {
    let (testbed, wharf) = testbed_and_example().await;

    let response = get(&wharf.url("/stock/MSFT?ms=50")).await;
    assert_eq!(response.status, StatusCode::OK, "{:?}", response.body);
    assert_eq!(response.header("content-type"), "application/json");
    let quote = response.json();
    assert_eq!(quote["code"], "MSFT");
    assert_eq!(
        quote["price"].as_f64(),
        Some(wharf_testbed::stock_price("MSFT"))
    );
    assert_eq!(testbed.hits("/stock/MSFT"), 1);

    assert!(
        metrics_show(&wharf, r#"wharf_calls_total{service="stock",code="200"} 1"#).await,
        "the stock call is counted under its own service"
    );
    let upstream = format!(
        r#"wharf_upstream_requests_total{{service="stock",backend="{}",outcome="ok"}} 1"#,
        testbed.addr()
    );
    assert!(metrics_show(&wharf, &upstream).await, "missing: {upstream}");
}

#[tokio::test]
async fn slow_quote_is_listed_in_flight_waiting_on_the_backend() {
    let (_testbed, wharf) = testbed_and_example().await;
    let url = wharf.url("/stock/SLOW?ms=2000");
    let call = tokio::spawn(async move { get(&url).await });

    let seen = RefCell::new(None);
    let listed = poll_until(Duration::from_millis(1500), || async {
        let row = stock_calls_in_flight(&wharf).await.into_iter().next();
        let waiting = row
            .as_ref()
            .is_some_and(|row| row["phase"] == "upstream_connect");
        *seen.borrow_mut() = row;
        waiting
    })
    .await;
    let row = seen.into_inner();
    assert!(listed, "not listed as waiting on the backend: {row:?}");
    let row = row.unwrap();
    assert_eq!(row["method"], "GET");
    assert_eq!(row["target"], "/stock/SLOW?ms=2000");
    assert!(row["id"].as_u64().is_some() && row["age_ms"].as_u64().is_some());

    let response = call.await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["code"], "SLOW");
    assert!(
        poll_until(Duration::from_secs(2), || async {
            stock_calls_in_flight(&wharf).await.is_empty()
        })
        .await,
        "the call leaves /debug/inflight when done"
    );
}

#[tokio::test]
async fn bad_requests_are_400_and_never_reach_the_backend() {
    let (testbed, wharf) = testbed_and_example().await;
    for path in [
        "/stock",
        "/stock/",
        "/stock/A$B",
        "/stock/a/b",
        "/stock/THIRTY-THREE-CHARACTERS-LONG-CODE",
        "/stock/MSFT?ms=soon",
        "/stock/MSFT?ms=600001",
        "/stock/MSFT?ms=-1",
    ] {
        let response = get(&wharf.url(path)).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(response.header("content-type"), "application/json");
        assert_eq!(response.json()["error"], "bad_request", "{path}");
    }
    assert_eq!(testbed.total_hits(), 0);
}

#[tokio::test]
async fn unreachable_backend_is_502() {
    // A port that was just free: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let wharf = start_example(closed).await;
    let response = get(&wharf.url("/stock/MSFT?ms=0")).await;
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    let error = response.json();
    assert_eq!(error["error"], "bad_gateway");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&closed.to_string()), "{message}");
    let counted = format!(
        r#"wharf_upstream_requests_total{{service="stock",backend="{closed}",outcome="error"}} 1"#
    );
    assert!(metrics_show(&wharf, &counted).await, "missing: {counted}");
}

/// Seed 002's load test in small: 25 calls to a slow backend in flight,
/// then 25 calls that should be fast. On WCF 3.5 the fast page took ~10 s,
/// waiting for threads; here every fast call is done before the first slow
/// one, even on this test's single-threaded runtime.
#[tokio::test]
async fn fast_calls_never_wait_behind_slow_stock_calls() {
    let (testbed, wharf) = testbed_and_example().await;
    let finished: Arc<Mutex<Vec<&'static str>>> = Arc::default();

    let slow: Vec<_> = (0..25)
        .map(|i| {
            let url = wharf.url(&format!("/stock/S{i}?ms=1500"));
            let finished = finished.clone();
            tokio::spawn(async move {
                let response = get(&url).await;
                finished.lock().unwrap().push("slow");
                response.status
            })
        })
        .collect();
    assert!(
        poll_until(Duration::from_secs(1), || async {
            stock_calls_in_flight(&wharf).await.len() == 25
        })
        .await,
        "the 25 slow calls are in flight"
    );

    let fast_url = wharf.url(&format!("/proxy?url={}", encode(&testbed.url("/fast"))));
    let fast: Vec<_> = (0..25)
        .map(|_| {
            let url = fast_url.clone();
            let finished = finished.clone();
            tokio::spawn(async move {
                let response = get(&url).await;
                finished.lock().unwrap().push("fast");
                response.status
            })
        })
        .collect();

    for call in fast {
        assert_eq!(call.await.unwrap(), StatusCode::OK);
    }
    for call in slow {
        assert_eq!(call.await.unwrap(), StatusCode::OK);
    }
    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.len(), 50);
    let first_slow = finished.iter().position(|&call| call == "slow").unwrap();
    assert_eq!(
        first_slow, 25,
        "a fast call finished after a slow one: {finished:?}"
    );
    assert_eq!(testbed.hits("/fast"), 25);
}
