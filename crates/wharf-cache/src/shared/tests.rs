//! The shared tier against the real Redis at 127.0.0.1:6379 (skipped, loudly, when there is
//! none), and its pure helpers.

use super::lease::meta_and_pttl;
use super::*;
use http::{HeaderMap, HeaderValue, StatusCode};
use wharf_metrics::Metrics;

const REDIS: &str = "redis://127.0.0.1:6379";

#[allow(clippy::disallowed_methods)] // a probe of the test's Redis, not an upstream
async fn redis_is_up() -> bool {
    let up = tokio::time::timeout(
        Duration::from_millis(500),
        tokio::net::TcpStream::connect("127.0.0.1:6379"),
    )
    .await
    .is_ok_and(|connected| connected.is_ok());
    if !up {
        eprintln!(
            "SKIP: no Redis at 127.0.0.1:6379 (start it: see .ci/run); shared tier test not run"
        );
    }
    up
}

fn unique(name: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("test:{name}:{}:{}", std::process::id(), now.as_nanos())
}

fn tier(metrics: &Metrics, url: &str) -> Arc<SharedTier> {
    SharedTier::new(SharedTierConfig::new(url), metrics.shared_cache("t")).unwrap()
}

/// Entries up to `max_bytes`, with a `max_ttl` longer than any test's TTL.
fn limits(max_bytes: u64) -> EntryLimits {
    EntryLimits {
        max_bytes,
        max_ttl: Duration::from_secs(3600),
    }
}

fn entry(body: Vec<Bytes>, ttl: Duration) -> CachedResponse {
    entry_stored(body, Instant::now(), ttl)
}

fn entry_stored(body: Vec<Bytes>, stored_at: Instant, ttl: Duration) -> CachedResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert("etag", HeaderValue::from_static("\"e\""));
    let head = Arc::new(ResponseHead {
        status: StatusCode::OK,
        headers,
    });
    CachedResponse::new(head, body, stored_at, ttl)
}

/// `a` asks for `key` first and takes its lease (else panics with `why`); `b`, asking next,
/// is told the lease is held: one fetcher between them.
async fn one_fetcher(
    (a, b): (&Arc<SharedTier>, &Arc<SharedTier>),
    key: &str,
    ttl: Duration,
    limits: EntryLimits,
    why: &str,
) -> Lease {
    let LeaseOutcome::Acquired(lease) = a.lookup_or_lease(key, ttl, limits).await else {
        panic!("{why}");
    };
    assert!(matches!(
        b.lookup_or_lease(key, ttl, limits).await,
        LeaseOutcome::Held
    ));
    lease
}

fn body_of(entry: &CachedResponse) -> Vec<u8> {
    let chunks = entry.body.chunks().unwrap();
    chunks.iter().flat_map(|c| c.iter().copied()).collect()
}

#[test]
fn rechunk_regroups_into_fixed_sizes_without_losing_bytes() {
    let pieces: Vec<Bytes> = [3usize, 10, 1, 0, 7, 4]
        .iter()
        .enumerate()
        .map(|(i, n)| Bytes::from(vec![i as u8; *n]))
        .collect();
    let whole: Vec<u8> = pieces.iter().flat_map(|c| c.iter().copied()).collect();
    let out = rechunk(&pieces, 4);
    assert!(out.iter().rev().skip(1).all(|c| c.len() == 4));
    assert_eq!(
        out.iter()
            .flat_map(|c| c.iter().copied())
            .collect::<Vec<_>>(),
        whole
    );
    assert!(rechunk(&[], 4).is_empty());
}

