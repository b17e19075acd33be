//! The `[server]` table: listeners, session and request-head limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::{builtin_duration, builtin_size, Checker};
use crate::defaults;
use crate::model::{self, ServerConfig, TlsConfig};
use crate::raw::RawServer;

/// `server.listen` and `server.admin_listen`.
fn socket_addr(
    c: &mut Checker<'_>,
    key: &str,
    value: &Option<Spanned<String>>,
    default: &str,
) -> SocketAddr {
    let default_value = default.parse().expect("built-in addresses are valid");
    let Some(value) = value else {
        return default_value;
    };
    match value.get_ref().parse() {
        Ok(addr) => addr,
        Err(_) => {
            let message = format!(
                "{:?} is not a socket address, use IP:port (e.g. {default:?}, \"[::1]:8080\")",
                value.get_ref()
            );
            c.report(Some(value.span()), key, message);
            default_value
        }
    }
}

/// `server.tls_cert` and `server.tls_key`: both or neither, files present.
fn tls(c: &mut Checker<'_>, raw: &RawServer) -> Option<TlsConfig> {
    let mut file = |key: &str, value: &Spanned<String>| {
        let path = PathBuf::from(value.get_ref());
        if path.is_file() {
            Some(path)
        } else {
            c.report(
                Some(value.span()),
                key,
                format!(
                    "{:?} is not a readable file (a PEM file is expected)",
                    value.get_ref()
                ),
            );
            None
        }
    };
    match (&raw.tls_cert, &raw.tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let cert = file("server.tls_cert", cert);
            let key = file("server.tls_key", key);
            Some(TlsConfig {
                cert: cert?,
                key: key?,
            })
        }
        (Some(only), None) | (None, Some(only)) => {
            let (key, missing) = if raw.tls_cert.is_some() {
                ("server.tls_cert", "tls_key")
            } else {
                ("server.tls_key", "tls_cert")
            };
            c.report(
                Some(only.span()),
                key,
                format!("TLS needs both tls_cert and tls_key: add {missing}"),
            );
            None
        }
    }
}

