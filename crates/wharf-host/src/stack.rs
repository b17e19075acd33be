//! The one place where a service gets the host's qualities.

use std::sync::Arc;

use tower::util::BoxCloneSyncService;
use tower::Layer;
use wharf_config::LimitsConfig;
use wharf_limits::Bulkhead;
use wharf_metrics::Metrics;

use crate::call::Inflight;
use crate::layers::count::CountLayer;
use crate::layers::throttle::ThrottleLayer;
use crate::layers::trace::TraceLayer;
use crate::service::HostService;

/// Wraps `service` in the host's layers, outermost first:
///
/// 1. trace — call id, `call` span, `/debug/inflight` entry; outermost so
///    that time spent queued is visible and traced too;
/// 2. count — calls by status and their duration, throttled 503s included;
/// 3. throttle — the service's own bulkhead (slots + bounded queue), so a
///    saturated service never holds up another.
pub(crate) fn hosted(
    name: &str,
    limits: &LimitsConfig,
    metrics: &Metrics,
    inflight: &Arc<Inflight>,
    service: HostService,
) -> HostService {
    let service_metrics = metrics.service(name);
    let bulkhead = Arc::new(Bulkhead::new(
        limits.max_concurrent_calls,
        limits.max_queued_calls,
        limits.queue_timeout,
    ));
    let sampled = (bulkhead.clone(), service_metrics.clone());
    metrics.set_sampler(
        &format!("bulkhead:{name}"),
        Box::new(move || {
            let (bulkhead, metrics) = &sampled;
            let stats = bulkhead.stats();
            metrics.set_load(stats.processing, stats.queued, stats.percent_of_max_calls());
        }),
    );

    let throttled = ThrottleLayer::new(bulkhead, service_metrics.clone()).layer(service);
    let counted = CountLayer::new(service_metrics).layer(BoxCloneSyncService::new(throttled));
    let traced = TraceLayer::new(name, inflight.clone()).layer(BoxCloneSyncService::new(counted));
    BoxCloneSyncService::new(traced)
}
