//! The route service: match, rewrite, then try backends in balancer order
//! until one answers, retrying only where it is safe.
//!
//! Retry safety: a backend that could not be connected to was sent
//! nothing, so the next one gets the untouched request (body included). A
//! request hyper gives back unsent is equally safe. After bytes went
//! upstream, only an idempotent request without a body is sent again
//! (it can be rebuilt exactly); anything else ends with 502/504.

use std::sync::Arc;
use std::time::Duration;

use std::borrow::Cow;

use http::{header, HeaderValue, Request, Response, Uri};
use http_body::Body as _;
use tracing::debug;
use wharf_config::RouteConfig;
use wharf_host::call::ClientAddr;
use wharf_host::error::{error_chain, json_error};
use wharf_host::metrics::{Metrics, Outcome};
use wharf_host::{
    core_work, handler, CallContext, CoreWork, HostService, Phase, RequestBody, ResponseBody,
};

use crate::backend::{Backend, BackendError, Lease};
use crate::balance::Balancer;
use crate::body::RelayBody;
use crate::error::RouteError;
use crate::matcher::Matcher;
use crate::rewrite::{Rewrite, HOP_BY_HOP_NAMES};
use wharf_upstream::{HeadFields, Relayed, RequestHead, ResponseBody as UpstreamBody};

/// A `route` service.
#[derive(Clone)]
pub struct RouteService {
    route: Arc<Route>,
}

struct Route {
    matcher: Matcher,
    rewrite: Rewrite,
    /// `path_prefix` to remove before forwarding, when `strip_prefix`.
    strip: Option<String>,
    backends: Vec<Arc<Backend>>,
    balancer: Balancer,
    timeout: Duration,
    retries: u32,
    /// Connections kept idle to each backend on each core (`preconnect`).
    preconnect: u32,
}

/// Why a route could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RouteBuildError {
    /// A backend URL is unusable.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The TLS client could not be configured.
    #[error("tls client: {0}")]
    Tls(#[from] rustls::Error),
}

impl RouteService {
    /// Builds route `name`: backends, pools and counters exist from start.
    pub fn new(
        name: &str,
        config: &RouteConfig,
        metrics: &Metrics,
    ) -> Result<Self, RouteBuildError> {
        let tls = wharf_upstream::tls_connector()?;
        let backends = config
            .backends
            .iter()
            .map(|url| {
                let label = url.as_str().trim_end_matches('/');
                Backend::new(url, &tls, metrics.upstream(name, label)).map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            route: Arc::new(Route {
                matcher: Matcher::new(config.methods.clone(), config.match_headers.clone()),
                rewrite: Rewrite::new(config.set_headers.clone(), config.remove_headers.clone()),
                strip: config.strip_prefix.then(|| config.path_prefix.clone()),
                backends,
                balancer: Balancer::new(config.strategy),
                timeout: config.timeout,
                retries: config.retries,
                preconnect: config.preconnect,
            }),
        })
    }

    /// The connections to keep open ahead of calls, `preconnect` to each backend on the core
    /// the work runs on (see [`wharf_host::HostBuilder::on_each_core`]): opened by the work,
    /// and again by a task it leaves on that core as calls take them. `None` when
    /// `preconnect` is 0. The work yields one line for each backend that could not be
    /// reached.
    pub fn preconnect_work(&self) -> Option<CoreWork> {
        let count = self.route.preconnect;
        if count == 0 {
            return None;
        }
        Some(core_work(
            self.route.clone(),
            move |route: Arc<Route>| async move {
                let attempts = route
                    .backends
                    .iter()
                    .map(|backend| backend.preconnect(count));
                let failures = futures_util::future::join_all(attempts).await;
                failures.into_iter().flatten().collect()
            },
        ))
    }

