//! Issue 6: one-way ("datagram") calls queued durably in NATS JetStream and delivered to a
//! backend with retries. Against the NATS server at 127.0.0.1:4222 (JetStream on); each test
//! uses its own stream and subjects (named with the process id) and deletes its stream at
//! the end. Without NATS each test prints a loud SKIP and returns; CI has it (.ci/run starts
//! it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::support::*;

const NATS: &str = "nats://127.0.0.1:4222";

/// Whether NATS answers at 127.0.0.1:4222; prints a SKIP line when not.
async fn nats_up(test: &str) -> bool {
    let up = tokio::time::timeout(
        Duration::from_millis(500),
        tokio::net::TcpStream::connect("127.0.0.1:4222"),
    )
    .await
    .is_ok_and(|connected| connected.is_ok());
    if !up {
        eprintln!("\n*** SKIP {test}: no NATS at 127.0.0.1:4222 (start it as .ci/run does) ***\n");
    }
    up
}

/// A stream name and subject unique to this test in this run.
fn names(test: &str) -> (String, String) {
    static SEQUENCE: AtomicUsize = AtomicUsize::new(0);
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    (
        format!("WHARF_TEST_{}_{pid}_{n}", test.to_uppercase()),
        format!("wharf.test.{test}.{pid}.{n}"),
    )
}

/// For a test that needs the broker: its stream name and subject, and the guard that
/// deletes the stream at its end; `None` (with a SKIP line) when NATS is not there.
async fn fresh_stream(test: &str) -> Option<(String, String, StreamGuard)> {
    if !nats_up("queue").await {
        return None;
    }
    let (stream, subject) = names(test);
    let guard = StreamGuard {
        stream: stream.clone(),
    };
    Some((stream, subject, guard))
}

/// Deletes the test's stream when dropped (also when the test fails).
struct StreamGuard {
    stream: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let stream = self.stream.clone();
        // The test's runtime may be gone: use a small one of our own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(NATS).await {
                    let jetstream = async_nats::jetstream::new(client);
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        jetstream.delete_stream(&stream),
                    )
                    .await;
                }
            });
        })
        .join();
    }
}

fn queue_toml(stream: &str, subject: &str, backend: SocketAddr, deliver: &str) -> String {
    format!(
        "[services.jobs]\ntype = \"queue\"\npath = \"/jobs\"\nnats_url = \"{NATS}\"\n\
         stream = \"{stream}\"\nsubject = \"{subject}\"\n\n[services.jobs.deliver]\n\
         backend = \"http://{backend}/handle\"\n{deliver}\n"
    )
}

