//! The data plane's cores (`crates/wharf-host/src/cores.rs`), seen from outside: TCP
//! sessions run on the core threads (not on the multi-threaded runtime's workers), new
//! connections are spread over every core, and after shutdown the service address takes
//! no more connections.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::net::TcpStream;
use wharf_config::{Config, LimitsConfig};
use wharf_host::body::full;
use wharf_host::{handler, Mount};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_on_every_core_and_stop_with_the_host() {
    let config = Config::from_toml_str(&server_table(""), "test.toml").unwrap();
    let limits = LimitsConfig {
        max_concurrent_calls: 64,
        max_queued_calls: 64,
        queue_timeout: Duration::from_secs(5),
    };
    // A service that answers with the name of the thread it ran on.
    let builder = wharf::build_host(&config).unwrap().mount(
        "thread",
        Mount::Exact("/thread".into()),
        &limits,
        handler(|_request| async {
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_owned();
            http::Response::new(full(name))
        }),
    );
    let wharf = spawn_host(builder).await;
    let request = b"GET /thread HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

    let mut threads = BTreeSet::new();
    for _ in 0..40 {
        let answer = raw_exchange(wharf.addr, request, Duration::from_secs(5)).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        threads.insert(answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned());
    }
    // Two workers, two cores; the kernel spreads 40 connections over both listeners (all
    // on one would take odds of 2 in 2^40).
    assert_eq!(
        threads,
        BTreeSet::from(["wharf-core-0".to_owned(), "wharf-core-1".to_owned()])
    );

    let addr = wharf.addr;
    tokio::time::timeout(Duration::from_secs(10), wharf.stop())
        .await
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the service address still takes connections after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_cores_watch_the_service_socket() {
    // The first core accepts from a copy of the host's listener (the same socket). Were the
    // host's own descriptor still registered with the multi-threaded runtime's epoll (the
    // one that watches the admin listener), every connection for that core would wake one
    // of that runtime's threads as well.
    let config = Config::from_toml_str(&server_table(""), "test.toml").unwrap();
    let wharf = spawn_host(wharf::build_host(&config).unwrap()).await;
    let request = b"GET /nothing-here HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    // A call first: a core serves it, so the cores have their listeners.
    let answer = raw_exchange(wharf.addr, request, Duration::from_secs(10)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Read until the view settles: other tests open and close sockets meanwhile, and a
    // read of `/proc/net/tcp` or of a descriptor that closes may miss an entry.
    let (mut service, mut admin) = (BTreeSet::new(), BTreeSet::new());
    let (mut main, mut unwatched, mut shared) = (0, BTreeSet::new(), BTreeSet::new());
    for _ in 0..100 {
        // One listening socket per core, bound to the same address (SO_REUSEPORT).
        service = listening_socket_inodes(wharf.addr);
        admin = listening_socket_inodes(wharf.admin_addr);
        let epolls = epoll_registrations();
        let admin_epolls: Vec<_> = epolls
            .iter()
            .filter(|watched| !watched.is_disjoint(&admin))
            .collect();
        main = admin_epolls.len();
        unwatched = service
            .iter()
            .filter(|socket| !epolls.iter().any(|watched| watched.contains(socket)))
            .copied()
            .collect();
        shared = admin_epolls
            .iter()
            .flat_map(|watched| watched.intersection(&service))
            .copied()
            .collect();
        let settled = service.len() == 2 && admin.len() == 1 && main > 0;
        if settled && unwatched.is_empty() && shared.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        service.len(),
        2,
        "one listening socket per core: {service:?}"
    );
    assert_eq!(admin.len(), 1, "one admin socket: {admin:?}");
    assert!(main > 0, "no epoll watches the admin socket");
    assert!(
        unwatched.is_empty(),
        "no epoll watches service sockets {unwatched:?}"
    );
    assert!(
        shared.is_empty(),
        "the runtime that serves the admin listener also watches service sockets {shared:?}"
    );
    wharf.stop().await;
}

/// The inodes of the sockets listening on `addr` (IPv4), from `/proc/net/tcp`.
fn listening_socket_inodes(addr: std::net::SocketAddr) -> BTreeSet<u64> {
    let std::net::SocketAddr::V4(v4) = addr else {
        return BTreeSet::new();
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state 0A (LISTEN), inode
            (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A"))
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// For each epoll descriptor of this process: the inodes of the files it watches.
fn epoll_registrations() -> Vec<BTreeSet<u64>> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy() == "anon_inode:[eventpoll]")
        })
        .filter_map(|fd| {
            let info = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .ok()?;
            Some(
                info.lines()
                    .filter(|line| line.starts_with("tfd:"))
                    .filter_map(|line| line.split_whitespace().find_map(|f| f.strip_prefix("ino:")))
                    .filter_map(|hex| u64::from_str_radix(hex, 16).ok())
                    .collect(),
            )
        })
        .collect()
}
