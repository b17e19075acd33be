//! Issue 6: several wharf instances share the proxy's second cache tier in Redis.
//! Two in-process instances on different ports, each with its own memory tier, against the
//! Redis at 127.0.0.1:6379 (or one started here for the outage test). Target URLs carry a
//! per-run query parameter, so entries left in Redis by earlier runs are never found.
//! Without Redis each test prints a loud SKIP and returns; CI has it (.ci/run starts it).

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::*;

const REDIS: &str = "redis://127.0.0.1:6379";

/// Whether a Redis answers at 127.0.0.1:`port`; prints a SKIP line when not.
async fn redis_up(port: u16, test: &str) -> bool {
    let up = tokio::time::timeout(
        Duration::from_millis(500),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .is_ok_and(|connected| connected.is_ok());
    if !up {
        eprintln!(
            "\n*** SKIP {test}: no Redis at 127.0.0.1:{port} (start it as .ci/run does) ***\n"
        );
    }
    up
}

/// A value unique to this run, for target URLs.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// A proxy at /proxy allowed to reach the testbed, with the shared tier at `redis`.
async fn instance(testbed: &TestbedHandle, redis: &str) -> RunningHost {
    instance_with(testbed, redis, "first_byte_timeout = \"2s\"").await
}

/// The proxy table of [`instance`], with `keys` (whole lines) instead of its
/// `first_byte_timeout`.
fn proxy_table(testbed: &TestbedHandle, redis: &str, keys: &str) -> String {
    format!(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n\
         allow_hosts = [\"127.0.0.1:{}\"]\nshared_cache = \"{redis}\"\n{keys}\n",
        testbed.addr().port()
    )
}

/// As [`instance`], with `keys` (whole lines) instead of its `first_byte_timeout`.
async fn instance_with(testbed: &TestbedHandle, redis: &str, keys: &str) -> RunningHost {
    start_wharf(&proxy_table(testbed, redis, keys)).await
}

fn proxy_url(wharf: &RunningHost, target: &str) -> String {
    wharf.url(&format!("/proxy?url={}&cacheDuration=60", encode(target)))
}

/// The value of the first series starting with `series` on the admin /metrics page.
async fn metric(wharf: &RunningHost, series: &str) -> f64 {
    let page = get(&wharf.admin_url("/metrics")).await;
    let text = String::from_utf8_lossy(page.bytes()).into_owned();
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{series} not on /metrics:\n{text}"))
}

const WRITES_OK: &str = "wharf_shared_cache_writes_total{service=\"proxy\",outcome=\"ok\"}";

#[tokio::test]
async fn a_miss_on_one_instance_is_a_shared_hit_on_another_and_big_bodies_round_trip() {
    if !redis_up(6379, "shared_cache").await {
        return;
    }
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let a = instance(&testbed, REDIS).await;
    let b = instance(&testbed, REDIS).await;
    let run = run_id();
    // 5000 bytes: one chunk; 1 MiB + 7: five 256 KiB chunks.
    for (n, writes) in [(5000u64, 1.0), ((1 << 20) + 7, 2.0)] {
        let target = testbed.url(&format!("/bytes/{n}?run={run}"));
        let first = get(&proxy_url(&a, &target)).await;
        assert_eq!(first.status, 200);
        assert_eq!(first.header("x-cache"), "miss");
        assert_eq!(first.bytes().as_ref(), expected_body(n).as_slice());
        // The write-through runs in the background: wait for it, then B must find it.
        assert!(
            poll_until(Duration::from_secs(5), || async {
                metric(&a, WRITES_OK).await >= writes
            })
            .await,
            "A wrote the entry to Redis"
        );
        let shared = get(&proxy_url(&b, &target)).await;
        assert_eq!(shared.status, 200);
        assert_eq!(shared.header("x-cache"), "hit");
        assert_eq!(shared.header("x-cache-tier"), "shared");
        assert!(
            shared.header("age").parse::<u64>().is_ok(),
            "{:?}",
            shared.headers
        );
        assert_eq!(
            shared.bytes().as_ref(),
            expected_body(n).as_slice(),
            "{n} bytes through Redis, byte for byte"
        );
        // Promoted into B's memory tier.
        let promoted = get(&proxy_url(&b, &target)).await;
        assert_eq!(promoted.header("x-cache"), "hit");
        assert_eq!(promoted.header("x-cache-tier"), "memory");
        assert_eq!(promoted.bytes().as_ref(), expected_body(n).as_slice());
        assert_eq!(testbed.hits(&format!("/bytes/{n}")), 1, "origin hit once");
    }
    let hits = "wharf_shared_cache_requests_total{service=\"proxy\",result=\"hit\"}";
    assert_eq!(metric(&b, hits).await, 2.0);
}

#[tokio::test]
async fn concurrent_misses_spread_over_two_instances_make_one_origin_request() {
    if !redis_up(6379, "shared_cache").await {
        return;
    }
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let a = instance(&testbed, REDIS).await;
    let b = instance(&testbed, REDIS).await;
    let n = 100_000u64;
    let target = testbed.url(&format!(
        "/stream?first_byte_ms=300&total_ms=600&bytes={n}&run={}",
        run_id()
    ));
    let urls = [proxy_url(&a, &target), proxy_url(&b, &target)];
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let url = urls[i % 2].clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        let response = call.await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.bytes().as_ref(), expected_body(n).as_slice());
        results.push(response.header("x-cache").to_owned());
    }
    assert_eq!(
        testbed.hits("/stream"),
        1,
        "one origin request: {results:?}"
    );
    assert_eq!(
        results.iter().filter(|r| *r == "miss").count(),
        1,
        "{results:?}"
    );
    let held = "wharf_shared_cache_leases_total{service=\"proxy\",result=\"held\"}";
    assert_eq!(
        metric(&a, held).await + metric(&b, held).await,
        1.0,
        "the other instance waited on the lease"
    );
}

