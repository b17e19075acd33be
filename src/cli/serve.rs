//! `wharf serve`: load the config, build the services, run until a signal.
//!
//! Loading ([`load`]) comes first and apart from running ([`run`]): the config's
//! `[telemetry]` table says how to log, so `main` installs telemetry in between.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::info;

use wharf::{ConfigReloader, ServerOverrides};
use wharf_config::Config;

/// Flags of `wharf serve`. Flags override only addresses; everything else
/// comes from the config file.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The TOML config; without it the embedded default runs.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides `[server] listen`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Overrides `[server] admin_listen`.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
}

/// A config ready to serve, and how long loading it took.
pub(crate) struct LoadedConfig {
    /// The validated config with the command-line overrides applied.
    pub(crate) config: Config,
    /// Start-up phase `config_load`.
    config_load: Duration,
    /// The file, when not the embedded default: what a reload re-reads.
    path: Option<PathBuf>,
    overrides: ServerOverrides,
}

/// Loads the config (the embedded default without `--config`) and applies the address
/// flags, refusing flags that give both listeners the same port. Runs before logging is set
/// up, so it logs nothing; `main` prints its error.
pub(crate) fn load(args: &ServeArgs) -> anyhow::Result<LoadedConfig> {
    let phase_started = Instant::now();
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    let overrides = ServerOverrides {
        listen: args.listen,
        admin_listen: args.admin_listen,
    };
    overrides.apply(&mut config.server)?;
    Ok(LoadedConfig {
        config,
        config_load: phase_started.elapsed(),
        path: args.config.clone(),
        overrides,
    })
}

/// Runs the host. `exec_started` is when the process began, so that the
/// logged and exported start-up time covers everything (seed 003);
/// `telemetry_init` is how long installing telemetry took (between [`load`] and this).
pub(crate) async fn run(
    loaded: LoadedConfig,
    telemetry_init: Duration,
    exec_started: Instant,
) -> anyhow::Result<()> {
    let LoadedConfig {
        config,
        config_load,
        path,
        overrides,
    } = loaded;

    // Process-wide, like the resolver it fronts; a reload reports a change as needing a
    // restart, as every `[server]` key.
    wharf_upstream::NameCache::system().set_hold(config.server.resolve_hold);
    let phase_started = Instant::now();
    let (builder, catalogue) = wharf::assemble(&config)?;
    let services_init = phase_started.elapsed();

    let metrics = builder.metrics().clone();
    // The twins' origin stays up as long as their calls run again (`keep_warm`).
    let (warm_up, _twins_origin) = warm_up(&builder, &config).await;
    let preconnect = preconnect(&builder, &catalogue).await;
    let host = builder.bind().await.context("cannot start")?;
    // Before "wharf listening": whoever reads that line may signal at once.
    let signals = shutdown_signals();
    let shutdown = {
        let signals = signals.clone();
        async move {
            nth_signal(signals, 1).await;
            info!("shutdown signal received");
        }
    };
    // An operator who signals again (Ctrl-C twice) does not want to wait out
    // `shutdown_timeout`, nor to need kill -9: the second signal ends the drain.
    let cut = {
        let signals = signals.clone();
        async move {
            nth_signal(signals, 2).await;
            info!("second shutdown signal: ending the drain");
        }
    };
    let reloader = path.map(|path| {
        let reloader = ConfigReloader::new(path, &config, catalogue, host.reloader(), overrides);
        host.on_reload(reloader.hook());
        reloader
    });
    reload_on_sighup(reloader);
    let ready = exec_started.elapsed();
    metrics.startup_phase("config_load", config_load.as_secs_f64());
    metrics.startup_phase("telemetry_init", telemetry_init.as_secs_f64());
    metrics.startup_phase("services_init", services_init.as_secs_f64());
    metrics.startup_phase("warm_up", warm_up.as_secs_f64());
    metrics.startup_phase("preconnect", preconnect.as_secs_f64());
    metrics.startup_phase("exec_to_ready", ready.as_secs_f64());
    info!(
        addr = %host.local_addr(),
        admin = %host.admin_addr(),
        config = %config.origin,
        config_load_ms = config_load.as_secs_f64() * 1e3,
        telemetry_init_ms = telemetry_init.as_secs_f64() * 1e3,
        services_init_ms = services_init.as_secs_f64() * 1e3,
        warm_up_ms = warm_up.as_secs_f64() * 1e3,
        preconnect_ms = preconnect.as_secs_f64() * 1e3,
        exec_to_ready_ms = ready.as_secs_f64() * 1e3,
        "wharf listening"
    );
    let summary = host.run_until_cut(shutdown, cut).await;
    if summary.cut_short {
        tracing::warn!(
            calls_cut = summary.calls_cut,
            ended_by = "second_signal",
            "second shutdown signal ended the drain; calls cut"
        );
    } else if summary.calls_cut > 0 {
        tracing::warn!(
            calls_cut = summary.calls_cut,
            ended_by = "shutdown_timeout",
            "shutdown_timeout reached; calls cut"
        );
    }
    stop_queue_deliverers(summary.shutdown_left, signals).await;
    Ok(())
}

