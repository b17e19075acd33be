//! `server.cpu_steering` end to end: a core takes the connections whose SYN came in on its
//! CPU (over loopback, the CPU of the thread that connects), and a core that keeps holding far
//! more than its share of the open sessions stops steering so the kernel's hash spreads the
//! new ones. The core that served
//! a call is read from the name of the thread its handler ran on (`wharf-core-N`).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use wharf_config::{LimitsConfig, ServerConfig};
use wharf_host::body::full;
use wharf_host::{handler, HostBuilder, Mount};

const LIMIT: Duration = Duration::from_secs(5);

/// A host with two cores (the test runtime's two workers) whose `/core` names the core that
/// served the call.
async fn host(cpu_steering: bool) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let limits = LimitsConfig {
        max_concurrent_calls: 64,
        max_queued_calls: 64,
        queue_timeout: LIMIT,
    };
    let server = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        cpu_steering,
        ..ServerConfig::default()
    };
    let host = HostBuilder::new(server)
        .mount(
            "core",
            Mount::Exact("/core".into()),
            &limits,
            handler(|_request| async {
                let name = std::thread::current().name().unwrap_or("?").to_owned();
                http::Response::new(full(name))
            }),
        )
        .bind()
        .await
        .unwrap();
    let addr = host.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    let mut only = rustix::thread::CpuSet::new();
    only.set(cpu);
    rustix::thread::sched_setaffinity(None, &only).unwrap();
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    let set = rustix::thread::sched_getaffinity(None).unwrap();
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect()
}

/// From a thread pinned to `cpu`: `count` connections, one after another, one call each,
/// closed after it; the core that served each.
async fn cores_seen_from(addr: SocketAddr, cpu: usize, count: usize) -> Vec<String> {
    open_from(addr, cpu, count, false).await.0
}

/// The CPUs to steer between, or `None` (and a note) on a machine with one.
fn two_cpus() -> Option<Vec<usize>> {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU only ({cpus:?}): nothing to steer between");
        return None;
    }
    Some(cpus)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_core_takes_the_connections_of_its_cpu() {
    let Some(cpus) = two_cpus() else {
        return;
    };
    let (addr, _stop) = host(true).await;
    for (core, &cpu) in cpus.iter().take(2).enumerate() {
        let seen = cores_seen_from(addr, cpu, 16).await;
        let expected = format!("wharf-core-{core}");
        assert!(
            seen.iter().all(|name| *name == expected),
            "connections from CPU {cpu}: {seen:?}, all expected on {expected}"
        );
    }
}

/// From a thread pinned to `cpu`: `count` keep-alive connections with one call each, left
/// open; the core that served each. With `at_once`, every connection is opened before the
/// first request is sent (a burst); else each is opened after the last one's answer.
async fn open_from(
    addr: SocketAddr,
    cpu: usize,
    count: usize,
    at_once: bool,
) -> (Vec<String>, Vec<TcpStream>) {
    tokio::task::spawn_blocking(move || {
        pin_to(cpu);
        let connect = || {
            let stream = TcpStream::connect(addr).unwrap();
            stream.set_read_timeout(Some(LIMIT)).unwrap();
            stream
        };
        if at_once {
            let mut streams: Vec<TcpStream> = (0..count).map(|_| connect()).collect();
            let names = streams.iter_mut().map(call).collect();
            (names, streams)
        } else {
            (0..count)
                .map(|_| {
                    let mut stream = connect();
                    (call(&mut stream), stream)
                })
                .unzip()
        }
    })
    .await
    .unwrap()
}

/// One call of `/core` on `stream`: the core that served it.
fn call(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /core HTTP/1.1\r\nhost: a\r\n\r\n")
        .unwrap();
    // The body is a thread name: "wharf-core-N" (N < 10 here).
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\nwharf-core-0")
        && !response.ends_with(b"\r\n\r\nwharf-core-1")
    {
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&response[response.len() - 12..]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_holding_most_sessions_stops_steering() {
    let Some(cpus) = two_cpus() else {
        return;
    };
    let (addr, _stop) = host(true).await;
    // 40 open sessions, all on core 0: over the guard's 32 and its 1.5 x share.
    let (first, _open) = open_from(addr, cpus[0], 40, false).await;
    assert!(
        first.iter().all(|name| name == "wharf-core-0"),
        "while steering: {first:?}"
    );
    // The guard checks at most once a second and acts at the third check in a row that
    // finds core 0 over its share; from then on the hash spreads connections from CPU 0.
    let started = Instant::now();
    loop {
        let seen = cores_seen_from(addr, cpus[0], 1).await;
        if seen.iter().any(|name| name == "wharf-core-1") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "core 0 still takes every connection from CPU {} after 15 s",
            cpus[0]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "steering stopped after {:?}, before three checks a second apart",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_from_one_cpu_pauses_steering() {
    let Some(cpus) = two_cpus() else {
        return;
    };
    let (addr, _stop) = host(true).await;
    // 200 connections at once from CPU 0 (a few milliseconds: loopback connects queue
    // without waiting for the accept): steered to core 0, whose 64th accept within 10 ms
    // pauses its steering. The first 63 were placed before that.
    let (burst, _burst_open) = open_from(addr, cpus[0], 200, true).await;
    assert!(
        burst[..63].iter().all(|name| name == "wharf-core-0"),
        "the burst's first 63: {:?}",
        &burst[..63]
    );
    // Within the pause (1 s), connections from the same CPU go by the hash.
    let after = cores_seen_from(addr, cpus[0], 32).await;
    assert!(
        after.iter().any(|name| name == "wharf-core-1"),
        "after the burst: {after:?}"
    );
}
