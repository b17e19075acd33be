//! Step two: raw model → [`Config`]. Units parsed, defaults filled, ranges, required keys,
//! keys of the wrong service type and cross-key rules checked.
//!
//! Validation never stops at the first problem: a [`Checker`] collects every problem (with
//! its line, taken from the raw model's spans) and substitutes the default for a bad value so
//! that later checks still run. The `[server]` table is checked in `server.rs`, `[telemetry]`
//! in `telemetry.rs`, proxy, route and queue keys in `proxy.rs`, `route.rs` and `queue.rs`;
//! this module holds the shared helpers, the service table and the cross-key rules.

mod proxy;
mod queue;
mod route;
mod server;
mod telemetry;

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use crate::defaults;
use crate::error::{ConfigError, Problem};
use crate::locate::line_of;
use crate::model::{
    methods_taken, route_rank, LimitsConfig, RouteConfig, ServiceConfig, ServiceKind,
};
use crate::raw::{RawConfig, RawDuration, RawService, RawSize};
use crate::units::{parse_duration, parse_size};
use crate::Config;

/// Validates a parsed file. `text` is the file's text (for line numbers), `file` its name.
pub(crate) fn validate(raw: RawConfig, text: &str, file: &str) -> Result<Config, ConfigError> {
    let mut c = Checker {
        text,
        file,
        problems: Vec::new(),
    };
    let server = server::server(&mut c, &raw.server.unwrap_or_default());
    let telemetry = telemetry::telemetry(&mut c, &raw.telemetry.unwrap_or_default());

    // BTreeMap order is by name; file order reads better and is what operators wrote.
    let mut entries: Vec<_> = raw.services.unwrap_or_default().into_iter().collect();
    entries.sort_by_key(|(name, _)| name.span().start);
    let mut services = Vec::new();
    // (path or path_prefix, service name, where it was written) for the uniqueness rule.
    let mut paths: Vec<(String, String, Option<Range<usize>>)> = Vec::new();
    // The streams and subjects of the queue services, for their uniqueness rule.
    let mut queues = Vec::new();
    for (name, raw) in &entries {
        if let Some((service, path_span)) = service(&mut c, name, raw) {
            if let ServiceKind::Queue(queue) = &service.kind {
                queues.push(queue::QueueNames::new(&service.name, raw, queue));
            }
            let path = match &service.kind {
                ServiceKind::Proxy(p) => p.path.clone(),
                ServiceKind::Route(r) => r.path_prefix.clone(),
                ServiceKind::Queue(q) => q.path.clone(),
            };
            paths.push((path, service.name.clone(), path_span));
            services.push(service);
        }
    }
    unique_paths(&mut c, &services, &paths);
    queue::unique_queue_names(&mut c, &queues);

    if c.problems.is_empty() {
        Ok(Config {
            server,
            services,
            telemetry,
            origin: file.to_owned(),
        })
    } else {
        Err(ConfigError::new(c.problems))
    }
}

