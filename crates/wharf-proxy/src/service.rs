//! The caching URL proxy as a hosted service: one call from query to
//! response, choosing between cache hit, coalesced fill, new fill and
//! pass-through.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http::{header, HeaderValue, Method, Request, Response};
use tracing::{debug, warn};
use url::Url;
use wharf_cache::{FillFailure, FillReader, FillRegistry, Joined, MemoryCache};
use wharf_cache::{SharedTier, SharedTierConfig};
use wharf_config::ProxyConfig;
use wharf_host::error::json_error;
use wharf_host::metrics::{CacheMetrics, Metrics, Outcome, UpstreamMetrics};
use wharf_host::service::CallFuture;
use wharf_host::{core_work, CallContext, CoreWork, HostService, Phase, RequestBody, ResponseBody};
use wharf_http1::recycle;
use wharf_upstream::HeadFields;

use crate::body::{from_fill, relay, OriginBody};
use crate::destination::DestinationPolicy;
use crate::error::ProxyError;
use crate::fill::FillJob;
use crate::headers::RELAYED_ONLY;
use crate::origin::Origin;
use crate::request::RawQuery;
use crate::response::{
    build_response, bypass_response, from_shared_tier, hit_response, CacheResult,
};
use crate::target::{Target, TargetMemo};

/// Longest cross-instance fill lease. Its TTL is 2 × `first_byte_timeout`, within 1 s and
/// this; the holder renews it every third of that while it fetches, so the TTL is not how
/// long a fetch may take but how soon other instances notice a holder that died (and
/// fetch the origin themselves).
const LEASE_TTL_CAP: Duration = Duration::from_secs(10);

/// The caching URL proxy of one `[services.X]` table.
#[derive(Clone)]
pub struct ProxyService {
    inner: Arc<Inner>,
}

struct Inner {
    cache_metrics: CacheMetrics,
    upstream_metrics: UpstreamMetrics,
    policy: Arc<DestinationPolicy>,
    /// Targets already parsed and allowed by `policy`, by raw `url` value.
    targets: TargetMemo,
    origin: Origin,
    cache: Arc<MemoryCache>,
    fills: Arc<FillRegistry>,
    max_ttl: Duration,
    max_object_bytes: u64,
    total_timeout: Duration,
    /// The Redis tier (`shared_cache`), when configured.
    shared: Option<Arc<SharedTier>>,
    /// How long a cross-instance fill lease lasts (see [`LEASE_TTL_CAP`]).
    lease_ttl: Duration,
    /// Origins to keep connections open to on each core (`preconnect_origins`).
    preconnect_origins: Vec<Url>,
    /// Connections kept to each of them on each core (`preconnect`).
    preconnect: u32,
}

impl ProxyService {
    /// Builds the proxy of service `name`: its destination policy, origin
    /// pool, cache and counters are created here, at start, never lazily
    /// on the first call.
    pub fn new(name: &str, config: &ProxyConfig, metrics: &Metrics) -> Self {
        let shared = config.shared_cache.as_ref().and_then(|url| {
            SharedTier::new(SharedTierConfig::new(url), metrics.shared_cache(name))
                .map_err(|error| {
                    // The config validated the URL; should the client still refuse it, the
                    // proxy serves from memory and origin rather than not at all.
                    warn!(service = name, error = %error, "shared cache disabled");
                })
                .ok()
        });
        Self::with_shared_tier(name, config, metrics, shared)
    }

    /// Builds the proxy with an explicit shared tier (or none), whatever `shared_cache`
    /// says: for embedding programs and tests that configure the tier themselves.
    pub fn with_shared_tier(
        name: &str,
        config: &ProxyConfig,
        metrics: &Metrics,
        shared: Option<Arc<SharedTier>>,
    ) -> Self {
        let policy = Arc::new(DestinationPolicy::new(
            config.allow_private_networks,
            &config.allow_hosts,
        ));
        let cache = Arc::new(MemoryCache::new(
            config.cache_max_bytes,
            config.max_object_bytes,
        ));
        let cache_metrics = metrics.cache(name);
        let sampled = (cache.clone(), cache_metrics.clone());
        metrics.set_sampler(
            &format!("cache:{name}"),
            Box::new(move || {
                let (cache, metrics) = &sampled;
                metrics.sample(cache.bytes(), cache.evictions());
            }),
        );
        Self {
            inner: Arc::new(Inner {
                cache_metrics,
                // Origins are open-ended: one label value for all of them
                // keeps the number of series bounded.
                upstream_metrics: metrics.upstream(name, "origin"),
                origin: Origin::new(config, policy.clone()),
                policy,
                targets: TargetMemo::new(),
                cache,
                fills: Arc::new(FillRegistry::new()),
                max_ttl: config.max_ttl,
                max_object_bytes: config.max_object_bytes,
                total_timeout: config.total_timeout,
                shared,
                lease_ttl: (config.first_byte_timeout * 2)
                    .clamp(Duration::from_secs(1), LEASE_TTL_CAP),
                preconnect_origins: config.preconnect_origins.clone(),
                preconnect: config.preconnect,
            }),
        }
    }