    /// The route's backends (for tests and /debug).
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.route.backends
    }

    /// The route as a service for [`wharf_host::HostBuilder::mount`]. A route with `methods`
    /// or `match_headers` takes only the requests they match, so that other routes may share
    /// its prefix (see [`wharf_host::Mount::Prefix`]).
    pub fn into_host_service(self) -> HostService {
        let matcher = self.route.matcher.clone();
        let service = handler(move |request| {
            let route = self.route.clone();
            async move { route.call(request).await }
        });
        if matcher.is_conditional() {
            service.taking_only(Arc::new(matcher))
        } else {
            service
        }
    }
}

impl Route {
    async fn call(self: Arc<Self>, request: Request<RequestBody>) -> Response<ResponseBody> {
        match self.forward(request).await {
            Ok(response) => response,
            Err(error) => {
                debug!(error = %error, "route call failed");
                let mut response = json_error(error.status(), error.kind(), &error.to_string());
                if let RouteError::Method { allowed, .. } = &error {
                    if let Ok(allow) = HeaderValue::from_str(allowed) {
                        response.headers_mut().insert(header::ALLOW, allow);
                    }
                }
                response
            }
        }
    }

    async fn forward(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<ResponseBody>, RouteError> {
        self.matcher.check(&request)?;
        let context = request.extensions().get::<CallContext>().cloned();
        let client = request
            .extensions()
            .get::<ClientAddr>()
            .map(|addr| addr.0.ip());
        let (mut parts, body) = request.into_parts();
        self.rewrite.request(&mut parts.headers, client);
        let target = self.upstream_target(&parts.uri);
        // Bodiless idempotent requests can be sent again exactly after bytes
        // went upstream; nothing else can.
        let replayable = body.is_end_stream() && parts.method.is_idempotent();
        // An HTTP/2 client's `:authority` is its `host` by now (the host's dispatch), so
        // this is the client's host, after the rewrite, for every protocol.
        let client_sent_host = parts.headers.contains_key(header::HOST);
        // Borrowed by each attempt, so an attempt that took none of it leaves
        // it whole for the next backend.
        let mut body = std::pin::pin!(body);
        let mut last = None;
        // Each backend once for failures before sending (always safe), plus
        // `retries` re-sends of a replayable request after bytes went out.
        let mut resends_left = self.retries;
        let attempts = self.backends.len() + self.retries as usize;
        if let Some(context) = &context {
            context.enter(Phase::UpstreamConnect);
        }
        let order = self.balancer.order(&self.backends);
        // The probe of an ejected backend, if this call took one: that backend comes first,
        // and the probe is over with the first attempt (its outcome recorded, or the call
        // dropped with it), whichever way that attempt leaves the loop.
        let mut probe = order.probe;
        for backend in order.backends.iter().cycle().take(attempts) {
            let _probe = probe.take();
            if !client_sent_host {
                match backend.authority() {
                    Some(authority) => {
                        parts.headers.insert(header::HOST, authority.clone());
                    }
                    None => {
                        parts.headers.remove(header::HOST);
                    }
                }
            }
            let (slot, mut connection) =
                match tokio::time::timeout(self.timeout, backend.connection()).await {
                    Ok(Ok(connection)) => connection,
                    Ok(Err(error)) => {
                        backend.record(Outcome::Error);
                        last = Some(unavailable(backend, &error));
                        continue; // nothing was sent
                    }
                    Err(_elapsed) => {
                        backend.record(Outcome::Timeout);
                        last = Some(RouteError::Timeout {
                            backend: backend.label().to_owned(),
                            after: self.timeout,
                        });
                        continue;
                    }
                };
            // Counts the call against the backend until the response body ends, or until it is
            // dropped: after a failure, or with the call when its client goes away while it
            // waits here (every way out, exactly once).
            let lease = backend.lease();
            let head = RequestHead {
                method: &parts.method,
                target: &target,
                headers: &parts.headers,
                edits: self.rewrite.edits(),
                // The backend's fields go on as its lines, without a map of them.
                response_fields: HeadFields::Relay(&Relayed::AllBut(&HOP_BY_HOP_NAMES)),
            };
            let sent = tokio::time::timeout(self.timeout, async {
                loop {
                    match connection.send(head, body.as_mut(), Some(slot.clone())).await {
                        // A pooled connection the backend closed while idle took
                        // nothing: the same request goes on a new connection (which
                        // is not pooled, so its own failure is not stale: one retry).
                        Err(failure) if failure.stale => {
                            debug!(backend = backend.label(), error = %failure.error, "pooled backend connection was closed; reconnecting");
                            connection = match backend.new_connection().await {
                                Ok(connection) => connection,
                                // The backend went away with its connection: as for
                                // any connect failure, nothing was sent.
                                Err(error) => return Err(Failed::Unsent(unavailable(backend, &error))),
                            };
                        }
                        Err(failure) => return Err(Failed::AfterSending(unavailable(backend, &failure.error))),
                        Ok(response) => return Ok(response),
                    }
                }
            })
            .await;
            match sent {
                Ok(Ok(response)) => {
                    backend.record(Outcome::Ok);
                    if let Some(context) = &context {
                        context.enter(Phase::FirstByte);
                    }
                    // The head went out: its map (grown by the rewrite) serves the next
                    // head parsed on this thread instead of a new one growing again.
                    wharf_http1::recycle::recycle(std::mem::take(&mut parts.headers));
                    return Ok(self.relay(response, lease));
                }
                Ok(Err(failed)) => {
                    drop(lease);
                    backend.record(Outcome::Error);
                    let (error, sent) = match failed {
                        Failed::Unsent(error) => (error, false),
                        Failed::AfterSending(error) => (error, true),
                    };
                    last = Some(error);
                    // Unsent, the next backend has it for free, as after a refused connect.
                    if sent && !spend(&mut resends_left, replayable) {
                        break;
                    }
                }
                Err(_elapsed) => {
                    drop(lease);
                    backend.record(Outcome::Timeout);
                    last = Some(RouteError::Timeout {
                        backend: backend.label().to_owned(),
                        after: self.timeout,
                    });
                    if !spend(&mut resends_left, replayable) {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| RouteError::Unavailable {
            backend: String::new(),
            message: "no backend configured".to_owned(),
        }))
    }

    /// The origin-form target sent upstream (prefix stripped if asked).
    fn upstream_target<'u>(&self, uri: &'u Uri) -> Cow<'u, str> {
        let path = uri.path();
        let Some(prefix) = &self.strip else {
            return match uri.path_and_query() {
                Some(pq) if pq.as_str().starts_with('/') => Cow::Borrowed(pq.as_str()),
                _ => Cow::Borrowed("/"),
            };
        };
        let rest = path.strip_prefix(prefix.as_str()).unwrap_or(path);
        let path = if rest.starts_with('/') {
            rest.to_owned()
        } else {
            format!("/{rest}")
        };
        Cow::Owned(match uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        })
    }

    fn relay(&self, response: Response<UpstreamBody>, lease: Lease) -> Response<ResponseBody> {
        let (mut parts, body) = response.into_parts();
        self.rewrite.response(&mut parts);
        let body = Box::pin(RelayBody::new(body, lease));
        Response::from_parts(parts, ResponseBody::spliced(body))
    }
}

/// How an attempt on a backend failed, which decides whether the next backend may
/// have the request.
enum Failed {
    /// Nothing reached the backend (a pooled connection found closed, and no new one
    /// could be made): the next backend gets the request as a connect failure does.
    Unsent(RouteError),
    /// Bytes went upstream: only a replayable request goes again, within `retries`.
    AfterSending(RouteError),
}

/// Takes one re-send from the budget, if the request can be rebuilt.
fn spend(resends_left: &mut u32, replayable: bool) -> bool {
    if replayable && *resends_left > 0 {
        *resends_left -= 1;
        true
    } else {
        false
    }
}

fn unavailable(backend: &Backend, error: &(dyn std::error::Error + 'static)) -> RouteError {
    RouteError::Unavailable {
        backend: backend.label().to_owned(),
        message: error_chain(error),
    }
}