/// `method url` with `body`; returns status and body.
async fn send(method: Method, url: &str, body: &'static str) -> (StatusCode, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// POSTs `body` and returns the message id of the 202.
async fn publish(url: &str, body: &'static str) -> String {
    let (status, reply) = send(Method::POST, url, body).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    reply["id"].as_str().unwrap().to_owned()
}

/// What the test backend saw: per message id, the bodies delivered (one per delivery).
type Seen = Arc<Mutex<HashMap<String, Vec<Bytes>>>>;

/// What the test backend saw: the `x-wharf-delivery` of each request, in order.
type Attempts = Arc<Mutex<Vec<String>>>;

/// A backend of its own on 127.0.0.1 (see `spawn_backend`): its address and what it saw.
async fn poison_backend(poison: &'static str) -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_backend(listener, seen.clone(), poison);
    (addr, seen)
}

/// A backend on `listener` recording deliveries; answers 500 to bodies equal to `poison`.
fn spawn_backend(listener: TcpListener, seen: Seen, poison: &'static str) {
    spawn_backend_counting(listener, seen, poison, Attempts::default());
}

/// [`spawn_backend`], also recording each request's `x-wharf-delivery` in `attempts`.
fn spawn_backend_counting(
    listener: TcpListener,
    seen: Seen,
    poison: &'static str,
    attempts: Attempts,
) {
    spawn_backend_ordered(listener, seen, poison, attempts, Order::default());
}

/// What the test backend saw: the body of each request, in order.
type Order = Arc<Mutex<Vec<Bytes>>>;

/// [`spawn_backend_counting`], also recording each request's body in `order`.
fn spawn_backend_ordered(
    listener: TcpListener,
    seen: Seen,
    poison: &'static str,
    attempts: Attempts,
    order: Order,
) {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            let attempts = attempts.clone();
            let order = order.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let seen = seen.clone();
                    let attempts = attempts.clone();
                    let order = order.clone();
                    async move {
                        let delivery = request
                            .headers()
                            .get("x-wharf-delivery")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        attempts.lock().unwrap().push(delivery);
                        let id = request
                            .headers()
                            .get("x-wharf-message-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        order.lock().unwrap().push(body.clone());
                        let status = if body == poison.as_bytes() {
                            StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            StatusCode::OK
                        };
                        seen.lock().unwrap().entry(id).or_default().push(body);
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// The value of the series `series` on the admin /metrics page (0 if absent).
async fn metric(wharf: &RunningHost, series: &str) -> f64 {
    metric_at(&wharf.admin_url("/metrics"), series).await
}

/// The value of the series `series` on the metrics page at `url` (0 if absent).
async fn metric_at(url: &str, series: &str) -> f64 {
    let page = get(url).await;
    String::from_utf8_lossy(page.bytes())
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn calls_accepted_while_the_backend_is_down_are_all_delivered_across_a_restart() {
    let Some((stream, subject, _cleanup)) = fresh_stream("restart").await else {
        return;
    };
    // The backend's port, with nothing listening on it yet: connections are refused.
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = backend.local_addr().unwrap();
    drop(backend);
    let toml = queue_toml(
        &stream,
        &subject,
        backend_addr,
        "backoff = \"100ms\"\nack_wait = \"2s\"\nconcurrency = 16",
    );

    let first = start_wharf(&toml).await;
    let url = first.url("/jobs");
    // 1000 bodies, each published once, 50 at a time.
    let bodies: Vec<&'static str> = (0..1000)
        .map(|i| &*Box::leak(format!("message {i}").into_boxed_str()))
        .collect();
    let mut published: HashMap<String, &'static str> = HashMap::new();
    for group in bodies.chunks(50) {
        let calls: Vec<_> = group
            .iter()
            .map(|body| {
                let url = url.clone();
                let body = *body;
                tokio::spawn(async move { (publish(&url, body).await, body) })
            })
            .collect();
        for call in calls {
            let (id, body) = call.await.unwrap();
            assert!(published.insert(id, body).is_none(), "ids are unique");
        }
    }
    assert_eq!(published.len(), 1000);
    let accepted = "wharf_queue_published_total{service=\"jobs\",outcome=\"ok\"}";
    assert_eq!(metric(&first, accepted).await, 1000.0);
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric(
                &first,
                "wharf_queue_retried_total{service=\"jobs\",reason=\"unreachable\"}",
            )
            .await
                >= 1.0
        })
        .await,
        "the deliverer tried the backend while it was down"
    );

    // Restart wharf: the old host and its deliverer stop, a new one takes over.
    first.stop().await;
    let second = start_wharf(&toml).await;
    // The backend comes back.
    let seen: Seen = Arc::default();
    let listener = TcpListener::bind(backend_addr).await.unwrap();
    spawn_backend(listener, seen.clone(), "never");

    let all_seen = poll_until(Duration::from_secs(30), || async {
        let seen = seen.lock().unwrap();
        published.keys().all(|id| seen.contains_key(id))
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        all_seen,
        "{} of 1000 delivered",
        published.keys().filter(|id| seen.contains_key(*id)).count()
    );
    // Every delivery of an id carried that id's body: duplicates (at least once) are the
    // same message, and are counted.
    let mut duplicates = 0;
    for (id, body) in &published {
        let deliveries = &seen[id];
        assert!(deliveries.iter().all(|b| b == body.as_bytes()), "{id}");
        duplicates += deliveries.len() - 1;
    }
    eprintln!("queue restart: 1000 delivered, {duplicates} duplicate deliveries");
    assert_eq!(seen.len(), 1000, "nothing but the published ids");
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric(&second, "wharf_queue_delivered_total{service=\"jobs\"}").await >= 1000.0
        })
        .await
    );
    assert!(
        poll_until(Duration::from_secs(10), || async {
            metric(&second, "wharf_queue_pending{service=\"jobs\"}").await == 0.0
        })
        .await,
        "nothing left pending"
    );
    second.stop().await;
}

#[tokio::test]
async fn a_poison_message_is_dead_lettered_after_max_deliver_attempts() {
    let Some((stream, subject, _cleanup)) = fresh_stream("poison").await else {
        return;
    };
    let dead_subject = format!("{subject}.dead");
    let client = async_nats::connect(NATS).await.unwrap();
    let mut dead_letters = client.subscribe(dead_subject.clone()).await.unwrap();
    client.flush().await.unwrap();

    let (backend_addr, seen) = poison_backend("poison").await;
    let wharf = start_wharf(&queue_toml(
        &stream,
        &subject,
        backend_addr,
        "max_deliver = 3\nbackoff = \"50ms\"\nack_wait = \"2s\"",
    ))
    .await;
    let url = wharf.url("/jobs");
    let poison = publish(&url, "poison").await;
    let fine = publish(&url, "fine").await;

    let dead = tokio::time::timeout(Duration::from_secs(10), dead_letters.next())
        .await
        .expect("a dead letter within 10 s")
        .expect("subscription open");
    assert_eq!(dead.payload.as_ref(), b"poison");
    let headers = dead.headers.expect("dead letter has headers");
    let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(
        header("x-wharf-message-id").as_deref(),
        Some(poison.as_str())
    );
    assert_eq!(header("x-wharf-deliveries").as_deref(), Some("3"));
    assert_eq!(header("content-type").as_deref(), Some("text/plain"));
    let reason = header("x-wharf-dead-reason").unwrap_or_default();
    assert!(reason.contains("500"), "{reason}");

    let fine_delivered = poll_until(Duration::from_secs(5), || async {
        seen.lock()
            .unwrap()
            .get(&fine)
            .is_some_and(|attempts| !attempts.is_empty())
    })
    .await;
    assert!(
        fine_delivered,
        "the good message behind the poison one was not delivered"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[&poison].len(), 3, "three attempts, then dead-lettered");
    assert_eq!(seen[&fine].len(), 1);
    // The dead letter can reach the subscriber before the deliverer counts it.
    let counted = poll_until(Duration::from_secs(5), || async {
        metric(&wharf, "wharf_queue_dead_lettered_total{service=\"jobs\"}").await == 1.0
    })
    .await;
    assert!(counted, "wharf_queue_dead_lettered_total never reached 1");
    assert_eq!(
        metric(
            &wharf,
            "wharf_queue_retried_total{service=\"jobs\",reason=\"rejected\"}"
        )
        .await,
        2.0
    );
    wharf.stop().await;
}

