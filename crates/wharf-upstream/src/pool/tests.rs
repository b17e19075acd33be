// The tests dial their own loopback listeners.
#![allow(clippy::disallowed_methods)]

use super::*;
use crate::error::NoRoom;
use tokio::net::{TcpListener, TcpStream};

const LIMITS: PoolLimits = PoolLimits {
    max_idle_per_key: 4,
    max_idle_total: 16,
    idle_timeout: Duration::from_secs(30),
    max_connecting_per_key: 2,
    max_connect_wait: Duration::from_secs(30),
};

/// An open connection to a listener that keeps its end open.
async fn open_connection(listener: &TcpListener) -> (Connection, TcpStream) {
    let address = listener.local_addr().unwrap();
    let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    (Connection::new(client.unwrap()), accepted.unwrap().0)
}

fn expect_connect(checkout: Option<Checkout>) -> (PoolSlot, ConnectPermit) {
    match checkout {
        Some(Checkout::Connect(slot, permit)) => (slot, permit),
        other => panic!("expected the right to connect, got {other:?}"),
    }
}

#[tokio::test]
async fn past_the_connect_slots_a_call_waits_for_a_returned_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let (slot, _first) = expect_connect(pool.try_acquire("up"));
    let _second = expect_connect(pool.try_acquire("up"));
    assert!(
        pool.try_acquire("up").is_none(),
        "both connect slots are taken"
    );

    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire("up").await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "no connection and no slot: it waits");

    let (connection, _server_end) = open_connection(&listener).await;
    slot.check_in(connection);
    match waiter.await.unwrap() {
        Checkout::Idle(..) => {}
        other => panic!("the waiting call should get the returned connection, got {other:?}"),
    }
}

#[tokio::test]
async fn the_sweep_gives_back_idle_read_buffers_and_keeps_the_connections() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let (slot, connection) = pool.check_out("up");
    assert!(connection.is_none());
    let (mut connection, _server_end) = open_connection(&listener).await;
    // What a finished exchange leaves: nothing buffered, the allocation's tail kept.
    connection.buf.reserve(8 * 1024);
    slot.check_in(connection);

    pool.sweep();
    assert_eq!(pool.idle_count(), 1, "a fresh, open connection stays");
    match pool.try_acquire("up") {
        Some(Checkout::Idle(_, connection)) => assert_eq!(connection.buf.capacity(), 0),
        other => panic!("expected the idle connection, got {other:?}"),
    }
}

/// A ledger with `room` descriptors to lend beside a reserve of 10 and no session.
fn ledger_with_room(room: u64) -> Arc<DescriptorLedger> {
    let ledger = DescriptorLedger::unlimited();
    ledger.set_limit(Some(10 + room), 10);
    ledger
}

/// Checks `count` open connections to `key` into `pool`; returns the upstream's ends.
async fn fill(
    pool: &Arc<IdlePool>,
    key: &str,
    count: usize,
    listener: &TcpListener,
) -> Vec<TcpStream> {
    let mut upstream_ends = Vec::new();
    for _ in 0..count {
        // A slot of its own: `check_out` would take the connection just returned.
        let slot = PoolSlot {
            pool: pool.clone(),
            key: Arc::from(key),
        };
        let (connection, upstream_end) = open_connection(listener).await;
        slot.check_in(connection);
        upstream_ends.push(upstream_end);
    }
    upstream_ends
}

/// Whether the upstream's end of a connection sees it closed (EOF) within `wait`: a
/// close is seen at once, so a short wait tells an open connection.
async fn sees_close_within(upstream_end: &mut TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, upstream_end.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn sees_close(upstream_end: &mut TcpStream) -> bool {
    sees_close_within(upstream_end, Duration::from_millis(100)).await
}

#[tokio::test]
async fn a_connection_is_kept_only_with_a_descriptor_to_spare() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(3);
    let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
    let mut ends = fill(&pool, "up", 4, &listener).await;
    assert_eq!(
        pool.idle_count(),
        3,
        "three descriptors to lend, four returned"
    );
    assert_eq!(ledger.lent(), 3);
    assert_eq!(ledger.stats().refused, 1, "the refusal is counted");
    assert!(sees_close(&mut ends[3]).await, "the fourth was closed");
    assert!(!sees_close(&mut ends[2]).await, "the third is kept open");
}

