use super::*;
use http::{HeaderMap, StatusCode};
use std::time::Duration;

fn head() -> Arc<ResponseHead> {
    Arc::new(ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    })
}

async fn read_all(reader: &mut FillReader) -> Result<Vec<u8>, FillFailure> {
    let mut out = Vec::new();
    while let Some(chunk) = reader.next_chunk().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

#[tokio::test]
async fn late_reader_replays_from_first_byte_and_body_is_committed() {
    let (writer, fill) = Fill::start(1024);
    let mut early = fill.attach().unwrap();
    writer.set_head(head(), true);
    writer.push(Bytes::from_static(b"hello ")).await;
    let mut late = fill.attach().unwrap();
    writer.push(Bytes::from_static(b"world")).await;
    let body = writer.finish().unwrap();
    assert_eq!(body.concat(), b"hello world");
    assert_eq!(read_all(&mut early).await.unwrap(), b"hello world");
    assert_eq!(read_all(&mut late).await.unwrap(), b"hello world");
}

#[tokio::test]
async fn failure_reaches_every_reader_as_an_error_never_a_clean_end() {
    let (writer, fill) = Fill::start(1024);
    let mut a = fill.attach().unwrap();
    let mut b = fill.attach().unwrap();
    writer.set_head(head(), true);
    writer.push(Bytes::from_static(b"partial")).await;
    writer.fail(Arc::new(Abandoned));
    assert!(read_all(&mut a).await.is_err());
    assert!(read_all(&mut b).await.is_err());
    assert!(!fill.is_shareable());
}

#[tokio::test]
async fn dropping_the_writer_fails_the_fill() {
    let (writer, fill) = Fill::start(1024);
    let mut reader = fill.attach().unwrap();
    drop(writer);
    assert!(reader.head().await.is_err());
}

#[tokio::test]
async fn reader_waits_for_chunks_pushed_later() {
    let (writer, fill) = Fill::start(1024);
    let mut reader = fill.attach().unwrap();
    let task = tokio::spawn(async move {
        let head = reader.head().await.unwrap();
        assert_eq!(head.status, StatusCode::OK);
        read_all(&mut reader).await.unwrap()
    });
    tokio::task::yield_now().await;
    writer.set_head(head(), true);
    for part in [&b"a"[..], b"b", b"c"] {
        writer.push(Bytes::copy_from_slice(part)).await;
        tokio::task::yield_now().await;
    }
    writer.finish();
    assert_eq!(task.await.unwrap(), b"abc");
}

#[tokio::test]
async fn oversized_body_is_not_committed_and_not_shareable() {
    let (writer, fill) = Fill::start(4);
    let mut reader = fill.attach().unwrap();
    writer.set_head(head(), true);
    writer.push(Bytes::from_static(b"12345")).await;
    assert!(!writer.is_committable());
    assert!(fill.attach().is_none());
    let drain = tokio::spawn(async move { read_all(&mut reader).await.unwrap() });
    writer.push(Bytes::from_static(b"678")).await;
    assert!(writer.finish().is_none());
    assert_eq!(drain.await.unwrap(), b"12345678");
}

#[tokio::test]
async fn uncommittable_fill_holds_a_bounded_window_for_a_slow_reader() {
    let (writer, fill) = Fill::start(0);
    let mut reader = fill.attach().unwrap();
    writer.set_head(head(), false);
    let chunk = Bytes::from(vec![1u8; 256 * 1024]);
    let writer_task = tokio::spawn(async move {
        for _ in 0..40 {
            assert_eq!(writer.push(chunk.clone()).await, PushOutcome::Continue);
        }
        writer.finish()
    });
    let mut seen = 0u64;
    while let Some(chunk) = reader.next_chunk().await {
        seen += chunk.unwrap().len() as u64;
        let held = fill.lock().retained_bytes;
        assert!(held <= UNSHARED_WINDOW + 256 * 1024, "held {held}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(seen, 40 * 256 * 1024);
    assert!(writer_task.await.unwrap().is_none());
}

#[tokio::test]
async fn uncommittable_fill_without_readers_is_abandoned() {
    let (writer, fill) = Fill::start(1024);
    let reader = fill.attach().unwrap();
    writer.set_head(head(), false);
    drop(reader);
    assert_eq!(
        writer.push(Bytes::from_static(b"x")).await,
        PushOutcome::Abandoned
    );
}

#[tokio::test]
async fn committable_fill_goes_on_without_readers() {
    let (writer, fill) = Fill::start(1024);
    drop(fill.attach().unwrap());
    writer.set_head(head(), true);
    assert_eq!(
        writer.push(Bytes::from_static(b"x")).await,
        PushOutcome::Continue
    );
    assert_eq!(writer.finish().unwrap().concat(), b"x");
}
