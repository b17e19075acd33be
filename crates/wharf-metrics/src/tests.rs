use super::*;

#[test]
fn every_metric_is_present_at_zero_from_start() {
    let metrics = Metrics::new();
    let _service = metrics.service("proxy");
    let _cache = metrics.cache("proxy");
    let _upstream = metrics.upstream("proxy", "origin");
    let _shared = metrics.shared_cache("proxy");
    let _queue = metrics.queue("jobs");
    let _sessions = metrics.sessions(100);
    metrics.startup_phase("config_load", 0.001);
    let text = metrics.encode();
    for name in names::ALL {
        assert!(
            text.lines().any(|line| line.starts_with(name)),
            "{name} missing from:\n{text}"
        );
    }
    assert!(
        text.contains("wharf_calls_outstanding{service=\"proxy\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("wharf_cache_requests_total{service=\"proxy\",result=\"coalesced\"} 0"),
        "{text}"
    );
    assert!(text.contains("wharf_upstream_requests_total{service=\"proxy\",backend=\"origin\",outcome=\"timeout\"} 0"), "{text}");
}

#[test]
fn counts_and_samples_show_up() {
    let metrics = Metrics::new();
    let service = metrics.service("s");
    let cache = metrics.cache("s");
    service.call_done(200, 0.01);
    service.call_done(200, 0.01);
    service.call_done(404, 0.5);
    service.throttled();
    let sampled = service.clone();
    metrics.add_sampler(Box::new(move || sampled.set_load(10, 5, 150.0)));
    cache.request("hit");
    cache.sample(1234, 3);
    cache.sample(1234, 5);
    let text = metrics.encode();
    assert!(
        text.contains("wharf_calls_total{service=\"s\",code=\"200\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("wharf_calls_total{service=\"s\",code=\"404\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("wharf_throttled_total{service=\"s\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("wharf_calls_outstanding{service=\"s\"} 10"),
        "{text}"
    );
    assert!(
        text.contains("wharf_calls_queued{service=\"s\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("wharf_percent_of_max_calls{service=\"s\"} 150.0"),
        "{text}"
    );
    assert!(
        text.contains("wharf_cache_evictions_total{service=\"s\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("wharf_cache_bytes{service=\"s\"} 1234"),
        "{text}"
    );
    assert!(
        text.contains("wharf_call_duration_seconds_count{service=\"s\"} 3"),
        "{text}"
    );
}

#[test]
fn shared_tier_and_queue_series_start_at_zero_and_count() {
    use crate::queue::{PublishOutcome, RetryReason};
    use crate::shared::{SharedFailure, SharedLease, SharedLookup, SharedOp, SharedWrite};
    let metrics = Metrics::new();
    let shared = metrics.shared_cache("p");
    let queue = metrics.queue("q");
    let text = metrics.encode();
    for series in [
        "wharf_shared_cache_requests_total{service=\"p\",result=\"skipped\"} 0",
        "wharf_shared_cache_errors_total{service=\"p\",op=\"get\",reason=\"timeout\"} 0",
        "wharf_shared_cache_op_duration_seconds_count{service=\"p\",op=\"put\"} 0",
        "wharf_shared_cache_writes_total{service=\"p\",outcome=\"ok\"} 0",
        "wharf_shared_cache_leases_total{service=\"p\",result=\"held\"} 0",
        "wharf_queue_published_total{service=\"q\",outcome=\"ok\"} 0",
        "wharf_queue_retried_total{service=\"q\",reason=\"unreachable\"} 0",
        "wharf_queue_dead_lettered_total{service=\"q\"} 0",
        "wharf_queue_dead_letter_failed_total{service=\"q\"} 0",
        "wharf_queue_pending{service=\"q\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    shared.lookup(SharedLookup::Hit);
    shared.lookup(SharedLookup::Error);
    shared.op(SharedOp::Get, 0.001, Some(SharedFailure::Timeout));
    shared.op(SharedOp::Lease, 0.001, None);
    shared.write(SharedWrite::Ok);
    shared.lease(SharedLease::Acquired);
    queue.published(PublishOutcome::Duplicate);
    queue.delivered();
    queue.retried(RetryReason::Rejected);
    queue.dead_lettered();
    queue.dead_letter_failed();
    queue.redelivered();
    queue.set_pending(7);
    let text = metrics.encode();
    for series in [
        "wharf_shared_cache_requests_total{service=\"p\",result=\"hit\"} 1",
        "wharf_shared_cache_requests_total{service=\"p\",result=\"error\"} 1",
        "wharf_shared_cache_errors_total{service=\"p\",op=\"get\",reason=\"timeout\"} 1",
        "wharf_shared_cache_op_duration_seconds_count{service=\"p\",op=\"lease\"} 1",
        "wharf_shared_cache_writes_total{service=\"p\",outcome=\"ok\"} 1",
        "wharf_shared_cache_leases_total{service=\"p\",result=\"acquired\"} 1",
        "wharf_queue_published_total{service=\"q\",outcome=\"duplicate\"} 1",
        "wharf_queue_delivered_total{service=\"q\"} 1",
        "wharf_queue_retried_total{service=\"q\",reason=\"rejected\"} 1",
        "wharf_queue_dead_lettered_total{service=\"q\"} 1",
        "wharf_queue_dead_letter_failed_total{service=\"q\"} 1",
        "wharf_queue_redelivered_total{service=\"q\"} 1",
        "wharf_queue_pending{service=\"q\"} 7",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
}

#[test]
fn read_buffer_totals_are_caught_up_by_samples() {
    let metrics = Metrics::new();
    let text = metrics.encode();
    assert!(
        text.contains("wharf_read_buffers_total{source=\"reused\"} 0"),
        "{text}"
    );
    let buffers = metrics.read_buffers();
    buffers.sample(10, 3, 2);
    buffers.sample(25, 4, 5);
    let text = metrics.encode();
    assert!(
        text.contains("wharf_read_buffers_total{source=\"reused\"} 25"),
        "{text}"
    );
    assert!(
        text.contains("wharf_read_buffers_total{source=\"allocated\"} 4"),
        "{text}"
    );
    assert!(text.contains("wharf_read_buffers_spare 5"), "{text}");
}

#[test]
fn kept_objects_exist_at_zero_per_kind_and_follow_samples() {
    let metrics = Metrics::new();
    let kept = metrics.kept_objects(&["header_map", "response_head"]);
    let text = metrics.encode();
    for series in [
        "wharf_kept_objects_total{kind=\"header_map\",source=\"reused\"} 0",
        "wharf_kept_objects_total{kind=\"response_head\",source=\"allocated\"} 0",
        "wharf_kept_objects_spare{kind=\"response_head\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    kept.sample("header_map", 40, 3, 7);
    kept.sample("header_map", 90, 4, 2);
    kept.sample("not_registered", 5, 5, 5);
    let text = metrics.encode();
    for series in [
        "wharf_kept_objects_total{kind=\"header_map\",source=\"reused\"} 90",
        "wharf_kept_objects_total{kind=\"header_map\",source=\"allocated\"} 4",
        "wharf_kept_objects_spare{kind=\"header_map\"} 2",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert!(!text.contains("not_registered"), "{text}");
}