    /// The connections to keep open ahead of calls, `preconnect` to each of
    /// `preconnect_origins` on the core the work runs on (see
    /// [`wharf_host::HostBuilder::on_each_core`]): opened by the work, and again by a task
    /// it leaves on that core as calls take them. `None` when no origin is configured. The
    /// work yields one line for each origin that could not be reached.
    pub fn preconnect_work(&self) -> Option<CoreWork> {
        if self.inner.preconnect_origins.is_empty() {
            return None;
        }
        Some(core_work(
            self.inner.clone(),
            |inner: Arc<Inner>| async move {
                let attempts = inner
                    .preconnect_origins
                    .iter()
                    .map(|origin| inner.origin.preconnect(origin, inner.preconnect));
                let failures = futures_util::future::join_all(attempts).await;
                failures.into_iter().flatten().collect()
            },
        ))
    }

    /// The memory tier, for counters and tests.
    pub fn cache(&self) -> &MemoryCache {
        &self.inner.cache
    }

    /// The proxy as a service for [`wharf_host::HostBuilder::mount`].
    pub fn into_host_service(self) -> HostService {
        let inner = self.inner;
        // A call reads the request's method, target and call context, never its fields.
        HostService::new(move |request| inner.start(request)).without_request_fields()
    }
}

/// What a call still has to wait for once its request has been read.
enum Start {
    /// Answered already: a cache hit, or an error.
    Done(Response<ResponseBody>, Option<CacheResult>),
    /// Relay the origin's response.
    PassThrough(Arc<Target>, Phases),
    /// Stream a fill: this call's own (`writer` set) or another call's.
    Fill {
        target: Arc<Target>,
        phases: Phases,
        joined: Joined,
        cache_duration: u64,
    },
}

impl Inner {
    /// Starts a call. Everything that needs no waiting (the query, the target, the cache
    /// lookup) is done here, before any future exists: a hit answers with a ready future,
    /// and a call that waits carries only what it waits with, not its request. Only a call
    /// that waits takes a count on the proxy: the count is shared by the cores, and a hit
    /// that took one would pass its cache line between them twice.
    fn start(self: &Arc<Self>, request: Request<RequestBody>) -> CallFuture {
        let start = self
            .prepare(request)
            .unwrap_or_else(|error| Start::Done(self.error_response(&error), None));
        match start {
            Start::Done(response, result) => {
                if let Some(result) = result {
                    self.cache_metrics.request(result.as_str());
                }
                CallFuture::ready(response)
            }
            Start::PassThrough(target, phases) => {
                CallFuture::new(self.clone().pass_through_call(target, phases))
            }
            Start::Fill {
                target,
                phases,
                joined,
                cache_duration,
            } => CallFuture::new(
                self.clone()
                    .fill_call(target, phases, joined, cache_duration),
            ),
        }
    }

    /// The waiting part of a pass-through call. Its size is memory every call in flight
    /// holds for as long as it waits on its origin (issue 4's RSS per call in flight):
    /// `waiting_calls_stay_small` guards it. Not an `async fn`: that keeps its arguments
    /// beside the copies moved into its body (16 bytes more a call, measured).
    #[allow(clippy::manual_async_fn)]
    fn pass_through_call(
        self: Arc<Self>,
        target: Arc<Target>,
        phases: Phases,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + 'static {
        async move {
            let served = self.pass_through(target, &phases).await;
            self.finish(served.map(|response| (response, CacheResult::Bypass)))
        }
    }

    /// The waiting part of a call that fills the cache or reads another call's fill (see
    /// [`Inner::pass_through_call`] on its size).
    #[allow(clippy::manual_async_fn)] // not an `async fn`, as above
    fn fill_call(
        self: Arc<Self>,
        target: Arc<Target>,
        phases: Phases,
        joined: Joined,
        cache_duration: u64,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + 'static {
        async move {
            let served = self.fill(target, &phases, joined, cache_duration).await;
            self.finish(served)
        }
    }

