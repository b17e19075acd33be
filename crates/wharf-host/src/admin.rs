//! The admin listener: `/metrics`, `/debug/inflight`, `/healthz`, `/readyz`,
//! and `POST /reload`.
//!
//! Bound separately from the service listener (loopback by default) so
//! operators' probes neither count as sessions nor compete with calls.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tracing::{debug, warn};
use wharf_metrics::Metrics;

use crate::body::{full, ResponseBody};
use crate::call::Inflight;
use crate::error::json_error;

/// Runs a reload; `Ok` carries a summary, `Err` why the new config was
/// refused (the old one stays).
pub type ReloadHook =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync>;

/// What the admin endpoints report on.
pub struct AdminState {
    /// Set once the service listener accepts calls; cleared when draining.
    ready: AtomicBool,
    metrics: Arc<Metrics>,
    inflight: Arc<Inflight>,
    /// Set once by the program that owns the config (`Host::on_reload`).
    reload: OnceLock<ReloadHook>,
    /// `authorization` value required on every endpoint but the probes.
    bearer: Option<HeaderValue>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl AdminState {
    pub(crate) fn new(metrics: Arc<Metrics>, inflight: Arc<Inflight>, token: Option<&str>) -> Self {
        Self {
            ready: AtomicBool::new(false),
            metrics,
            inflight,
            reload: OnceLock::new(),
            bearer: token.and_then(|token| HeaderValue::from_str(&format!("Bearer {token}")).ok()),
        }
    }

    /// Whether `request` may see anything beyond the probes.
    fn authorized<B>(&self, request: &Request<B>) -> bool {
        match &self.bearer {
            None => true,
            Some(expected) => request
                .headers()
                .get(header::AUTHORIZATION)
                .is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes())),
        }
    }

    /// Sets what `POST /reload` runs; only the first call takes effect.
    pub(crate) fn set_reload(&self, hook: ReloadHook) -> bool {
        self.reload.set(hook).is_ok()
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// The host's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The host's calls in flight.
    pub fn inflight(&self) -> &Arc<Inflight> {
        &self.inflight
    }
}

/// Answers one admin request.
pub fn respond<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
        "/readyz" if state.ready.load(Ordering::Acquire) => text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "ready\n".into(),
        ),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            "not ready\n".into(),
        ),
        // Prometheus asks for OpenMetrics first in its Accept header; curl and
        // older scrapers get the classic format, which types counters their way.
        "/metrics" if accepts_openmetrics(request) => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.encode_classic(),
        ),
        "/debug/inflight" => {
            let calls = state.inflight.snapshot();
            let body = serde_json::to_string(&calls).unwrap_or_else(|_| "[]".to_owned());
            text(StatusCode::OK, "application/json", body)
        }
        path => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "no admin endpoint at {path} (try /metrics, /debug/inflight, /healthz, /readyz)"
            ),
        ),
    }
}

/// Whether the scraper lists OpenMetrics text among the media types it takes
/// (and not with `q=0`).
fn accepts_openmetrics<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media_type = parts.next().unwrap_or("");
            media_type.eq_ignore_ascii_case("application/openmetrics-text")
                && !parts.any(|param| {
                    // Parameter names ignore case (RFC 9110 §5.6.6): `Q=0` refuses too.
                    param
                        .split_once('=')
                        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                        .and_then(|(_, q)| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q == 0.0)
                })
        })
}

/// Compares without stopping at the first difference, so response times
/// do not reveal how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Answers one admin request, including the async `POST /reload`.
async fn answer<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody> {
    let path = request.uri().path();
    if path != "/healthz" && path != "/readyz" && !state.authorized(&request) {
        let mut response = json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this admin endpoint needs authorization: Bearer <admin_token>",
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    if request.uri().path() != "/reload" {
        return respond(state, &request);
    }
    if request.method() != http::Method::POST {
        let mut response = json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use POST /reload",
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let Some(reload) = state.reload.get() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this host has no config file to reload",
        );
    };
    match reload().await {
        Ok(summary) => {
            let body = serde_json::json!({ "status": "reloaded", "message": summary }).to_string();
            text(StatusCode::OK, "application/json", body)
        }
        Err(why) => json_error(StatusCode::BAD_REQUEST, "invalid_config", &why),
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Serves the admin listener until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(error = %error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(answer(&state, request).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(peer = %peer, error = %error, "admin connection ended with error");
            }
        });
    }
}