#[tokio::test]
async fn sessions_opening_recall_idle_connections_oldest_first() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(8);
    let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
    let mut ends = fill(&pool, "up", 4, &listener).await;
    ends.extend(fill(&pool, "other", 4, &listener).await);
    assert_eq!(pool.idle_count(), 8);
    // Each session may need two descriptors: three of them take back six.
    (0..3).for_each(|_| ledger.session_opened());
    assert_eq!(pool.idle_count(), 2);
    assert_eq!(ledger.lent(), 2);
    assert_eq!(ledger.overdrawn(), 0);
    assert_eq!(
        ledger.stats().recalled,
        6,
        "the closed connections are counted"
    );
    let mut open = Vec::new();
    for (index, end) in ends.iter_mut().enumerate() {
        if !sees_close(end).await {
            open.push(index);
        }
    }
    // Oldest first: the two kept are the newest returned to one of the keys.
    assert!(open == [2, 3] || open == [6, 7], "kept open: {open:?}");
}

#[tokio::test]
async fn a_call_that_connects_takes_its_descriptor_back_from_another_pool() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(4);
    let holding = IdlePool::with_ledger(LIMITS, ledger.clone());
    let connecting = IdlePool::with_ledger(LIMITS, ledger.clone());
    let _ends = fill(&holding, "up", 4, &listener).await;
    assert_eq!(holding.idle_count(), 4);
    // Overdrawn without a session opening to recall it (as when a loan raced a
    // session's recall): the connect makes room.
    ledger.set_limit(Some(10), 10);
    assert_eq!(ledger.overdrawn(), 4);
    let _permit = expect_connect(connecting.try_acquire("elsewhere"));
    assert_eq!(
        holding.idle_count(),
        0,
        "every lent descriptor was recalled"
    );
    assert_eq!(ledger.overdrawn(), 0);
}

#[tokio::test]
async fn a_dropped_pool_gives_its_loan_back() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(100);
    let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
    let _ends = fill(&pool, "up", 3, &listener).await;
    assert!(ledger.lent() >= 3);
    drop(pool);
    assert_eq!(ledger.lent(), 0);
}

#[tokio::test]
async fn connections_sunk_below_the_top_of_the_stack_give_their_buffers_back() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(PoolLimits {
        max_idle_per_key: 1000,
        max_idle_total: 1000,
        ..LIMITS
    });
    let slot = PoolSlot {
        pool: pool.clone(),
        key: Arc::from("up"),
    };
    let mut upstream_ends = Vec::new();
    for _ in 0..BUFFERED_DEPTH + 2 {
        let (mut connection, upstream_end) = open_connection(&listener).await;
        connection.buf.reserve(8 * 1024);
        slot.check_in(connection);
        upstream_ends.push(upstream_end);
    }
    let slots = pool.lock();
    let capacities: Vec<usize> = slots.by_key["up"]
        .idle
        .iter()
        .map(|idle| idle.connection.buf.capacity())
        .collect();
    assert_eq!(capacities[..2], [0, 0], "the two oldest gave theirs back");
    assert!(
        capacities[2..].iter().all(|&capacity| capacity >= 8 * 1024),
        "the top {BUFFERED_DEPTH} keep theirs: {capacities:?}"
    );
}

const SWEEP_EVERY: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn the_sweeper_sleeps_while_the_pool_holds_nothing_and_wakes_for_a_call() {
    let pool = IdlePool::new(LIMITS);
    pool.spawn_sweeper(SWEEP_EVERY);
    tokio::task::yield_now().await;
    // An upstream put in behind the pool's back, without the wake-up its calls give:
    // a sweeper that ticked would forget it (nothing is held for it).
    pool.lock()
        .by_key
        .insert(Arc::from("planted"), Upstream::default());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        pool.lock().by_key.contains_key("planted"),
        "the sweeper of an empty pool swept"
    );
    pool.lock().by_key.clear();

    // A call's upstream wakes it: within a tick the upstream, unused again, is forgotten.
    drop(expect_connect(pool.try_acquire("up")));
    assert!(pool.lock().by_key.contains_key("up"));
    tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
    assert!(
        pool.lock().by_key.is_empty(),
        "the woken sweeper did not sweep within a tick"
    );
}