#[tokio::test]
async fn a_multi_chunk_body_round_trips_byte_for_byte() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let tier = tier(&metrics, REDIS);
    let key = unique("roundtrip");
    // 1 MiB + 1000 bytes in odd origin-sized pieces: five 256 KiB values.
    let whole: Vec<u8> = (0..(1 << 20) + 1000)
        .map(|i: u32| (i % 251) as u8)
        .collect();
    let pieces: Vec<Bytes> = whole.chunks(16_000).map(Bytes::copy_from_slice).collect();
    tier.put(&key, &entry(pieces, Duration::from_secs(30)))
        .await;
    let found = tier
        .get(&key, limits(64 << 20))
        .await
        .expect("entry stored");
    // Stored as five 256 KiB values; read back, the entry is one compact buffer.
    assert_eq!(found.body_len, whole.len() as u64);
    assert_eq!(body_of(&found), whole);
    assert_eq!(found.head.headers["etag"], "\"e\"");
    assert!(found.expires_at > Instant::now() + Duration::from_secs(25));
    assert!(
        tier.get(&key, limits(1000)).await.is_none(),
        "over max_bytes"
    );
    let text = metrics.encode();
    assert!(
        text.contains("wharf_shared_cache_requests_total{service=\"t\",result=\"hit\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("wharf_shared_cache_writes_total{service=\"t\",outcome=\"ok\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn the_lease_makes_one_fetcher_and_waiters_see_its_entry_or_its_release() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let a = tier(&metrics, REDIS);
    let b = tier(&metrics, REDIS);
    let key = unique("lease");
    let ttl = Duration::from_secs(5);
    let lease = one_fetcher(
        (&a, &b),
        &key,
        ttl,
        limits(1 << 20),
        "first instance takes the lease",
    )
    .await;
    // Given back without an entry: the waiter is told at its next poll.
    a.release(lease).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    assert!(matches!(
        b.wait(&key, limits(1 << 20), until).await,
        WaitOutcome::LeaseFree
    ));
    // Taken again; the entry arrives while the other waits.
    let LeaseOutcome::Acquired(lease) = b.lookup_or_lease(&key, ttl, limits(1 << 20)).await else {
        panic!("free lease is taken");
    };
    let writer = {
        let b = b.clone();
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.put(&key, &entry(vec![Bytes::from_static(b"shared")], ttl))
                .await;
            b.release(lease).await;
        })
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    match a.wait(&key, limits(1 << 20), until).await {
        WaitOutcome::Found(found) => assert_eq!(body_of(&found), b"shared"),
        other => panic!("expected the entry, got {other:?}"),
    }
    writer.await.unwrap();
    assert!(matches!(
        a.lookup_or_lease(&key, ttl, limits(1 << 20)).await,
        LeaseOutcome::Found(_)
    ));
}

#[tokio::test]
async fn a_lease_is_renewed_while_its_holder_lives_and_expires_within_a_ttl_once_it_dies() {
    if !redis_is_up().await {
        return;
    }
    let key = unique("renew");
    let ttl = Duration::from_millis(500);
    let holder_lives = Duration::from_millis(1500);
    // The holder runs on a runtime of its own, dropped while it still holds the lease: its
    // renewal task dies with it and never gives the lease back, as when a process dies.
    let (taken_tx, taken_rx) = std::sync::mpsc::channel();
    let holder = {
        let key = key.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let lease = runtime.block_on(async {
                let metrics = Metrics::new();
                let a = tier(&metrics, REDIS);
                let LeaseOutcome::Acquired(lease) =
                    a.lookup_or_lease(&key, ttl, limits(1 << 20)).await
                else {
                    panic!("the holder takes the lease");
                };
                taken_tx.send(()).unwrap();
                // Fetching, for three TTLs.
                tokio::time::sleep(holder_lives).await;
                lease
            });
            drop(runtime);
            drop(lease);
        })
    };
    tokio::task::spawn_blocking(move || taken_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let taken = Instant::now();
    let metrics = Metrics::new();
    let b = tier(&metrics, REDIS);
    assert!(matches!(
        b.lookup_or_lease(&key, ttl, limits(1 << 20)).await,
        LeaseOutcome::Held
    ));
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let outcome = b.wait(&key, limits(1 << 20), until).await;
    let waited = taken.elapsed();
    holder.join().unwrap();
    assert!(matches!(outcome, WaitOutcome::LeaseFree), "{outcome:?}");
    assert!(
        waited >= holder_lives - Duration::from_millis(100),
        "the lease outlived its {ttl:?} TTL while renewed: free after {waited:?}"
    );
    assert!(
        waited < holder_lives + ttl + Duration::from_millis(400),
        "a dead holder's lease expires within one TTL: free after {waited:?}"
    );
}

