//! The `[telemetry]` table: log format and level, trace export.

use url::Url;

use super::Checker;
use crate::defaults;
use crate::model::{LogFormat, TelemetryConfig};
use crate::raw::RawTelemetry;

/// The `[telemetry]` table. Bad values are reported and replaced by defaults (no export).
pub(super) fn telemetry(c: &mut Checker<'_>, raw: &RawTelemetry) -> TelemetryConfig {
    let default_format = log_format(defaults::LOG_FORMAT).expect("the built-in format is valid");
    let log_format = match &raw.log_format {
        None => default_format,
        Some(value) => log_format(value.get_ref()).unwrap_or_else(|| {
            c.report(
                Some(value.span()),
                "telemetry.log_format",
                format!(
                    r#"unknown log format {:?}, use "pretty" or "json""#,
                    value.get_ref()
                ),
            );
            default_format
        }),
    };

    let log_level = match &raw.log_level {
        None => defaults::LOG_LEVEL.to_owned(),
        Some(value) => match log_level(value.get_ref()) {
            Ok(()) => value.get_ref().clone(),
            Err(why) => {
                c.report(Some(value.span()), "telemetry.log_level", why);
                defaults::LOG_LEVEL.to_owned()
            }
        },
    };

    let otlp_endpoint = raw.otlp_endpoint.as_ref().and_then(|value| {
        otlp_endpoint(value.get_ref())
            .map_err(|why| c.report(Some(value.span()), "telemetry.otlp_endpoint", why))
            .ok()
    });

    let service_name = match &raw.service_name {
        None => defaults::SERVICE_NAME.to_owned(),
        Some(value) => {
            let name = value.get_ref();
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                c.report(
                    Some(value.span()),
                    "telemetry.service_name",
                    format!(
                        "{name:?} is not a service name, use a non-empty name without control \
                         characters (e.g. {:?})",
                        defaults::SERVICE_NAME
                    ),
                );
                defaults::SERVICE_NAME.to_owned()
            } else {
                name.clone()
            }
        }
    };

    let sample_ratio = match &raw.sample_ratio {
        None => defaults::SAMPLE_RATIO,
        // NaN is outside every range, so it is refused here too.
        Some(value) if (0.0..=1.0).contains(value.get_ref()) => *value.get_ref(),
        Some(value) => {
            c.report(
                Some(value.span()),
                "telemetry.sample_ratio",
                format!(
                    "{} is out of range, use 0.0 (export no trace) to 1.0 (every trace)",
                    value.get_ref()
                ),
            );
            defaults::SAMPLE_RATIO
        }
    };

    TelemetryConfig {
        log_format,
        log_level,
        otlp_endpoint,
        service_name,
        sample_ratio,
    }
}

/// The format spelled `written`, if any.
fn log_format(written: &str) -> Option<LogFormat> {
    LogFormat::ALL.into_iter().find(|f| f.as_str() == written)
}

