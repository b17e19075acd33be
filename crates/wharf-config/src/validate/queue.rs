//! The keys of a `type = "queue"` service and its `deliver` sub-table.

use std::ops::Range;

use http::HeaderName;
use url::Url;

use super::route::HOP_BY_HOP;
use super::{at_line, check_path, Checker};
use crate::defaults;
use crate::model::{DeliverConfig, NatsCredentials, QueueConfig};
use crate::raw::{RawDeliver, RawService};

/// Validates the queue keys of `raw`; `table` is `services.NAME`. Bad values are reported
/// and replaced by defaults (empty strings for required keys).
pub(super) fn queue(
    c: &mut Checker<'_>,
    table: &str,
    raw: &RawService,
    name_span: &Option<Range<usize>>,
) -> QueueConfig {
    let key = |k: &str| format!("{table}.{k}");

    let path = match &raw.path {
        Some(path) => check_path(c, &key("path"), path).unwrap_or_default(),
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `path` (e.g. path = "/jobs")"#,
            );
            String::new()
        }
    };

    let mut url_reported = false;
    let (nats_url, nats_credentials) = match &raw.nats_url {
        None => (defaults::NATS_URL.to_owned(), None),
        Some(written) => nats_url(written.get_ref()).unwrap_or_else(|why| {
            c.report(Some(written.span()), &key("nats_url"), why);
            url_reported = true;
            (defaults::NATS_URL.to_owned(), None)
        }),
    };

    let nats_ca_file = raw.nats_ca_file.as_ref().and_then(|written| {
        // A bad `nats_url` is reported already: whether it asks for TLS is unknown.
        let tls = url_reported || nats_url.starts_with("tls://");
        nats_ca_file(written.get_ref(), tls).map_or_else(
            |why| {
                c.report(Some(written.span()), &key("nats_ca_file"), why);
                None
            },
            Some,
        )
    });

    let stream = match &raw.stream {
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `stream` (e.g. stream = "WHARF_JOBS")"#,
            );
            String::new()
        }
        Some(written) => stream_name(written.get_ref()).unwrap_or_else(|why| {
            c.report(Some(written.span()), &key("stream"), why);
            String::new()
        }),
    };

    let subject = match &raw.subject {
        None => {
            c.report(
                name_span.clone(),
                table,
                r#"missing required key `subject` (e.g. subject = "wharf.jobs")"#,
            );
            String::new()
        }
        Some(written) => subject_name(written.get_ref()).unwrap_or_else(|why| {
            c.report(Some(written.span()), &key("subject"), why);
            String::new()
        }),
    };

    let mut forward_headers = vec![HeaderName::from_static("content-type")];
    match &raw.forward_headers {
        None => {
            for name in defaults::FORWARD_HEADERS {
                let name = HeaderName::from_static(name);
                if !forward_headers.contains(&name) {
                    forward_headers.push(name);
                }
            }
        }
        Some(list) => {
            for entry in list.get_ref() {
                let why = match HeaderName::from_bytes(entry.get_ref().as_bytes()) {
                    Err(_) => Some(format!(
                        "{:?} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)",
                        entry.get_ref()
                    )),
                    Ok(name) if HOP_BY_HOP.contains(&name.as_str()) => Some(format!(
                        "{name:?} is a hop-by-hop or framing header, which wharf manages itself"
                    )),
                    // Stored with the message, these would let a client steer the broker
                    // (`Nats-Msg-Id` de-duplicates, `Nats-Expected-*` and `Nats-Rollup`
                    // change what is stored) or pose as wharf's own count of attempts.
                    Ok(name) if name.as_str().starts_with("nats-") => Some(format!(
                        "{name:?} is a NATS header, which the broker acts on: a client must not set it"
                    )),
                    Ok(name) if name.as_str().starts_with("x-wharf-") => Some(format!(
                        "{name:?} is one of wharf's queue headers, which wharf sets itself \
                         (a client's x-wharf-message-id is read without being forwarded)"
                    )),
                    Ok(name) => {
                        if !forward_headers.contains(&name) {
                            forward_headers.push(name);
                        }
                        None
                    }
                };
                if let Some(why) = why {
                    c.report(Some(entry.span()), &key("forward_headers"), why);
                }
            }
        }
    }

    let publish_timeout = c.duration(
        &key("publish_timeout"),
        &raw.publish_timeout,
        defaults::PUBLISH_TIMEOUT,
        "1ms",
    );

    let deliver = deliver(
        c,
        &key("deliver"),
        raw.deliver.as_ref(),
        &subject,
        name_span,
    );

    QueueConfig {
        path,
        nats_url,
        nats_credentials,
        nats_ca_file,
        stream,
        subject,
        forward_headers,
        publish_timeout,
        deliver,
    }
}

