//! The broker side: connecting to NATS, and creating the stream and the durable pull
//! consumer a queue needs, checked against nats-server 2.9 (no 2.10+ API is used).

use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use async_nats::Client;
use tracing::{debug, info, warn};
use wharf_config::{NatsCredentials, QueueConfig};

use crate::stop::Stop;

/// Bound of the first try to connect to the broker (name lookup, TCP connect, the broker's
/// first words, TLS); doubled after each try that runs out, up to [`MAX_CONNECT_TRY_BOUND`],
/// so a slow resolver or a distant broker still gets through.
const CONNECT_TRY_BOUND: Duration = Duration::from_secs(3);
/// Longest bound of one try to connect.
const MAX_CONNECT_TRY_BOUND: Duration = Duration::from_secs(30);
/// Longest pause between two tries to connect, and between two attempts to set the stream
/// and consumer up.
const MAX_SETUP_PAUSE: Duration = Duration::from_secs(5);

/// A connected client and what was set up with it.
#[derive(Clone)]
pub(crate) struct Ready {
    pub(crate) client: Client,
    pub(crate) jetstream: Context,
}

/// The durable consumer's name for service `service`.
pub(crate) fn consumer_name(service: &str) -> String {
    format!("wharf_{service}")
}

/// Connects and builds the JetStream context. A broker that cannot be reached is not an
/// error: each failed try is a warning with its cause (TLS that does not verify, credentials
/// refused, nothing listening, no answer within the try's bound), and the next comes after a
/// pause doubling from 100 ms to [`MAX_SETUP_PAUSE`], until one connects; the caller stops
/// it with the service.
pub(crate) async fn connect(service: &str, config: &QueueConfig) -> Ready {
    // The tries are wharf's, not async-nats's own initial retries: those report a failure at
    // `info` by its error kind only (an unverified certificate is an "IO error"; the cause
    // is at `debug`), and are not bounded past the TCP connect, so a broker that accepts and
    // never speaks (a black hole behind a proxy) would hold them for ever. Once connected,
    // reconnecting is the client's (with that same limit: docs/configuration.md).
    let mut pause = Duration::from_millis(100);
    let mut bound = CONNECT_TRY_BOUND;
    let client = loop {
        let tried = tokio::time::timeout(
            bound,
            connect_options(service, config).connect(config.nats_url.as_str()),
        )
        .await;
        let error = match tried {
            Ok(Ok(client)) => break client,
            Ok(Err(error)) => error.to_string(),
            Err(_elapsed) => {
                let error = format!("no answer within {bound:?}");
                bound = (bound * 2).min(MAX_CONNECT_TRY_BOUND);
                error
            }
        };
        warn!(
            service,
            url = config.nats_url,
            error,
            retry_in = ?pause,
            "queue broker not connected; trying again"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_SETUP_PAUSE);
    };
    let jetstream = jetstream::ContextBuilder::new()
        .timeout(config.publish_timeout)
        // Wait for an in-flight slot rather than fail: the publish as a whole is bounded
        // by `publish_timeout`.
        .backpressure_on_inflight(true)
        .build(client.clone());
    Ready { client, jetstream }
}

/// The client's options for `service`: its name, events logged, timeouts, TLS and
/// credentials.
fn connect_options(service: &str, config: &QueueConfig) -> async_nats::ConnectOptions {
    let (service_name, url) = (service.to_owned(), config.nats_url.clone());
    let options = async_nats::ConnectOptions::new()
        .name(format!("wharf {service}"))
        // The client's own events name neither the service nor the broker. After a
        // disconnect (a warning here) its failed reconnects are `debug` events, every few
        // seconds.
        .event_callback(move |event| {
            let (service, url) = (service_name.clone(), url.clone());
            async move {
                match event {
                    async_nats::Event::Connected => info!(service, url, "queue broker connected"),
                    async_nats::Event::Disconnected => {
                        warn!(service, url, "queue broker disconnected; reconnecting")
                    }
                    event => debug!(service, url, event = %event, "queue broker client event"),
                }
            }
        })
        // `tls://`: TLS required, never a plain connection (async-nats reads the scheme
        // too; this does not leave it to the URL alone).
        .require_tls(config.nats_url.starts_with("tls://"))
        .connection_timeout(Duration::from_secs(2))
        .request_timeout(Some(config.publish_timeout));
    // The system's roots verify the broker's certificate unless `nats_ca_file` names others
    // (async-nats reads the file at each connect; the config checked it holds certificates).
    let options = match &config.nats_ca_file {
        Some(ca_file) => options.add_root_certificates(ca_file.clone()),
        None => options,
    };
    // async-nats reads no credentials from the URL (0.46 sends only those set here), so the
    // config keeps them apart from `nats_url`, which is then safe to log.
    match &config.nats_credentials {
        None => options,
        Some(NatsCredentials::UserPassword { user, password }) => {
            options.user_and_password(user.clone(), password.clone())
        }
        Some(NatsCredentials::Token(token)) => options.token(token.clone()),
    }
}