/// Checks `EnvFilter` directives the way the binary will parse them.
fn log_level(written: &str) -> Result<(), String> {
    if written.trim().is_empty() {
        return Err(format!(
            "empty log level, use a level or filter directives (e.g. {:?}, \"warn,wharf_proxy=debug\")",
            defaults::LOG_LEVEL
        ));
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(written)
        .map(drop)
        .map_err(|err| {
            format!(
                "{written:?} is not a log level or filter: {err} (e.g. {:?}, \"warn,wharf_proxy=debug\")",
                defaults::LOG_LEVEL
            )
        })
}

/// An OTLP/HTTP collector's base URL; wharf appends `/v1/traces`.
fn otlp_endpoint(written: &str) -> Result<Url, String> {
    let shown = crate::redacted_url(written);
    let example = defaults::OTLP_ENDPOINT_EXAMPLE;
    let url = Url::parse(written)
        .map_err(|err| format!("{shown:?} is not a URL: {err} (e.g. {example:?})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{shown:?}: unsupported scheme {:?}, use http or https (OTLP over HTTP, e.g. {example:?})",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{shown:?} must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{shown:?} must not have a query or fragment"));
    }
    let path = url.path().trim_end_matches('/');
    if let Some(prefix) = path.strip_suffix(defaults::OTLP_TRACES_PATH) {
        // No query or fragment (refused above): the path ends the URL.
        let base = &url.as_str()[..url.as_str().len() - url.path().len()];
        return Err(format!(
            "{shown:?}: give the collector's base URL, wharf adds {} (use {:?})",
            defaults::OTLP_TRACES_PATH,
            format!("{base}{prefix}")
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use crate::{Config, LogFormat};

    fn problem(text: &str) -> String {
        let err = Config::from_toml_str(text, "wharf.toml").expect_err("must be refused");
        assert_eq!(err.problems().len(), 1, "{err}");
        err.to_string()
    }

    #[test]
    fn defaults_without_the_table() {
        let t = Config::from_toml_str("", "wharf.toml").unwrap().telemetry;
        assert_eq!(t.log_format, LogFormat::Pretty);
        assert_eq!(t.log_level, "info");
        assert_eq!(t.otlp_endpoint, None);
        assert_eq!(t.service_name, "wharf");
        assert_eq!(t.sample_ratio, 1.0);
    }

    #[test]
    fn every_key_parsed() {
        let t = Config::from_toml_str(
            r#"
[telemetry]
log_format = "json"
log_level = "warn,wharf_proxy=debug"
otlp_endpoint = "https://Collector.example:4318/otel/"
service_name = "edge-1"
sample_ratio = 0.25
"#,
            "wharf.toml",
        )
        .unwrap()
        .telemetry;
        assert_eq!(t.log_format, LogFormat::Json);
        assert_eq!(t.log_level, "warn,wharf_proxy=debug");
        assert_eq!(
            t.otlp_endpoint.map(String::from).as_deref(),
            Some("https://collector.example:4318/otel/")
        );
        assert_eq!(t.service_name, "edge-1");
        assert_eq!(t.sample_ratio, 0.25);
        // A TOML integer is a ratio too.
        let t = Config::from_toml_str("[telemetry]\nsample_ratio = 0\n", "wharf.toml")
            .unwrap()
            .telemetry;
        assert_eq!(t.sample_ratio, 0.0);
    }

    #[test]
    fn bad_values_name_file_line_key() {
        let cases: &[(&str, &str)] = &[
            ("log_format = \"text\"", r#"telemetry.log_format: unknown log format "text", use "pretty" or "json""#),
            ("log_level = \"info,wharf=loud\"", r#"telemetry.log_level: "info,wharf=loud" is not a log level or filter"#),
            ("log_level = \"\"", "telemetry.log_level: empty log level"),
            ("otlp_endpoint = \"127.0.0.1:4318\"", r#"telemetry.otlp_endpoint: "127.0.0.1:4318""#),
            ("otlp_endpoint = \"collector:4318\"", r#"telemetry.otlp_endpoint: "collector:4318": unsupported scheme "collector""#),
            ("otlp_endpoint = \"grpc://c:4317\"", r#"telemetry.otlp_endpoint: "grpc://c:4317": unsupported scheme "grpc""#),
            ("otlp_endpoint = \"\"", r#"telemetry.otlp_endpoint: "" is not a URL"#),
            ("otlp_endpoint = \"http://u:p@c:4318\"", "telemetry.otlp_endpoint: \"http://***@c:4318\" must not contain credentials"),
            ("otlp_endpoint = \"http://c:4318/?k=v\"", "telemetry.otlp_endpoint: \"http://c:4318/?k=v\" must not have a query"),
            ("otlp_endpoint = \"http://c:4318/v1/traces\"", r#"telemetry.otlp_endpoint: "http://c:4318/v1/traces": give the collector's base URL, wharf adds /v1/traces (use "http://c:4318")"#),
            ("service_name = \" \"", r#"telemetry.service_name: " " is not a service name"#),
            ("sample_ratio = 1.5", "telemetry.sample_ratio: 1.5 is out of range, use 0.0 (export no trace) to 1.0 (every trace)"),
            ("sample_ratio = -0.1", "telemetry.sample_ratio: -0.1 is out of range"),
            ("sample_ratio = nan", "telemetry.sample_ratio: NaN is out of range"),
            ("sample_ratio = \"1\"", r#"telemetry.sample_ratio: expected a number, found string "1""#),
            ("sampel_ratio = 1.0", "telemetry.sampel_ratio: unknown key `sampel_ratio`"),
        ];
        for (line, want) in cases {
            let p = problem(&format!("[telemetry]\n{line}\n"));
            let want = format!("wharf.toml:2: {want}");
            assert!(
                p.starts_with(&want),
                "for {line:?}\n got: {p}\nwant: {want}"
            );
        }
    }

    #[test]
    fn every_problem_reported() {
        let text = "[telemetry]\notlp_endpoint = \"ftp://x\"\nsample_ratio = 2.0\n";
        let err = Config::from_toml_str(text, "wharf.toml").expect_err("invalid");
        let keys: Vec<_> = err.problems().iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["telemetry.otlp_endpoint", "telemetry.sample_ratio"]);
    }
}