    /// The JSON answer to a refused or failed call.
    fn error_response(&self, error: &ProxyError) -> Response<ResponseBody> {
        debug!(error = %error, status = error.status().as_u16(), "call refused or failed");
        let mut response = json_error(error.status(), error.kind(), &error.to_string());
        if let ProxyError::Method(_) = error {
            // RFC 9110 §15.5.6: a 405 names the methods that are allowed.
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
        response
    }

    /// Counts a served call, or answers its error.
    fn finish(
        &self,
        served: Result<(Response<ResponseBody>, CacheResult), ProxyError>,
    ) -> Response<ResponseBody> {
        match served {
            Ok((response, result)) => {
                self.cache_metrics.request(result.as_str());
                response
            }
            Err(error) => self.error_response(&error),
        }
    }

    fn prepare(self: &Arc<Self>, request: Request<RequestBody>) -> Result<Start, ProxyError> {
        // HEAD is served as GET: the host writes no body for it (RFC 9110
        // §9.3.2), and a miss still fills the cache.
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return Err(ProxyError::Method(request.method().clone()));
        }
        let raw = RawQuery::parse(request.uri().query())?;
        let target = self.targets.resolve(&raw, &self.policy)?;
        let cache_duration = raw.cache_duration;
        let phases = Phases(request.extensions().get::<CallContext>().cloned());
        // The call needs nothing more of the request; its maps serve the next one.
        let parts = request.into_parts().0;
        recycle::recycle(parts.headers);
        recycle::recycle_extensions(parts.extensions);
        if cache_duration == 0 {
            return Ok(Start::PassThrough(target, phases));
        }
        phases.enter(Phase::CacheLookup);
        let now = Instant::now();
        if let Some(entry) = self.cache.get(target.key(), now) {
            return Ok(Start::Done(
                hit_response(&entry, now),
                Some(CacheResult::Hit),
            ));
        }
        phases.enter(Phase::UpstreamConnect);
        let joined = self
            .fills
            .join_or_start(target.key(), self.max_object_bytes);
        Ok(Start::Fill {
            target,
            phases,
            joined,
            cache_duration,
        })
    }

    /// Streams a fill in progress, starting it first when this call leads it.
    async fn fill(
        self: &Arc<Self>,
        target: Arc<Target>,
        phases: &Phases,
        joined: Joined,
        cache_duration: u64,
    ) -> Result<(Response<ResponseBody>, CacheResult), ProxyError> {
        match joined {
            Joined::Follower(reader) => {
                stream_fill(reader, &target.label, CacheResult::Coalesced, phases).await
            }
            Joined::Leader(writer, reader) => {
                let ttl = Duration::from_secs(cache_duration).min(self.max_ttl);
                // Set by the fill before the head when the body comes from Redis.
                let source = Arc::new(OnceLock::new());
                FillJob {
                    origin: self.origin.clone(),
                    cache: self.cache.clone(),
                    fills: self.fills.clone(),
                    target: target.clone(),
                    ttl,
                    max_ttl: self.max_ttl,
                    max_object_bytes: self.max_object_bytes,
                    total_timeout: self.total_timeout,
                    upstream_metrics: self.upstream_metrics.clone(),
                    shared: self.shared.clone(),
                    lease_ttl: self.lease_ttl,
                    source: source.clone(),
                }
                .spawn(writer);
                let (mut response, mut result) =
                    stream_fill(reader, &target.label, CacheResult::Miss, phases).await?;
                if let Some(source) = source.get() {
                    result = from_shared_tier(&mut response, source);
                }
                Ok((response, result))
            }
        }
    }

    /// `cacheDuration` 0: relay the origin's response, read at the
    /// client's pace (no buffering beyond hyper's own).
    async fn pass_through(
        &self,
        target: Arc<Target>,
        phases: &Phases,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        phases.enter(Phase::UpstreamConnect);
        let deadline = tokio::time::Instant::now() + self.total_timeout;
        // In a block: the `Result` must not stay in this future's state while the first
        // frame is awaited (every call in flight would carry it).
        let (parts, incoming) = {
            let fetched = self
                .origin
                .fetch(
                    &target,
                    HeadFields::Relay(&RELAYED_ONLY),
                    deadline,
                    self.total_timeout,
                )
                .await;
            self.upstream_metrics.record(upstream_outcome(&fetched));
            fetched?.into_parts()
        };
        phases.enter(Phase::FirstByte);
        let mut body = Box::pin(OriginBody::new(
            incoming,
            target,
            deadline,
            self.total_timeout,
        ));
        // A body broken before its first byte gets a 502/504 answer, not a
        // connection closed without one (see `read_first_frame`).
        body.as_mut().read_first_frame().await?;
        Ok(bypass_response(parts, relay(body)))
    }
}

