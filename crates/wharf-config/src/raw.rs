//! The raw model: the TOML file as serde sees it, before any unit is parsed or rule checked.
//!
//! Every struct denies unknown keys, nothing is `flatten`ed, and every scalar and array is a
//! [`Spanned`] so that the validator (`validate`) can name the line of a bad value. Tables
//! (maps) are not wrapped: toml gives no span for a table written with dotted keys
//! (`services.a.type = "proxy"`), and asking for one fails the parse. A service is one flat
//! struct holding the keys of every service type; `validate` refuses the keys that do not
//! belong to the declared `type` (an internally tagged enum would lose the spans).
//!
//! A derived struct also accepts an array, assigning its elements to the keys in order
//! (`telemetry = ["json", "debug"]` would pass). Every struct-typed key is therefore read
//! through [`table`] (or [`services`]), which accepts only a TOML table.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

/// A TOML table of header names to values, e.g. `match_headers`.
pub(crate) type RawHeaderTable = BTreeMap<Spanned<String>, Spanned<String>>;
/// A TOML array of strings, with the span of the array and of each element.
pub(crate) type RawStringList = Spanned<Vec<Spanned<String>>>;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default, deserialize_with = "table")]
    pub(crate) server: Option<RawServer>,
    #[serde(default, deserialize_with = "services")]
    pub(crate) services: Option<BTreeMap<Spanned<String>, RawService>>,
    #[serde(default, deserialize_with = "table")]
    pub(crate) telemetry: Option<RawTelemetry>,
}

/// The `[telemetry]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    pub(crate) log_format: Option<Spanned<String>>,
    pub(crate) log_level: Option<Spanned<String>>,
    pub(crate) otlp_endpoint: Option<Spanned<String>>,
    pub(crate) service_name: Option<Spanned<String>>,
    /// A TOML float; serde also takes an integer (`1`) as a float.
    pub(crate) sample_ratio: Option<Spanned<f64>>,
}

/// The `[server]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<Spanned<String>>,
    pub(crate) admin_listen: Option<Spanned<String>>,
    pub(crate) max_connections: Option<Spanned<u64>>,
    pub(crate) header_read_timeout: Option<Spanned<RawDuration>>,
    pub(crate) max_header_bytes: Option<Spanned<RawSize>>,
    pub(crate) idle_timeout: Option<Spanned<RawDuration>>,
    pub(crate) shutdown_timeout: Option<Spanned<RawDuration>>,
    pub(crate) cpu_steering: Option<Spanned<bool>>,
    pub(crate) busy_poll_us: Option<Spanned<u64>>,
    pub(crate) keep_warm: Option<Spanned<RawDuration>>,
    pub(crate) splice_bodies: Option<Spanned<bool>>,
    pub(crate) resolve_hold: Option<Spanned<RawDuration>>,
    pub(crate) tls_cert: Option<Spanned<String>>,
    pub(crate) tls_key: Option<Spanned<String>>,
    pub(crate) listen_unix: Option<Spanned<String>>,
    pub(crate) admin_token: Option<Spanned<String>>,
}

/// One `[services.NAME]` table: the keys of every service type, all optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<String>>,

    // Common to every type.
    pub(crate) max_concurrent_calls: Option<Spanned<u64>>,
    pub(crate) max_queued_calls: Option<Spanned<u64>>,
    pub(crate) queue_timeout: Option<Spanned<RawDuration>>,

    // type = "proxy"
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) cache_max_bytes: Option<Spanned<RawSize>>,
    pub(crate) max_object_bytes: Option<Spanned<RawSize>>,
    pub(crate) max_ttl: Option<Spanned<RawDuration>>,
    pub(crate) allow_private_networks: Option<Spanned<bool>>,
    pub(crate) allow_hosts: Option<RawStringList>,
    pub(crate) connect_timeout: Option<Spanned<RawDuration>>,
    pub(crate) first_byte_timeout: Option<Spanned<RawDuration>>,
    pub(crate) total_timeout: Option<Spanned<RawDuration>>,
    pub(crate) shared_cache: Option<Spanned<String>>,
    pub(crate) preconnect_origins: Option<RawStringList>,

    // type = "route"
    pub(crate) path_prefix: Option<Spanned<String>>,
    pub(crate) strip_prefix: Option<Spanned<bool>>,
    pub(crate) methods: Option<RawStringList>,
    pub(crate) match_headers: Option<RawHeaderTable>,
    pub(crate) backends: Option<RawStringList>,
    pub(crate) strategy: Option<Spanned<String>>,
    pub(crate) set_headers: Option<RawHeaderTable>,
    pub(crate) remove_headers: Option<RawStringList>,
    pub(crate) timeout: Option<Spanned<RawDuration>>,
    pub(crate) retries: Option<Spanned<u64>>,
    /// Also a proxy key (connections per `preconnect_origins` entry).
    pub(crate) preconnect: Option<Spanned<u64>>,

    // type = "queue" (and `path`, shared with proxy)
    pub(crate) nats_url: Option<Spanned<String>>,
    pub(crate) nats_ca_file: Option<Spanned<String>>,
    pub(crate) stream: Option<Spanned<String>>,
    pub(crate) subject: Option<Spanned<String>>,
    pub(crate) forward_headers: Option<RawStringList>,
    pub(crate) publish_timeout: Option<Spanned<RawDuration>>,
    #[serde(default, deserialize_with = "table")]
    pub(crate) deliver: Option<RawDeliver>,
}

