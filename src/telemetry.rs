//! Telemetry: installs the global tracing subscriber from `[telemetry]`.
//!
//! Log lines go to stderr, pretty or JSON (`--log-format` over `log_format`), filtered by
//! `RUST_LOG` or else `log_level`; this is the one module that reads the environment. With
//! `otlp_endpoint` set, spans are also exported over OTLP/HTTP (protobuf): finished spans go
//! into a bounded queue that a task on the tokio runtime drains in batches, so a call never
//! waits on the collector, and a full queue drops spans rather than blocking. The export
//! sees every `call` span with its phase events whatever `log_level` says (its own filter).
//!
//! [`init`] returns a [`TelemetryGuard`] that sends the spans still queued when dropped.
//! Which spans exist and what they carry is wharf-host's business (`layers/trace.rs`).

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;
use wharf_config::TelemetryConfig;

use crate::cli::LogFormat;

/// The environment variable that replaces `telemetry.log_level`.
const LOG_ENV: &str = "RUST_LOG";
/// Longest wait for one export request, and so for the final flush at exit.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often queued spans are sent (also when a batch fills up).
const EXPORT_INTERVAL: Duration = Duration::from_secs(5);
/// Spans per export request.
const EXPORT_BATCH: usize = 512;
/// Finished spans waiting for export; beyond this new ones are dropped.
const EXPORT_QUEUE: usize = 2048;
/// The OTLP/HTTP path of traces under the collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// Keeps the trace export running; dropping it sends the spans still queued (waiting at most
/// [`EXPORT_TIMEOUT`]) and stops the export.
///
/// Drop it on a thread that is not a runtime worker (it blocks), while the tokio runtime that
/// [`init`] ran in is still alive (the export task runs there): in `main`, after `block_on`.
#[must_use = "dropping the guard stops the trace export"]
pub(crate) struct TelemetryGuard {
    /// The exporting provider; `None` when no `otlp_endpoint` is configured.
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            match provider.shutdown() {
                Ok(()) => tracing::debug!("trace export flushed"),
                Err(error) => tracing::warn!(error = %error, "trace export: final flush failed"),
            }
        }
    }
}

/// Installs the global subscriber: log lines on stderr and, with `otlp_endpoint`, the OTLP
/// export. `flag_format` (`--log-format`) overrides `config.log_format`.
///
/// With an `otlp_endpoint` it must run inside a tokio runtime (`Runtime::enter`), which then
/// hosts the export task.
///
/// # Errors
///
/// The exporter cannot be built, or a subscriber is already installed. An invalid `RUST_LOG`
/// is not an error: it is ignored with a warning.
pub(crate) fn init(
    config: &TelemetryConfig,
    flag_format: Option<LogFormat>,
) -> anyhow::Result<TelemetryGuard> {
    let (log_filter, ignored_env) = log_filter(config)?;
    let format = match flag_format {
        Some(LogFormat::Pretty) => wharf_config::LogFormat::Pretty,
        Some(LogFormat::Json) => wharf_config::LogFormat::Json,
        None => config.log_format,
    };
    // Colours only on a terminal: a log file or collector gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let fmt = match format {
        wharf_config::LogFormat::Pretty => fmt.boxed(),
        wharf_config::LogFormat::Json => fmt.json().boxed(),
    }
    .with_filter(log_filter);

    let provider = match &config.otlp_endpoint {
        Some(endpoint) => Some(tracer_provider(config, endpoint.as_str())?),
        None => None,
    };
    let otel = provider.as_ref().map(|provider| {
        let tracer = provider.tracer("wharf");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Busy/idle time costs two clock reads per poll of every call; phases carry the
            // timing that matters.
            .with_tracked_inactivity(false)
            .with_threads(false)
            // `code.module.name` says where a span comes from; a `target` attribute would
            // also clash with the `call` span's own `target` field (the request target).
            .with_target(false)
            .with_filter(export_filter())
    });

    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .context("cannot install the tracing subscriber")?;
    if let Some(warning) = ignored_env {
        tracing::warn!(log_level = %config.log_level, "{warning}");
    }
    if let Some(endpoint) = &config.otlp_endpoint {
        tracing::info!(
            endpoint = %traces_url(endpoint.as_str()),
            service_name = %config.service_name,
            sample_ratio = config.sample_ratio,
            "exporting traces over OTLP/HTTP"
        );
    }
    Ok(TelemetryGuard { provider })
}

/// The proxy variables other HTTP clients honour. wharf reaches origins and backends
/// directly (SPEC §3: none is honoured silently), so each one set is logged.
const PROXY_ENV: [&str; 8] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Logs a warning for each proxy variable set in the environment: a user who set one
/// for wharf must learn that it has no effect. Call it once the subscriber is installed.
pub(crate) fn warn_of_ignored_proxy_variables() {
    for name in PROXY_ENV {
        if std::env::var_os(name).is_some_and(|value| !value.is_empty()) {
            tracing::warn!(
                variable = name,
                "{name} is set and ignored: wharf connects to origins and backends directly"
            );
        }
    }
}