#[tokio::test]
async fn an_entry_is_fresh_for_no_longer_than_the_readers_max_ttl() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let tier = tier(&metrics, REDIS);
    let key = unique("max_ttl");
    // Stored 3 s ago by a writer whose TTL is 30 s.
    let stored_at = Instant::now() - Duration::from_secs(3);
    let body = vec![Bytes::from_static(b"capped")];
    tier.put(
        &key,
        &entry_stored(body, stored_at, Duration::from_secs(30)),
    )
    .await;
    let reader = |max_ttl: u64| EntryLimits {
        max_bytes: 1 << 20,
        max_ttl: Duration::from_secs(max_ttl),
    };
    assert!(
        tier.get(&key, reader(2)).await.is_none(),
        "older than the reader's max_ttl: a miss"
    );
    // A miss here, refetched under the lease (an_entry_unusable_here_is_replaced_under_the_lease).
    let LeaseOutcome::Acquired(lease) = tier
        .lookup_or_lease(&key, Duration::from_secs(1), reader(2))
        .await
    else {
        panic!("older than the reader's max_ttl: a miss");
    };
    tier.release(lease).await;
    // Fresh for this reader for 10 s from the store time, 7 s from now, not 27 s.
    let found = tier.get(&key, reader(10)).await.expect("fresh for 10 s");
    let left = found.expires_at.saturating_duration_since(Instant::now());
    assert!(
        left > Duration::from_secs(6) && left <= Duration::from_millis(7_050),
        "{left:?}"
    );
    assert_eq!(found.age_secs(Instant::now()), 3);
    // A reader allowing more keeps the writer's TTL.
    let found = tier.get(&key, limits(1 << 20)).await.expect("writer's TTL");
    let left = found.expires_at.saturating_duration_since(Instant::now());
    assert!(
        left > Duration::from_secs(26) && left <= Duration::from_millis(27_050),
        "{left:?}"
    );
}