/// How soon after the first shutdown signal another one counts as a second request (one
/// that ends the drain) rather than the same one delivered twice.
const SAME_REQUEST: Duration = Duration::from_secs(1);

/// Least time given to queue deliverers at exit, even when the drain used all of
/// `shutdown_timeout`: enough for a held message's hand-back (two broker round trips).
const QUEUE_STOP_MIN: Duration = Duration::from_secs(2);

/// Stops the queue services' deliverers once the host has drained, and waits for them
/// (what is left of `shutdown_timeout`, at least [`QUEUE_STOP_MIN`]): the runtime ends when
/// `serve` returns, and a message held for a backend that is down must be handed back to
/// the broker before, or the next wharf waits `ack_wait` for it.
///
/// A second shutdown signal cuts that wait to [`QUEUE_STOP_MIN`] from it, as it cuts the
/// drain: deliveries still waiting for a backend are left (their messages come back after
/// `ack_wait`).
async fn stop_queue_deliverers(left: Duration, signals: watch::Receiver<u32>) {
    let within = left.max(QUEUE_STOP_MIN);
    let started = Instant::now();
    let cut = async {
        nth_signal(signals, 2).await;
        tokio::time::sleep(QUEUE_STOP_MIN).await;
    };
    let running = tokio::select! {
        biased;
        running = wharf_queue::stop_deliverers(within) => running,
        () = cut => {
            tracing::warn!("second shutdown signal: not waiting for the queue deliverers still running");
            return;
        }
    };
    if running == 0 {
        tracing::debug!(
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "queue deliverers stopped"
        );
    } else {
        tracing::warn!(
            running,
            ?within,
            "queue deliverers still running at exit; their messages come back after ack_wait"
        );
    }
}

/// Opens the connections the services open ahead (`preconnect`, `preconnect_origins`) on
/// each core before the listeners are bound, waiting at most
/// [`wharf::catalogue::PRECONNECT_WAIT`]; returns how long it waited.
async fn preconnect(host: &wharf_host::HostBuilder, catalogue: &wharf::Catalogue) -> Duration {
    let Some(work) = catalogue.preconnect_work(|_| true) else {
        return Duration::ZERO;
    };
    let report = host
        .on_each_core(&work, wharf::catalogue::PRECONNECT_WAIT)
        .await;
    wharf::catalogue::log_preconnect(&report);
    report.elapsed
}

/// Warms the host and a twin of each service type up (seed 000, `wharf::warm_up`) before
/// the listeners are bound; returns how long it took, and, with `keep_warm` set, the
/// twins' origin (their calls run again while the host runs: keep it as long). A failed
/// warm-up call is a warning: the first client's call then pays for what it would have done.
async fn warm_up(
    host: &wharf_host::HostBuilder,
    config: &Config,
) -> (Duration, Option<wharf_testbed::TestbedHandle>) {
    let (plan, origin) = wharf::warm_up::plan(config).await;
    let report = host.warm_up(plan).await;
    let origin = origin.filter(|_| config.server.keep_warm.is_some());
    if !report.failed.is_empty() {
        tracing::warn!(
            failed = ?report.failed,
            "start-up warm-up: calls failed; the first calls pay for it"
        );
    }
    tracing::debug!(calls = report.calls, "start-up warm-up done");
    (report.elapsed, origin)
}