/// The `deliver` sub-table; `table` is `services.NAME.deliver`.
fn deliver(
    c: &mut Checker<'_>,
    table: &str,
    raw: Option<&RawDeliver>,
    subject: &str,
    name_span: &Option<Range<usize>>,
) -> DeliverConfig {
    let key = |k: &str| format!("{table}.{k}");
    let empty = RawDeliver::default();
    let raw = raw.unwrap_or(&empty);
    let fallback = || Url::parse("http://127.0.0.1/").expect("a literal URL parses");

    let backend = match &raw.backend {
        None => {
            c.report(
                raw.first_span().or_else(|| name_span.clone()),
                table,
                r#"missing required key `backend` (e.g. deliver = { backend = "http://127.0.0.1:7001/handle" })"#,
            );
            fallback()
        }
        Some(written) => backend_url(written.get_ref()).unwrap_or_else(|why| {
            c.report(Some(written.span()), &key("backend"), why);
            fallback()
        }),
    };
    let max_deliver = c.count(
        &key("max_deliver"),
        &raw.max_deliver,
        defaults::MAX_DELIVER,
        1..=defaults::MAX_DELIVER_LIMIT,
    );
    let backoff = c.duration(&key("backoff"), &raw.backoff, defaults::BACKOFF, "1ms");
    let dead_letter_subject = match &raw.dead_letter_subject {
        None => format!("{subject}.dead"),
        Some(written) => match subject_name(written.get_ref()) {
            Ok(dead) if dead == subject => {
                c.report(
                    Some(written.span()),
                    &key("dead_letter_subject"),
                    format!("{dead:?} is the queue's own subject, use another (e.g. \"{subject}.dead\")"),
                );
                format!("{subject}.dead")
            }
            Ok(dead) => dead,
            Err(why) => {
                c.report(Some(written.span()), &key("dead_letter_subject"), why);
                format!("{subject}.dead")
            }
        },
    };
    let concurrency = c.count(
        &key("concurrency"),
        &raw.concurrency,
        defaults::CONCURRENCY,
        1..=defaults::MAX_CONCURRENCY,
    );
    let ack_wait = c.duration(&key("ack_wait"), &raw.ack_wait, defaults::ACK_WAIT, "1s");
    DeliverConfig {
        backend,
        // Both bounded by their ranges above.
        max_deliver: u32::try_from(max_deliver).unwrap_or(u32::MAX),
        backoff,
        dead_letter_subject,
        concurrency: usize::try_from(concurrency).unwrap_or(usize::MAX),
        ack_wait,
    }
}