/// A dead letter the broker does not store is kept and tried again until it is stored; the
/// backend is never called past `max_deliver` meanwhile (stop 57's finding: the message was
/// nak'd, and every redelivery called the backend again).
#[tokio::test]
async fn a_dead_letter_the_broker_refuses_is_tried_again_and_the_backend_never_past_max_deliver() {
    use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy};
    let Some((stream, subject, _cleanup)) = fresh_stream("deadfull").await else {
        return;
    };
    let dead_subject = format!("{subject}.dead");
    let dead_stream = format!("{stream}_DEAD");
    let _dead_cleanup = StreamGuard {
        stream: dead_stream.clone(),
    };
    let client = async_nats::connect(NATS).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .create_stream(Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    // The dead letters' own stream holds one message and refuses more: it is full.
    let dead = jetstream
        .create_stream(Config {
            name: dead_stream.clone(),
            subjects: vec![dead_subject.clone()],
            max_messages: 1,
            discard: DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();
    jetstream
        .publish(dead_subject.clone(), "filler".into())
        .await
        .unwrap()
        .await
        .unwrap();

    let (backend_addr, seen) = poison_backend("poison").await;
    let wharf = start_wharf(&queue_toml(
        &stream,
        &subject,
        backend_addr,
        "max_deliver = 2\nbackoff = \"50ms\"\nack_wait = \"2s\"",
    ))
    .await;
    let url = wharf.url("/jobs");
    let poison = publish(&url, "poison").await;

    // Refused at the last attempt, then at least twice more from the pending copy.
    let failed = "wharf_queue_dead_letter_failed_total{service=\"jobs\"}";
    let refused = poll_until(Duration::from_secs(10), || async {
        metric(&wharf, failed).await >= 3.0
    })
    .await;
    assert!(refused, "{failed} never reached 3");
    let attempts = |seen: &Seen| seen.lock().unwrap().get(&poison).map_or(0, Vec::len);
    assert_eq!(
        attempts(&seen),
        2,
        "the backend was called past max_deliver"
    );
    let dead_lettered = "wharf_queue_dead_lettered_total{service=\"jobs\"}";
    assert_eq!(metric(&wharf, dead_lettered).await, 0.0);
    // Waiting for its next try, the pending copy is unacknowledged with the broker (as
    // docs/configuration.md says): it counts against max_ack_pending.
    let consumer: async_nats::jetstream::consumer::PullConsumer = jetstream
        .get_stream(&stream)
        .await
        .unwrap()
        .get_consumer("wharf_jobs")
        .await
        .unwrap();
    let ack_pending = poll_until(Duration::from_secs(5), || {
        let mut consumer = consumer.clone();
        async move { consumer.info().await.unwrap().num_ack_pending >= 1 }
    })
    .await;
    assert!(ack_pending, "the pending copy is not ack-pending");

    // Room again: the pending dead letter is stored, with no attempt more.
    dead.purge().await.unwrap();
    let stored = poll_until(Duration::from_secs(10), || async {
        metric(&wharf, dead_lettered).await == 1.0
    })
    .await;
    assert!(stored, "{dead_lettered} never reached 1");
    let letter = jetstream
        .get_stream(&dead_stream)
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&dead_subject)
        .await
        .unwrap();
    assert_eq!(letter.payload.as_ref(), b"poison");
    let header = |name: &str| letter.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(
        header("x-wharf-message-id").as_deref(),
        Some(poison.as_str())
    );
    assert_eq!(header("x-wharf-deliveries").as_deref(), Some("2"));
    assert_eq!(header("content-type").as_deref(), Some("text/plain"));
    let reason = header("x-wharf-dead-reason").unwrap_or_default();
    assert!(reason.contains("500"), "{reason}");
    for internal in ["x-wharf-dead-pending", "x-wharf-attempts-made"] {
        assert_eq!(
            header(internal),
            None,
            "{internal} stored with the dead letter"
        );
    }
    // Nothing left in the queue, and still two attempts.
    let emptied = poll_until(Duration::from_secs(5), || {
        let mut consumer = consumer.clone();
        async move {
            let info = consumer.info().await.unwrap();
            info.num_ack_pending == 0 && info.num_pending == 0
        }
    })
    .await;
    assert!(emptied, "the message is still in the queue");
    assert_eq!(attempts(&seen), 2);
    wharf.stop().await;
}

/// The queue's own stream (which keeps the dead letters, as wharf makes it) refuses the
/// dead letter and a copy alike: the message is held and both are tried again, and the
/// backend is not called past `max_deliver` meanwhile. A held message gives its delivery
/// slot back: with `concurrency = 1` the second message is attempted while the first is
/// held (a review found the slot kept, which stops the queue for good when only other
/// deliveries can make room).
#[tokio::test]
async fn a_dead_letter_refused_with_its_copy_holds_the_message_and_spares_the_backend() {
    use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy};
    let Some((stream, subject, _cleanup)) = fresh_stream("deadheld").await else {
        return;
    };
    let dead_subject = format!("{subject}.dead");
    let client = async_nats::connect(NATS).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    // wharf's own layout, full with the two messages: two at most.
    let full = Config {
        name: stream.clone(),
        subjects: vec![subject.clone(), dead_subject.clone()],
        retention: RetentionPolicy::WorkQueue,
        max_messages: 2,
        discard: DiscardPolicy::New,
        ..Default::default()
    };
    jetstream.create_stream(full.clone()).await.unwrap();

    let (backend_addr, seen) = poison_backend("poison").await;
    let wharf = start_wharf(&queue_toml(
        &stream,
        &subject,
        backend_addr,
        "max_deliver = 2\nbackoff = \"50ms\"\nack_wait = \"1s\"\nconcurrency = 1",
    ))
    .await;
    let first = publish(&wharf.url("/jobs"), "poison").await;
    let second = publish(&wharf.url("/jobs"), "poison").await;
    let attempts = |seen: &Seen, id: &str| seen.lock().unwrap().get(id).map_or(0, Vec::len);
    let failed = "wharf_queue_dead_letter_failed_total{service=\"jobs\"}";
    // Both attempted twice and held, each refused a few times (held for 50, 100, 200 ms...).
    let both_held = poll_until(Duration::from_secs(10), || async {
        attempts(&seen, &first) == 2
            && attempts(&seen, &second) == 2
            && metric(&wharf, failed).await >= 6.0
    })
    .await;
    assert!(
        both_held,
        "attempts {} and {}, {failed} {}",
        attempts(&seen, &first),
        attempts(&seen, &second),
        metric(&wharf, failed).await
    );

    // Room again: the held messages are dead-lettered, with no attempt more.
    jetstream
        .update_stream(Config {
            max_messages: 10,
            ..full
        })
        .await
        .unwrap();
    let dead_lettered = "wharf_queue_dead_lettered_total{service=\"jobs\"}";
    let stored = poll_until(Duration::from_secs(10), || async {
        metric(&wharf, dead_lettered).await == 2.0
    })
    .await;
    assert!(stored, "{dead_lettered} never reached 2");
    assert_eq!((attempts(&seen, &first), attempts(&seen, &second)), (2, 2));
    wharf.stop().await;
}

