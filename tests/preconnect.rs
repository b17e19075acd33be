//! Connections opened ahead of calls (seed 000's first call that also connects; seed 002's
//! fast calls behind slow ones that hold every pooled connection): a route's `preconnect`
//! and a proxy's `preconnect_origins` open them on every core before the port listens, the
//! first calls use them, calls that take them have them opened again, and an upstream that
//! cannot be reached is reported once and does not stop the start.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf_config::Config;
use wharf_host::{CoreWork, HostBuilder};

use crate::support::*;

/// The cores `wharf serve` runs here: one per runtime worker, tokio's default.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn serve_opens_connections_ahead_on_every_core_and_the_first_calls_use_them() {
    let (backend, backend_accepted) = counting_server(b"backend").await;
    let (origin, origin_accepted) = counting_server(b"origin").await;
    let path = config_file(
        "preconnect",
        &format!(
            "{}[services.orders]\ntype = \"route\"\npath_prefix = \"/orders\"\n\
             backends = [\"http://{backend}\"]\npreconnect = 1\n\n\
             [services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n\
             allow_private_networks = true\nallow_hosts = [\"{origin}\"]\n\
             preconnect_origins = [\"http://{origin}\"]\n",
            server_table("")
        ),
    );
    let wharf = WharfProcess::start(&path);
    let cores = cores();
    // Opened before "wharf listening"; the counting servers' accept loops may trail.
    let both_opened = poll_until(Duration::from_secs(5), || async {
        backend_accepted.load(Ordering::SeqCst) == cores
            && origin_accepted.load(Ordering::SeqCst) == cores
    })
    .await;
    assert!(
        both_opened,
        "one connection per core to each: backend {}, origin {}, cores {cores}",
        backend_accepted.load(Ordering::SeqCst),
        origin_accepted.load(Ordering::SeqCst)
    );

    // Calls one after another, each on a new client connection, whichever core takes it:
    // every core has an idle connection to each upstream, so no call opens one. A call that
    // takes a core's kept connection has its keeper open one more while it holds it (a
    // floor of 1); returned, the two stay idle, so each core opens at most one more.
    let origin_url = encode(&format!("http://{origin}/x"));
    for _ in 0..4 * cores {
        let routed = get(&wharf.url("/orders/1")).await;
        assert_eq!(routed.status, 200);
        assert_eq!(&routed.bytes()[..], b"backend");
        let proxied = get(&wharf.url(&format!("/proxy?url={origin_url}&cacheDuration=0"))).await;
        assert_eq!(proxied.status, 200);
        assert_eq!(&proxied.bytes()[..], b"origin");
    }
    let (backend_total, origin_total) = (
        backend_accepted.load(Ordering::SeqCst),
        origin_accepted.load(Ordering::SeqCst),
    );
    assert!(backend_total <= 2 * cores, "{backend_total}");
    assert!(origin_total <= 2 * cores, "{origin_total}");

    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    assert!(
        !logs.contains("preconnect: upstreams not reached"),
        "{logs}"
    );
    remove_config_file(&path);
}

/// An upstream's connections: accepted since start, and open now.
#[derive(Default)]
struct Connections {
    accepted: AtomicUsize,
    open: AtomicUsize,
}