/// The `[server]` table.
pub(super) fn server(c: &mut Checker<'_>, raw: &RawServer) -> ServerConfig {
    let listen = socket_addr(c, "server.listen", &raw.listen, defaults::LISTEN);
    let admin_listen = socket_addr(
        c,
        "server.admin_listen",
        &raw.admin_listen,
        defaults::ADMIN_LISTEN,
    );
    if model::listeners_collide(listen, admin_listen) {
        let span = raw
            .admin_listen
            .as_ref()
            .or(raw.listen.as_ref())
            .map(Spanned::span);
        let message = if listen == admin_listen {
            format!("{admin_listen} is also `listen`, give the admin listener its own address")
        } else if listen.ip().to_canonical() == admin_listen.ip().to_canonical() {
            // One of them IPv4-mapped (`[::ffff:127.0.0.1]`): the same address.
            format!(
                "{admin_listen} is the same address as `listen` {listen}, give the admin \
                 listener its own address"
            )
        } else {
            // Not the same address: a wildcard covers the other (`[::]` more than `0.0.0.0`).
            let wildcard = [listen, admin_listen]
                .into_iter()
                .filter(|addr| addr.ip().is_unspecified())
                .max_by_key(SocketAddr::is_ipv6)
                .unwrap_or(listen);
            let every = match wildcard.is_ipv4() {
                true => "every IPv4 address",
                false => "every address, IPv4 included",
            };
            format!(
                "{admin_listen} collides with `listen` {listen} ({wildcard} listens on {every}), \
                 give the admin listener its own port"
            )
        };
        c.report(span, "server.admin_listen", message);
    }
    let max_connections = c.count(
        "server.max_connections",
        &raw.max_connections,
        defaults::MAX_CONNECTIONS,
        1..=defaults::MAX_COUNT,
    );
    let header_read_timeout = c.duration(
        "server.header_read_timeout",
        &raw.header_read_timeout,
        defaults::HEADER_READ_TIMEOUT,
        "1ms",
    );
    let (mut max_header_bytes, span) = c.size(
        "server.max_header_bytes",
        &raw.max_header_bytes,
        defaults::MAX_HEADER_BYTES,
    );
    let (min, max) = (
        builtin_size(defaults::MIN_HEADER_BYTES),
        builtin_size(defaults::MAX_HEADER_BYTES_LIMIT),
    );
    if !(min..=max).contains(&max_header_bytes) {
        c.report(
            span,
            "server.max_header_bytes",
            format!(
                "{max_header_bytes} bytes is out of range, use {} to {}",
                defaults::MIN_HEADER_BYTES,
                defaults::MAX_HEADER_BYTES_LIMIT
            ),
        );
        max_header_bytes = builtin_size(defaults::MAX_HEADER_BYTES);
    }
    let idle_timeout = c.duration(
        "server.idle_timeout",
        &raw.idle_timeout,
        defaults::IDLE_TIMEOUT,
        "1ms",
    );
    let shutdown_timeout = c.duration(
        "server.shutdown_timeout",
        &raw.shutdown_timeout,
        defaults::SHUTDOWN_TIMEOUT,
        "0s",
    );
    let cpu_steering = raw.cpu_steering.as_ref().is_some_and(|v| *v.get_ref());
    let busy_poll = Duration::from_micros(c.count(
        "server.busy_poll_us",
        &raw.busy_poll_us,
        defaults::BUSY_POLL_US,
        0..=defaults::MAX_BUSY_POLL_US,
    ));
    let keep_warm = keep_warm(c, raw);
    let splice_bodies = raw.splice_bodies.as_ref().is_some_and(|v| *v.get_ref());
    let resolve_hold = resolve_hold(c, raw);
    let tls = tls(c, raw);
    let listen_unix = raw.listen_unix.as_ref().and_then(|path| {
        let value = path.get_ref();
        if value.starts_with('/') && value.len() > 1 {
            Some(PathBuf::from(value))
        } else {
            c.report(
                Some(path.span()),
                "server.listen_unix",
                format!("{value:?} is not an absolute path (e.g. \"/run/wharf/wharf.sock\")"),
            );
            None
        }
    });
    let admin_token = raw.admin_token.as_ref().and_then(|token| {
        let value = token.get_ref();
        if value.len() >= 16 && !value.chars().any(char::is_whitespace) {
            Some(value.clone())
        } else {
            c.report(
                Some(token.span()),
                "server.admin_token",
                "the token must be at least 16 characters with no whitespace".to_owned(),
            );
            None
        }
    });
    ServerConfig {
        tls,
        listen_unix,
        admin_token,
        listen,
        admin_listen,
        // Bounded above (MAX_COUNT, 16MiB): they fit a usize, 32-bit included.
        max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
        header_read_timeout,
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
        idle_timeout,
        shutdown_timeout,
        cpu_steering,
        busy_poll,
        keep_warm,
        splice_bodies,
        resolve_hold,
    }
}

/// `server.resolve_hold`: `"0s"` to 1h.
fn resolve_hold(c: &mut Checker<'_>, raw: &RawServer) -> Duration {
    c.duration_within(
        "server.resolve_hold",
        &raw.resolve_hold,
        defaults::RESOLVE_HOLD,
        "0s",
        defaults::MAX_RESOLVE_HOLD,
    )
}

/// `server.keep_warm`: `"0s"` is off; anything else must lie in 10ms..=60s.
fn keep_warm(c: &mut Checker<'_>, raw: &RawServer) -> Option<Duration> {
    let every = c.duration(
        "server.keep_warm",
        &raw.keep_warm,
        defaults::KEEP_WARM,
        "0s",
    );
    if every.is_zero() {
        return None;
    }
    if every < builtin_duration(defaults::MIN_KEEP_WARM)
        || every > builtin_duration(defaults::MAX_KEEP_WARM)
    {
        if let Some(value) = &raw.keep_warm {
            c.report(
                Some(value.span()),
                "server.keep_warm",
                format!(
                    "{:?} is out of range, use \"0s\" (off) or {} to {}",
                    value.get_ref().0,
                    defaults::MIN_KEEP_WARM,
                    defaults::MAX_KEEP_WARM
                ),
            );
        }
        return None;
    }
    Some(every)
}
