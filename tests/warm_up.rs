//! The start-up warm-up (seed 000): twins of the services answer it, the services clients
//! call never see it, and `wharf serve` times it as a start-up phase.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use wharf_config::{Config, LimitsConfig};
use wharf_host::{handler, HostBuilder, Mount, ResponseBody, WarmUp, WarmUpReport};

use crate::support::*;

fn config(toml: &str) -> Config {
    let text = format!("{}{toml}", server_table(""));
    Config::from_toml_str(&text, "test.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// A proxy with the embedded default's safe settings (no private networks: the warm-up
/// must not depend on what the real service may reach) and room for one call at a time,
/// and a route whose backend does not exist and whose methods and header conditions a
/// warm-up GET would not meet.
const PROXY_AND_ROUTE: &str = r#"
[services.proxy]
type = "proxy"
path = "/proxy"
max_concurrent_calls = 1
max_queued_calls = 0

[services.orders]
type = "route"
path_prefix = "/orders"
backends = ["http://192.0.2.1:9"]
methods = ["POST"]
match_headers = { "x-tenant" = "acme" }
set_headers = { "x-via" = "wharf" }
"#;

/// A warm-up of one twin, mounted at `path` with `limits`, called once there.
fn one_twin(path: &str, limits: &LimitsConfig, twin: wharf_host::HostService) -> WarmUp {
    let mut warm = WarmUp::new();
    warm.mount(
        "twin",
        Mount::Exact(path.into()),
        limits,
        twin,
        [[path.to_owned()]],
    );
    warm
}

/// Warms a host up through one twin, at `/broken`, that answers every call 500.
async fn warm_up_a_twin_answering_500() -> WarmUpReport {
    let config = config(PROXY_AND_ROUTE);
    let limits = config.services[0].limits.clone();
    let broken = handler(|_request| async {
        let mut response = Response::new(ResponseBody::full(Bytes::from_static(b"no")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    });
    HostBuilder::new(config.server)
        .warm_up(one_twin("/broken", &limits, broken))
        .await
}

#[tokio::test]
async fn every_service_type_is_warmed_up_through_a_twin_and_leaves_no_trace() {
    let config = config(PROXY_AND_ROUTE);
    let (builder, _) = wharf::assemble(&config).unwrap();
    let (plan, origin) = wharf::warm_up::plan(&config).await;
    assert!(origin.is_some(), "the warm-up origin binds on 127.0.0.1");
    let report = builder.warm_up(plan).await;
    drop(origin);
    // Pass-through, fill and hit through the proxy twin, one forward through the route's.
    assert_eq!(report.calls, 4, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");

    let wharf = spawn_host(builder).await;
    let metrics =
        String::from_utf8(get(&wharf.admin_url("/metrics")).await.bytes().to_vec()).unwrap();
    assert!(
        !metrics.contains("warm-up"),
        "warm-up series on /metrics:\n{metrics}"
    );
    for line in metrics.lines().filter(|line| {
        line.starts_with("wharf_calls_total{")
            || line.starts_with("wharf_cache_bytes{")
            || line.starts_with("wharf_upstream_requests_total{")
    }) {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(value, 0.0, "the warm-up was counted: {line}");
    }
    let inflight = get(&wharf.admin_url("/debug/inflight")).await.json();
    assert_eq!(inflight.as_array().map(Vec::len), Some(0), "{inflight}");
    // The real proxy still refuses what its twin was allowed to reach.
    let refused = get(&wharf.url("/proxy?url=http://127.0.0.1:1/&cacheDuration=0")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    wharf.stop().await;
}

#[tokio::test]
async fn without_twins_the_host_warms_its_own_404_up() {
    let builder = HostBuilder::new(config("").server);
    let report = builder.warm_up(WarmUp::new()).await;
    assert_eq!(report.calls, 1, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
}

#[tokio::test]
async fn a_twin_answering_an_error_is_reported_by_path_and_status() {
    let report = warm_up_a_twin_answering_500().await;
    assert_eq!(report.failed, ["GET /broken: status 500"], "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_on_every_core_is_reported_once() {
    // Two runtime workers: two cores, each making the twin's call once.
    let report = warm_up_a_twin_answering_500().await;
    assert_eq!(report.calls, 2, "{report:?}");
    assert_eq!(
        report.failed,
        ["GET /broken: status 500 (2 calls)"],
        "{report:?}"
    );
}

#[tokio::test]
async fn serve_times_the_warm_up_as_a_start_up_phase() {
    let path = config_file(
        "warm-up",
        &format!(
            "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n",
            server_table("")
        ),
    );
    let wharf = WharfProcess::start(&path);
    // The same duration is exported as a start-up phase on the admin listener.
    let metrics = get(&format!("http://{}/metrics", wharf.admin)).await;
    let page = String::from_utf8_lossy(metrics.bytes()).into_owned();
    let exported = sample(&page, "wharf_startup_phase_seconds{phase=\"warm_up\"}");
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    let listening = logs
        .lines()
        .find(|line| line.contains("wharf listening"))
        .unwrap();
    let event: serde_json::Value = serde_json::from_str(listening).unwrap();
    let warm_up_ms = event["fields"]["warm_up_ms"].as_f64();
    assert!(warm_up_ms.is_some_and(|ms| ms > 0.0), "{listening}");
    assert!(exported.is_some_and(|s| s > 0.0), "{page}");
    assert!(!logs.contains("start-up warm-up: calls failed"), "{logs}");
    remove_config_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warm_up_runs_on_every_core_even_through_a_one_call_twin() {
    let builder = HostBuilder::new(config("").server);
    // Room for one call and no queue: the two cores' calls meet at the same time.
    let limits = LimitsConfig {
        max_concurrent_calls: 1,
        max_queued_calls: 0,
        queue_timeout: Duration::from_millis(1),
    };
    let threads = Arc::new(Mutex::new(Vec::new()));
    // Long enough for the other core's call to arrive while this one runs.
    let twin = thread_recording_twin(&threads, Duration::from_millis(20));
    let report = builder.warm_up(one_twin("/twin", &limits, twin)).await;
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(report.calls, 2, "one call per core: {report:?}");
    let cores: BTreeSet<String> = threads.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        cores,
        BTreeSet::from(["wharf-core-0".to_owned(), "wharf-core-1".to_owned()])
    );
}

/// A twin that records the name of the thread each of its calls ran on, and answers
/// after `hold`.
fn thread_recording_twin(
    threads: &Arc<Mutex<Vec<String>>>,
    hold: Duration,
) -> wharf_host::HostService {
    let seen = threads.clone();
    handler(move |_request| {
        let seen = seen.clone();
        async move {
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_owned();
            seen.lock().unwrap().push(name);
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            Response::new(ResponseBody::full(Bytes::from_static(b"warm")))
        }
    })
}

/// A host whose `[server]` has `keys`, warmed up through one twin at `/twin` that counts
/// its calls and the threads they ran on.
async fn host_with_a_counting_twin(keys: &str) -> (HostBuilder, Arc<Mutex<Vec<String>>>) {
    let builder = HostBuilder::new(config(keys).server);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let twin = thread_recording_twin(&calls, Duration::ZERO);
    let limits = LimitsConfig {
        max_concurrent_calls: 1,
        max_queued_calls: 0,
        queue_timeout: Duration::from_millis(1),
    };
    let report = builder.warm_up(one_twin("/twin", &limits, twin)).await;
    assert!(report.failed.is_empty(), "{report:?}");
    (builder, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_warm_runs_the_warm_up_again_on_every_core_until_the_host_stops() {
    let (builder, calls) = host_with_a_counting_twin("keep_warm = \"20ms\"\n").await;
    assert_eq!(
        calls.lock().unwrap().len(),
        2,
        "the start-up warm-up, once per core"
    );
    let wharf = spawn_host(builder).await;
    // Three more rounds, each once per core.
    let again = poll_until(Duration::from_secs(10), || async {
        calls.lock().unwrap().len() >= 8
    })
    .await;
    assert!(again, "keep-warm rounds: {:?}", calls.lock().unwrap());
    let cores: BTreeSet<String> = calls.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        cores,
        BTreeSet::from(["wharf-core-0".to_owned(), "wharf-core-1".to_owned()])
    );
    // The host's calls are served as ever beside it (its own 404 here).
    assert_eq!(
        get(&wharf.url("/elsewhere")).await.status,
        StatusCode::NOT_FOUND
    );
    wharf.stop().await;
    let after_stop = calls.lock().unwrap().len();
    // Five periods: a round still running at the stop may end, none starts.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        calls.lock().unwrap().len() <= after_stop + 2,
        "keep-warm went on after the host stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_warm_stands_aside_while_calls_keep_a_core_busy() {
    let (builder, twin_calls) = host_with_a_counting_twin("keep_warm = \"50ms\"\n").await;
    let limits = LimitsConfig {
        max_concurrent_calls: 4,
        max_queued_calls: 4,
        queue_timeout: Duration::from_secs(1),
    };
    // Each call holds its core's thread for 40 ms: a core serving them back to back is
    // busy for nearly the whole of every keep-warm period.
    let busy = handler(|_request| async {
        std::thread::sleep(Duration::from_millis(40));
        Response::new(ResponseBody::full(Bytes::from_static(b"done")))
    });
    let builder = builder.mount("busy", Mount::Exact("/busy".into()), &limits, busy);
    let wharf = spawn_host(builder).await;
    // Idle: the rounds run.
    let rounds = poll_until(Duration::from_secs(10), || async {
        twin_calls.lock().unwrap().len() >= 4
    })
    .await;
    assert!(rounds, "no keep-warm round while idle");
    let before_load = twin_calls.lock().unwrap().len();
    let loaded = std::time::Instant::now();
    while loaded.elapsed() < Duration::from_millis(800) {
        assert_eq!(get(&wharf.url("/busy")).await.status, StatusCode::OK);
    }
    // Sixteen periods under load: at most the round of the first, once per core.
    let during_load = twin_calls.lock().unwrap().len() - before_load;
    assert!(during_load <= 2, "{during_load} keep-warm calls under load");
    // Idle again: the rounds resume.
    let resumed = poll_until(Duration::from_secs(10), || async {
        twin_calls.lock().unwrap().len() >= before_load + during_load + 2
    })
    .await;
    assert!(resumed, "keep-warm did not resume after the load");
    wharf.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keep_warm_the_warm_up_runs_once() {
    let (builder, calls) = host_with_a_counting_twin("").await;
    let wharf = spawn_host(builder).await;
    assert_eq!(
        get(&wharf.url("/elsewhere")).await.status,
        StatusCode::NOT_FOUND
    );
    // As long as a keep-warm of 20ms would take for five rounds.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        2,
        "{:?}",
        calls.lock().unwrap()
    );
    wharf.stop().await;
}

#[tokio::test]
async fn serve_keeps_the_twins_origin_up_for_keep_warm() {
    // The proxy twin's pass-through and the route twin's forward reach the twins' own
    // origin each round: were it dropped after start-up, every round would fail.
    let path = config_file(
        "keep-warm",
        &format!(
            "{}[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n\n\
             [services.orders]\ntype = \"route\"\npath_prefix = \"/orders\"\nbackends = [\"http://192.0.2.1:9\"]\n",
            server_table("keep_warm = \"10ms\"\n")
        ),
    );
    let wharf = WharfProcess::start(&path);
    // About fifty rounds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    assert!(!logs.contains("keep-warm: calls failed"), "{logs}");
    assert!(!logs.contains("start-up warm-up: calls failed"), "{logs}");
    remove_config_file(&path);
}
