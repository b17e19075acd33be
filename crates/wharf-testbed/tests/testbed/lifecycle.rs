//! Starting and stopping: `spawn`'s handle, `serve`'s shutdown, keep-alive.

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{client, get, start, PATIENCE};

#[tokio::test]
async fn url_and_addr_agree() {
    let tb = start().await;
    assert_ne!(tb.addr().port(), 0);
    assert_eq!(
        tb.url("/fast?x=1"),
        format!("http://{}/fast?x=1", tb.addr())
    );
    assert_eq!(get(&tb, "/fast").await.status, StatusCode::OK);
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server() {
    let tb = start().await;
    let addr = tb.addr();
    assert_eq!(get(&tb, "/fast").await.status, StatusCode::OK);
    drop(tb);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if TcpStream::connect(addr).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after drop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn keep_alive_serves_several_requests_per_connection() {
    let tb = start().await;
    let mut stream = TcpStream::connect(tb.addr()).await.unwrap();
    stream
        .write_all(b"GET /fast HTTP/1.1\r\nhost: t\r\n\r\nGET /bytes/3 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    assert!(text.contains("\r\n\r\nok\n"));
    assert!(out.ends_with(&[0, 1, 2]));
}

#[tokio::test]
async fn serve_stops_on_shutdown_and_cuts_long_calls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(wharf_testbed::serve(listener, async {
        let _ = stop_rx.await;
    }));

    let client = client();
    let fast = client
        .get(format!("http://{addr}/fast").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(fast.status(), StatusCode::OK);
    let slow = tokio::spawn({
        let client = client.clone();
        async move {
            let resp = client
                .get(format!("http://{addr}/slow?ms=60000").parse().unwrap())
                .await?;
            resp.into_body()
                .collect()
                .await
                .map(|_| ())
                .map_err(Into::into)
        }
    });
    // Let the slow call reach the server before stopping it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = Instant::now();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(PATIENCE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(10));
    let slow: Result<(), Box<dyn std::error::Error + Send + Sync>> =
        tokio::time::timeout(PATIENCE, slow).await.unwrap().unwrap();
    assert!(slow.is_err(), "the 60 s call was cut");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}