/// Regression (shared tier, defect 1): a body slower than the lease's TTL used to let the
/// lease expire mid-fetch, so the waiting instance fetched the origin too (and its client
/// waited a TTL for nothing). The holder now renews its lease while it fetches.
#[tokio::test]
async fn a_body_slower_than_the_lease_is_still_fetched_once_across_instances() {
    if !redis_up(6379, "shared_cache").await {
        return;
    }
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    // Lease TTL: 2 × 500 ms = 1 s; the body takes three.
    let a = instance_with(&testbed, REDIS, "first_byte_timeout = \"500ms\"").await;
    let b = instance_with(&testbed, REDIS, "first_byte_timeout = \"500ms\"").await;
    let n = 5000u64;
    let target = testbed.url(&format!(
        "/stream?first_byte_ms=100&total_ms=3000&bytes={n}&run={}",
        run_id()
    ));
    let first = {
        let url = proxy_url(&a, &target);
        tokio::spawn(async move { get(&url).await })
    };
    assert!(
        poll_until(Duration::from_secs(5), || async {
            testbed.hits("/stream") >= 1
        })
        .await,
        "A asked the origin"
    );
    let started = Instant::now();
    let second = get(&proxy_url(&b, &target)).await;
    let waited = started.elapsed();
    let first = first.await.unwrap();
    assert_eq!(first.header("x-cache"), "miss");
    assert_eq!(first.bytes().as_ref(), expected_body(n).as_slice());
    assert_eq!(second.status, 200);
    assert_eq!(second.bytes().as_ref(), expected_body(n).as_slice());
    assert_eq!(
        (second.header("x-cache"), second.header("x-cache-tier")),
        ("coalesced", "shared"),
        "B waited for A's entry ({waited:?})"
    );
    assert_eq!(testbed.hits("/stream"), 1, "one origin request");
}

/// Regression (shared tier, defect 2): an entry read from Redis kept its writer's TTL, so
/// an instance with a shorter `max_ttl` served it (and its memory copy) for longer.
#[tokio::test]
async fn a_shared_hit_is_fresh_for_no_longer_than_the_readers_max_ttl() {
    if !redis_up(6379, "shared_cache").await {
        return;
    }
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let a = instance(&testbed, REDIS).await;
    let short = instance_with(&testbed, REDIS, "max_ttl = \"1s\"").await;
    let target = testbed.url(&format!("/bytes/300?run={}", run_id()));
    let stored = Instant::now();
    // Stored by A for 60 s (cacheDuration=60).
    assert_eq!(get(&proxy_url(&a, &target)).await.header("x-cache"), "miss");
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric(&a, WRITES_OK).await >= 1.0
        })
        .await,
        "A wrote the entry to Redis"
    );
    let shared = get(&proxy_url(&short, &target)).await;
    assert_eq!(
        (shared.header("x-cache"), shared.header("x-cache-tier")),
        ("hit", "shared")
    );
    // Served from its memory copy until the entry is 1 s old, then fetched anew.
    assert!(
        poll_until(Duration::from_secs(4), || async {
            get(&proxy_url(&short, &target)).await.header("x-cache") != "hit"
        })
        .await,
        "still a hit {:?} after the store, with max_ttl 1s",
        stored.elapsed()
    );
    assert!(
        stored.elapsed() < Duration::from_millis(2500),
        "{:?}",
        stored.elapsed()
    );
}