/// The `deliver` sub-table of a queue service.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDeliver {
    pub(crate) backend: Option<Spanned<String>>,
    pub(crate) max_deliver: Option<Spanned<u64>>,
    pub(crate) backoff: Option<Spanned<RawDuration>>,
    pub(crate) dead_letter_subject: Option<Spanned<String>>,
    pub(crate) concurrency: Option<Spanned<u64>>,
    pub(crate) ack_wait: Option<Spanned<RawDuration>>,
}

impl RawDeliver {
    /// Where to point at the table: its first key written, if any.
    pub(crate) fn first_span(&self) -> Option<Range<usize>> {
        let spans = [
            self.backend.as_ref().map(Spanned::span),
            self.max_deliver.as_ref().map(Spanned::span),
            self.backoff.as_ref().map(Spanned::span),
            self.dead_letter_subject.as_ref().map(Spanned::span),
            self.concurrency.as_ref().map(Spanned::span),
            self.ack_wait.as_ref().map(Spanned::span),
        ];
        spans.into_iter().flatten().min_by_key(|span| span.start)
    }
}

/// A key that is present in a service table, with where to point at it (if toml knows).
pub(crate) type PresentKey = (&'static str, Option<Range<usize>>);

impl RawService {
    /// The proxy-only keys written in this table.
    pub(crate) fn proxy_keys(&self) -> Vec<PresentKey> {
        let mut keys = Vec::new();
        present(&mut keys, "path", &self.path);
        present(&mut keys, "cache_max_bytes", &self.cache_max_bytes);
        present(&mut keys, "max_object_bytes", &self.max_object_bytes);
        present(&mut keys, "max_ttl", &self.max_ttl);
        present(
            &mut keys,
            "allow_private_networks",
            &self.allow_private_networks,
        );
        present(&mut keys, "allow_hosts", &self.allow_hosts);
        present(&mut keys, "connect_timeout", &self.connect_timeout);
        present(&mut keys, "first_byte_timeout", &self.first_byte_timeout);
        present(&mut keys, "total_timeout", &self.total_timeout);
        present(&mut keys, "shared_cache", &self.shared_cache);
        present(&mut keys, "preconnect_origins", &self.preconnect_origins);
        keys
    }

    /// The route-only keys written in this table.
    pub(crate) fn route_keys(&self) -> Vec<PresentKey> {
        let mut keys = Vec::new();
        present(&mut keys, "path_prefix", &self.path_prefix);
        present(&mut keys, "strip_prefix", &self.strip_prefix);
        present(&mut keys, "methods", &self.methods);
        present_table(&mut keys, "match_headers", &self.match_headers);
        present(&mut keys, "backends", &self.backends);
        present(&mut keys, "strategy", &self.strategy);
        present_table(&mut keys, "set_headers", &self.set_headers);
        present(&mut keys, "remove_headers", &self.remove_headers);
        present(&mut keys, "timeout", &self.timeout);
        present(&mut keys, "retries", &self.retries);
        present(&mut keys, "preconnect", &self.preconnect);
        keys
    }

    /// The queue-only keys written in this table (`path` is shared with proxy).
    pub(crate) fn queue_keys(&self) -> Vec<PresentKey> {
        let mut keys = Vec::new();
        present(&mut keys, "nats_url", &self.nats_url);
        present(&mut keys, "nats_ca_file", &self.nats_ca_file);
        present(&mut keys, "stream", &self.stream);
        present(&mut keys, "subject", &self.subject);
        present(&mut keys, "forward_headers", &self.forward_headers);
        present(&mut keys, "publish_timeout", &self.publish_timeout);
        if let Some(deliver) = &self.deliver {
            keys.push(("deliver", deliver.first_span()));
        }
        keys
    }
}

fn present<T>(keys: &mut Vec<PresentKey>, name: &'static str, value: &Option<Spanned<T>>) {
    if let Some(value) = value {
        keys.push((name, Some(value.span())));
    }
}

/// A table has no span of its own (see the module docs): point at its first key, if any.
fn present_table(keys: &mut Vec<PresentKey>, name: &'static str, table: &Option<RawHeaderTable>) {
    if let Some(table) = table {
        keys.push((name, table.keys().next().map(Spanned::span)));
    }
}

/// A struct-typed key (`server`, `telemetry`, `deliver`): a TOML table only, never an array.
fn table<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Table::deserialize(deserializer).map(|Table(value)| Some(value))
}

/// `services`: a table of service tables, each a TOML table only.
fn services<'de, D>(
    deserializer: D,
) -> Result<Option<BTreeMap<Spanned<String>, RawService>>, D::Error>
where
    D: Deserializer<'de>,
{
    let services = BTreeMap::<Spanned<String>, Table<RawService>>::deserialize(deserializer)?;
    let services = services.into_iter().map(|(name, Table(raw))| (name, raw));
    Ok(Some(services.collect()))
}

/// A `T` read from a TOML table. An array is refused as `invalid type: sequence, expected a
/// table`, which `locate` rewords with the key's name.
struct Table<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TableVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for TableVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(TableVisitor(PhantomData))
            .map(Table)
    }
}

/// A duration as written: a string, parsed by the validator (`"5s"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawDuration(pub(crate) String);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a duration string such as "5s" or "250ms""#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration(v.to_owned()))
            }
        }
        deserializer.deserialize_str(DurationVisitor)
    }
}

/// A size as written: a string with a unit (`"64KiB"`) or a plain integer of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawSize {
    /// `"64KiB"`, parsed by the validator.
    Text(String),
    /// `65536`; negative integers are refused by the validator.
    Bytes(i64),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = RawSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a size string such as "64KiB" or an integer number of bytes"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawSize, E> {
                i64::try_from(v)
                    .map(RawSize::Bytes)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}