/// The call's phase reporter (a no-op outside a host).
struct Phases(Option<CallContext>);

impl Phases {
    fn enter(&self, phase: Phase) {
        if let Some(context) = &self.0 {
            context.enter(phase);
        }
    }
}

/// How an origin fetch ended, for `wharf_upstream_requests_total`.
pub(crate) fn upstream_outcome<T>(fetched: &Result<T, ProxyError>) -> Outcome {
    match fetched {
        Ok(_) => Outcome::Ok,
        Err(ProxyError::OriginTimeout { .. }) => Outcome::Timeout,
        Err(_) => Outcome::Error,
    }
}

/// Waits for the fill's head, then streams its body.
async fn stream_fill(
    mut reader: FillReader,
    origin: &str,
    result: CacheResult,
    phases: &Phases,
) -> Result<(Response<ResponseBody>, CacheResult), ProxyError> {
    let head = reader
        .head()
        .await
        .map_err(|failure| fill_error(&failure, origin))?;
    // Answer once the first body byte is there: a fill that fails before it
    // gets a 502/504, not a connection closed without any answer (hyper
    // drops a head it has not flushed when the body fails at once).
    let first = match reader.next_chunk().await {
        Some(Ok(chunk)) => Some(chunk),
        Some(Err(failure)) => return Err(fill_error(&failure, origin)),
        None => None,
    };
    phases.enter(Phase::FirstByte);
    Ok((
        build_response(&head, from_fill(first, reader), result),
        result,
    ))
}

/// The error a reader's call answers with when its fill failed: each
/// reader gets its own copy of the shared failure. A failure that is not
/// the proxy's own (the fill was abandoned) is named after `origin`.
fn fill_error(failure: &FillFailure, origin: &str) -> ProxyError {
    match failure.downcast_ref::<ProxyError>() {
        Some(error) => error.clone(),
        None => ProxyError::OriginUnavailable {
            origin: origin.to_owned(),
            message: failure.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a waiting call's future may take. Measured when this test was written (test
    /// profile, x86-64): 680 for a pass-through, 496 for a fill. The margin is for a
    /// toolchain's layout changes; a change that needs more is one to weigh against the RSS
    /// figure, not to wave through by raising these.
    const PASS_THROUGH_CALL_BYTES: usize = 768;
    const FILL_CALL_BYTES: usize = 576;

    fn proxy() -> Arc<Inner> {
        let toml =
            "[services.p]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n";
        let config = wharf_config::Config::from_toml_str(toml, "test").unwrap();
        let Some(wharf_config::ServiceKind::Proxy(proxy)) =
            config.service("p").map(|service| &service.kind)
        else {
            panic!("a proxy service");
        };
        ProxyService::with_shared_tier("p", proxy, &Metrics::new(), None).inner
    }

    fn call(query: &str) -> Request<RequestBody> {
        Request::get(format!("/proxy?{query}"))
            .body(RequestBody::Empty)
            .unwrap()
    }

    /// What the host holds per call in flight: a future the RSS-per-call figure of
    /// bench/compare.sh (issue 4) multiplies by every waiting call. A regression there was
    /// once caught only by a full compare run (+0.6 KiB per call); this catches it in CI.
    #[tokio::test]
    async fn waiting_calls_stay_small() {
        let inner = proxy();
        match inner.prepare(call("url=http://127.0.0.1:9/a&cacheDuration=0")) {
            Ok(Start::PassThrough(target, phases)) => {
                let future = inner.clone().pass_through_call(target, phases);
                let size = std::mem::size_of_val(&future);
                assert!(
                    size <= PASS_THROUGH_CALL_BYTES,
                    "a waiting pass-through call takes {size} bytes (bound {PASS_THROUGH_CALL_BYTES})"
                );
            }
            _ => panic!("cacheDuration=0 is a pass-through"),
        }
        match inner.prepare(call("url=http://127.0.0.1:9/b&cacheDuration=60")) {
            Ok(Start::Fill {
                target,
                phases,
                joined,
                cache_duration,
            }) => {
                let future = inner
                    .clone()
                    .fill_call(target, phases, joined, cache_duration);
                let size = std::mem::size_of_val(&future);
                assert!(
                    size <= FILL_CALL_BYTES,
                    "a waiting fill call takes {size} bytes (bound {FILL_CALL_BYTES})"
                );
            }
            _ => panic!("a miss with cacheDuration=60 starts a fill"),
        }
    }
}