/// A queue service's stream and the subjects its stream captures, with where each was
/// written, for [`unique_queue_names`].
pub(super) struct QueueNames {
    name: String,
    stream: (String, Option<Range<usize>>),
    /// `(subject, key, span)`: `subject` and `deliver.dead_letter_subject` (spanned at
    /// `subject` when it is the default derived from it).
    subjects: Vec<(String, &'static str, Option<Range<usize>>)>,
}

impl QueueNames {
    /// The names of service `name` (validated as `queue`, written as `raw`).
    pub(super) fn new(name: &str, raw: &RawService, queue: &QueueConfig) -> Self {
        let span = |value: &Option<toml::Spanned<String>>| value.as_ref().map(|v| v.span());
        let subject_span = span(&raw.subject);
        let dead_span = raw
            .deliver
            .as_ref()
            .and_then(|deliver| span(&deliver.dead_letter_subject))
            .or_else(|| subject_span.clone());
        Self {
            name: name.to_owned(),
            stream: (queue.stream.clone(), span(&raw.stream)),
            subjects: vec![
                (queue.subject.clone(), "subject", subject_span),
                (
                    queue.deliver.dead_letter_subject.clone(),
                    "deliver.dead_letter_subject",
                    dead_span,
                ),
            ],
        }
    }
}

/// No two queue services share a stream, nor a subject (`subject` or
/// `deliver.dead_letter_subject`, in any combination). wharf creates each service's stream
/// capturing its two subjects: a second service on the same stream would find it made with
/// other subjects, and JetStream refuses two streams capturing one subject, so one of the
/// services would answer 503 for ever. Checked whatever the `nats_url`s: one broker may be
/// spelt two ways.
pub(super) fn unique_queue_names(c: &mut Checker<'_>, queues: &[QueueNames]) {
    for (i, queue) in queues.iter().enumerate() {
        let earlier = &queues[..i];
        let (stream, stream_span) = &queue.stream;
        // An invalid name was reported already and left empty.
        if let Some(first) = earlier
            .iter()
            .find(|other| !stream.is_empty() && other.stream.0 == *stream)
        {
            let at = at_line(c, &first.stream.1);
            c.report(
                stream_span.clone(),
                &format!("services.{}.stream", queue.name),
                format!(
                    "{stream:?} is already the stream of services.{}{at}, each queue service needs its own stream",
                    first.name
                ),
            );
        }
        for (subject, key, span) in &queue.subjects {
            // Empty: invalid, reported already (a dead-letter subject derived from it is
            // ".dead", never written, so never equal to a valid one).
            if subject.is_empty() || subject.starts_with('.') {
                continue;
            }
            let first = earlier.iter().find_map(|other| {
                other
                    .subjects
                    .iter()
                    .find(|(theirs, _, _)| theirs == subject)
                    .map(|(_, their_key, their_span)| (other, their_key, their_span))
            });
            let Some((first, first_key, first_span)) = first else {
                continue;
            };
            let at = at_line(c, first_span);
            c.report(
                span.clone(),
                &format!("services.{}.{key}", queue.name),
                format!(
                    "{subject:?} is already services.{}.{first_key}{at}, each queue service needs subjects of its own",
                    first.name
                ),
            );
        }
    }
}

/// `nats://[user:password@|token@]host[:port]` (or `tls://...`, TLS required), returned
/// normalised without its user information, and that as credentials (percent-decoded, as
/// the URL carries them). The NATS client reads no credentials from a URL, so they are
/// handed to it separately.
pub(crate) fn nats_url(written: &str) -> Result<(String, Option<NatsCredentials>), String> {
    let shown = crate::redacted_url(written);
    let example = r#"e.g. "nats://127.0.0.1:4222""#;
    let url =
        Url::parse(written).map_err(|err| format!("{shown:?} is not a URL: {err} ({example})"))?;
    if !matches!(url.scheme(), "nats" | "tls") {
        return Err(format!(
            "{shown:?}: unsupported scheme {:?}, use nats://, or tls:// to require TLS \
             ({example})",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host ({example})"));
    }
    if url.path() != "/" && !url.path().is_empty()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(format!(
            "{shown:?} must not have a path, query or fragment ({example})"
        ));
    }
    let decoded = |part: &str, what: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| format!("{shown:?}: the {what} is not UTF-8 once percent-decoded"))
    };
    // Read from the text, not from `url`, which drops an empty password (`user:@h` would
    // become the token "user") and reads `:@h` as no user information at all. The path
    // check above makes the authority run to the end, or to a lone `/`.
    let after_scheme = written.split_once("://").map_or(written, |(_, rest)| rest);
    let authority = after_scheme
        .find(['/', '?', '#'])
        .map_or(after_scheme, |end| &after_scheme[..end]);
    let credentials = match authority.rsplit_once('@').map(|(userinfo, _)| userinfo) {
        None => None,
        Some(userinfo) => Some(match userinfo.split_once(':') {
            None if !userinfo.is_empty() => NatsCredentials::Token(decoded(userinfo, "token")?),
            Some((user, password)) if !user.is_empty() => NatsCredentials::UserPassword {
                user: decoded(user, "user")?,
                password: decoded(password, "password")?,
            },
            // `@h`, `:@h`, `:pw@h`: credentials meant, and none usable.
            _ => {
                return Err(format!(
                    "{shown:?} has user information without a user (user:password@ for a \
                     user, token@ for a token)"
                ))
            }
        }),
    };
    let mut bare = url;
    // Only fails for URLs that cannot have a host, and this one has a host.
    if bare.set_username("").is_err() || bare.set_password(None).is_err() {
        return Err(format!(
            "{shown:?}: its user information cannot be separated"
        ));
    }
    let mut normalised = bare.to_string();
    if normalised.ends_with('/') {
        normalised.pop();
    }
    Ok((normalised, credentials))
}