/// Reloads the config on every SIGHUP, or logs that there is nothing to reload when
/// no file was given (the handler is installed now, so a SIGHUP right after start-up
/// is not fatal).
fn reload_on_sighup(reloader: Option<Arc<ConfigReloader>>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // Watched with or without a file: SIGHUP's default action ends the
        // process, and log rotators send it to whatever runs.
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => {
                tokio::spawn(async move {
                    while hangup.recv().await.is_some() {
                        let Some(reloader) = &reloader else {
                            info!("SIGHUP: nothing to reload (the embedded default runs); ignored");
                            continue;
                        };
                        info!("SIGHUP: reloading the config");
                        // reload() logs both outcomes; a refusal keeps the old config.
                        let _ = reloader.reload().await;
                    }
                });
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot watch SIGHUP; use POST /reload on the admin listener");
            }
        }
    }
    #[cfg(not(unix))]
    drop(reloader);
}

/// Counts SIGINT and SIGTERM from this call on: the receiver holds how many arrived. One
/// watch for both the start of the drain (the first) and its end (the second, see
/// [`run`]), so that a signal is counted once whichever of them is waiting. The handlers
/// are installed here, not at the first poll: a signal sent as soon as "wharf listening"
/// is logged must stop wharf cleanly, not kill it (default action). Call it inside the
/// runtime.
fn shutdown_signals() -> watch::Receiver<u32> {
    let (count, counted) = watch::channel(0);
    // A signal within SAME_REQUEST of the first is the same request: Ctrl-C reaches
    // every process of the terminal's group, so a supervisor (a shell script, an init
    // such as tini) that forwards it makes two signals at once.
    let mut first_at: Option<Instant> = None;
    let mut counts = move || {
        let now = Instant::now();
        match first_at {
            Some(first) if now.duration_since(first) < SAME_REQUEST => {
                tracing::debug!("shutdown signal right after the first: the same request");
                return;
            }
            Some(_) => {}
            None => first_at = Some(now),
        }
        count.send_modify(|count| *count += 1);
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind, name: &'static str| {
            signal(kind)
                .inspect_err(|error| {
                    tracing::warn!(signal = name, error = %error, "cannot watch signal; it does not stop wharf");
                })
                .ok()
        };
        let mut interrupt = install(SignalKind::interrupt(), "SIGINT");
        let mut terminate = install(SignalKind::terminate(), "SIGTERM");
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = recv_or_pending(interrupt.as_mut()) => {}
                    () = recv_or_pending(terminate.as_mut()) => {}
                }
                counts();
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            counts();
        }
    });
    counted
}

/// The next signal of `signal`; never, when it is not watched or its driver is gone (the
/// loop above would spin on a closed stream).
#[cfg(unix)]
async fn recv_or_pending(signal: Option<&mut tokio::signal::unix::Signal>) {
    if let Some(signal) = signal {
        if signal.recv().await.is_some() {
            return;
        }
    }
    std::future::pending::<()>().await;
}

/// Resolves once `signals` has counted `nth` shutdown signals (at once if it has already).
async fn nth_signal(mut signals: watch::Receiver<u32>, nth: u32) {
    if signals.wait_for(|count| *count >= nth).await.is_err() {
        // The counting task is gone (the runtime is shutting down): never.
        std::future::pending::<()>().await;
    }
}

/// Resolves on the first SIGINT or SIGTERM after this call (see [`shutdown_signals`]).
/// Call it inside the runtime.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let signals = shutdown_signals();
    async move {
        nth_signal(signals, 1).await;
        info!("shutdown signal received");
    }
}
