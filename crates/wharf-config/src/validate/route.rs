//! The keys of a `type = "route"` service.

use std::ops::Range;

use http::{HeaderName, HeaderValue, Method};
use url::Url;

use super::{check_path, Checker};
use crate::defaults;
use crate::model::{RouteConfig, Strategy};
use crate::raw::{RawHeaderTable, RawService};

/// Headers a route may neither set nor remove: they frame the message or concern one hop
/// only (RFC 9110 §7.6.1), and the host manages them.
pub(super) const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Validates the route keys of `raw`; `table` is `services.NAME`. Bad values are reported
/// and left out (or replaced by defaults).
pub(super) fn route(
    c: &mut Checker<'_>,
    table: &str,
    raw: &RawService,
    name_span: &Option<Range<usize>>,
) -> RouteConfig {
    let key = |k: &str| format!("{table}.{k}");

    let path_prefix = match &raw.path_prefix {
        Some(prefix) => check_path(c, &key("path_prefix"), prefix).unwrap_or_default(),
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `path_prefix` (e.g. path_prefix = "/orders")"#,
            );
            String::new()
        }
    };
    let strip_prefix = raw.strip_prefix.as_ref().is_some_and(|v| *v.get_ref());

    let mut methods: Vec<Method> = Vec::new();
    for entry in raw.methods.iter().flat_map(|list| list.get_ref()) {
        let written = entry.get_ref();
        match Method::from_bytes(written.to_ascii_uppercase().as_bytes()) {
            Ok(method) if methods.contains(&method) => c.report(
                Some(entry.span()),
                &key("methods"),
                format!("{method} is listed twice"),
            ),
            Ok(method) => methods.push(method),
            Err(_) => c.report(
                Some(entry.span()),
                &key("methods"),
                format!("{written:?} is not an HTTP method (e.g. \"GET\")"),
            ),
        }
    }

    let match_headers = header_table(c, &key("match_headers"), &raw.match_headers, false);

    let backends: Vec<Url> = match &raw.backends {
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `backends` (e.g. backends = ["http://127.0.0.1:7001"])"#,
            );
            Vec::new()
        }
        Some(list) if list.get_ref().is_empty() => {
            c.report(
                Some(list.span()),
                &key("backends"),
                r#"no backends, list at least one (e.g. ["http://127.0.0.1:7001"])"#,
            );
            Vec::new()
        }
        Some(list) => c.unique_list(&key("backends"), list.get_ref(), backend),
    };

    let strategy = match &raw.strategy {
        None => Strategy::Failover,
        Some(written) => {
            let found = Strategy::ALL
                .into_iter()
                .find(|s| s.as_str() == written.get_ref());
            found.unwrap_or_else(|| {
                c.report(
                    Some(written.span()),
                    &key("strategy"),
                    format!(
                        r#"unknown strategy {:?}, use "failover", "round_robin" or "least_outstanding""#,
                        written.get_ref()
                    ),
                );
                Strategy::Failover
            })
        }
    };

    let set_headers = header_table(c, &key("set_headers"), &raw.set_headers, true);
    let mut remove_headers: Vec<HeaderName> = Vec::new();
    for entry in raw.remove_headers.iter().flat_map(|list| list.get_ref()) {
        let why = match HeaderName::from_bytes(entry.get_ref().as_bytes()) {
            Err(_) => Some(bad_name(entry.get_ref())),
            Ok(name) if HOP_BY_HOP.contains(&name.as_str()) => Some(hop_by_hop(&name)),
            Ok(name) if set_headers.iter().any(|(set, _)| *set == name) => Some(format!(
                "{name:?} is also in set_headers, keep it in one of them"
            )),
            Ok(name) if remove_headers.contains(&name) => Some(format!("{name:?} is listed twice")),
            Ok(name) => {
                remove_headers.push(name);
                None
            }
        };
        if let Some(why) = why {
            c.report(Some(entry.span()), &key("remove_headers"), why);
        }
    }

    let timeout = c.duration(
        &key("timeout"),
        &raw.timeout,
        defaults::ROUTE_TIMEOUT,
        "1ms",
    );
    let retries = c.count(
        &key("retries"),
        &raw.retries,
        defaults::RETRIES,
        0..=defaults::MAX_RETRIES,
    );
    let preconnect = c.count(
        &key("preconnect"),
        &raw.preconnect,
        0,
        0..=defaults::MAX_PRECONNECT,
    );

    RouteConfig {
        path_prefix,
        strip_prefix,
        methods,
        match_headers,
        backends,
        strategy,
        set_headers,
        remove_headers,
        timeout,
        // At most MAX_RETRIES (10).
        retries: u32::try_from(retries).unwrap_or(u32::MAX),
        // At most MAX_PRECONNECT (1024).
        preconnect: u32::try_from(preconnect).unwrap_or(u32::MAX),
    }
}