/// Collects problems, and parses the values every table has (durations, sizes, counts).
pub(crate) struct Checker<'a> {
    text: &'a str,
    file: &'a str,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    /// Records a problem with `key`, at the line of `span` (no line if `None`).
    pub(crate) fn report(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        message: impl Into<String>,
    ) {
        self.problems.push(Problem {
            file: self.file.to_owned(),
            line: span.map(|s| line_of(self.text, s.start)),
            column: None,
            key: key.to_owned(),
            message: message.into(),
        });
    }

    /// A duration key, or `default` if absent or bad; `min` is `"0s"` or `"1ms"` (must be
    /// greater than zero) or a larger bound. Every duration is at most 365d.
    pub(crate) fn duration(
        &mut self,
        key: &str,
        value: &Option<Spanned<RawDuration>>,
        default: &str,
        min: &str,
    ) -> Duration {
        self.duration_within(key, value, default, min, defaults::MAX_DURATION)
    }

    /// [`Checker::duration`] with a maximum of the key's own, `max` (at most 365d).
    pub(crate) fn duration_within(
        &mut self,
        key: &str,
        value: &Option<Spanned<RawDuration>>,
        default: &str,
        min: &str,
        max: &str,
    ) -> Duration {
        let default_value = builtin_duration(default);
        let Some(value) = value else {
            return default_value;
        };
        let text = &value.get_ref().0;
        let parsed = match parse_duration(text) {
            Ok(parsed) => parsed,
            Err(err) => {
                let message = format!("{text:?} is not a duration (e.g. {default:?}): {err}");
                self.report(Some(value.span()), key, message);
                return default_value;
            }
        };
        let problem = if parsed < builtin_duration(min) {
            Some(match min {
                "1ms" => format!("{text:?} is too short, it must be greater than 0"),
                _ => format!("{text:?} is too short, the minimum is {min}"),
            })
        } else if parsed > builtin_duration(max) {
            Some(format!("{text:?} is too long, the maximum is {max}"))
        } else {
            None
        };
        match problem {
            Some(message) => {
                self.report(Some(value.span()), key, message);
                default_value
            }
            None => parsed,
        }
    }

    /// A size key in bytes, or `default` if absent or bad, with the span of the value when
    /// one was written (for the caller's range checks).
    pub(crate) fn size(
        &mut self,
        key: &str,
        value: &Option<Spanned<RawSize>>,
        default: &str,
    ) -> (u64, Option<Range<usize>>) {
        let default_value = builtin_size(default);
        let Some(value) = value else {
            return (default_value, None);
        };
        let parsed = match value.get_ref() {
            RawSize::Text(text) => parse_size(text)
                .map_err(|err| format!("{text:?} is not a size (e.g. {default:?}): {err}")),
            RawSize::Bytes(bytes) => u64::try_from(*bytes).map_err(|_| {
                format!("{bytes} is negative, use a number of bytes or a size such as {default:?}")
            }),
        };
        match parsed {
            Ok(bytes) => (bytes, Some(value.span())),
            Err(message) => {
                self.report(Some(value.span()), key, message);
                (default_value, None)
            }
        }
    }

    /// A count key in `range`, or `default` if absent or bad.
    pub(crate) fn count(
        &mut self,
        key: &str,
        value: &Option<Spanned<u64>>,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> u64 {
        let Some(value) = value else {
            return default;
        };
        let n = *value.get_ref();
        if range.contains(&n) {
            n
        } else {
            let message = format!(
                "{n} is out of range, use {} to {}",
                range.start(),
                range.end()
            );
            self.report(Some(value.span()), key, message);
            default
        }
    }

    /// The entries of a list key parsed by `parse`, in file order: an entry that does not
    /// parse, or parses to one already listed, is reported at its place and left out.
    pub(crate) fn unique_list<T: PartialEq>(
        &mut self,
        key: &str,
        entries: &[Spanned<String>],
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Vec<T> {
        let mut parsed: Vec<T> = Vec::new();
        for entry in entries {
            match parse(entry.get_ref()) {
                Ok(value) if parsed.contains(&value) => self.report(
                    Some(entry.span()),
                    key,
                    format!("{:?} is listed twice", entry.get_ref()),
                ),
                Ok(value) => parsed.push(value),
                Err(why) => self.report(Some(entry.span()), key, why),
            }
        }
        parsed
    }

    /// The line of a span, for messages that point at another place in the file.
    pub(crate) fn line(&self, span: &Option<Range<usize>>) -> Option<usize> {
        span.as_ref().map(|s| line_of(self.text, s.start))
    }
}

/// A built-in duration; the defaults module only holds valid spellings (tests check them).
pub(super) fn builtin_duration(text: &str) -> Duration {
    parse_duration(text).expect("built-in durations are valid")
}

/// A built-in size; the defaults module only holds valid spellings (tests check them).
fn builtin_size(text: &str) -> u64 {
    parse_size(text).expect("built-in sizes are valid")
}

/// One `[services.NAME]` table; `None` if its type is missing or unknown. Also returns the
/// span of its `path`/`path_prefix`.
fn service(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    raw: &RawService,
) -> Option<(ServiceConfig, Option<Range<usize>>)> {
    let table = format!("services.{}", name.get_ref());
    let name_span = Some(name.span());
    let valid_name = !name.get_ref().is_empty()
        && name
            .get_ref()
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
    if !valid_name {
        c.report(
            name_span.clone(),
            &table,
            format!(
                "{:?} is not a valid service name, use letters, digits, `-` and `_`",
                name.get_ref()
            ),
        );
    }

    let Some(kind) = &raw.kind else {
        c.report(
            name_span,
            &table,
            r#"missing `type`, add type = "proxy", type = "route" or type = "queue""#,
        );
        return None;
    };
    let (default_calls, default_queue) = match kind.get_ref().as_str() {
        "proxy" => (
            defaults::PROXY_MAX_CONCURRENT_CALLS,
            defaults::PROXY_MAX_QUEUED_CALLS,
        ),
        "route" => (
            defaults::ROUTE_MAX_CONCURRENT_CALLS,
            defaults::ROUTE_MAX_QUEUED_CALLS,
        ),
        "queue" => (
            defaults::QUEUE_MAX_CONCURRENT_CALLS,
            defaults::QUEUE_MAX_QUEUED_CALLS,
        ),
        other => {
            c.report(
                Some(kind.span()),
                &format!("{table}.type"),
                format!(r#"unknown service type {other:?}, use "proxy", "route" or "queue""#),
            );
            return None;
        }
    };

    let max_concurrent_calls = c.count(
        &format!("{table}.max_concurrent_calls"),
        &raw.max_concurrent_calls,
        default_calls,
        1..=defaults::MAX_COUNT,
    );
    let max_queued_calls = c.count(
        &format!("{table}.max_queued_calls"),
        &raw.max_queued_calls,
        default_queue,
        0..=defaults::MAX_COUNT,
    );
    let queue_timeout = c.duration(
        &format!("{table}.queue_timeout"),
        &raw.queue_timeout,
        defaults::QUEUE_TIMEOUT,
        "1ms",
    );
    let limits = LimitsConfig {
        // Bounded by MAX_COUNT, which fits any usize.
        max_concurrent_calls: usize::try_from(max_concurrent_calls).unwrap_or(usize::MAX),
        max_queued_calls: usize::try_from(max_queued_calls).unwrap_or(usize::MAX),
        queue_timeout,
    };

    // The keys written that belong to type `owner`, except `shared`: keys of the table's own
    // type too (`path` of proxies and queues, `preconnect` of routes and proxies).
    let owned = |keys: Vec<crate::raw::PresentKey>, owner: &'static str, shared: &[&str]| {
        keys.into_iter()
            .filter(|(key, _)| !shared.contains(key))
            .map(move |key| (key, owner))
            .collect::<Vec<_>>()
    };
    let (kind, path_span) = match kind.get_ref().as_str() {
        "proxy" => {
            let mut foreign = owned(raw.route_keys(), "route", &["preconnect"]);
            foreign.extend(owned(raw.queue_keys(), "queue", &[]));
            foreign_keys(c, &table, "proxy", foreign, &name_span);
            let proxy = proxy::proxy(c, &table, raw, &name_span);
            (
                ServiceKind::Proxy(proxy),
                raw.path.as_ref().map(Spanned::span),
            )
        }
        "queue" => {
            let mut foreign = owned(raw.proxy_keys(), "proxy", &["path"]);
            foreign.extend(owned(raw.route_keys(), "route", &[]));
            foreign_keys(c, &table, "queue", foreign, &name_span);
            let queue = queue::queue(c, &table, raw, &name_span);
            (
                ServiceKind::Queue(queue),
                raw.path.as_ref().map(Spanned::span),
            )
        }
        _ => {
            let mut foreign = owned(raw.proxy_keys(), "proxy", &[]);
            foreign.extend(owned(raw.queue_keys(), "queue", &[]));
            foreign_keys(c, &table, "route", foreign, &name_span);
            let route = route::route(c, &table, raw, &name_span);
            let span = raw.path_prefix.as_ref().map(Spanned::span);
            (ServiceKind::Route(route), span)
        }
    };
    let service = ServiceConfig {
        name: name.get_ref().clone(),
        limits,
        kind,
    };
    Some((service, path_span))
}

/// Refuses keys that belong to another service type (`keys` with the type each belongs to).
fn foreign_keys(
    c: &mut Checker<'_>,
    table: &str,
    type_name: &str,
    mut keys: Vec<(crate::raw::PresentKey, &'static str)>,
    name_span: &Option<Range<usize>>,
) {
    // Report in file order whichever type the keys belong to.
    keys.sort_by_key(|((_, span), _)| span.as_ref().map_or(usize::MAX, |s| s.start));
    for ((key, span), other) in keys {
        c.report(
            span.or_else(|| name_span.clone()),
            table,
            format!("`{key}` is not a key of a {type_name} service (it is a {other} key)"),
        );
    }
}

/// No two services share a `path`/`path_prefix`, except routes: they may share a prefix
/// when each takes requests the ones asked before it do not (see [`hidden_by`]).
fn unique_paths(
    c: &mut Checker<'_>,
    services: &[ServiceConfig],
    paths: &[(String, String, Option<Range<usize>>)],
) {
    let route = |i: usize| match services.get(i).map(|s| &s.kind) {
        Some(ServiceKind::Route(route)) => Some(route),
        _ => None,
    };
    for (i, (path, name, span)) in paths.iter().enumerate() {
        // An invalid path was reported already and left empty.
        if path.is_empty() {
            continue;
        }
        let same_path: Vec<usize> = (0..paths.len())
            .filter(|&j| j != i && paths[j].0 == *path)
            .collect();
        // A proxy's or queue's path is its own: reported once, at the later of the two.
        let (key, taken) = match route(i) {
            Some(_) => (
                "path_prefix",
                same_path.iter().find(|&&j| j < i && route(j).is_none()),
            ),
            None => ("path", same_path.iter().find(|&&j| j < i)),
        };
        if let Some(&j) = taken {
            let (_, first, first_span) = &paths[j];
            let at = at_line(c, first_span);
            c.report(
                span.clone(),
                &format!("services.{name}.{key}"),
                format!("{path:?} is already used by services.{first}{at}, each service needs its own path (only routes may share one)"),
            );
            continue;
        }
        let Some(this) = route(i) else {
            continue;
        };
        let routes: Vec<(usize, &RouteConfig)> = same_path
            .iter()
            .filter_map(|&j| route(j).map(|r| (j, r)))
            .collect();
        let hiding = hidden_by(i, this, &routes);
        if hiding.is_empty() {
            continue;
        }
        let named: Vec<String> = hiding
            .iter()
            .map(|&j| format!("services.{}{}", paths[j].1, at_line(c, &paths[j].2)))
            .collect();
        let (which, takes) = match named.as_slice() {
            [one] => (one.clone(), "takes"),
            _ => (named.join(" and "), "together take"),
        };
        c.report(
            span.clone(),
            &format!("services.{name}.path_prefix"),
            format!(
                "{path:?} is also the prefix of {which}, asked before this route, which {takes} every request it would take: \
                 write this route first, give it a `match_headers` entry they lack, or give it another prefix"
            ),
        );
    }
}

/// The routes (indexes into `others`' first field) that leave route `this` (index `i`)
/// no request: empty if it can be reached. `others` are the other routes with its prefix.
///
/// The host asks routes sharing a prefix in order of rank ([`route_rank`], which the route's
/// matcher uses too), then in file order, and the first
/// whose conditions hold takes the request. A route is hidden when the routes asked before
/// it whose headers it requires too (theirs a subset of its own) take every method it takes
/// (any method, for a route without `methods`), GET allowing HEAD ([`methods_taken`]).
fn hidden_by(i: usize, this: &RouteConfig, others: &[(usize, &RouteConfig)]) -> Vec<usize> {
    let rank = |r: &RouteConfig| route_rank(r.match_headers.len(), !r.methods.is_empty());
    let asked_before = |j: usize, other: &RouteConfig| {
        rank(other) > rank(this) || (rank(other) == rank(this) && j < i)
    };
    // Every request `this` takes has its headers, so only routes asking no other header
    // can take its requests.
    let covering: Vec<(usize, &RouteConfig)> = others
        .iter()
        .filter(|(j, other)| asked_before(*j, other))
        .filter(|(_, other)| {
            other
                .match_headers
                .iter()
                .all(|h| this.match_headers.contains(h))
        })
        .copied()
        .collect();
    if let Some((j, _)) = covering.iter().find(|(_, other)| other.methods.is_empty()) {
        return vec![*j];
    }
    if this.methods.is_empty() {
        return Vec::new();
    }
    let mut hiding = Vec::new();
    for method in methods_taken(&this.methods) {
        let Some((j, _)) = covering
            .iter()
            .find(|(_, other)| methods_taken(&other.methods).contains(&method))
        else {
            return Vec::new();
        };
        if !hiding.contains(j) {
            hiding.push(*j);
        }
    }
    hiding.sort_unstable();
    hiding
}

/// `" (line N)"` for `span`, or nothing without one.
pub(super) fn at_line(c: &Checker<'_>, span: &Option<Range<usize>>) -> String {
    match c.line(span) {
        Some(line) => format!(" (line {line})"),
        None => String::new(),
    }
}

/// Validates a `path` or `path_prefix`: an absolute URL path without query, fragment,
/// trailing slash or dot segments. Returns `None` (and reports) if it is not.
pub(crate) fn check_path(
    c: &mut Checker<'_>,
    key: &str,
    value: &Spanned<String>,
) -> Option<String> {
    let path = value.get_ref();
    let problem = if !path.starts_with('/') {
        Some(format!(
            "{path:?} must start with \"/\" (e.g. \"/{}\")",
            path.trim_start_matches('/')
        ))
    } else if path.contains('?') {
        Some(format!("{path:?} must not contain a query (\"?\")"))
    } else if path.contains('#') {
        Some(format!("{path:?} must not contain a fragment (\"#\")"))
    } else if path.len() > 1 && path.ends_with('/') {
        Some(format!(
            "{path:?} must not end with \"/\" (use {:?})",
            path.trim_end_matches('/')
        ))
    } else if path.len() > 1
        && path[1..]
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        Some(format!(
            "{path:?} must not contain empty, \".\" or \"..\" segments"
        ))
    } else if path.parse::<http::uri::PathAndQuery>().is_err() || path.contains(char::is_whitespace)
    {
        Some(format!(
            "{path:?} is not a valid URL path (percent-encode other characters)"
        ))
    } else {
        None
    };
    match problem {
        Some(message) => {
            c.report(Some(value.span()), key, message);
            None
        }
        None => Some(path.clone()),
    }
}