/// An HTTP/1.1 upstream (keep-alive) that counts its connections and holds every response
/// until `release` is sent `true`; its address, counts and release.
async fn holding_server() -> (
    std::net::SocketAddr,
    Arc<Connections>,
    tokio::sync::watch::Sender<bool>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let connections = Arc::new(Connections::default());
    let (release, released) = tokio::sync::watch::channel(false);
    let counts = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            counts.open.fetch_add(1, Ordering::SeqCst);
            let (counts, released) = (counts.clone(), released.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| {
                    let mut released = released.clone();
                    async move {
                        let _ = released.wait_for(|go| *go).await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"held")),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                counts.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (address, connections, release)
}

#[tokio::test]
async fn connections_that_calls_take_are_opened_again_in_the_background() {
    const KEPT: usize = 2;
    let (backend, backend_connections, release_backend) = holding_server().await;
    let (origin, origin_connections, release_origin) = holding_server().await;
    let path = config_file(
        "preconnect-kept",
        &format!(
            "{}[services.orders]\ntype = \"route\"\npath_prefix = \"/orders\"\n\
             backends = [\"http://{backend}\"]\npreconnect = {KEPT}\n\n\
             [services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n\
             allow_private_networks = true\nallow_hosts = [\"{origin}\"]\n\
             preconnect_origins = [\"http://{origin}\"]\npreconnect = {KEPT}\n",
            server_table("")
        ),
    );
    let wharf = WharfProcess::start(&path);
    let cores = cores();
    let kept = KEPT * cores;
    for (name, connections) in [
        ("backend", &backend_connections),
        ("origin", &origin_connections),
    ] {
        let opened = poll_until(Duration::from_secs(5), || async {
            connections.open.load(Ordering::SeqCst) == kept
        })
        .await;
        assert!(
            opened,
            "{name}: {KEPT} per core at start, open: {}",
            connections.open.load(Ordering::SeqCst)
        );
    }

    // Calls that hold their connections, more than the cores keep. Each core's calls take
    // its kept connections first and connect for the rest; its keeper then opens as many
    // as were taken. So the upstream ends with every held call's connection plus KEPT idle
    // per core; without the keeper a core left with no idle connection would not add any.
    let held = 3 * cores;
    let origin_url = encode(&format!("http://{origin}/slow"));
    let mut calls = Vec::new();
    for _ in 0..held {
        let routed = wharf.url("/orders/slow");
        let proxied = wharf.url(&format!("/proxy?url={origin_url}&cacheDuration=0"));
        calls.push(tokio::spawn(async move { get(&routed).await }));
        calls.push(tokio::spawn(async move { get(&proxied).await }));
    }
    for (name, connections) in [
        ("backend", &backend_connections),
        ("origin", &origin_connections),
    ] {
        let refilled = poll_until(Duration::from_secs(5), || async {
            connections.open.load(Ordering::SeqCst) == held + kept
        })
        .await;
        assert!(
            refilled,
            "{name}: {held} held and {KEPT} idle per core, open: {}",
            connections.open.load(Ordering::SeqCst)
        );
    }

    release_backend.send_replace(true);
    release_origin.send_replace(true);
    for call in calls {
        let response = call.await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(&response.bytes()[..], b"held");
    }
    // Returned, the connections are idle above the floor: nothing more is opened.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (name, connections) in [
        ("backend", &backend_connections),
        ("origin", &origin_connections),
    ] {
        assert_eq!(
            connections.accepted.load(Ordering::SeqCst),
            held + kept,
            "{name}"
        );
        assert_eq!(
            connections.open.load(Ordering::SeqCst),
            held + kept,
            "{name}"
        );
    }

    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    remove_config_file(&path);
}