/// Regression (shared tier, defect 3): a tier that never works (here a database index
/// Redis refuses) was only logged at debug level. Now: one warning naming the URL and the
/// error, then at most one a period, however many calls skip the tier meanwhile.
#[tokio::test]
async fn a_shared_tier_that_never_works_is_warned_about_once_a_period() {
    if !redis_up(6379, "shared_cache").await {
        return;
    }
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let redis = "redis://127.0.0.1:6379/99";
    let config = config_file(
        "shared-cache-warn",
        &format!("{}{}", server_table(""), proxy_table(&testbed, redis, "")),
    );
    let wharf = WharfProcess::start(&config);
    let errors = "wharf_shared_cache_requests_total{service=\"proxy\",result=\"error\"}";
    let mut i = 0;
    // Two failed lookups at least (the tier rests 1 s after each), every call served.
    assert!(
        poll_until(Duration::from_secs(10), || {
            i += 1;
            let url = wharf.url(&format!(
                "/proxy?url={}&cacheDuration=60",
                encode(&testbed.url(&format!("/bytes/{i}")))
            ));
            let admin = format!("http://{}/metrics", wharf.admin);
            async move {
                assert_eq!(get(&url).await.status, 200);
                let page = get(&admin).await;
                sample(&String::from_utf8_lossy(page.bytes()), errors).unwrap_or(0.0) >= 2.0
            }
        })
        .await,
        "lookups failed"
    );
    wharf.signal("TERM");
    let (_status, logs) = wharf.wait().await;
    remove_config_file(&config);
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("\"WARN\"") && line.contains("shared cache"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning a period:\n{logs}");
    assert!(
        warnings[0].contains(redis),
        "names the URL: {}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("DB index is out of range"),
        "names the error: {}",
        warnings[0]
    );
}

/// A Redis of this test's own, on a free port; shut down when dropped.
struct OwnRedis {
    port: u16,
}

impl OwnRedis {
    fn start(port: u16) -> bool {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
            .args(["--enable-debug-command", "yes"])
            .status()
            .is_ok_and(|status| status.success())
    }

    fn shutdown(&self) {
        let _ = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "shutdown", "nosave"])
            .output();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn redis_slow_or_stopped_mid_test_never_fails_or_stalls_a_call_and_is_used_again() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("\n*** SKIP shared_cache outage: no redis-server binary ***\n");
        return;
    }
    let port = free_port();
    assert!(OwnRedis::start(port), "redis-server starts on {port}");
    let redis = OwnRedis { port };
    assert!(
        poll_until(Duration::from_secs(5), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await
    );
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = instance(&testbed, &format!("redis://127.0.0.1:{port}")).await;
    let run = run_id();
    let url = |i: usize| {
        proxy_url(
            &wharf,
            &testbed.url(&format!("/bytes/{}?run={run}", 1000 + i)),
        )
    };

    assert_eq!(get(&url(0)).await.header("x-cache"), "miss");
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric(&wharf, WRITES_OK).await >= 1.0
        })
        .await,
        "the tier works before the outage"
    );

    // Every call is served from the origin (or memory), none fails, none waits on Redis
    // for more than one operation timeout (100 ms): first with Redis stalled for 1.5 s
    // (DEBUG SLEEP), then with Redis gone.
    let slowest = |calls: std::ops::RangeInclusive<usize>| {
        let wharf = &wharf;
        let url = &url;
        async move {
            let mut slowest = Duration::ZERO;
            for i in calls {
                let started = Instant::now();
                let response = get(&url(i)).await;
                slowest = slowest.max(started.elapsed());
                assert_eq!(response.status, 200, "call {i}");
                assert_eq!(response.bytes().len(), 1000 + i);
                assert_eq!(response.header("x-cache"), "miss");
            }
            let _ = wharf;
            slowest
        }
    };
    let stall = std::thread::spawn(move || {
        Command::new("redis-cli")
            .args(["-p", &port.to_string(), "debug", "sleep", "1.5"])
            .output()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slow = slowest(1..=10).await;
    let timeouts =
        "wharf_shared_cache_errors_total{service=\"proxy\",op=\"lease\",reason=\"timeout\"}";
    assert!(
        metric(&wharf, timeouts).await >= 1.0,
        "slow Redis: timeouts counted"
    );
    let _ = stall.join();
    redis.shutdown();
    let gone = slowest(11..=30).await;
    eprintln!(
        "shared tier outage: slowest call {slow:?} with Redis stalled, {gone:?} with Redis gone"
    );
    assert!(
        slow < Duration::from_millis(500),
        "slowest call {slow:?} while Redis stalled"
    );
    assert!(
        gone < Duration::from_millis(500),
        "slowest call {gone:?} while Redis gone"
    );
    let memory_hit = get(&url(1)).await;
    assert_eq!(memory_hit.header("x-cache-tier"), "memory");
    let errors = "wharf_shared_cache_requests_total{service=\"proxy\",result=\"error\"}";
    let skipped = "wharf_shared_cache_requests_total{service=\"proxy\",result=\"skipped\"}";
    assert!(metric(&wharf, errors).await >= 1.0, "errors counted");
    assert!(
        metric(&wharf, skipped).await >= 1.0,
        "then skipped at once while resting"
    );

    // Back up: after the rest period the tier is used again (the client reconnects).
    assert!(OwnRedis::start(port), "redis-server restarts on {port}");
    let before = metric(&wharf, WRITES_OK).await;
    let mut i = 100;
    assert!(
        poll_until(Duration::from_secs(10), || {
            i += 1;
            let url = url(i);
            let wharf = &wharf;
            async move {
                assert_eq!(get(&url).await.status, 200);
                metric(wharf, WRITES_OK).await > before
            }
        })
        .await,
        "writes resume once Redis is back"
    );
}