/// A dead letter that gets no acknowledgement within `publish_timeout`, longer than
/// `ack_wait`, keeps the message with its delivery meanwhile: the broker does not hand it
/// to another delivery, so the backend is not called past `max_deliver` (found by a review:
/// with `ack_wait = "1s"` and the default 5 s, six attempts in 12 s).
#[tokio::test]
async fn a_dead_letter_slower_than_ack_wait_does_not_let_the_message_be_redelivered() {
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    let Some((stream, subject, _cleanup)) = fresh_stream("deadslow").await else {
        return;
    };
    let dead_subject = format!("{subject}.dead");
    let client = async_nats::connect(NATS).await.unwrap();
    let jetstream = async_nats::jetstream::new(client.clone());
    jetstream
        .create_stream(Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    // A listener on the dead subject that never answers, and no stream: a JetStream
    // publish there waits for an acknowledgement that never comes.
    let _silent = client.subscribe(dead_subject).await.unwrap();
    client.flush().await.unwrap();

    let (backend_addr, seen) = poison_backend("poison").await;
    let toml = queue_toml(
        &stream,
        &subject,
        backend_addr,
        "max_deliver = 2\nbackoff = \"50ms\"\nack_wait = \"1s\"",
    )
    .replace("stream = ", "publish_timeout = \"2500ms\"\nstream = ");
    let wharf = start_wharf(&toml).await;
    let poison = publish(&wharf.url("/jobs"), "poison").await;
    let failed = "wharf_queue_dead_letter_failed_total{service=\"jobs\"}";
    let refused = poll_until(Duration::from_secs(15), || async {
        metric(&wharf, failed).await >= 2.0
    })
    .await;
    assert!(refused, "{failed} never reached 2");
    let attempts = seen.lock().unwrap().get(&poison).map_or(0, Vec::len);
    assert_eq!(attempts, 2, "the backend was called past max_deliver");
    wharf.stop().await;
}

#[tokio::test]
async fn only_post_is_accepted_and_a_client_id_is_kept() {
    let Some((stream, subject, _cleanup)) = fresh_stream("methods").await else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    spawn_backend(listener, seen.clone(), "never");
    let wharf = start_wharf(&queue_toml(&stream, &subject, backend_addr, "")).await;
    let url = wharf.url("/jobs");
    let (status, body) = send(Method::GET, &url, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(String::from_utf8_lossy(&body).contains("method_not_allowed"));

    // A client-chosen id, published twice: stored once, delivered once.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..2 {
        let request = Request::post(&url)
            .header("x-wharf-message-id", "order-17")
            .body(Full::new(Bytes::from_static(b"once")))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    assert!(
        poll_until(Duration::from_secs(10), || async {
            seen.lock().unwrap().contains_key("order-17")
        })
        .await
    );
    let duplicate = "wharf_queue_published_total{service=\"jobs\",outcome=\"duplicate\"}";
    assert_eq!(metric(&wharf, duplicate).await, 1.0);
    // A later message delivered: a stored duplicate would have been delivered by now.
    let after = publish(&url, "after").await;
    assert!(
        poll_until(Duration::from_secs(10), || async {
            seen.lock().unwrap().contains_key(&after)
        })
        .await
    );
    assert_eq!(seen.lock().unwrap()["order-17"].len(), 1);
    wharf.stop().await;
}

/// A message held while its backend is down when wharf gets SIGTERM is handed back before
/// the process exits: the next wharf delivers it at once, not after `ack_wait` (30 s here),
/// and the time it spent held used up no attempt (`x-wharf-delivery: 1`, then 2, then the
/// dead letter at `max_deliver = 2`).
#[tokio::test]
async fn a_message_held_at_sigterm_is_handed_back_at_once_with_no_attempt_used() {
    let Some((stream, subject, _cleanup)) = fresh_stream("handback").await else {
        return;
    };
    let dead_subject = format!("{subject}.dead");
    let client = async_nats::connect(NATS).await.unwrap();
    let mut dead_letters = client.subscribe(dead_subject.clone()).await.unwrap();
    client.flush().await.unwrap();
    // The backend's port, with nothing listening on it yet: connections are refused.
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = backend.local_addr().unwrap();
    drop(backend);
    let toml = queue_toml(
        &stream,
        &subject,
        backend_addr,
        "max_deliver = 2\nbackoff = \"100ms\"\nack_wait = \"30s\"",
    );
    let config = config_file("queue-handback", &format!("{}{toml}", server_table("")));
    let first = WharfProcess::start(&config);
    let id = publish(&first.url("/jobs"), "poison").await;
    let metrics = format!("http://{}/metrics", first.admin);
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric_at(
                &metrics,
                "wharf_queue_retried_total{service=\"jobs\",reason=\"unreachable\"}",
            )
            .await
                >= 1.0
        })
        .await,
        "the deliverer held the message while the backend was down"
    );
    first.signal("TERM");
    let (status, logs) = first.wait().await;
    remove_config_file(&config);
    assert!(status.success(), "{status}\n{logs}");
    assert!(logs.contains("queue deliverer stopped"), "{logs}");

    // The backend is up (and fails this message); a new wharf takes over.
    let seen: Seen = Arc::default();
    let attempts = Attempts::default();
    let listener = TcpListener::bind(backend_addr).await.unwrap();
    spawn_backend_counting(listener, seen.clone(), "poison", attempts.clone());
    let second = start_wharf(&toml).await;
    assert!(
        poll_until(Duration::from_secs(10), || async {
            seen.lock().unwrap().contains_key(&id)
        })
        .await,
        "the held message was not handed back: delivered only after ack_wait"
    );
    let dead = tokio::time::timeout(Duration::from_secs(10), dead_letters.next())
        .await
        .expect("a dead letter within 10 s")
        .expect("subscription open");
    let headers = dead.headers.expect("dead letter has headers");
    let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header("x-wharf-message-id").as_deref(), Some(id.as_str()));
    assert_eq!(header("x-wharf-deliveries").as_deref(), Some("2"));
    assert_eq!(
        header("x-wharf-attempts-made"),
        None,
        "internal header leaked"
    );
    assert_eq!(
        *attempts.lock().unwrap(),
        ["1", "2"],
        "attempts numbered from 1, the time held not counted"
    );
    second.stop().await;
}

