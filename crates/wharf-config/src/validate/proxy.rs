//! The keys of a `type = "proxy"` service.

use std::ops::Range;

use url::Url;

use super::{check_path, Checker};
use crate::defaults;
use crate::model::ProxyConfig;
use crate::raw::RawService;

/// Validates the proxy keys of `raw`; `table` is `services.NAME`. Bad values are reported
/// and replaced by defaults (an empty `path`).
pub(super) fn proxy(
    c: &mut Checker<'_>,
    table: &str,
    raw: &RawService,
    name_span: &Option<Range<usize>>,
) -> ProxyConfig {
    let key = |k: &str| format!("{table}.{k}");

    let path = match &raw.path {
        Some(path) => check_path(c, &key("path"), path).unwrap_or_default(),
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `path` (e.g. path = "/proxy")"#,
            );
            String::new()
        }
    };

    let (cache_max_bytes, cache_span) = c.size(
        &key("cache_max_bytes"),
        &raw.cache_max_bytes,
        defaults::CACHE_MAX_BYTES,
    );
    let (mut max_object_bytes, object_span) = c.size(
        &key("max_object_bytes"),
        &raw.max_object_bytes,
        defaults::MAX_OBJECT_BYTES,
    );
    if max_object_bytes > cache_max_bytes {
        c.report(
            object_span.or(cache_span).or_else(|| name_span.clone()),
            &key("max_object_bytes"),
            format!(
                "{max_object_bytes} bytes is more than cache_max_bytes ({cache_max_bytes} \
                 bytes), lower it or raise cache_max_bytes"
            ),
        );
        max_object_bytes = cache_max_bytes;
    }

    let max_ttl = c.duration(&key("max_ttl"), &raw.max_ttl, defaults::MAX_TTL, "1s");
    let allow_private_networks = raw
        .allow_private_networks
        .as_ref()
        .is_some_and(|v| *v.get_ref());

    let mut allow_hosts: Vec<String> = Vec::new();
    for entry in raw.allow_hosts.iter().flat_map(|list| list.get_ref()) {
        match host_entry(entry.get_ref()) {
            Ok(host) if allow_hosts.contains(&host) => {}
            Ok(host) => allow_hosts.push(host),
            Err(why) => c.report(Some(entry.span()), &key("allow_hosts"), why),
        }
    }

    let connect_timeout = c.duration(
        &key("connect_timeout"),
        &raw.connect_timeout,
        defaults::CONNECT_TIMEOUT,
        "1ms",
    );
    let first_byte_timeout = c.duration(
        &key("first_byte_timeout"),
        &raw.first_byte_timeout,
        defaults::FIRST_BYTE_TIMEOUT,
        "1ms",
    );
    let total_timeout = c.duration(
        &key("total_timeout"),
        &raw.total_timeout,
        defaults::TOTAL_TIMEOUT,
        "1ms",
    );

    let shared_cache = raw.shared_cache.as_ref().and_then(|written| {
        redis_url(written.get_ref())
            .map_err(|why| c.report(Some(written.span()), &key("shared_cache"), why))
            .ok()
    });

    let preconnect_origins = raw
        .preconnect_origins
        .as_ref()
        .map(|list| {
            c.unique_list(&key("preconnect_origins"), list.get_ref(), |entry| {
                preconnect_origin(entry, &allow_hosts)
            })
        })
        .unwrap_or_default();
    let preconnect = c.count(
        &key("preconnect"),
        &raw.preconnect,
        defaults::PROXY_PRECONNECT,
        1..=defaults::MAX_PRECONNECT,
    );
    if let (Some(written), true) = (&raw.preconnect, raw.preconnect_origins.is_none()) {
        c.report(
            Some(written.span()),
            &key("preconnect"),
            "counts connections to the origins in `preconnect_origins`, which lists none \
             (add the origins there, or remove this key)",
        );
    }

    ProxyConfig {
        path,
        cache_max_bytes,
        max_object_bytes,
        max_ttl,
        allow_private_networks,
        allow_hosts,
        connect_timeout,
        first_byte_timeout,
        total_timeout,
        shared_cache,
        preconnect_origins,
        // At most MAX_PRECONNECT (1024).
        preconnect: u32::try_from(preconnect).unwrap_or(u32::MAX),
    }
}

/// Parses a `preconnect_origins` entry, `http(s)://host[:port][/]`, and checks that
/// `allow_hosts` (normalised, empty: any host) lets the proxy fetch from it: a connection
/// opened ahead to an origin no call may reach would only hold a descriptor.
pub(crate) fn preconnect_origin(written: &str, allow_hosts: &[String]) -> Result<Url, String> {
    let shown = crate::redacted_url(written);
    let url = super::route::backend(written)?;
    if url.scheme() == "unix" {
        return Err(format!(
            "{shown:?}: the proxy fetches http and https URLs only (e.g. \"http://127.0.0.1:8080\")"
        ));
    }
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default().unwrap_or(80);
    let allowed = allow_hosts.is_empty()
        || allow_hosts
            .iter()
            .any(|entry| entry == host || *entry == format!("{host}:{port}"));
    if !allowed {
        return Err(format!(
            "{shown:?} is not in allow_hosts, so no call could use its connections (add \"{host}:{port}\" there)"
        ));
    }
    Ok(url)
}