/// Caps the one log target known to print a secret: async-nats 0.46 logs its CONNECT
/// message at `trace` with the broker password or token in it (`connection.rs`, the derived
/// `Debug` of `ConnectInfo`). See [`secret_safe`].
const SECRET_SAFE: &str = "async_nats::connection=debug";

/// The log filter: `RUST_LOG` if set and valid, else `log_level`, made [`secret_safe`];
/// plus a warning when `RUST_LOG` was set but invalid.
fn log_filter(config: &TelemetryConfig) -> anyhow::Result<(EnvFilter, Option<String>)> {
    let (filter, ignored) = chosen_log_filter(config)?;
    Ok((secret_safe(filter), ignored))
}

/// `filter` with [`SECRET_SAFE`] added, if it could log at `trace` at all. A filter that
/// cannot is left alone: the directive would raise its most verbose level to `debug`, and
/// every `debug` event on a call's path would then pass tracing's one-load level check and
/// go on to the filter's slower one (stop 58's run: 3,200-5,200 more instructions a call
/// at `log_level = "warn"`).
fn secret_safe(filter: EnvFilter) -> EnvFilter {
    if filter
        .max_level_hint()
        .is_some_and(|most_verbose| most_verbose < LevelFilter::TRACE)
    {
        return filter;
    }
    let directive = SECRET_SAFE
        .parse()
        .expect("SECRET_SAFE is a valid directive (a unit test parses it)");
    filter.add_directive(directive)
}

/// `RUST_LOG` if set and valid, else `log_level`.
fn chosen_log_filter(config: &TelemetryConfig) -> anyhow::Result<(EnvFilter, Option<String>)> {
    let mut ignored = None;
    if let Ok(directives) = std::env::var(LOG_ENV) {
        if !directives.trim().is_empty() {
            match EnvFilter::builder().parse(&directives) {
                Ok(filter) => return Ok((filter, None)),
                Err(error) => {
                    ignored = Some(format!(
                        "{LOG_ENV}={directives:?} ignored ({error}), using telemetry.log_level"
                    ));
                }
            }
        }
    }
    // wharf-config checked it with the same parser.
    let filter = EnvFilter::builder()
        .parse(&config.log_level)
        .with_context(|| format!("telemetry.log_level {:?}", config.log_level))?;
    Ok((filter, ignored))
}

/// What the OTLP export records: wharf's spans and events at debug (the call phases), other
/// crates' at info, and nothing from the OpenTelemetry crates themselves (their diagnostics
/// go to the log, never back into the export).
fn export_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("wharf", LevelFilter::DEBUG)
        .with_target("opentelemetry", LevelFilter::OFF)
}

/// `{otlp_endpoint}/v1/traces`, keeping a path prefix of the base URL.
fn traces_url(endpoint: &str) -> String {
    format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
}

/// The exporting provider: OTLP/HTTP protobuf over hyper (http or https with rustls/ring and
/// the webpki roots), batched by a task on the current tokio runtime, sampled by trace id.
fn tracer_provider(config: &TelemetryConfig, endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .context("cannot set up TLS for the OTLP exporter")?
        .https_or_http()
        .enable_http1()
        .build();
    let client = opentelemetry_http::hyper::HyperClient::new(connector, EXPORT_TIMEOUT, None);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .with_context(|| format!("cannot build the OTLP exporter for {endpoint}"))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(EXPORT_QUEUE)
        .with_max_export_batch_size(EXPORT_BATCH)
        .with_scheduled_delay(EXPORT_INTERVAL)
        .with_max_export_timeout(EXPORT_TIMEOUT)
        .build();
    let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio)
        .with_batch_config(batch)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sample_ratio,
        ))))
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The secret-safe cap is added only where `trace` could log, and never makes a filter
    /// more verbose (which would cost every call its debug events' slow check).
    #[test]
    fn the_secret_safe_cap_never_raises_the_most_verbose_level() {
        for (directives, most_verbose, capped) in [
            ("warn", LevelFilter::WARN, false),
            ("info", LevelFilter::INFO, false),
            ("debug", LevelFilter::DEBUG, false),
            ("trace", LevelFilter::TRACE, true),
            ("info,async_nats=trace", LevelFilter::TRACE, true),
        ] {
            let filter = secret_safe(EnvFilter::new(directives));
            assert_eq!(filter.max_level_hint(), Some(most_verbose), "{directives}");
            assert_eq!(
                filter.to_string().contains(SECRET_SAFE),
                capped,
                "{directives}: {filter}"
            );
        }
    }

    #[test]
    fn traces_url_appends_the_signal_path() {
        // As wharf-config stores them: a URL always has a path, at least "/".
        assert_eq!(
            traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://c.example/otel/"),
            "https://c.example/otel/v1/traces"
        );
    }
}