/// `match_headers` or `set_headers`, in file order. `rewrite`: refuse hop-by-hop names.
fn header_table(
    c: &mut Checker<'_>,
    key: &str,
    table: &Option<RawHeaderTable>,
    rewrite: bool,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut entries: Vec<_> = table.iter().flatten().collect();
    entries.sort_by_key(|(name, _)| name.span().start);
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (name, value) in entries {
        let name_key = format!("{key}.{}", name.get_ref());
        let parsed = match HeaderName::from_bytes(name.get_ref().as_bytes()) {
            Ok(parsed) => parsed,
            Err(_) => {
                c.report(Some(name.span()), &name_key, bad_name(name.get_ref()));
                continue;
            }
        };
        if rewrite && HOP_BY_HOP.contains(&parsed.as_str()) {
            c.report(Some(name.span()), &name_key, hop_by_hop(&parsed));
            continue;
        }
        if headers.iter().any(|(seen, _)| *seen == parsed) {
            let why = format!("{parsed:?} is listed twice (header names ignore case)");
            c.report(Some(name.span()), &name_key, why);
            continue;
        }
        match HeaderValue::from_str(value.get_ref()) {
            Ok(value) => headers.push((parsed, value)),
            Err(_) => c.report(
                Some(value.span()),
                &name_key,
                format!(
                    "{:?} is not a valid header value (control characters are not allowed)",
                    value.get_ref()
                ),
            ),
        }
    }
    headers
}

fn bad_name(name: &str) -> String {
    format!("{name:?} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)")
}

fn hop_by_hop(name: &HeaderName) -> String {
    format!("{name:?} is a hop-by-hop or framing header, which wharf manages itself")
}

/// Parses a backend: `http(s)://host[:port][/]` or `unix:/absolute/path`.
pub(crate) fn backend(written: &str) -> Result<Url, String> {
    let shown = crate::redacted_url(written);
    let example = r#"e.g. "http://127.0.0.1:7001" or "unix:/run/app.sock""#;
    let url =
        Url::parse(written).map_err(|err| format!("{shown:?} is not a URL: {err} ({example})"))?;
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{shown:?} must not have a query or fragment"));
    }
    match url.scheme() {
        "http" | "https" => {
            if !url.username().is_empty() || url.password().is_some() {
                return Err(format!(
                    "{shown:?} must not contain credentials, use set_headers"
                ));
            }
            if url.path() != "/" {
                return Err(format!(
                    "{shown:?} must not have a path, the request path is forwarded (use {:?})",
                    url.origin().ascii_serialization()
                ));
            }
            Ok(url)
        }
        "unix" => {
            let absolute = !url.cannot_be_a_base()
                && url.host_str().is_none_or(str::is_empty)
                && url.path().len() > 1
                && !url.path().ends_with('/');
            if absolute {
                Ok(url)
            } else {
                Err(format!(
                    "{shown:?} is not a unix socket, use \"unix:\" and an absolute file path (e.g. \"unix:/run/app.sock\")"
                ))
            }
        }
        other => Err(format!(
            "{shown:?}: unsupported scheme {other:?}, use http, https or unix ({example})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::backend;

    #[test]
    fn backends() {
        let good = [
            ("http://127.0.0.1:7001", "http://127.0.0.1:7001/"),
            ("https://Api.Example.com/", "https://api.example.com/"),
            ("http://[::1]:80", "http://[::1]/"),
            ("unix:/tmp/x.sock", "unix:/tmp/x.sock"),
            ("unix:///run/app.sock", "unix:///run/app.sock"),
        ];
        for (written, want) in good {
            let url = backend(written).unwrap_or_else(|e| panic!("{written:?}: {e}"));
            assert_eq!(url.as_str(), want);
        }
        let bad = [
            "127.0.0.1:7001",
            "localhost",
            "ftp://example.com",
            "http://example.com/api",
            "http://example.com/?x=1",
            "http://example.com/#f",
            "http://user:pw@example.com",
            "unix:relative.sock",
            "unix:/",
            "unix:/run/",
            "unix://host/run/app.sock",
            "",
        ];
        for written in bad {
            assert!(backend(written).is_err(), "{written:?} should be refused");
        }
    }
}