#[tokio::test]
async fn a_dead_redis_costs_at_most_one_timeout_then_is_skipped() {
    // Nothing listens on port 1: refused at once, or at worst the op timeout.
    let metrics = Metrics::new();
    let tier = tier(&metrics, "redis://127.0.0.1:1");
    let started = Instant::now();
    assert!(tier.get("k", limits(1 << 20)).await.is_none());
    assert!(started.elapsed() < DEFAULT_OP_TIMEOUT + Duration::from_millis(50));
    let started = Instant::now();
    assert!(matches!(
        tier.lookup_or_lease("k", Duration::from_secs(1), limits(1 << 20))
            .await,
        LeaseOutcome::Skip
    ));
    tier.put(
        "k",
        &entry(vec![Bytes::from_static(b"x")], Duration::from_secs(5)),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(5),
        "resting tier is skipped at once"
    );
    let text = metrics.encode();
    assert!(
        text.contains("wharf_shared_cache_requests_total{service=\"t\",result=\"error\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("wharf_shared_cache_requests_total{service=\"t\",result=\"skipped\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("wharf_shared_cache_writes_total{service=\"t\",outcome=\"skipped\"} 1"),
        "{text}"
    );
}

#[test]
fn a_bad_url_is_refused_at_build() {
    let metrics = Metrics::new();
    let error = SharedTier::new(
        SharedTierConfig::new("http://nope"),
        metrics.shared_cache("t"),
    )
    .expect_err("not a redis url");
    assert!(error.to_string().contains("http://nope"), "{error}");
}

/// A failure anywhere on the tier rests it for a second; the holder's renewals go on
/// meanwhile, or a lease shorter than the rest would lapse and a waiter fetch the origin
/// too.
#[tokio::test]
async fn a_lease_is_renewed_while_the_tier_rests() {
    if !redis_is_up().await {
        return;
    }
    let key = unique("rest");
    let ttl = Duration::from_millis(400);
    let metrics = Metrics::new();
    let a = tier(&metrics, REDIS);
    let LeaseOutcome::Acquired(lease) = a.lookup_or_lease(&key, ttl, limits(1 << 20)).await else {
        panic!("the holder takes the lease");
    };
    // Resting for three TTLs, as after a failed operation of another call.
    let resting_until = Instant::now() + ttl * 3;
    while Instant::now() < resting_until {
        a.rest();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = tier(&metrics, REDIS);
    assert!(
        matches!(
            b.lookup_or_lease(&key, ttl, limits(1 << 20)).await,
            LeaseOutcome::Held
        ),
        "the lease lapsed while the tier rested"
    );
    drop(lease);
}

/// An entry's age is its TTL less what Redis has left of it, not a time of day the writer
/// stored: instances whose clocks disagree agree on it. Shortening the meta value's expiry
/// by hand (as Redis's clock running 40 s ahead of the writer's would) ages the entry for
/// every reader, and a reader's `max_ttl` then refuses it.
#[tokio::test]
async fn an_entrys_age_is_counted_on_the_clock_of_redis() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let tier = tier(&metrics, REDIS);
    let key = unique("redis_clock");
    let body = vec![Bytes::from_static(b"aged by redis")];
    tier.put(&key, &entry(body, Duration::from_secs(60))).await;
    let fresh = tier.get(&key, limits(1 << 20)).await.expect("stored");
    assert!(fresh.age_secs(Instant::now()) <= 1);

    let mut connection = tier.connection.clone();
    let shortened: i64 = redis::cmd("PEXPIRE")
        .arg(Keys::new(&key).meta)
        .arg(20_000)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(shortened, 1);
    let aged = tier.get(&key, limits(1 << 20)).await.expect("still fresh");
    // 40 s and the few ms since the PEXPIRE (a second more on a stalled machine).
    assert!((40..=41).contains(&aged.age_secs(Instant::now())));
    let left = aged.expires_at.saturating_duration_since(Instant::now());
    assert!(
        left > Duration::from_secs(19) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    let reader = EntryLimits {
        max_bytes: 1 << 20,
        max_ttl: Duration::from_secs(30),
    };
    assert!(
        tier.get(&key, reader).await.is_none(),
        "40 s old: past a 30 s max_ttl"
    );
    let LeaseOutcome::Acquired(lease) = tier
        .lookup_or_lease(&key, Duration::from_secs(1), reader)
        .await
    else {
        panic!("40 s old: a miss past a 30 s max_ttl");
    };
    tier.release(lease).await;
    match tier
        .lookup_or_lease(&key, Duration::from_secs(1), limits(1 << 20))
        .await
    {
        LeaseOutcome::Found(entry) => {
            assert!((40..=41).contains(&entry.age_secs(Instant::now())));
        }
        other => panic!("expected the entry, found {other:?}"),
    }
    // A waiter for another instance's fill that finds the entry ages it alike.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    match tier.wait(&key, limits(1 << 20), until).await {
        WaitOutcome::Found(entry) => {
            assert!((40..=41).contains(&entry.age_secs(Instant::now())));
        }
        other => panic!("expected the entry, found {other:?}"),
    }
}

/// An entry in Redis that this instance cannot serve but its fetch would replace (older
/// than its `max_ttl`, or a chunk evicted, as Redis evicts big values first) is refetched
/// under the lease, as a miss is: one instance fetches, the others wait for its entry
/// rather than each fetching the origin. One over this instance's `max_bytes` is not (its
/// fetch would store nothing).
#[tokio::test]
async fn an_entry_unusable_here_is_replaced_under_the_lease() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let (a, b) = (tier(&metrics, REDIS), tier(&metrics, REDIS));
    let key = unique("replace");
    let lease_ttl = Duration::from_secs(5);
    // Stored 3 s ago with a 30 s TTL: stale for instances whose max_ttl is 2 s.
    let stored_at = Instant::now() - Duration::from_secs(3);
    let old = vec![Bytes::from_static(b"old")];
    a.put(&key, &entry_stored(old, stored_at, Duration::from_secs(30)))
        .await;
    let short = EntryLimits {
        max_bytes: 1 << 20,
        max_ttl: Duration::from_secs(2),
    };
    let lease = one_fetcher(
        (&a, &b),
        &key,
        lease_ttl,
        short,
        "a stale entry is a miss that takes the lease",
    )
    .await;
    assert!(
        matches!(
            b.lookup_or_lease(&key, lease_ttl, limits(2)).await,
            LeaseOutcome::Skip
        ),
        "over this instance's max_bytes: fetched without the lease"
    );
    // The holder replaces the entry while the other waits past the stale one.
    let writer = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let new = vec![Bytes::from_static(b"new")];
            a.put(&key, &entry(new, Duration::from_secs(30))).await;
            a.release(lease).await;
        })
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    match b.wait(&key, short, until).await {
        WaitOutcome::Found(found) => assert_eq!(body_of(&found), b"new"),
        other => panic!("expected the holder's entry, got {other:?}"),
    }
    writer.await.unwrap();

    // A chunk evicted: the meta value names a body Redis no longer has all of.
    let key = unique("evicted");
    let body: Vec<u8> = (0..(300 << 10)).map(|i: u32| (i % 251) as u8).collect();
    a.put(
        &key,
        &entry(vec![Bytes::from(body)], Duration::from_secs(30)),
    )
    .await;
    let mut connection = a.connection.clone();
    let chunks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", Keys::new(&key).chunk_prefix))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(chunks.len(), 2, "300 KiB in 256 KiB values");
    let _: i64 = redis::cmd("DEL")
        .arg(&chunks[1])
        .query_async(&mut connection)
        .await
        .unwrap();
    let lease = one_fetcher(
        (&a, &b),
        &key,
        lease_ttl,
        limits(1 << 20),
        "an entry missing a chunk is a miss that takes the lease",
    )
    .await;
    a.release(lease).await;
    // Given back with the broken entry still there: the waiter is told the lease is free.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    assert!(matches!(
        b.wait(&key, limits(1 << 20), until).await,
        WaitOutcome::LeaseFree
    ));
}