#[tokio::test]
async fn upstreams_that_cannot_be_reached_are_reported_once_and_the_start_goes_on() {
    let (origin, _) = counting_server(b"origin").await;
    let refusing = closed_port();
    // The proxy may not reach loopback (the default): its connection ahead is refused by
    // the same check as a call's.
    let path = config_file(
        "preconnect-unreached",
        &format!(
            "{}[services.orders]\ntype = \"route\"\npath_prefix = \"/orders\"\n\
             backends = [\"http://127.0.0.1:{refusing}\"]\npreconnect = 2\n\n\
             [services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n\
             preconnect_origins = [\"http://{origin}\"]\n",
            server_table("")
        ),
    );
    let wharf = WharfProcess::start(&path);
    // It serves: the route's call fails over to nothing and is answered 502.
    let routed = get(&wharf.url("/orders/1")).await;
    assert_eq!(routed.status, 502);
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("preconnect: upstreams not reached"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning for all cores: {logs}");
    let warning = warnings[0];
    assert!(
        warning.contains(&format!(
            "services.orders: backend http://127.0.0.1:{refusing}: "
        )),
        "{warning}"
    );
    assert!(
        warning.contains("services.proxy: destination 127.0.0.1 refused"),
        "{warning}"
    );
    if cores() > 1 {
        let on_every_core = format!(" ({} cores)", cores());
        assert_eq!(
            warning.matches(&on_every_core).count(),
            2,
            "each line once, with how many cores had it: {warning}"
        );
    }
    remove_config_file(&path);
}

fn empty_config() -> Config {
    Config::from_toml_str(&server_table(""), "test.toml").unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_for_every_core_runs_on_each_core_and_reports_a_shared_failure_once() {
    let builder = HostBuilder::new(empty_config().server);
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let recorded = threads.clone();
    let work: CoreWork = Arc::new(move || {
        let recorded = recorded.clone();
        Box::pin(async move {
            recorded.lock().unwrap().insert(std::thread::current().id());
            vec!["upstream x: refused".to_owned()]
        })
    });
    let report = builder.on_each_core(&work, Duration::from_secs(10)).await;
    assert_eq!(report.cores, 2, "one core per runtime worker");
    assert_eq!(report.finished, 2);
    assert_eq!(report.failed, ["upstream x: refused (2 cores)"]);
    let threads = threads.lock().unwrap();
    assert_eq!(threads.len(), 2, "each core on its own thread");
    assert!(
        !threads.contains(&std::thread::current().id()),
        "the work runs on the cores, not on the caller's thread"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_still_going_at_the_wait_s_end_finishes_in_the_background() {
    let builder = HostBuilder::new(empty_config().server);
    let (release, released) = tokio::sync::watch::channel(false);
    let finished = Arc::new(AtomicUsize::new(0));
    let counter = finished.clone();
    let work: CoreWork = Arc::new(move || {
        let (mut released, counter) = (released.clone(), counter.clone());
        Box::pin(async move {
            let _ = released.wait_for(|go| *go).await;
            counter.fetch_add(1, Ordering::SeqCst);
            Vec::new()
        })
    });
    let report = builder.on_each_core(&work, Duration::from_millis(20)).await;
    assert_eq!((report.cores, report.finished), (2, 0));
    assert!(report.failed.is_empty());
    release.send_replace(true);
    assert!(
        poll_until(Duration::from_secs(5), || async {
            finished.load(Ordering::SeqCst) == 2
        })
        .await,
        "the work was left running on both cores, not cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_opens_connections_ahead_for_the_services_it_builds_anew_only() {
    let (backend, accepted) = counting_server(b"backend").await;
    let route = |preconnect: u32| {
        format!(
            "{}[services.orders]\ntype = \"route\"\npath_prefix = \"/orders\"\n\
             backends = [\"http://{backend}\"]\npreconnect = {preconnect}\n",
            server_table("")
        )
    };
    let path = config_file("preconnect-reload", &route(0));
    let config = Config::load(&path).unwrap();
    let (builder, catalogue) = wharf::assemble(&config).unwrap();
    let host = builder.bind().await.unwrap();
    let reloader = wharf::ConfigReloader::new(
        path.clone(),
        &config,
        catalogue,
        host.reloader(),
        wharf::ServerOverrides::default(),
    );
    let wharf = spawn_bound(host);
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "none without the key");

    std::fs::write(&path, route(1)).unwrap();
    let summary = reloader.reload().await.unwrap();
    assert!(summary.contains("built [\"orders\"]"), "{summary}");
    let opened = poll_until(Duration::from_secs(5), || async {
        accepted.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(opened, "one per core: {}", accepted.load(Ordering::SeqCst));

    // Kept as it is, the service opens nothing more.
    let summary = reloader.reload().await.unwrap();
    assert!(summary.contains("kept [\"orders\"]"), "{summary}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    for _ in 0..4 {
        assert_eq!(get(&wharf.url("/orders/1")).await.status, 200);
    }
    // The calls took kept connections: each core's keeper opens at most one more.
    assert!(accepted.load(Ordering::SeqCst) <= 4);
    wharf.stop().await;
    remove_config_file(&path);
}