/// The order a hand-back gives (docs/configuration.md, `type = "queue"`): a message handed
/// back at SIGTERM is stored again as a copy at the stream's tail, so it is delivered after
/// the messages that were waiting in the stream when it was handed back. With one delivery
/// slot, "first" is held (backend down) while "second" waits; the next wharf delivers
/// "second", then "first" (with no attempt used: `x-wharf-delivery: 1`).
#[tokio::test]
async fn a_handed_back_message_goes_behind_the_messages_waiting_in_the_stream() {
    let Some((stream, subject, _cleanup)) = fresh_stream("handorder").await else {
        return;
    };
    // The backend's port, with nothing listening on it yet: connections are refused.
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = backend.local_addr().unwrap();
    drop(backend);
    let toml = queue_toml(
        &stream,
        &subject,
        backend_addr,
        "concurrency = 1\nbackoff = \"100ms\"\nack_wait = \"30s\"",
    );
    let config = config_file("queue-handorder", &format!("{}{toml}", server_table("")));
    let first = WharfProcess::start(&config);
    let url = first.url("/jobs");
    let held = publish(&url, "first").await;
    let metrics = format!("http://{}/metrics", first.admin);
    assert!(
        poll_until(Duration::from_secs(5), || async {
            metric_at(
                &metrics,
                "wharf_queue_retried_total{service=\"jobs\",reason=\"unreachable\"}",
            )
            .await
                >= 1.0
        })
        .await,
        "the deliverer held the first message while the backend was down"
    );
    // The only delivery slot is taken: this one waits in the stream.
    let waiting = publish(&url, "second").await;
    first.signal("TERM");
    let (status, logs) = first.wait().await;
    remove_config_file(&config);
    assert!(status.success(), "{status}\n{logs}");

    let seen: Seen = Arc::default();
    let attempts = Attempts::default();
    let order = Order::default();
    let listener = TcpListener::bind(backend_addr).await.unwrap();
    spawn_backend_ordered(
        listener,
        seen.clone(),
        "never",
        attempts.clone(),
        order.clone(),
    );
    let second = start_wharf(&toml).await;
    assert!(
        poll_until(Duration::from_secs(10), || async {
            let seen = seen.lock().unwrap();
            seen.contains_key(&held) && seen.contains_key(&waiting)
        })
        .await,
        "both delivered within 10 s"
    );
    assert_eq!(
        *order.lock().unwrap(),
        [Bytes::from_static(b"second"), Bytes::from_static(b"first")],
        "the handed-back copy is delivered after the message that waited in the stream"
    );
    assert_eq!(
        *attempts.lock().unwrap(),
        ["1", "1"],
        "no attempt used by the hold"
    );
    second.stop().await;
}