#[tokio::test(start_paused = true)]
async fn a_returned_connection_wakes_the_sweeper_which_gives_back_its_buffer() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    pool.spawn_sweeper(SWEEP_EVERY);
    tokio::task::yield_now().await;
    // The pool holds nothing until the connection comes back (`check_out` adds no key).
    let (slot, _) = pool.check_out("up");
    let (mut connection, _server_end) = open_connection(&listener).await;
    connection.buf.reserve(8 * 1024);
    slot.check_in(connection);
    tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
    let slots = pool.lock();
    let kept = &slots.by_key["up"].idle;
    assert_eq!(kept.len(), 1, "a fresh, open connection stays");
    assert_eq!(kept[0].connection.buf.capacity(), 0, "its buffer was kept");
}

/// The sweeper of a pool built on one runtime (the start-up's) and used on another (a
/// core's) is started by the first call, on the core: there it is woken without waking
/// another thread.
#[test]
fn a_deferred_sweeper_starts_on_the_runtime_of_the_first_call() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let start_up = runtime();
    let pool = start_up.block_on(async {
        let pool = IdlePool::new(LIMITS);
        pool.sweep_from_first_call(SWEEP_EVERY);
        pool
    });
    assert_eq!(start_up.metrics().num_alive_tasks(), 0);
    let core = std::thread::spawn({
        let pool = pool.clone();
        move || {
            let core = runtime();
            let alive = || core.metrics().num_alive_tasks();
            core.block_on(async {
                let permit = expect_connect(pool.try_acquire("up"));
                tokio::task::yield_now().await;
                assert_eq!(alive(), 1, "started by the first call, on its runtime");
                // Emptied and used again: the same sweeper, woken, not a second one.
                drop(permit);
                pool.sweep();
                assert_eq!(pool.lock().by_key.len(), 0);
                let _permit = expect_connect(pool.try_acquire("up"));
                tokio::task::yield_now().await;
                assert_eq!(alive(), 1);
            });
        }
    });
    core.join().unwrap();
    assert_eq!(
        start_up.metrics().num_alive_tasks(),
        0,
        "none where it was built"
    );
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_ends_with_its_pool() {
    let metrics = tokio::runtime::Handle::current().metrics();
    for holding in [false, true] {
        let pool = IdlePool::new(LIMITS);
        pool.spawn_sweeper(SWEEP_EVERY);
        // Asleep without a timer (an empty pool) or on its tick (a pool in use).
        let permit = holding.then(|| expect_connect(pool.try_acquire("up")));
        tokio::task::yield_now().await;
        assert_eq!(metrics.num_alive_tasks(), 1);
        drop(permit);
        drop(pool);
        tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
        assert_eq!(metrics.num_alive_tasks(), 0, "holding: {holding}");
    }
}

#[tokio::test]
async fn a_finished_connect_lets_a_waiting_call_open_the_next() {
    let pool = IdlePool::new(LIMITS);
    let (_, first) = expect_connect(pool.try_acquire("up"));
    let _second = expect_connect(pool.try_acquire("up"));
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire("up").await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    drop(first); // that connect failed (or is open and in use): its slot is free
    match waiter.await.unwrap() {
        Checkout::Connect(..) => {}
        other => panic!("the waiting call should get the free slot, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waited_too_long_connects_anyway() {
    let pool = IdlePool::new(PoolLimits {
        max_connect_wait: Duration::from_millis(5),
        ..LIMITS
    });
    let _first = expect_connect(pool.try_acquire("up"));
    let _second = expect_connect(pool.try_acquire("up"));
    let started = tokio::time::Instant::now();
    match pool.acquire("up").await {
        Checkout::Connect(..) => {}
        other => panic!("expected a connect past the wait, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(5));
}

#[tokio::test]
async fn a_cancelled_wait_and_spent_permits_leave_nothing_behind() {
    let pool = IdlePool::new(LIMITS);
    let first = expect_connect(pool.try_acquire("up"));
    let second = expect_connect(pool.try_acquire("up"));
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire("up").await }
    });
    tokio::task::yield_now().await;
    waiter.abort();
    let _ = waiter.await;
    drop((first, second));
    {
        let slots = pool.lock();
        let upstream = &slots.by_key["up"];
        assert_eq!((upstream.connecting, upstream.waiting), (0, 0));
    }
    pool.sweep();
    assert!(
        pool.lock().by_key.is_empty(),
        "an unused upstream is forgotten"
    );
}

#[tokio::test]
async fn a_connection_opened_ahead_is_the_next_calls_and_kept_only_with_a_descriptor() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(1);
    let pool = IdlePool::with_ledger(LIMITS, ledger.clone());

    let (connection, _kept_end) = open_connection(&listener).await;
    assert_eq!(pool.keep_opened_ahead("up", connection), Ok(()));
    assert_eq!(pool.idle_count(), 1);

    // The ledger has no descriptor left for a second one: it is closed, not kept.
    let (connection, mut refused_end) = open_connection(&listener).await;
    assert_eq!(pool.keep_opened_ahead("up", connection), Err(NoRoom));
    assert!(
        sees_close(&mut refused_end).await,
        "the refused one is closed"
    );
    assert_eq!(pool.idle_count(), 1);

    match pool.try_acquire("up") {
        Some(Checkout::Idle(slot, _)) => assert_eq!(slot.key(), "up"),
        other => panic!("the first call should take the connection opened ahead, got {other:?}"),
    }
}