/// The second run of the lookup-or-lease script, for an entry this instance would replace,
/// takes the lease only past that very entry: one stored meanwhile by another instance is
/// returned to be read, not fetched again.
#[tokio::test]
async fn the_lease_is_taken_past_the_entry_read_and_no_other() {
    if !redis_is_up().await {
        return;
    }
    let metrics = Metrics::new();
    let tier = tier(&metrics, REDIS);
    let key = unique("look_past");
    let keys = Keys::new(&key);
    let mut connection = tier.connection.clone();
    let meta_now = || {
        let mut connection = connection.clone();
        let meta = keys.meta.clone();
        async move {
            redis::cmd("GET")
                .arg(meta)
                .query_async::<Vec<u8>>(&mut connection)
                .await
                .unwrap()
        }
    };
    let body = || vec![Bytes::from_static(b"v")];
    tier.put(&key, &entry(body(), Duration::from_secs(30)))
        .await;
    let read = meta_now().await;
    // Another instance stores a new entry after this one read the first.
    tier.put(&key, &entry(body(), Duration::from_secs(30)))
        .await;
    let stored = meta_now().await;
    assert_ne!(read, stored, "a new version");
    let answer = tier
        .lookup_script(&keys, "token", 5_000, Some(&read))
        .await
        .unwrap();
    assert_eq!(
        meta_and_pttl(&answer).map(|(meta, _)| meta.to_vec()),
        Some(stored.clone()),
        "the new entry, to be read"
    );
    let answer = tier
        .lookup_script(&keys, "token", 5_000, Some(&stored))
        .await
        .unwrap();
    assert_eq!(answer, Value::Int(1), "past the entry read: the lease");
    let _: i64 = redis::cmd("DEL")
        .arg(&keys.lease)
        .query_async(&mut connection)
        .await
        .unwrap();
}