/// `nats_ca_file`: a readable PEM file of certificates that the NATS client can each take as
/// a trust anchor (as it does at every connect), for a `tls://` `nats_url` only (`tls`):
/// with `nats://` TLS is the broker's choice, and roots for it would suggest a protection the
/// URL does not ask for.
fn nats_ca_file(written: &str, tls: bool) -> Result<std::path::PathBuf, String> {
    use rustls_pki_types::pem::{self, PemObject};
    use rustls_pki_types::CertificateDer;
    if !tls {
        return Err(format!(
            "{written:?}: certificates for the broker need a tls:// nats_url, which requires \
             TLS (e.g. \"tls://nats.example:4222\")"
        ));
    }
    let path = std::path::PathBuf::from(written);
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|error| match error {
            pem::Error::Io(error) => format!("{written:?} cannot be read: {error}"),
            other => format!("{written:?} is not valid PEM: {other}"),
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{written:?} holds no certificate (PEM \"CERTIFICATE\" blocks expected)"
        ));
    }
    // The very parse async-nats 0.46 makes of each (its `tls::config_tls`).
    for (n, cert) in certs.iter().enumerate() {
        webpki::anchor_from_trusted_cert(cert).map_err(|error| {
            format!(
                "{written:?}: certificate {} cannot be a trust anchor: {error}",
                n + 1
            )
        })?;
    }
    Ok(path)
}

/// A JetStream stream name: letters, digits, `-` and `_`, at most 255 characters.
pub(crate) fn stream_name(written: &str) -> Result<String, String> {
    let valid = !written.is_empty()
        && written.len() <= 255
        && written
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
    if valid {
        Ok(written.to_owned())
    } else {
        Err(format!(
            "{written:?} is not a valid stream name, use letters, digits, `-` and `_` (e.g. \"WHARF_JOBS\")"
        ))
    }
}

/// A literal NATS subject: dot-separated non-empty tokens of printable characters without
/// wildcards (`*`, `>`) or spaces.
pub(crate) fn subject_name(written: &str) -> Result<String, String> {
    let valid = !written.is_empty()
        && written.len() <= 255
        && written.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|ch| ch.is_ascii_graphic() && ch != '*' && ch != '>')
        });
    if valid {
        Ok(written.to_owned())
    } else {
        Err(format!(
            "{written:?} is not a valid subject, use dot-separated tokens without spaces or wildcards (e.g. \"wharf.jobs\")"
        ))
    }
}

