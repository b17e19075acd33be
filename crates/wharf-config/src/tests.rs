//! Tests of the whole pipeline: TOML text to `Config` or `ConfigError`.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};

use crate::*;

/// The problems of a config that must be refused, one `Display` line each.
fn problems(text: &str) -> Vec<String> {
    match Config::from_toml_str(text, "wharf.toml") {
        Ok(config) => panic!("expected errors, got {config:#?}"),
        Err(err) => err.to_string().lines().map(str::to_owned).collect(),
    }
}

/// The single problem of a config that must be refused.
fn problem(text: &str) -> String {
    let mut all = problems(text);
    assert_eq!(all.len(), 1, "expected one problem, got {all:#?}");
    all.remove(0)
}

fn ok(text: &str) -> Config {
    Config::from_toml_str(text, "wharf.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn proxy(config: &Config, name: &str) -> ProxyConfig {
    match &config.service(name).expect("service exists").kind {
        ServiceKind::Proxy(p) => p.clone(),
        other => panic!("{name} is not a proxy: {other:?}"),
    }
}

fn route(config: &Config, name: &str) -> RouteConfig {
    match &config.service(name).expect("service exists").kind {
        ServiceKind::Route(r) => r.clone(),
        other => panic!("{name} is not a route: {other:?}"),
    }
}

const MINIMAL_ROUTE: &str = r#"
[services.orders]
type = "route"
path_prefix = "/orders"
backends = ["http://127.0.0.1:7001"]
"#;

#[test]
fn embedded_default_is_the_spec_default() {
    let config = Config::embedded_default();
    assert_eq!(config.origin, "<embedded default>");
    assert_eq!(
        config.server.listen,
        "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.server.admin_listen,
        "127.0.0.1:9901".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(config.services.len(), 1);
    let service = &config.services[0];
    assert_eq!(service.name, "proxy");
    assert_eq!(service.type_name(), "proxy");
    assert_eq!(proxy(&config, "proxy").path, "/proxy");
}

#[test]
fn embedded_default_spells_out_the_builtin_defaults() {
    // default.toml repeats every default: it must say what the code does.
    let minimal = ok("[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n");
    let embedded = Config::embedded_default();
    assert_eq!(embedded.server, minimal.server);
    assert_eq!(embedded.services, minimal.services);
    assert_eq!(embedded.server, ServerConfig::default());
    assert_eq!(embedded.telemetry, minimal.telemetry);
    assert_eq!(embedded.telemetry, TelemetryConfig::default());
}

#[test]
fn configuration_reference_shows_the_embedded_default() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let docs = std::fs::read_to_string(&docs).expect("docs/configuration.md exists");
    assert!(
        docs.contains(DEFAULT_TOML),
        "update the last section of docs/configuration.md"
    );
}

#[test]
fn defaults_filled() {
    let config = ok("");
    assert!(config.services.is_empty());
    let server = config.server;
    assert_eq!(server.max_connections, 10_000);
    assert_eq!(server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(server.max_header_bytes, 64 * 1024);
    assert_eq!(server.idle_timeout, Duration::from_secs(60));
    assert_eq!(server.shutdown_timeout, Duration::from_secs(30));
    assert!(!server.cpu_steering);
    assert!(!server.splice_bodies, "bodies are copied by default");
    assert_eq!(
        server.busy_poll,
        Duration::ZERO,
        "busy polling is off by default"
    );
    assert_eq!(server.keep_warm, None, "keep-warm is off by default");
    assert_eq!(server.resolve_hold, Duration::from_secs(10));

    let config = ok(&format!(
        "{MINIMAL_ROUTE}\n[services.p]\ntype = \"proxy\"\npath = \"/p\"\n"
    ));
    let orders = config.service("orders").expect("orders");
    assert_eq!(orders.limits.max_concurrent_calls, 256);
    assert_eq!(orders.limits.max_queued_calls, 64);
    assert_eq!(orders.limits.queue_timeout, Duration::from_secs(5));
    let r = route(&config, "orders");
    assert!(!r.strip_prefix && r.methods.is_empty() && r.match_headers.is_empty());
    assert_eq!(r.strategy, Strategy::Failover);
    assert_eq!(r.timeout, Duration::from_secs(10));
    assert_eq!(r.retries, 1);
    assert_eq!(r.preconnect, 0, "no connections opened ahead by default");
    let p = config.service("p").expect("p");
    assert_eq!(p.limits.max_concurrent_calls, 4096);
    assert_eq!(p.limits.max_queued_calls, 1024);
    let p = proxy(&config, "p");
    assert_eq!(p.cache_max_bytes, 256 << 20);
    assert_eq!(p.max_object_bytes, 64 << 20);
    assert_eq!(p.max_ttl, Duration::from_secs(86_400));
    assert!(!p.allow_private_networks && p.allow_hosts.is_empty());
    assert!(p.preconnect_origins.is_empty());
    assert_eq!(p.preconnect, 1);
    assert_eq!(p.connect_timeout, Duration::from_secs(5));
    assert_eq!(p.first_byte_timeout, Duration::from_secs(30));
    assert_eq!(p.total_timeout, Duration::from_secs(300));
}

#[test]
fn services_in_file_order() {
    let config = ok(r#"
[services.zeta]
type = "proxy"
path = "/z"
[services.alpha]
type = "proxy"
path = "/a"
"#);
    let names: Vec<_> = config.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha"]);
}

#[test]
fn route_fully_parsed() {
    let config = ok(r#"
[server]
listen = "0.0.0.0:80"
admin_listen = "[::1]:9000"
max_connections = 50
max_header_bytes = 16384
cpu_steering = true
busy_poll_us = 50
keep_warm = "250ms"
splice_bodies = true
resolve_hold = "0s"

[services.orders]
type = "route"
path_prefix = "/orders"
strip_prefix = true
methods = ["get", "POST", "PURGE"]
match_headers = { "X-Tenant" = "acme", "x-region" = "eu west" }
backends = ["http://127.0.0.1:7001", "https://Backup.example:8443/", "unix:/run/orders.sock"]
strategy = "least_outstanding"
set_headers = { "x-via" = "wharf", "Host" = "orders.internal" }
remove_headers = ["X-Internal-Token", "cookie"]
timeout = "2500ms"
retries = 3
preconnect = 2
max_concurrent_calls = 8
max_queued_calls = 0
queue_timeout = "250ms"

[services.rr]
type = "route"
path_prefix = "/"
backends = ["http://127.0.0.1:7003"]
strategy = "round_robin"
"#);
    assert_eq!(
        config.server.listen,
        "0.0.0.0:80".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.server.admin_listen,
        "[::1]:9000".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(config.server.max_connections, 50);
    assert_eq!(config.server.max_header_bytes, 16384);
    assert!(config.server.cpu_steering);
    assert!(config.server.splice_bodies);
    assert_eq!(config.server.busy_poll, Duration::from_micros(50));
    assert_eq!(config.server.keep_warm, Some(Duration::from_millis(250)));
    assert_eq!(
        config.server.resolve_hold,
        Duration::ZERO,
        "no hold is allowed"
    );

    let service = config.service("orders").expect("orders");
    assert_eq!(service.type_name(), "route");
    assert_eq!(
        service.limits,
        LimitsConfig {
            max_concurrent_calls: 8,
            max_queued_calls: 0,
            queue_timeout: Duration::from_millis(250),
        }
    );
    let r = route(&config, "orders");
    assert_eq!(r.path_prefix, "/orders");
    assert!(r.strip_prefix);
    assert_eq!(
        r.methods,
        [
            Method::GET,
            Method::POST,
            Method::from_bytes(b"PURGE").unwrap()
        ]
    );
    let h = |n: &'static str, v: &'static str| {
        (HeaderName::from_static(n), HeaderValue::from_static(v))
    };
    assert_eq!(
        r.match_headers,
        [h("x-tenant", "acme"), h("x-region", "eu west")]
    );
    let backends: Vec<_> = r.backends.iter().map(url::Url::as_str).collect();
    assert_eq!(
        backends,
        [
            "http://127.0.0.1:7001/",
            "https://backup.example:8443/",
            "unix:/run/orders.sock"
        ]
    );
    assert_eq!(r.backends[2].scheme(), "unix");
    assert_eq!(r.backends[2].path(), "/run/orders.sock");
    assert_eq!(r.strategy, Strategy::LeastOutstanding);
    assert_eq!(
        r.set_headers,
        [h("x-via", "wharf"), h("host", "orders.internal")]
    );
    assert_eq!(
        r.remove_headers,
        [
            HeaderName::from_static("x-internal-token"),
            HeaderName::from_static("cookie")
        ]
    );
    assert_eq!(r.timeout, Duration::from_millis(2500));
    assert_eq!(r.retries, 3);
    assert_eq!(r.preconnect, 2);
    assert_eq!(route(&config, "rr").strategy, Strategy::RoundRobin);
}

#[test]
fn proxy_fully_parsed() {
    let config = ok(r#"
[services.cache]
type = "proxy"
path = "/"
cache_max_bytes = "1GB"
max_object_bytes = 1048576
max_ttl = "2h"
allow_private_networks = true
allow_hosts = ["Example.COM", "api.example.com:8443", "[::1]:80", "api.example.com:8443"]
connect_timeout = "1s"
first_byte_timeout = "2s"
total_timeout = "10m"
shared_cache = "redis://127.0.0.1:6379/"
preconnect_origins = ["http://Example.com:8080/", "https://api.example.com:8443"]
preconnect = 16
"#);
    let p = proxy(&config, "cache");
    assert_eq!(
        p,
        ProxyConfig {
            path: "/".into(),
            cache_max_bytes: 1_000_000_000,
            max_object_bytes: 1 << 20,
            max_ttl: Duration::from_secs(7200),
            allow_private_networks: true,
            allow_hosts: vec![
                "example.com".into(),
                "api.example.com:8443".into(),
                "[::1]:80".into()
            ],
            connect_timeout: Duration::from_secs(1),
            first_byte_timeout: Duration::from_secs(2),
            total_timeout: Duration::from_secs(600),
            shared_cache: Some("redis://127.0.0.1:6379".into()),
            preconnect_origins: vec![
                url::Url::parse("http://example.com:8080").unwrap(),
                url::Url::parse("https://api.example.com:8443").unwrap(),
            ],
            preconnect: 16,
        }
    );
}

#[test]
fn unknown_key_at_top_level() {
    let p = problem("[server]\nlisten = \"127.0.0.1:1\"\n\nbogus = 1\n");
    assert!(
        p.starts_with("wharf.toml:4: server.bogus: unknown key `bogus`"),
        "{p}"
    );
    let p = problem("# comment\nbogus = 1\n[server]\n");
    assert!(
        p.starts_with("wharf.toml:2: bogus: unknown key `bogus`, expected one of `server`, `services`, `telemetry`"),
        "{p}"
    );
    let p = problem("[bogus]\n");
    assert!(
        p.starts_with("wharf.toml:1: bogus: unknown key `bogus`"),
        "{p}"
    );
}

#[test]
fn unknown_key_in_server() {
    let p = problem("[server]\nlisten = \"127.0.0.1:8080\"\nmax_conections = 5\n");
    assert!(
        p.starts_with(
            "wharf.toml:3: server.max_conections: unknown key `max_conections` (did you mean `max_connections`?), expected one of"
        ),
        "{p}"
    );
    assert!(p.contains("`max_connections`"), "lists the valid keys: {p}");
}

#[test]
fn unknown_key_in_service() {
    let p = problem(&format!("{MINIMAL_ROUTE}\nbakends = []\n"));
    assert!(
        p.starts_with("wharf.toml:7: services.orders.bakends: unknown key `bakends`"),
        "{p}"
    );
    // Dotted keys and inline tables are located too.
    let p = problem("services.a.type = \"proxy\"\nservices.a.pth = \"/a\"\n");
    assert!(
        p.starts_with("wharf.toml:2: services.a.pth: unknown key"),
        "{p}"
    );
    let p = problem("[services]\na = { type = \"proxy\", pth = \"/a\" }\n");
    assert!(
        p.starts_with("wharf.toml:2: services.a.pth: unknown key"),
        "{p}"
    );
}

#[test]
fn wrong_toml_type() {
    let p = problem("[server]\nmax_connections = \"lots\"\n");
    assert_eq!(
        p,
        r#"wharf.toml:2: server.max_connections: expected an integer, found string "lots""#
    );
    let p = problem("[server]\nmax_connections = -1\n");
    assert_eq!(
        p,
        "wharf.toml:2: server.max_connections: expected a non-negative integer, found integer `-1`"
    );
    let p = problem("[server]\nidle_timeout = 60\n");
    assert!(
        p.starts_with("wharf.toml:2: server.idle_timeout: expected a duration string"),
        "{p}"
    );
    let p = problem("[server]\nbusy_poll_us = 10001\n");
    assert_eq!(
        p,
        "wharf.toml:2: server.busy_poll_us: 10001 is out of range, use 0 to 10000"
    );
    for (value, shown) in [("\"5ms\"", "\"5ms\""), ("\"2m\"", "\"2m\"")] {
        let p = problem(&format!("[server]\nkeep_warm = {value}\n"));
        assert_eq!(
            p,
            format!("wharf.toml:2: server.keep_warm: {shown} is out of range, use \"0s\" (off) or 10ms to 60s")
        );
    }
    let p = problem("[server]\nresolve_hold = \"2h\"\n");
    assert_eq!(
        p,
        "wharf.toml:2: server.resolve_hold: \"2h\" is too long, the maximum is 1h"
    );
    let p = problem("[server]\nresolve_hold = \"soon\"\n");
    assert!(
        p.starts_with("wharf.toml:2: server.resolve_hold: \"soon\" is not a duration"),
        "{p}"
    );
    let p = problem("[server]\nkeep_warm = \"often\"\n");
    assert!(
        p.starts_with("wharf.toml:2: server.keep_warm: \"often\" is not a duration"),
        "{p}"
    );
    let p = problem("[server]\nbusy_poll_us = \"50us\"\n");
    assert!(
        p.starts_with("wharf.toml:2: server.busy_poll_us: expected an integer"),
        "{p}"
    );
    let p = problem("[server]\nsplice_bodies = \"yes\"\n");
    assert!(
        p.starts_with("wharf.toml:2: server.splice_bodies: expected a boolean"),
        "{p}"
    );
    let p = problem("[server]\ncpu_steering = 1\n");
    assert!(
        p.starts_with("wharf.toml:2: server.cpu_steering: expected a boolean"),
        "{p}"
    );
    let p = problem(&format!("{MINIMAL_ROUTE}strip_prefix = \"yes\"\n"));
    assert!(
        p.starts_with("wharf.toml:6: services.orders.strip_prefix: expected a boolean"),
        "{p}"
    );
    let p = problem("[services.a]\ntype = \"proxy\"\nallow_hosts = [\n  \"a\",\n  5,\n]\n");
    assert!(
        p.starts_with("wharf.toml:5: services.a.allow_hosts: expected a string"),
        "{p}"
    );
    let p = problem("[[services]]\nname = \"a\"\n");
    assert_eq!(
        p,
        "wharf.toml:1: services: expected a table, found an array"
    );
    let p = problem("server = 5\n");
    assert!(
        p.starts_with("wharf.toml:1: server: expected a table"),
        "{p}"
    );
}

#[test]
fn toml_syntax_error() {
    let p = problem("[server]\nlisten = \"127.0.0.1:8080\n");
    assert!(p.starts_with("wharf.toml:2:25: server.listen: "), "{p}");
    let p = problem("[server]\n[server]\n");
    assert!(
        p.starts_with("wharf.toml:2:1: ") && p.contains("duplicate key"),
        "{p}"
    );
}

/// A syntax error gives line, column and the key whose value it is in; a bare word where a
/// string belongs also gives the fix.
#[test]
fn toml_syntax_error_located() {
    for (text, expected) in [
        (
            "[server]\nlisten = 127.0.0.1:1\n",
            "wharf.toml:2:15: server.listen: expected newline, `#`; \
             strings need quotes: listen = \"127.0.0.1:1\"",
        ),
        (
            "[services.p]\ntype = proxy # the cache\n",
            "wharf.toml:2:8: services.p.type: invalid string; expected `\"`, `'`; \
             strings need quotes: type = \"proxy\"",
        ),
        (
            "[services.p]\nmax_ttl = 1d\r\n",
            "wharf.toml:2:12: services.p.max_ttl: expected newline, `#`; \
             strings need quotes: max_ttl = \"1d\"",
        ),
        // A number or a flag mistyped: quoting it would not help, no hint.
        (
            "[server]\nmax_connections = 10k\n",
            "wharf.toml:2:21: server.max_connections: expected newline, `#`",
        ),
        (
            "[server]\ncpu_steering = yes\n",
            "wharf.toml:2:16: server.cpu_steering: invalid string; expected `\"`, `'`",
        ),
        // Not a bare word: no hint.
        (
            "[server]\ncpu_steering = True\n",
            "wharf.toml:2:16: server.cpu_steering: invalid string; expected `\"`, `'`",
        ),
        ("x = \"a\" b\n", "wharf.toml:1:9: x: expected newline, `#`"),
        (
            "hosts = [\n  \"a\",\n  b,\n]\n",
            "wharf.toml:3:3: hosts: invalid array; expected `]`",
        ),
        // Not in a value: no key.
        ("this is { not toml\n", "wharf.toml:1:6: expected `.`, `=`"),
        ("{\"server\": {}}\n", "wharf.toml:1:1: invalid key"),
        (
            "[server\nlisten = \"x\"\n",
            "wharf.toml:1:8: invalid table header; expected `.`, `]`",
        ),
        // Columns count characters, not bytes.
        (
            "[server]\nlisten = \"é\" x\n",
            "wharf.toml:2:14: server.listen: expected newline, `#`",
        ),
    ] {
        assert_eq!(problem(text), expected, "{text:?}");
    }
}

/// An integer beyond TOML's 64 bits is a bad value of its key, not bad syntax.
#[test]
fn integer_too_large_names_its_key() {
    let p = problem("[server]\nmax_connections = 99999999999999999999\n");
    assert_eq!(
        p,
        "wharf.toml:2: server.max_connections: 99999999999999999999 is too large \
         for a TOML integer (at most 9223372036854775807)"
    );
    let p = problem(
        "[services.p]\ntype = \"proxy\"\nmax_queued_calls = -1_000_000_000_000_000_000_000\n",
    );
    assert_eq!(
        p,
        "wharf.toml:3: services.p.max_queued_calls: -1_000_000_000_000_000_000_000 is too small \
         for a TOML integer (at least -9223372036854775808)"
    );
}

/// A table-typed key given an array (`[[server]]`, `server = [...]`) is refused with the
/// key, never read by position (`telemetry = ["json", ...]` used to pass).
#[test]
fn array_where_a_table_belongs() {
    for (text, expected) in [
        (
            "[[server]]\nlisten = \"127.0.0.1:1\"\n",
            "wharf.toml:1: server: expected a table ([server]), found an array",
        ),
        (
            "server = [\"127.0.0.1:21070\", \"127.0.0.1:21071\", 5]\n",
            "wharf.toml:1: server: expected a table ([server]), found an array",
        ),
        (
            "telemetry = [\"json\", \"debug\", \"http://127.0.0.1:4318\", \"svc\", 0.5]\n",
            "wharf.toml:1: telemetry: expected a table ([telemetry]), found an array",
        ),
        (
            "[[telemetry]]\nlog_format = \"json\"\n",
            "wharf.toml:1: telemetry: expected a table ([telemetry]), found an array",
        ),
        (
            "services.p = [1]\n",
            "wharf.toml:1: services.p: expected a table ([services.p]), found an array",
        ),
        (
            "[[services.p]]\ntype = \"proxy\"\npath = \"/p\"\n",
            "wharf.toml:1: services.p: expected a table ([services.p]), found an array",
        ),
        (
            "[services.q]\ntype = \"queue\"\n[[services.q.deliver]]\nbackend = \"x\"\n",
            "wharf.toml:3: services.q.deliver: expected a table ([services.q.deliver]), \
             found an array",
        ),
        (
            "[services.q]\ntype = \"queue\"\ndeliver = [\"http://127.0.0.1:1\", 3]\n",
            "wharf.toml:3: services.q.deliver: expected a table ([services.q.deliver]), \
             found an array",
        ),
    ] {
        assert_eq!(problem(text), expected, "{text:?}");
    }
    // Tables read through the same path keep refusing unknown keys, at the key.
    let p = problem("[services.q]\ntype = \"queue\"\n[services.q.deliver]\nbakend = \"x\"\n");
    assert!(
        p.starts_with("wharf.toml:4: services.q.deliver.bakend: unknown key `bakend`"),
        "{p}"
    );
    let p = problem("[telemetry]\nlog_fromat = \"json\"\n");
    assert!(
        p.starts_with("wharf.toml:2: telemetry.log_fromat: unknown key"),
        "{p}"
    );
}

/// `listen` and `admin_listen` on the same port collide when one is a wildcard covering
/// the other, as the second bind would fail.
#[test]
fn listeners_on_the_same_port() {
    let server = |listen: &str, admin: &str| {
        format!("[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\n")
    };
    for (listen, admin, every) in [
        (
            "0.0.0.0:21060",
            "127.0.0.1:21060",
            "0.0.0.0:21060 listens on every IPv4 address",
        ),
        (
            "127.0.0.1:21060",
            "0.0.0.0:21060",
            "0.0.0.0:21060 listens on every IPv4 address",
        ),
        (
            "[::]:21060",
            "[::1]:21060",
            "[::]:21060 listens on every address, IPv4 included",
        ),
        (
            "[::]:21060",
            "127.0.0.1:21060",
            "[::]:21060 listens on every address, IPv4 included",
        ),
        (
            "0.0.0.0:21060",
            "[::]:21060",
            "[::]:21060 listens on every address, IPv4 included",
        ),
    ] {
        assert_eq!(
            problem(&server(listen, admin)),
            format!(
                "wharf.toml:3: server.admin_listen: {admin} collides with `listen` {listen} \
                 ({every}), give the admin listener its own port"
            )
        );
    }
    assert_eq!(
        problem(&server("127.0.0.1:21060", "127.0.0.1:21060")),
        "wharf.toml:3: server.admin_listen: 127.0.0.1:21060 is also `listen`, \
         give the admin listener its own address"
    );
    // An IPv4-mapped IPv6 address is the IPv4 one.
    assert_eq!(
        problem(&server("127.0.0.1:21060", "[::ffff:127.0.0.1]:21060")),
        "wharf.toml:3: server.admin_listen: [::ffff:127.0.0.1]:21060 is the same address as \
         `listen` 127.0.0.1:21060, give the admin listener its own address"
    );
    assert!(
        problem(&server("0.0.0.0:21060", "[::ffff:127.0.0.2]:21060"))
            .contains("0.0.0.0:21060 listens on every IPv4 address")
    );
    for (listen, admin) in [
        ("0.0.0.0:0", "127.0.0.1:0"),
        ("0.0.0.0:21060", "127.0.0.1:21061"),
        ("0.0.0.0:21060", "[::1]:21060"),
        ("127.0.0.1:21060", "127.0.0.2:21060"),
        ("127.0.0.1:21060", "[::1]:21060"),
    ] {
        let config = ok(&server(listen, admin));
        assert!(!config.server.listeners_collide(), "{listen} {admin}");
    }
}

#[test]
fn bad_duration_names_file_line_key() {
    let text = "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nmax_ttl = \"1dy\"\n";
    let p = problem(text);
    assert_eq!(
        p,
        r#"wharf.toml:4: services.proxy.max_ttl: "1dy" is not a duration (e.g. "1d"): unknown unit "dy", use ms, s, m, h or d"#
    );
}

#[test]
fn bad_units_and_ranges() {
    let cases: &[(&str, &str)] = &[
        ("[server]\nheader_read_timeout = \"0s\"", r#"server.header_read_timeout: "0s" is too short, it must be greater than 0"#),
        ("[server]\nidle_timeout = \"400d\"", r#"server.idle_timeout: "400d" is too long, the maximum is 365d"#),
        ("[server]\nmax_header_bytes = \"4KiB\"", "server.max_header_bytes: 4096 bytes is out of range, use 8KiB to 16MiB"),
        ("[server]\nmax_header_bytes = \"64\"", r#"server.max_header_bytes: "64" is not a size (e.g. "64KiB"): missing unit"#),
        ("[server]\nmax_header_bytes = -5", "server.max_header_bytes: -5 is negative"),
        ("[server]\nmax_connections = 0", "server.max_connections: 0 is out of range, use 1 to 1000000"),
        ("[server]\nlisten = \"localhost:80\"", r#"server.listen: "localhost:80" is not a socket address"#),
        ("[server]\nlisten = \"127.0.0.1:9901\"", "server.admin_listen: 127.0.0.1:9901 is also `listen`"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nmax_concurrent_calls = 0", "services.p.max_concurrent_calls: 0 is out of range, use 1 to 1000000"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nmax_ttl = \"500ms\"", r#"services.p.max_ttl: "500ms" is too short, the minimum is 1s"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nmax_object_bytes = \"2GiB\"", "services.p.max_object_bytes: 2147483648 bytes is more than cache_max_bytes (268435456 bytes)"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\ncache_max_bytes = 0", "services.p.max_object_bytes: 67108864 bytes is more than cache_max_bytes (0 bytes)"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nconnect_timeout = \"0ms\"", r#"services.p.connect_timeout: "0ms" is too short"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nallow_hosts = [\"*.example.com\"]", "services.p.allow_hosts: \"*.example.com\": wildcards are not supported"),
        ("[services.p]\ntype = \"proxy\"\npath = \"p\"", r#"services.p.path: "p" must start with "/" (e.g. "/p")"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p/\"", r#"services.p.path: "/p/" must not end with "/" (use "/p")"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p?x=1\"", r#"services.p.path: "/p?x=1" must not contain a query"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/a//b\"", r#"services.p.path: "/a//b" must not contain empty"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/a b\"", r#"services.p.path: "/a b" is not a valid URL path"#),
        ("[services.p]\ntype = \"proxy\"", "services.p: missing required key `path`"),
        ("[services.p]\npath = \"/p\"", r#"services.p: missing `type`, add type = "proxy", type = "route" or type = "queue""#),
        ("[services.p]\ntype = \"cache\"", r#"services.p.type: unknown service type "cache", use "proxy", "route" or "queue""#),
        ("[services.\"a b\"]\ntype = \"proxy\"\npath = \"/p\"", r#"services.a b: "a b" is not a valid service name"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"", "services.r: missing required key `backends`"),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = []", "services.r.backends: no backends"),
        ("[services.r]\ntype = \"route\"\nbackends = [\"http://a\"]", "services.r: missing required key `path_prefix`"),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a/api\"]", r#"services.r.backends: "http://a/api" must not have a path"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\", \"http://a/\"]", r#"services.r.backends: "http://a/" is listed twice"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"unix:run.sock\"]", r#"services.r.backends: "unix:run.sock" is not a unix socket"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nstrategy = \"random\"", r#"services.r.strategy: unknown strategy "random", use "failover", "round_robin" or "least_outstanding""#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nretries = 11", "services.r.retries: 11 is out of range, use 0 to 10"),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\npreconnect = 1025", "services.r.preconnect: 1025 is out of range, use 0 to 1024"),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\npreconnect_origins = [\"http://a\"]", "services.r: `preconnect_origins` is not a key of a route service (it is a proxy key)"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\npreconnect = 2", "services.p.preconnect: counts connections to the origins in `preconnect_origins`, which lists none (add the origins there, or remove this key)"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\npreconnect_origins = [\"http://a\"]\npreconnect = 0", "services.p.preconnect: 0 is out of range, use 1 to 1024"),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\nallow_hosts = [\"a:81\"]\npreconnect_origins = [\"http://a\"]", r#"services.p.preconnect_origins: "http://a" is not in allow_hosts, so no call could use its connections (add "a:80" there)"#),
        ("[services.p]\ntype = \"proxy\"\npath = \"/p\"\npreconnect_origins = [\"http://a\", \"http://a:80/\"]", r#"services.p.preconnect_origins: "http://a:80/" is listed twice"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nmethods = [\"GET\", \"get\"]", "services.r.methods: GET is listed twice"),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nmethods = [\"G ET\"]", r#"services.r.methods: "G ET" is not an HTTP method"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nset_headers = { \"content-length\" = \"5\" }", r#"services.r.set_headers.content-length: "content-length" is a hop-by-hop or framing header"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nset_headers = { \"x-a\" = \"1\" }\nremove_headers = [\"X-A\"]", r#"services.r.remove_headers: "x-a" is also in set_headers"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nmatch_headers = { \"X-A\" = \"1\", \"x-a\" = \"2\" }", r#"services.r.match_headers.x-a: "x-a" is listed twice"#),
        ("[services.r]\ntype = \"route\"\npath_prefix = \"/r\"\nbackends = [\"http://a\"]\nmatch_headers = { \"x-a\" = \"a\\nb\" }", r#"services.r.match_headers.x-a: "a\nb" is not a valid header value"#),
    ];
    for (text, want) in cases {
        let p = problem(text);
        let line_and_rest = p
            .strip_prefix("wharf.toml:")
            .unwrap_or_else(|| panic!("{p}"));
        let rest = line_and_rest
            .split_once(": ")
            .map(|(_, r)| r)
            .unwrap_or_default();
        assert!(
            rest.starts_with(want),
            "for {text:?}\n got: {p}\nwant: {want}"
        );
    }
}

#[test]
fn invalid_header_names_refused() {
    let text = r#"
[services.r]
type = "route"
path_prefix = "/r"
backends = ["http://a"]
match_headers = { "x tenant" = "acme" }
set_headers = { "x:via" = "wharf" }
remove_headers = ["bad header", ""]
"#;
    let all = problems(text);
    assert_eq!(all.len(), 4, "{all:#?}");
    assert!(all[0].starts_with(r#"wharf.toml:6: services.r.match_headers.x tenant: "x tenant" is not a valid header name"#), "{}", all[0]);
    assert!(
        all[1].starts_with(
            r#"wharf.toml:7: services.r.set_headers.x:via: "x:via" is not a valid header name"#
        ),
        "{}",
        all[1]
    );
    assert!(
        all[2].starts_with(
            r#"wharf.toml:8: services.r.remove_headers: "bad header" is not a valid header name"#
        ),
        "{}",
        all[2]
    );
    assert!(
        all[3].starts_with(
            r#"wharf.toml:8: services.r.remove_headers: "" is not a valid header name"#
        ),
        "{}",
        all[3]
    );
}

#[test]
fn proxy_refuses_route_keys_and_route_refuses_proxy_keys() {
    let text = r#"
[services.cache]
type = "proxy"
path = "/cache"
backends = ["http://a"]
match_headers = { "x-a" = "1" }

[services.orders]
type = "route"
path_prefix = "/orders"
backends = ["http://a"]
max_ttl = "1h"
"#;
    assert_eq!(
        problems(text),
        [
            "wharf.toml:5: services.cache: `backends` is not a key of a proxy service (it is a route key)",
            "wharf.toml:6: services.cache: `match_headers` is not a key of a proxy service (it is a route key)",
            "wharf.toml:12: services.orders: `max_ttl` is not a key of a route service (it is a proxy key)",
        ]
    );
}

#[test]
fn duplicate_paths_refused() {
    let text = r#"
[services.a]
type = "proxy"
path = "/x"

[services.b]
type = "proxy"
path = "/x"

[services.c]
type = "route"
path_prefix = "/x"
backends = ["http://a"]

[services.d]
type = "route"
path_prefix = "/d"
backends = ["http://a"]

[services.e]
type = "route"
path_prefix = "/d"
backends = ["http://a"]
"#;
    assert_eq!(
        problems(text),
        [
            r#"wharf.toml:8: services.b.path: "/x" is already used by services.a (line 4), each service needs its own path (only routes may share one)"#,
            r#"wharf.toml:12: services.c.path_prefix: "/x" is already used by services.a (line 4), each service needs its own path (only routes may share one)"#,
            r#"wharf.toml:22: services.e.path_prefix: "/d" is also the prefix of services.d (line 17), asked before this route, which takes every request it would take: write this route first, give it a `match_headers` entry they lack, or give it another prefix"#,
        ]
    );
}

#[test]
fn routes_may_share_a_prefix_when_each_can_be_reached() {
    let route = |name: &str, conditions: &str| {
        format!(
            "[services.{name}]\ntype = \"route\"\npath_prefix = \"/orders\"\nbackends = [\"http://a\"]\n{conditions}\n"
        )
    };
    // A catch-all written first is asked last: the tenants' routes are asked before it.
    let text = [
        route("any", ""),
        route("acme", r#"match_headers = { "x-tenant" = "acme" }"#),
        route(
            "acme_reads",
            r#"match_headers = { "x-tenant" = "acme" }
methods = ["GET"]"#,
        ),
        route("beta", r#"match_headers = { "X-Tenant" = "beta" }"#),
        route("writes", r#"methods = ["POST", "PUT"]"#),
        route(
            "puts",
            r#"methods = ["PUT"]
match_headers = { "x-tenant" = "beta" }"#,
        ),
    ]
    .concat();
    let config = ok(&text);
    assert_eq!(config.services.len(), 6);

    // Each of these is hidden by a route asked before it (same rank, written first, or a
    // higher rank) that holds for every request it holds for.
    for (hidden, by) in [
        (route("again", ""), "any"),
        (
            route("acme_too", r#"match_headers = { "x-tenant" = "acme" }"#),
            "acme",
        ),
        (
            route(
                "reads",
                r#"match_headers = { "x-tenant" = "acme" }
methods = ["GET"]"#,
            ),
            "acme_reads",
        ),
        (route("posts", r#"methods = ["POST"]"#), "writes"),
        // GET allows HEAD.
        (
            route(
                "heads",
                r#"match_headers = { "x-tenant" = "acme" }
methods = ["HEAD"]"#,
            ),
            "acme_reads",
        ),
    ] {
        let text = [text.clone(), hidden].concat();
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(&format!("is also the prefix of services.{by} (line")),
            "{found:?}"
        );
    }
}

#[test]
fn a_route_hidden_by_several_routes_together_is_refused() {
    let route = |name: &str, methods: &str| {
        format!(
            "[services.{name}]\ntype = \"route\"\npath_prefix = \"/o\"\nbackends = [\"http://a\"]\nmethods = {methods}\n\n"
        )
    };
    let text = [
        route("gets", r#"["GET"]"#),
        route("posts", r#"["POST"]"#),
        route("both", r#"["GET", "POST"]"#),
    ]
    .concat();
    assert_eq!(
        problem(&text),
        r#"wharf.toml:15: services.both.path_prefix: "/o" is also the prefix of services.gets (line 3) and services.posts (line 9), asked before this route, which together take every request it would take: write this route first, give it a `match_headers` entry they lack, or give it another prefix"#
    );
    // Written first, it takes GET and POST; the others are left nothing, and said so.
    let text = [
        route("both", r#"["GET", "POST"]"#),
        route("gets", r#"["GET"]"#),
        route("puts", r#"["PUT"]"#),
    ]
    .concat();
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("wharf.toml:9: services.gets.path_prefix"),
        "{found:?}"
    );
}

#[test]
fn listeners_on_port_zero_may_share_an_address() {
    let config = ok("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n");
    assert_eq!(config.server.listen.port(), 0);
}

#[test]
fn all_problems_collected_in_line_order() {
    let text = r#"
[services.orders]
type = "route"
path_prefix = "orders"
backends = ["ftp://x", "http://ok"]
timeout = "soon"

[server]
max_connections = 0
idle_timeout = "5"
"#;
    let all = problems(text);
    let lines: Vec<_> = all
        .iter()
        .map(|p| p.split(':').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(lines, ["4", "5", "6", "9", "10"], "{all:#?}");
    assert!(all[1].contains(r#"unsupported scheme "ftp""#), "{}", all[1]);
    assert!(
        all[2].contains(r#""soon" is not a duration (e.g. "10s"): no number"#),
        "{}",
        all[2]
    );
    let err = Config::from_toml_str(text, "wharf.toml").expect_err("invalid");
    assert_eq!(err.problems().len(), 5);
    assert_eq!(err.problems()[3].key, "server.max_connections");
    assert_eq!(err.problems()[3].line, Some(9));
}

#[test]
fn load_reads_files_and_names_them() {
    let dir = std::env::temp_dir().join(format!("wharf-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, MINIMAL_ROUTE).unwrap();
    let config = Config::load(&good).unwrap();
    assert_eq!(config.origin, good.display().to_string());
    assert_eq!(config.services.len(), 1);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\nidle_timeout = \"1dy\"\n").unwrap();
    let err = Config::load(&bad).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{}:2: server.idle_timeout: ", bad.display())),
        "{err}"
    );

    let missing = dir.join("missing.toml");
    let err = Config::load(&missing).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{}: cannot read: ", missing.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_needs_both_files_and_they_must_exist() {
    let dir = std::env::temp_dir().join(format!("wharf-config-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = dir.join("cert.pem");
    std::fs::write(&cert, "not checked here").unwrap();
    let only_cert = format!("[server]\ntls_cert = {:?}\n", cert.display().to_string());
    let error = Config::from_toml_str(&only_cert, "w.toml")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("w.toml:2: server.tls_cert: TLS needs both"),
        "{error}"
    );
    let missing_key = format!(
        "[server]\ntls_cert = {:?}\ntls_key = \"/nonexistent/key.pem\"\n",
        cert.display().to_string()
    );
    let error = Config::from_toml_str(&missing_key, "w.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("w.toml:3: server.tls_key"), "{error}");
    let both = format!(
        "[server]\ntls_cert = {:?}\ntls_key = {:?}\n",
        cert.display().to_string(),
        cert.display().to_string()
    );
    let config = Config::from_toml_str(&both, "w.toml").unwrap();
    assert_eq!(config.server.tls.unwrap().cert, cert);
}

#[test]
fn listen_unix_must_be_absolute() {
    let error = Config::from_toml_str("[server]\nlisten_unix = \"wharf.sock\"\n", "w.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("w.toml:2: server.listen_unix"), "{error}");
    let config =
        Config::from_toml_str("[server]\nlisten_unix = \"/tmp/w.sock\"\n", "w.toml").unwrap();
    assert_eq!(
        config.server.listen_unix.unwrap(),
        std::path::PathBuf::from("/tmp/w.sock")
    );
}

fn queue(config: &Config, name: &str) -> QueueConfig {
    match &config.service(name).expect("service exists").kind {
        ServiceKind::Queue(q) => q.clone(),
        other => panic!("{name} is not a queue: {other:?}"),
    }
}

#[test]
fn queue_fully_parsed_and_defaulted() {
    let config = ok(r#"
[services.jobs]
type = "queue"
path = "/jobs"
nats_url = "nats://127.0.0.1:4222"
stream = "WHARF_JOBS"
subject = "wharf.jobs"
forward_headers = ["X-Tenant", "content-type"]
publish_timeout = "2s"

[services.jobs.deliver]
backend = "http://127.0.0.1:7001/handle"
max_deliver = 3
backoff = "250ms"
dead_letter_subject = "wharf.dead"
concurrency = 4
ack_wait = "10s"

[services.lean]
type = "queue"
path = "/lean"
stream = "LEAN"
subject = "lean.jobs"
deliver = { backend = "https://backend.example/in" }
"#);
    assert_eq!(
        config.service("jobs").map(ServiceConfig::type_name),
        Some("queue")
    );
    let q = queue(&config, "jobs");
    assert_eq!(
        q,
        QueueConfig {
            path: "/jobs".into(),
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_credentials: None,
            nats_ca_file: None,
            stream: "WHARF_JOBS".into(),
            subject: "wharf.jobs".into(),
            forward_headers: vec![
                HeaderName::from_static("content-type"),
                HeaderName::from_static("x-tenant")
            ],
            publish_timeout: Duration::from_secs(2),
            deliver: DeliverConfig {
                backend: "http://127.0.0.1:7001/handle".parse().unwrap(),
                max_deliver: 3,
                backoff: Duration::from_millis(250),
                dead_letter_subject: "wharf.dead".into(),
                concurrency: 4,
                ack_wait: Duration::from_secs(10),
            },
        }
    );
    let lean = queue(&config, "lean");
    assert_eq!(lean.nats_url, "nats://127.0.0.1:4222");
    assert_eq!(lean.forward_headers.len(), 5);
    assert_eq!(lean.publish_timeout, Duration::from_secs(5));
    let d = lean.deliver;
    assert_eq!((d.max_deliver, d.concurrency), (5, 16));
    assert_eq!(d.backoff, Duration::from_millis(500));
    assert_eq!(d.ack_wait, Duration::from_secs(30));
    assert_eq!(d.dead_letter_subject, "lean.jobs.dead");
    let limits = &config.service("lean").expect("lean").limits;
    assert_eq!(
        (limits.max_concurrent_calls, limits.max_queued_calls),
        (1024, 1024)
    );
}

/// `tls://` requires TLS to the broker; `nats_ca_file` names the roots that verify its
/// certificate, is read as PEM at load, and only goes with `tls://`.
#[test]
fn nats_over_tls_and_its_ca_file() {
    let dir = std::env::temp_dir().join(format!("wharf-config-nats-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["nats.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let ca = write("ca.pem", &cert.pem());
    // A CA with a critical extension the client's webpki (0.102) does not know, as some
    // enterprise CAs have (policyConstraints, requireExplicitPolicy 0): rustls 0.23's own
    // webpki would take it, the NATS client fails every connect on it.
    let mut strict = rcgen::CertificateParams::new(vec!["ca.example".to_owned()]).unwrap();
    strict.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let mut policy = rcgen::CustomExtension::from_oid_content(
        &[2, 5, 29, 36],
        vec![0x30, 0x03, 0x80, 0x01, 0x00],
    );
    policy.set_criticality(true);
    strict.custom_extensions.push(policy);
    let strict_ca = write("strict.pem", &strict.self_signed(&key).unwrap().pem());
    // PEM, but no X.509 inside: the NATS client would fail every connect on it.
    let not_x509 = write(
        "bad.pem",
        "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcI\n-----END CERTIFICATE-----\n",
    );
    let no_cert = write(
        "key.pem",
        "-----BEGIN PRIVATE KEY-----\nAAECAwQFBgcI\n-----END PRIVATE KEY-----\n",
    );
    let not_pem = write("junk.pem", "-----BEGIN CERTIFICATE-----\n%%%\n");
    let toml = |url: &str, ca_file: Option<&str>| {
        let ca_line = ca_file.map_or(String::new(), |path| format!("nats_ca_file = {path:?}\n"));
        format!(
            "[services.jobs]\ntype = \"queue\"\npath = \"/jobs\"\nnats_url = {url:?}\n{ca_line}\
             stream = \"J\"\nsubject = \"j\"\ndeliver = {{ backend = \"http://127.0.0.1:1/\" }}\n"
        )
    };
    let load = |text: String| Config::from_toml_str(&text, "w.toml");

    let config = load(toml("TLS://u:pw@nats.example:4222", Some(&ca))).unwrap();
    let q = queue(&config, "jobs");
    assert_eq!(q.nats_url, "tls://nats.example:4222");
    assert_eq!(q.nats_ca_file, Some(std::path::PathBuf::from(&ca)));
    assert!(q.nats_credentials.is_some());
    let q = queue(&load(toml("tls://nats.example", None)).unwrap(), "jobs");
    assert_eq!(
        (q.nats_url.as_str(), q.nats_ca_file),
        ("tls://nats.example", None)
    );

    let error = |url: &str, ca_file: &str| load(toml(url, Some(ca_file))).unwrap_err().to_string();
    let plain = error("nats://nats.example:4222", &ca);
    assert!(
        plain.contains("w.toml:5: services.jobs.nats_ca_file: ")
            && plain.contains("need a tls:// nats_url"),
        "{plain}"
    );
    let missing = error("tls://h", "/nonexistent/ca.pem");
    assert!(
        missing.contains("services.jobs.nats_ca_file: \"/nonexistent/ca.pem\" cannot be read"),
        "{missing}"
    );
    let keyonly = error("tls://h", &no_cert);
    assert!(keyonly.contains("holds no certificate"), "{keyonly}");
    let junk = error("tls://h", &not_pem);
    assert!(junk.contains("is not valid PEM"), "{junk}");
    let unsupported = error("tls://h", &strict_ca);
    assert!(
        unsupported
            .contains("certificate 1 cannot be a trust anchor: UnsupportedCriticalExtension"),
        "{unsupported}"
    );
    let bad = error("tls://h", &not_x509);
    assert!(
        bad.contains("certificate 1 cannot be a trust anchor"),
        "{bad}"
    );
    // A bad URL is one problem, not two: whether it wanted TLS is unknown.
    let bad_url = error("tcp://h", &ca);
    assert!(bad_url.contains("use nats://, or tls://"), "{bad_url}");
    assert!(!bad_url.contains("nats_ca_file"), "{bad_url}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `forward_headers` stores a client's headers with the message: the broker's own and
/// wharf's own names are refused, whatever their case.
#[test]
fn queue_forward_headers_refuse_the_brokers_and_wharfs_own_names() {
    let text = r#"
[services.jobs]
type = "queue"
path = "/jobs"
stream = "WHARF_JOBS"
subject = "wharf.jobs"
forward_headers = ["x-tenant", "Nats-Msg-Id", "nats-rollup", "X-Wharf-Attempts-Made"]

[services.jobs.deliver]
backend = "http://127.0.0.1:7001/handle"
"#;
    assert_eq!(
        problems(text),
        [
            r#"wharf.toml:7: services.jobs.forward_headers: "nats-msg-id" is a NATS header, which the broker acts on: a client must not set it"#,
            r#"wharf.toml:7: services.jobs.forward_headers: "nats-rollup" is a NATS header, which the broker acts on: a client must not set it"#,
            r#"wharf.toml:7: services.jobs.forward_headers: "x-wharf-attempts-made" is one of wharf's queue headers, which wharf sets itself (a client's x-wharf-message-id is read without being forwarded)"#,
        ]
    );
}

#[test]
fn queue_problems_name_file_line_key() {
    let text = r#"
[services.jobs]
type = "queue"
path = "/jobs"
nats_url = "http://127.0.0.1:4222"
stream = "WHARF.JOBS"
subject = "wharf.*"
forward_headers = ["transfer-encoding"]
max_ttl = "1h"

[services.jobs.deliver]
backend = "ftp://x"
max_deliver = 0
ack_wait = "10ms"
bogus_free = 1
"#;
    // An unknown key stops the reading: reported alone.
    let p = problem(text);
    assert!(
        p.starts_with("wharf.toml:15: services.jobs.deliver.bogus_free: unknown key"),
        "{p}"
    );
    let text = text.replace("bogus_free = 1\n", "");
    assert_eq!(
        problems(&text),
        [
            r#"wharf.toml:5: services.jobs.nats_url: "http://127.0.0.1:4222": unsupported scheme "http", use nats://, or tls:// to require TLS (e.g. "nats://127.0.0.1:4222")"#,
            r#"wharf.toml:6: services.jobs.stream: "WHARF.JOBS" is not a valid stream name, use letters, digits, `-` and `_` (e.g. "WHARF_JOBS")"#,
            r#"wharf.toml:7: services.jobs.subject: "wharf.*" is not a valid subject, use dot-separated tokens without spaces or wildcards (e.g. "wharf.jobs")"#,
            r#"wharf.toml:8: services.jobs.forward_headers: "transfer-encoding" is a hop-by-hop or framing header, which wharf manages itself"#,
            "wharf.toml:9: services.jobs: `max_ttl` is not a key of a queue service (it is a proxy key)",
            r#"wharf.toml:12: services.jobs.deliver.backend: "ftp://x": unsupported scheme "ftp", use http or https (e.g. "http://127.0.0.1:7001/handle")"#,
            "wharf.toml:13: services.jobs.deliver.max_deliver: 0 is out of range, use 1 to 1000",
            r#"wharf.toml:14: services.jobs.deliver.ack_wait: "10ms" is too short, the minimum is 1s"#,
        ]
    );
    let missing = problems("[services.q]\ntype = \"queue\"\n");
    assert_eq!(missing.len(), 4, "{missing:#?}");
    assert!(
        missing.iter().all(
            |p| p.starts_with("wharf.toml:1: services.q") && p.contains("missing required key")
        ),
        "{missing:#?}"
    );
    let same = problem("[services.q]\ntype = \"queue\"\npath = \"/q\"\nstream = \"Q\"\nsubject = \"q\"\ndeliver = { backend = \"http://a/\", dead_letter_subject = \"q\" }\n");
    assert!(
        same.contains("deliver.dead_letter_subject: \"q\" is the queue's own subject"),
        "{same}"
    );
}

#[test]
fn queue_keys_are_foreign_to_proxies_and_routes_and_paths_stay_unique() {
    let text = r#"
[services.cache]
type = "proxy"
path = "/cache"
stream = "S"

[services.orders]
type = "route"
path_prefix = "/orders"
backends = ["http://a"]
shared_cache = "redis://127.0.0.1:6379"
deliver = { backend = "http://a/" }

[services.jobs]
type = "queue"
path = "/cache"
stream = "S"
subject = "s"
deliver = { backend = "http://a/" }
"#;
    assert_eq!(
        problems(text),
        [
            "wharf.toml:5: services.cache: `stream` is not a key of a proxy service (it is a queue key)",
            "wharf.toml:11: services.orders: `shared_cache` is not a key of a route service (it is a proxy key)",
            "wharf.toml:12: services.orders: `deliver` is not a key of a route service (it is a queue key)",
            r#"wharf.toml:16: services.jobs.path: "/cache" is already used by services.cache (line 4), each service needs its own path (only routes may share one)"#,
        ]
    );
}

#[test]
fn shared_cache_must_be_a_redis_url() {
    let p = problem(
        "[services.p]\ntype = \"proxy\"\npath = \"/p\"\nshared_cache = \"rediss://r:6379\"\n",
    );
    assert_eq!(
        p,
        r#"wharf.toml:4: services.p.shared_cache: "rediss://r:6379": TLS to Redis is not supported, use redis:// (e.g. "redis://127.0.0.1:6379")"#
    );
    assert_eq!(
        proxy(&ok("[services.p]\ntype = \"proxy\"\npath = \"/p\"\n"), "p").shared_cache,
        None
    );
}

#[test]
fn admin_token_must_be_long_enough() {
    let error = Config::from_toml_str("[server]\nadmin_token = \"short\"\n", "w.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("w.toml:2: server.admin_token"), "{error}");
    let config =
        Config::from_toml_str("[server]\nadmin_token = \"0123456789abcdef\"\n", "w.toml").unwrap();
    assert_eq!(
        config.server.admin_token.as_deref(),
        Some("0123456789abcdef")
    );
}

#[test]
fn queue_services_need_streams_and_subjects_of_their_own() {
    let text = r#"
[services.a]
type = "queue"
path = "/a"
stream = "JOBS"
subject = "jobs.a"
deliver = { backend = "http://127.0.0.1:1/" }

[services.b]
type = "queue"
path = "/b"
stream = "JOBS"
subject = "jobs.b"
deliver = { backend = "http://127.0.0.1:1/" }

[services.c]
type = "queue"
path = "/c"
stream = "OTHER"
subject = "jobs.a"
deliver = { backend = "http://127.0.0.1:1/", dead_letter_subject = "jobs.b.dead" }

[services.d]
type = "queue"
path = "/d"
stream = "D"
subject = "jobs.d"
deliver = { backend = "http://127.0.0.1:1/", dead_letter_subject = "jobs.b" }
"#;
    assert_eq!(
        problems(text),
        [
            r#"wharf.toml:12: services.b.stream: "JOBS" is already the stream of services.a (line 5), each queue service needs its own stream"#,
            r#"wharf.toml:20: services.c.subject: "jobs.a" is already services.a.subject (line 6), each queue service needs subjects of its own"#,
            r#"wharf.toml:21: services.c.deliver.dead_letter_subject: "jobs.b.dead" is already services.b.deliver.dead_letter_subject (line 13), each queue service needs subjects of its own"#,
            r#"wharf.toml:28: services.d.deliver.dead_letter_subject: "jobs.b" is already services.b.subject (line 13), each queue service needs subjects of its own"#,
        ]
    );
    // Distinct names pass, and so does one stream name per file.
    ok(&text
        .replace("stream = \"JOBS\"\nsubject = \"jobs.b\"", "stream = \"JOBS_B\"\nsubject = \"jobs.b\"")
        .replace("subject = \"jobs.a\"\ndeliver = { backend = \"http://127.0.0.1:1/\", dead_letter_subject = \"jobs.b.dead\" }", "subject = \"jobs.c\"\ndeliver = { backend = \"http://127.0.0.1:1/\" }")
        .replace("dead_letter_subject = \"jobs.b\"", "dead_letter_subject = \"jobs.d.dead\""));
}