/// A keeper's function: a plain connect to `address` (the listener's backlog completes it).
fn opener(
    address: std::net::SocketAddr,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Connection>> + Send>>
{
    move || Box::pin(async move { TcpStream::connect(address).await.map(Connection::new) })
}

/// Polls (bounded) until `pool` holds `count` idle connections.
async fn until_idle(pool: &IdlePool, count: usize) {
    for _ in 0..400 {
        if pool.idle_count() == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "expected {count} idle connections, found {}",
        pool.idle_count()
    );
}

#[tokio::test]
async fn a_floor_is_filled_then_kept_as_calls_take_its_connections() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 3);
    let open = opener(listener.local_addr().unwrap());
    kept.fill(&open).await.unwrap();
    assert_eq!(pool.idle_count(), 3, "filled to the floor");
    let keeper = tokio::spawn(kept.keep(open));

    // Two calls take two: the keeper opens two more while the calls still hold theirs.
    let (_slot, first) = pool.check_out("up");
    let second = pool.try_acquire("up");
    assert!(first.is_some() && matches!(second, Some(Checkout::Idle(..))));
    until_idle(&pool, 3).await;

    // At the floor, nothing more is opened.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(pool.idle_count(), 3);
    assert!(!keeper.is_finished());
}

#[tokio::test]
async fn a_floor_above_the_caps_raises_them_instead_of_closing_its_own() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // LIMITS keeps at most 4 idle per key.
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 6);
    kept.fill(&opener(listener.local_addr().unwrap()))
        .await
        .unwrap();
    assert_eq!(pool.idle_count(), 6);

    // Another key still has the pool's cap.
    let ends = fill(&pool, "other", 5, &listener).await;
    assert_eq!(ends.len(), 5);
    assert_eq!(pool.idle_count(), 6 + 4);
}

#[tokio::test]
async fn a_keeper_stops_when_the_ledger_has_no_descriptor_to_spare() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger = ledger_with_room(2);
    let pool = IdlePool::with_ledger(LIMITS, ledger.clone());
    let kept = pool.keep_idle("up", 3);
    let failure = kept
        .fill(&opener(listener.local_addr().unwrap()))
        .await
        .expect_err("two descriptors for a floor of three");
    assert!(matches!(failure, KeepFailure::NoRoom(_)), "{failure}");
    assert_eq!(pool.idle_count(), 2, "as many as the ledger lent");
    assert_eq!(ledger.lent(), 2);
}

#[tokio::test]
async fn a_failed_connect_ends_the_fill_with_the_services_error() {
    // A port nothing listens on.
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 2);
    match kept.fill(&opener(address)).await {
        Err(KeepFailure::Open(error)) => {
            assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused)
        }
        other => panic!("expected the connect's error, got {other:?}"),
    }
    assert_eq!(pool.idle_count(), 0);
}

#[tokio::test]
async fn a_keeper_ends_with_its_pool() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 1);
    let keeper = tokio::spawn(kept.keep(opener(listener.local_addr().unwrap())));
    tokio::task::yield_now().await;
    drop(pool);
    tokio::time::timeout(Duration::from_secs(2), keeper)
        .await
        .expect("the keeper ends once its pool is gone")
        .unwrap();
}

#[tokio::test]
async fn the_sweep_wakes_the_keeper_for_connections_it_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let short = PoolLimits {
        idle_timeout: Duration::from_millis(20),
        ..LIMITS
    };
    let pool = IdlePool::new(short);
    let kept = pool.keep_idle("up", 2);
    let open = opener(listener.local_addr().unwrap());
    kept.fill(&open).await.unwrap();
    let _keeper = tokio::spawn(kept.keep(open));
    tokio::time::sleep(Duration::from_millis(40)).await;
    // Both are past the timeout: the sweep closes them and the keeper opens two anew.
    pool.sweep();
    until_idle(&pool, 2).await;
}