/// `http(s)://host[:port][/path][?query]`, no credentials or fragment.
pub(crate) fn backend_url(written: &str) -> Result<Url, String> {
    let shown = crate::redacted_url(written);
    let example = r#"e.g. "http://127.0.0.1:7001/handle""#;
    let url =
        Url::parse(written).map_err(|err| format!("{shown:?} is not a URL: {err} ({example})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{shown:?}: unsupported scheme {:?}, use http or https ({example})",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host ({example})"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{shown:?} must not contain credentials"));
    }
    if url.fragment().is_some() {
        return Err(format!("{shown:?} must not have a fragment"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls() {
        assert_eq!(
            nats_url("nats://nats.example:4222/"),
            Ok(("nats://nats.example:4222".to_owned(), None))
        );
        assert_eq!(
            nats_url("tls://nats.example:4222"),
            Ok(("tls://nats.example:4222".to_owned(), None))
        );
        for bad in [
            "",
            "127.0.0.1:4222",
            "ws://x:4222",
            "nats://",
            "nats://x/jobs",
            "nats://:pw@x:4222",
            "nats://:@x:4222",
            "nats://@x:4222",
            "nats://u:%FF@x:4222",
        ] {
            assert!(nats_url(bad).is_err(), "{bad:?}");
        }
    }

    /// The NATS client takes no credentials from a URL: they are separated here, decoded,
    /// and the URL kept (and logged) without them.
    #[test]
    fn nats_credentials_are_taken_out_of_the_url() {
        let user_password = |user: &str, password: &str| NatsCredentials::UserPassword {
            user: user.into(),
            password: password.into(),
        };
        for (written, credentials) in [
            (
                "nats://app:s3cret@h:4222",
                Some(user_password("app", "s3cret")),
            ),
            (
                "nats://app:p%40ss%2Fw@h:4222/",
                Some(user_password("app", "p@ss/w")),
            ),
            (
                "nats://t0ken@h:4222",
                Some(NatsCredentials::Token("t0ken".into())),
            ),
            ("nats://app:@h:4222", Some(user_password("app", ""))),
            ("nats://app:p@ss@h:4222", Some(user_password("app", "p@ss"))),
            (
                "nats://t%3Ak@h:4222",
                Some(NatsCredentials::Token("t:k".into())),
            ),
            ("nats://h:4222", None),
        ] {
            assert_eq!(
                nats_url(written),
                Ok(("nats://h:4222".to_owned(), credentials)),
                "{written}"
            );
        }
        let shown = format!("{:?}", user_password("app", "s3cret"));
        assert!(
            !shown.contains("s3cret") && shown.contains("app"),
            "{shown}"
        );
        let shown = format!("{:?}", NatsCredentials::Token("t0ken".into()));
        assert!(!shown.contains("t0ken"), "{shown}");
        let refused = nats_url("nats://:s3cret@h:4222").unwrap_err();
        assert!(!refused.contains("s3cret"), "{refused}");
    }

    #[test]
    fn more_names() {
        assert!(stream_name("WHARF_JOBS-1").is_ok());
        for bad in ["", "a.b", "a b", "a*", "a>", "a/b"] {
            assert!(stream_name(bad).is_err(), "{bad:?}");
        }
        assert!(subject_name("wharf.jobs.dead").is_ok());
        for bad in ["", "a..b", ".a", "a.", "a.*", "a.>", "a b"] {
            assert!(subject_name(bad).is_err(), "{bad:?}");
        }
        assert!(backend_url("https://h:1/x?y=1").is_ok());
        for bad in [
            "h:1/x",
            "ftp://h",
            "http://u:p@h/",
            "http://h/#f",
            "unix:/a",
        ] {
            assert!(backend_url(bad).is_err(), "{bad:?}");
        }
    }
}
