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

use http::request::Parts;
use http::{header, HeaderValue, Request, Response, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tracing::debug;
use wharf_config::RouteConfig;
use wharf_host::body::BoxError;
use wharf_host::call::ClientAddr;
use wharf_host::error::{error_chain, json_error};
use wharf_host::metrics::{Metrics, Outcome};
use wharf_host::{handler, CallContext, HostService, Phase, ResponseBody};

use crate::backend::{Backend, BackendError};
use crate::balance::Balancer;
use crate::body::{ForwardBody, Lease, RelayBody};
use crate::error::RouteError;
use crate::matcher::Matcher;
use crate::pool::tls_connector;
use crate::rewrite::Rewrite;

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
        let tls = tls_connector()?;
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
            }),
        })
    }

    /// The route's backends (for tests and /debug).
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.route.backends
    }

    /// The route as a service for [`wharf_host::HostBuilder::mount`].
    pub fn into_host_service(self) -> HostService {
        handler(move |request| {
            let route = self.route.clone();
            async move { route.call(request).await }
        })
    }
}

impl Route {
    async fn call(self: Arc<Self>, request: Request<Incoming>) -> Response<ResponseBody> {
        match self.forward(request).await {
            Ok(response) => response,
            Err(error) => {
                debug!(error = %error, "route call failed");
                let mut response = json_error(error.status(), error.kind(), &error.to_string());
                if let RouteError::Method { .. } = error {
                    if let Ok(allow) = HeaderValue::from_str(&self.matcher.allowed()) {
                        response.headers_mut().insert(header::ALLOW, allow);
                    }
                }
                response
            }
        }
    }

    async fn forward(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<ResponseBody>, RouteError> {
        self.matcher.check(&request)?;
        let context = request.extensions().get::<CallContext>().cloned();
        let client = request
            .extensions()
            .get::<ClientAddr>()
            .map(|addr| addr.0.ip());
        let (mut parts, body) = request.into_parts();
        self.rewrite.request(&mut parts.headers, client);
        parts.uri = self.upstream_uri(&parts.uri);
        // Bodiless idempotent requests can be rebuilt exactly for a retry
        // after bytes went upstream; nothing else can.
        let replayable = body.is_end_stream() && parts.method.is_idempotent();
        let mut pending = Some(Request::from_parts(parts, ForwardBody::Client { body }));
        let mut replay: Option<Parts> = None;
        let mut last = None;
        // Each backend once for failures before sending (always safe), plus
        // `retries` re-sends of a replayable request after bytes went out.
        let mut resends_left = self.retries;
        let attempts = self.backends.len() + self.retries as usize;
        if let Some(context) = &context {
            context.enter(Phase::UpstreamConnect);
        }
        for backend in self
            .balancer
            .order(&self.backends)
            .into_iter()
            .cycle()
            .take(attempts)
        {
            let mut request = match pending.take() {
                Some(request) => request,
                None => match &replay {
                    Some(parts) => Request::from_parts(parts.clone(), ForwardBody::Empty),
                    None => break,
                },
            };
            if request.headers().get(header::HOST).is_none() {
                if let Some(authority) = backend.authority() {
                    request
                        .headers_mut()
                        .insert(header::HOST, authority.clone());
                }
            }
            let mut connection =
                match tokio::time::timeout(self.timeout, backend.connection()).await {
                    Ok(Ok(connection)) => connection,
                    Ok(Err(error)) => {
                        backend.record(Outcome::Error);
                        last = Some(unavailable(&backend, &error));
                        pending = Some(request); // nothing was sent
                        continue;
                    }
                    Err(_elapsed) => {
                        backend.record(Outcome::Timeout);
                        last = Some(RouteError::Timeout {
                            backend: backend.label().to_owned(),
                            after: self.timeout,
                        });
                        pending = Some(request);
                        continue;
                    }
                };
            if replayable && replay.is_none() && resends_left > 0 {
                let (parts, body) = request.into_parts();
                replay = Some(parts.clone());
                request = Request::from_parts(parts, body);
            }
            backend.call_started();
            let sent =
                tokio::time::timeout(self.timeout, connection.try_send_request(request)).await;
            match sent {
                Ok(Ok(response)) => {
                    backend.record(Outcome::Ok);
                    if let Some(context) = &context {
                        context.enter(Phase::FirstByte);
                    }
                    let lease = Lease {
                        backend: backend.clone(),
                        connection: Some(connection),
                    };
                    return Ok(self.relay(response, lease));
                }
                Ok(Err(mut error)) => {
                    backend.call_ended();
                    backend.record(Outcome::Error);
                    last = Some(unavailable(&backend, error.error()));
                    // hyper hands back a request it never started sending.
                    pending = error.take_message();
                    if pending.is_none() && !spend(&mut resends_left, replay.is_some()) {
                        break;
                    }
                }
                Err(_elapsed) => {
                    backend.call_ended();
                    backend.record(Outcome::Timeout);
                    last = Some(RouteError::Timeout {
                        backend: backend.label().to_owned(),
                        after: self.timeout,
                    });
                    if !spend(&mut resends_left, replay.is_some()) {
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
    fn upstream_uri(&self, uri: &Uri) -> Uri {
        let path = uri.path();
        let path = match &self.strip {
            Some(prefix) => {
                let rest = path.strip_prefix(prefix.as_str()).unwrap_or(path);
                if rest.starts_with('/') {
                    rest.to_owned()
                } else {
                    format!("/{rest}")
                }
            }
            None => path.to_owned(),
        };
        let target = match uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        // Built from a valid path and query, so it parses; keep the original otherwise.
        target.parse().unwrap_or_else(|_| uri.clone())
    }

    fn relay(&self, response: Response<Incoming>, lease: Lease) -> Response<ResponseBody> {
        let (mut parts, body) = response.into_parts();
        self.rewrite.response(&mut parts.headers);
        let body = RelayBody::new(body, lease)
            .map_err(|error| Box::new(error) as BoxError)
            .boxed_unsync();
        Response::from_parts(parts, body)
    }
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