#[tokio::test]
async fn a_start_opens_one_batch_and_the_keeper_the_rest() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let kept = pool.keep_idle("up", 20);
    let open = opener(listener.local_addr().unwrap());
    kept.start(open).await.unwrap();
    assert_eq!(pool.idle_count(), 8, "one batch before the port listens");
    until_idle(&pool, 20).await;
}

/// A floor of `count` to `listener` whose pause is `rule`, filled; the upstream's ends of
/// its connections.
async fn filled_floor(
    pool: &Arc<IdlePool>,
    listener: &TcpListener,
    count: usize,
    rule: keep::PauseRule,
) -> (KeptIdle, Vec<TcpStream>) {
    let kept = pool.keep_idle_pausing("up", count, rule);
    kept.fill(&opener(listener.local_addr().unwrap()))
        .await
        .unwrap();
    let mut upstream_ends = Vec::new();
    for _ in 0..count {
        upstream_ends.push(listener.accept().await.unwrap().0);
    }
    (kept, upstream_ends)
}

/// Sweeps (bounded polling) until the pool holds no idle connection: the upstream's closes
/// have arrived.
async fn sweep_until_empty(pool: &IdlePool) {
    for _ in 0..400 {
        pool.sweep();
        if pool.idle_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the closed connections were not swept");
}

#[tokio::test]
async fn an_upstream_that_closes_connections_opened_ahead_unused_pauses_the_floor() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let rule = keep::PauseRule {
        closed_within: Duration::from_secs(30),
        pause: Duration::from_millis(1_000),
    };
    let (kept, upstream_ends) = filled_floor(&pool, &listener, 2, rule).await;
    let keeper = tokio::spawn(kept.keep(opener(listener.local_addr().unwrap())));

    // The upstream closes both before any call: the sweep finds them so and pauses.
    drop(upstream_ends);
    sweep_until_empty(&pool).await;
    assert!(pool.floor_pause("up").is_some(), "closed unused: paused");

    // Unpaused, the keeper would have opened them again 50 ms after the sweep woke it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        pool.idle_count(),
        0,
        "nothing opened ahead during the pause"
    );
    // After it, the floor is filled again.
    until_idle(&pool, 2).await;
    assert!(pool.floor_pause("up").is_none());
    assert!(!keeper.is_finished());
}

#[tokio::test]
async fn a_call_that_finds_a_connection_opened_ahead_closed_unused_pauses_the_floor() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let (_kept, upstream_ends) = filled_floor(&pool, &listener, 1, keep::PAUSE_RULE).await;
    drop(upstream_ends);

    // Bounded polling until the close has reached the pool's side.
    let key: Arc<str> = Arc::from("up");
    let mut found = true;
    for _ in 0..400 {
        let (_slot, connection) = pool.check_out(&key);
        let Some(connection) = connection else {
            found = false;
            break;
        };
        // Not seen closed yet: back as it was, opened ahead and unused.
        pool.check_in(&key, connection, true);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!found, "the closed connection is not handed out");
    assert!(pool.floor_pause("up").is_some(), "closed unused: paused");
}

#[tokio::test]
async fn a_floor_is_not_paused_by_late_closes_nor_by_connections_calls_returned() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = IdlePool::new(LIMITS);
    let rule = keep::PauseRule {
        closed_within: Duration::from_millis(10),
        pause: Duration::from_secs(300),
    };
    // Closed unused, but later than the rule's window.
    let (kept, upstream_ends) = filled_floor(&pool, &listener, 2, rule).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(upstream_ends);
    sweep_until_empty(&pool).await;
    assert!(
        pool.floor_pause("up").is_none(),
        "a late close does not pause"
    );

    // Returned by calls, then closed at once: not opened ahead, no pause either.
    let upstream_ends = fill(&pool, "up", 2, &listener).await;
    drop(upstream_ends);
    sweep_until_empty(&pool).await;
    assert!(
        pool.floor_pause("up").is_none(),
        "a used connection does not pause"
    );

    // And the keeper (woken by the sweeps) fills the floor again as always.
    let _keeper = tokio::spawn(kept.keep(opener(listener.local_addr().unwrap())));
    until_idle(&pool, 2).await;
}