/// A stream made beforehand without the dead-letter subject, and a consumer made beforehand
/// with a `max_deliver` the broker enforces (and a setting wharf cannot update in place):
/// wharf warns that dead letters would be kept by no stream, and refuses the consumer with
/// what is wrong and the fix, instead of delivering on it (the broker would stop redelivering
/// a message after two deliveries, leaving it unacknowledged, unseen and never
/// dead-lettered).
#[tokio::test]
async fn a_stream_and_consumer_made_beforehand_are_checked_at_set_up() {
    use async_nats::jetstream::consumer::{pull, AckPolicy, ReplayPolicy};
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    let Some((stream, subject, _cleanup)) = fresh_stream("premade").await else {
        return;
    };
    let client = async_nats::connect(NATS).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let made = jetstream
        .create_stream(Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    made.create_consumer(pull::Config {
        durable_name: Some("wharf_jobs".into()),
        filter_subject: subject.clone(),
        ack_policy: AckPolicy::Explicit,
        // Not editable: wharf's update (ReplayPolicy::Instant) is refused.
        replay_policy: ReplayPolicy::Original,
        max_deliver: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let toml = queue_toml(&stream, &subject, "127.0.0.1:9".parse().unwrap(), "");
    let config = config_file("queue-premade", &format!("{}{toml}", server_table("")));
    let wharf = WharfProcess::start(&config);
    // Set-up runs at start and again after 100 ms, 200 ms, ...: a second is a few tries.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    remove_config_file(&config);
    assert!(status.success(), "{status}\n{logs}");
    let event = |message: &str| {
        logs.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|event| {
                event["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message))
            })
            .unwrap_or_else(|| panic!("no {message:?} logged:\n{logs}"))
    };
    let unkept = event("no stream captures the dead-letter subject");
    assert_eq!(unkept["level"], "WARN", "{unkept}");
    assert_eq!(
        unkept["fields"]["subject"],
        format!("{subject}.dead"),
        "{unkept}"
    );
    let refused = event("queue set-up failed");
    let error = refused["fields"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("has max_deliver = 2") && error.contains("nats consumer rm"),
        "{refused}"
    );
    assert!(
        !logs.contains("queue stream and consumer ready") && !logs.contains("using it as it is"),
        "the consumer was used:\n{logs}"
    );
    // Set-up was retried, the dead-letter lookup made once.
    let count = |message: &str| logs.lines().filter(|line| line.contains(message)).count();
    assert!(count("queue set-up failed") >= 2, "{logs}");
    assert_eq!(
        count("no stream captures the dead-letter subject"),
        1,
        "{logs}"
    );
}

/// With no broker at `nats_url`, the set-up failure is a warning naming the service and the
/// broker's URL (without credentials), retried; publishes get 503 meanwhile.
#[tokio::test]
async fn an_unreachable_broker_is_a_warning_naming_the_service_and_url() {
    let (stream, subject) = names("nobroker");
    // A port with nothing listening on it.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = nowhere.local_addr().unwrap().port();
    drop(nowhere);
    let toml = queue_toml(&stream, &subject, "127.0.0.1:9".parse().unwrap(), "")
        .replace(NATS, &format!("nats://user:secret@127.0.0.1:{port}"))
        .replace(
            "[services.jobs.deliver]",
            "publish_timeout = \"200ms\"\n\n[services.jobs.deliver]",
        );
    let config = config_file("queue-nobroker", &format!("{}{toml}", server_table("")));
    let wharf = WharfProcess::start(&config);
    // Each 503 waits publish_timeout; meanwhile connects are tried and fail.
    for _ in 0..4 {
        let (status, body) = send(Method::POST, &wharf.url("/jobs"), "x").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        // The client's answer names the broker without its credentials too.
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("secret"),
            "credentials sent to the client: {body}"
        );
    }
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    remove_config_file(&config);
    assert!(status.success(), "{status}\n{logs}");
    let failures: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("queue broker not connected"))
        .collect();
    assert!(failures.len() >= 2, "not tried again:\n{logs}");
    let failed = failures[0];
    let event: serde_json::Value = serde_json::from_str(failed).unwrap();
    assert_eq!(event["level"], "WARN", "{failed}");
    assert_eq!(event["fields"]["service"], "jobs", "{failed}");
    assert!(
        event["fields"]["error"]
            .as_str()
            .is_some_and(|error| error.contains("refused")),
        "the cause is named: {failed}"
    );
    assert_eq!(
        event["fields"]["url"],
        format!("nats://127.0.0.1:{port}"),
        "{failed}"
    );
    assert!(!logs.contains("secret"), "credentials logged:\n{logs}");
}

/// A nats-server of the test's own (JetStream on, its store in a fresh directory), started
/// with the test's `options` (credentials, TLS); stopped and its store removed when dropped.
struct OwnNats {
    child: std::process::Child,
    store: std::path::PathBuf,
    port: u16,
}

impl OwnNats {
    /// `None` (with a SKIP line) when no nats-server binary is installed.
    fn start(options: &[&str]) -> Option<OwnNats> {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let store = std::env::temp_dir().join(format!("wharf-nats-{}-{port}", std::process::id()));
        // Debian installs it in /usr/sbin, which a test's PATH may lack.
        let child = ["nats-server", "/usr/sbin/nats-server"]
            .iter()
            .find_map(|binary| {
                std::process::Command::new(binary)
                    .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                    .arg(&store)
                    .args(options)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .ok()
            });
        let Some(child) = child else {
            eprintln!("\n*** SKIP queue: no nats-server binary ***\n");
            return None;
        };
        Some(OwnNats { child, store, port })
    }

    /// Waits (bounded) until it listens.
    async fn listening(&self) {
        let up = poll_until(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
        })
        .await;
        assert!(up, "nats-server listens on {}", self.port);
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Credentials in `nats_url` authenticate. async-nats reads none from a URL, so they were
/// dropped and a broker that requires them refused every connection: publishes got 503
/// and nothing was delivered. A password with an `@` is percent-encoded in the URL and
/// decoded for the broker; at `trace` (where the NATS client logs the address it dials and
/// its CONNECT message) no log line holds it.
#[tokio::test]
async fn credentials_in_nats_url_authenticate_and_appear_in_no_log_line() {
    let Some(nats) = OwnNats::start(&["--user", "wharf", "--pass", "p@ss-s3cret"]) else {
        return;
    };
    nats.listening().await;
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let seen = Seen::default();
    spawn_backend(backend, seen.clone(), "");
    let (stream, subject) = names("credentials");
    let toml = queue_toml(&stream, &subject, backend_addr, "").replace(
        NATS,
        &format!("nats://wharf:p%40ss-s3cret@127.0.0.1:{}", nats.port),
    );
    let config = config_file(
        "queue-credentials",
        &format!(
            "{}{toml}\n[telemetry]\nlog_level = \"trace\"\n",
            server_table("")
        ),
    );
    let wharf = WharfProcess::start(&config);
    let (status, reply) = send(Method::POST, &wharf.url("/jobs"), "authenticated").await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let delivered = status == StatusCode::ACCEPTED
        && poll_until(Duration::from_secs(10), || async {
            seen.lock()
                .unwrap()
                .values()
                .any(|bodies| bodies.iter().any(|body| body == "authenticated"))
        })
        .await;
    wharf.signal("TERM");
    let (exit, logs) = wharf.wait().await;
    remove_config_file(&config);
    assert!(delivered, "publish: {status} {reply}\n{logs}");
    assert!(exit.success(), "{exit}\n{logs}");
    assert!(
        logs.contains("queue broker connected"),
        "trace logs were written:\n{logs}"
    );
    assert!(!logs.contains("s3cret"), "the password was logged:\n{logs}");
}

/// `tls://` requires TLS to the broker, and `nats_ca_file` names what verifies its
/// certificate: messages are published and delivered over TLS. The same broker with the
/// system's roots, which do not know its certificate, is refused: publishes get 503, and a
/// warning names the cause (before, `tls://` was refused by the config, and credentials
/// went to a broker in clear).
#[tokio::test]
async fn tls_to_the_broker_is_verified_against_nats_ca_file() {
    let dir = std::env::temp_dir().join(format!("wharf-nats-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let (cert_arg, key_arg) = (
        cert_file.display().to_string(),
        key_file.display().to_string(),
    );
    let Some(nats) = OwnNats::start(&["--tls", "--tlscert", &cert_arg, "--tlskey", &key_arg])
    else {
        return;
    };
    nats.listening().await;
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let seen = Seen::default();
    spawn_backend(backend, seen.clone(), "");
    let (stream, subject) = names("tls");
    let broker = |ca_file: Option<&str>| {
        let ca_line = ca_file.map_or(String::new(), |path| format!("\nnats_ca_file = {path:?}"));
        queue_toml(&stream, &subject, backend_addr, "").replace(
            &format!("nats_url = \"{NATS}\""),
            &format!("nats_url = \"tls://127.0.0.1:{}\"{ca_line}", nats.port),
        )
    };

    let config = config_file(
        "queue-tls",
        &format!("{}{}", server_table(""), broker(Some(&cert_arg))),
    );
    let wharf = WharfProcess::start(&config);
    let (status, reply) = send(Method::POST, &wharf.url("/jobs"), "over tls").await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let delivered = status == StatusCode::ACCEPTED
        && poll_until(Duration::from_secs(10), || async {
            seen.lock()
                .unwrap()
                .values()
                .any(|bodies| bodies.iter().any(|body| body == "over tls"))
        })
        .await;
    wharf.signal("TERM");
    let (exit, logs) = wharf.wait().await;
    remove_config_file(&config);
    assert!(delivered, "publish: {status} {reply}\n{logs}");
    assert!(exit.success(), "{exit}\n{logs}");

    // The system's roots do not know this certificate.
    let config = config_file(
        "queue-tls-unverified",
        &format!(
            "{}{}",
            server_table(""),
            broker(None).replace("stream = ", "publish_timeout = \"2s\"\nstream = ")
        ),
    );
    let wharf = WharfProcess::start(&config);
    // Answered once `publish_timeout` has passed, the client having tried to connect.
    let (status, _) = send(Method::POST, &wharf.url("/jobs"), "never sent").await;
    wharf.signal("TERM");
    let (exit, logs) = wharf.wait().await;
    remove_config_file(&config);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{logs}");
    let refused = logs
        .lines()
        .find(|line| line.contains("queue broker not connected"))
        .unwrap_or_else(|| panic!("no warning about the refused connection:\n{logs}"));
    let event: serde_json::Value = serde_json::from_str(refused).unwrap();
    assert_eq!(event["level"], "WARN", "{refused}");
    assert!(
        event["fields"]["error"]
            .as_str()
            .is_some_and(|text| text.contains("invalid peer certificate")),
        "the cause is named: {refused}"
    );
    assert!(exit.success(), "{exit}\n{logs}");
    assert!(
        !seen
            .lock()
            .unwrap()
            .values()
            .any(|bodies| bodies.iter().any(|body| body == "never sent")),
        "delivered without a verified broker"
    );
}

/// `tls://` never talks in clear: against a broker without TLS the client refuses, the
/// credentials stay unsent, publishes get 503 and the warning names the cause.
#[tokio::test]
async fn a_tls_url_refuses_a_broker_without_tls() {
    let Some(nats) = OwnNats::start(&["--user", "wharf", "--pass", "plain-s3cret"]) else {
        return;
    };
    nats.listening().await;
    let (stream, subject) = names("plain");
    let toml = queue_toml(&stream, &subject, "127.0.0.1:9".parse().unwrap(), "").replace(
        &format!("nats_url = \"{NATS}\""),
        &format!(
            "nats_url = \"tls://wharf:plain-s3cret@127.0.0.1:{}\"\npublish_timeout = \"1s\"",
            nats.port
        ),
    );
    let config = config_file("queue-tls-plain", &format!("{}{toml}", server_table("")));
    let wharf = WharfProcess::start(&config);
    let (status, _) = send(Method::POST, &wharf.url("/jobs"), "never sent").await;
    wharf.signal("TERM");
    let (exit, logs) = wharf.wait().await;
    remove_config_file(&config);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{logs}");
    assert!(exit.success(), "{exit}\n{logs}");
    let refused = logs
        .lines()
        .find(|line| line.contains("queue broker not connected"))
        .unwrap_or_else(|| panic!("no warning about the refused connection:\n{logs}"));
    let event: serde_json::Value = serde_json::from_str(refused).unwrap();
    assert!(
        event["fields"]["error"]
            .as_str()
            .is_some_and(|text| text.contains("corrupt message")),
        "the TLS failure is named: {refused}"
    );
    assert!(
        !logs.contains("plain-s3cret"),
        "the password was logged:\n{logs}"
    );
}

/// A broker that accepts the connection and never speaks (a black hole behind a proxy):
/// each try to connect ends after 3 s with a warning naming it and another follows, and
/// every publish gets 503 in `publish_timeout` meanwhile.
#[tokio::test]
async fn a_silent_broker_bounds_each_connect_try_and_publishes_get_503() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            kept.push(socket);
        }
    });
    let (stream, subject) = names("silent");
    let toml = queue_toml(&stream, &subject, "127.0.0.1:9".parse().unwrap(), "").replace(
        &format!("nats_url = \"{NATS}\""),
        &format!("nats_url = \"nats://127.0.0.1:{port}\"\npublish_timeout = \"1s\""),
    );
    let config = config_file("queue-silent", &format!("{}{toml}", server_table("")));
    let wharf = WharfProcess::start(&config);
    // Tries end at about 3 s and 6.1 s: publishes of 1 s each until the second began.
    let second_try = poll_until(Duration::from_secs(15), || async {
        let (status, _) = send(Method::POST, &wharf.url("/jobs"), "never sent").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        accepted.load(Ordering::Relaxed) >= 2
    })
    .await;
    wharf.signal("TERM");
    let (exit, logs) = wharf.wait().await;
    remove_config_file(&config);
    held.abort();
    assert!(exit.success(), "{exit}\n{logs}");
    assert!(second_try, "no second try to connect:\n{logs}");
    let first = logs
        .lines()
        .find(|line| line.contains("queue broker not connected"))
        .unwrap_or_else(|| panic!("the first try's end is not logged:\n{logs}"));
    assert!(first.contains("no answer within 3s"), "{first}");
}
