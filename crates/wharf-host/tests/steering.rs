//! `server.cpu_steering` end to end: a core takes the connections whose SYN came in on its
//! CPU (over loopback, the CPU of the thread that connects), and a core that takes far more
//! than its share stops steering so the kernel's hash spreads the rest. The core that served
//! a call is read from the name of the thread its handler ran on (`wharf-core-N`).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

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

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    let set = rustix::thread::sched_getaffinity(None).unwrap();
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect()
}

/// From a thread pinned to `cpu`: `count` connections, one after another, one call each;
/// the core that served each.
async fn cores_seen_from(addr: SocketAddr, cpu: usize, count: usize) -> Vec<String> {
    tokio::task::spawn_blocking(move || {
        let mut only = rustix::thread::CpuSet::new();
        only.set(cpu);
        rustix::thread::sched_setaffinity(None, &only).unwrap();
        (0..count)
            .map(|_| {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.set_read_timeout(Some(LIMIT)).unwrap();
                stream
                    .write_all(b"GET /core HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
                    .unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                assert!(response.starts_with("HTTP/1.1 200"), "{response}");
                response
                    .rsplit("\r\n\r\n")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_core_takes_the_connections_of_its_cpu() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU only ({cpus:?}): nothing to steer between");
        return;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_taking_every_connection_stops_steering() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU only ({cpus:?}): nothing to steer between");
        return;
    }
    let (addr, _stop) = host(true).await;
    // The balance's window is 256 connections: all of them come to core 0 while it steers.
    let first = cores_seen_from(addr, cpus[0], 256).await;
    assert!(
        first.iter().all(|name| name == "wharf-core-0"),
        "while steering: {first:?}"
    );
    // Then the hash spreads connections from the same CPU over both cores.
    let after = cores_seen_from(addr, cpus[0], 64).await;
    assert!(
        after.iter().any(|name| name == "wharf-core-1"),
        "after the guard: {after:?}"
    );
}