/// Checks a `shared_cache` URL: `redis://[:password@]host[:port][/db]`, returned normalised.
pub(crate) fn redis_url(written: &str) -> Result<String, String> {
    let shown = crate::redacted_url(written);
    let example = r#"e.g. "redis://127.0.0.1:6379""#;
    let url = url::Url::parse(written)
        .map_err(|err| format!("{shown:?} is not a URL: {err} ({example})"))?;
    match url.scheme() {
        "redis" => {}
        "rediss" => {
            return Err(format!(
                "{shown:?}: TLS to Redis is not supported, use redis:// ({example})"
            ))
        }
        other => {
            return Err(format!(
                "{shown:?}: unsupported scheme {other:?}, use redis:// ({example})"
            ))
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host ({example})"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{shown:?} must not have a query or fragment"));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(format!(
            "{shown:?}: the path is a database number, e.g. \"redis://127.0.0.1:6379/2\""
        ));
    }
    let mut normalised = url.to_string();
    if normalised.ends_with('/') {
        normalised.pop();
    }
    Ok(normalised)
}

/// Normalises an `allow_hosts` entry (`"Example.COM:8443"` → `"example.com:8443"`) the way
/// `url` normalises a URL's host, so that the proxy can compare it with `Url::host_str`.
pub(crate) fn host_entry(entry: &str) -> Result<String, String> {
    if entry.is_empty() {
        return Err(r#"empty entry, use "host" or "host:port""#.to_owned());
    }
    if entry.contains('/') || entry.contains('@') {
        return Err(format!(
            r#"{entry:?} is not a host, use "host" or "host:port" (no scheme, path or user)"#
        ));
    }
    if entry.contains('*') {
        return Err(format!(
            "{entry:?}: wildcards are not supported, list each host"
        ));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        // [IPv6] or [IPv6]:port
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!("{entry:?} is missing the closing \"]\""));
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(format!(r#"{entry:?}: expected ":port" after "]""#)),
            },
        };
        (&entry[..addr.len() + 2], port)
    } else if entry.matches(':').count() > 1 {
        return Err(format!(
            r#"{entry:?}: write an IPv6 address in brackets, e.g. "[::1]" or "[::1]:8080""#
        ));
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    let host = url::Host::parse(host).map_err(|err| {
        format!("{entry:?}: {host:?} is not a valid host name or address ({err})")
    })?;
    match port {
        None => Ok(host.to_string()),
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Ok(format!("{host}:{port}")),
            _ => Err(format!("{entry:?}: {port:?} is not a port (1 to 65535)")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{host_entry, preconnect_origin, redis_url};

    #[test]
    fn preconnect_origins_must_be_origins_the_proxy_may_fetch_from() {
        let anywhere: [String; 0] = [];
        let listed = ["127.0.0.1:8080".to_owned(), "example.com".to_owned()];
        let good: [(&str, &[String]); 5] = [
            ("http://127.0.0.1:8080", &anywhere),
            ("https://example.com/", &anywhere),
            ("http://127.0.0.1:8080/", &listed),
            ("http://Example.COM:9000", &listed),
            ("https://example.com", &listed),
        ];
        for (written, allow) in good {
            assert!(
                preconnect_origin(written, allow).is_ok(),
                "{written:?} with {allow:?}"
            );
        }
        let bad: [(&str, &[String], &str); 6] = [
            ("127.0.0.1:8080", &anywhere, "is not a URL"),
            ("http://127.0.0.1:8080/x", &anywhere, "must not have a path"),
            ("unix:/run/app.sock", &anywhere, "http and https URLs only"),
            ("ftp://127.0.0.1", &anywhere, "unsupported scheme"),
            ("http://127.0.0.1:8081", &listed, "not in allow_hosts"),
            ("http://other.example", &listed, "add \"other.example:80\""),
        ];
        for (written, allow, why) in bad {
            let error = preconnect_origin(written, allow).expect_err(written);
            assert!(error.contains(why), "{written:?}: {error}");
        }
    }

    #[test]
    fn shared_cache_urls() {
        let good = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://cache.example:6380/", "redis://cache.example:6380"),
            ("redis://:secret@10.0.0.2/3", "redis://:secret@10.0.0.2/3"),
        ];
        for (written, want) in good {
            assert_eq!(redis_url(written).as_deref(), Ok(want), "{written:?}");
        }
        for bad in [
            "",
            "127.0.0.1:6379",
            "rediss://127.0.0.1:6379",
            "http://127.0.0.1:6379",
            "redis://",
            "redis://127.0.0.1/x",
            "redis://127.0.0.1?db=1",
        ] {
            assert!(redis_url(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn allow_hosts_entries() {
        let good = [
            ("example.com", "example.com"),
            ("Example.COM:8443", "example.com:8443"),
            ("10.0.0.1", "10.0.0.1"),
            ("0x7f.1:80", "127.0.0.1:80"),
            ("[::1]", "[::1]"),
            ("[::1]:8080", "[::1]:8080"),
            ("bücher.example", "xn--bcher-kva.example"),
        ];
        for (entry, want) in good {
            assert_eq!(host_entry(entry).as_deref(), Ok(want), "{entry:?}");
        }
        let bad = [
            "",
            "http://example.com",
            "example.com/x",
            "user@example.com",
            "*.example.com",
            "::1",
            "[::1",
            "[::1]x",
            "example.com:0",
            "example.com:65536",
            "example.com:http",
            "example.com:",
            "exa mple.com",
        ];
        for entry in bad {
            assert!(host_entry(entry).is_err(), "{entry:?} should be refused");
        }
    }
}