/// Creates (or finds) the stream and the durable consumer, retrying until it works or
/// `stop` fires.
pub(crate) async fn set_up(
    ready: &Ready,
    service: &str,
    config: &QueueConfig,
    stop: &mut Stop,
) -> Option<PullConsumer> {
    let mut pause = Duration::from_millis(100);
    // Whether the dead-letter subject's stream was looked for: once per set-up, not at
    // every retry.
    let mut dead_letters_checked = false;
    loop {
        match try_set_up(&ready.jetstream, service, config, &mut dead_letters_checked).await {
            Ok(consumer) => {
                info!(
                    service,
                    stream = config.stream,
                    subject = config.subject,
                    "queue stream and consumer ready"
                );
                return Some(consumer);
            }
            Err(error) => {
                warn!(
                    service,
                    url = config.nats_url,
                    stream = config.stream,
                    error = %error,
                    "queue set-up failed; retrying"
                );
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.stopped() => return None,
        }
        pause = (pause * 2).min(MAX_SETUP_PAUSE);
    }
}

async fn try_set_up(
    jetstream: &Context,
    service: &str,
    config: &QueueConfig,
    dead_letters_checked: &mut bool,
) -> Result<PullConsumer, async_nats::Error> {
    // File storage: what the broker acknowledged survives a broker restart. Work-queue
    // retention: a message is removed once acknowledged (or terminated after being
    // dead-lettered). The dead-letter subject is captured too, so dead letters are kept
    // (no consumer reads them; operators can add one).
    let stream = jetstream
        .get_or_create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![
                config.subject.clone(),
                config.deliver.dead_letter_subject.clone(),
            ],
            storage: StorageType::File,
            retention: RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let name = consumer_name(service);
    let consumer_config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(format!("wharf queue service {service}")),
        filter_subject: config.subject.clone(),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: config.deliver.ack_wait,
        // wharf counts attempts itself (a backend that is down does not use them up) and
        // dead-letters; the broker must never silently stop redelivering.
        max_deliver: -1,
        max_ack_pending: i64::try_from(config.deliver.concurrency.saturating_mul(4))
            .unwrap_or(i64::MAX)
            .max(64),
        ..Default::default()
    };
    let dead_subject = &config.deliver.dead_letter_subject;
    // A stream that captures it by name needs no lookup (wharf's own always does).
    if !*dead_letters_checked && !stream.cached_info().config.subjects.contains(dead_subject) {
        warn_if_dead_letters_are_not_kept(jetstream, service, config).await;
    }
    *dead_letters_checked = true;
    // Create, or update an existing durable consumer's editable settings (ack_wait, ...).
    match stream.create_consumer(consumer_config.clone()).await {
        Ok(consumer) => Ok(consumer),
        Err(error) => {
            // An existing consumer whose settings cannot be changed in place: use it, if
            // it delivers as the deliverers count on.
            let consumer: PullConsumer = stream.get_consumer(&name).await?;
            let found = &consumer.cached_info().config;
            match unusable_consumer(found, &consumer_config) {
                Some(why) => Err(format!(
                    "consumer {name} of stream {} {why}, and cannot be updated ({error}): \
                     delete it (e.g. `nats consumer rm {} {name}`) and wharf makes it again",
                    config.stream, config.stream
                )
                .into()),
                None => {
                    warn!(service, consumer = name, error = %error, "consumer not updated; using it as it is");
                    Ok(consumer)
                }
            }
        }
    }
}

/// Why an existing consumer, found with `found` settings, cannot serve the deliverers,
/// which need `wanted`'s: `None` if it can. The deliverers count attempts and dead-letter
/// themselves, so a consumer on which the broker stops redelivering (`max_deliver`) would
/// leave a message unacknowledged, unseen and never dead-lettered; one without explicit
/// acks, or filtering another subject, would lose messages or deliver others.
fn unusable_consumer(found: &consumer::Config, wanted: &pull::Config) -> Option<String> {
    if found.max_deliver > 0 {
        return Some(format!(
            "has max_deliver = {} (wharf needs no limit: it counts attempts itself)",
            found.max_deliver
        ));
    }
    if found.ack_policy != wanted.ack_policy {
        return Some(format!(
            "has ack_policy {:?} (wharf needs {:?})",
            found.ack_policy, wanted.ack_policy
        ));
    }
    if found.filter_subject != wanted.filter_subject {
        return Some(format!(
            "filters {:?} (wharf needs {:?})",
            found.filter_subject, wanted.filter_subject
        ));
    }
    None
}

/// Warns when no stream captures the dead-letter subject (a stream made beforehand without
/// it): dead letters are then published to whoever listens at that moment, and kept by no
/// one. Only a warning: the stream is the operator's, and a lookup that fails says nothing.
async fn warn_if_dead_letters_are_not_kept(
    jetstream: &Context,
    service: &str,
    config: &QueueConfig,
) {
    let subject = config.deliver.dead_letter_subject.as_str();
    match jetstream.stream_by_subject(subject).await {
        Ok(_) => {}
        Err(error) if error.kind() == GetStreamByNameErrorKind::NotFound => warn!(
            service,
            subject,
            "no stream captures the dead-letter subject: dead letters will reach only the \
             subscribers of the moment; add the subject to a stream's subjects"
        ),
        Err(error) => debug!(service, subject, error = %error, "dead-letter stream not looked up"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_that_limits_deliveries_or_filters_elsewhere_is_unusable() {
        let wanted = pull::Config {
            filter_subject: "jobs".into(),
            ack_policy: AckPolicy::Explicit,
            max_deliver: -1,
            ..Default::default()
        };
        let found = |edit: fn(&mut consumer::Config)| {
            let mut config = consumer::Config {
                filter_subject: "jobs".into(),
                ack_policy: AckPolicy::Explicit,
                max_deliver: -1,
                ..Default::default()
            };
            edit(&mut config);
            unusable_consumer(&config, &wanted)
        };
        assert_eq!(found(|_| {}), None);
        assert_eq!(
            found(|c| c.max_deliver = 0),
            None,
            "0 is the broker's default: no limit"
        );
        assert!(found(|c| c.max_deliver = 5).is_some_and(|why| why.contains("max_deliver = 5")));
        assert!(
            found(|c| c.ack_policy = AckPolicy::None).is_some_and(|why| why.contains("ack_policy"))
        );
        assert!(found(|c| c.filter_subject = "other".into())
            .is_some_and(|why| why.contains("\"other\"")));
    }
}
