//! `wharf serve`: load the config, build the services, run until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use tracing::info;
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

/// Runs the host. `exec_started` is when the process began, so that the
/// logged and exported start-up time covers everything (seed 003).
pub(crate) async fn run(args: ServeArgs, exec_started: Instant) -> anyhow::Result<()> {
    let phase_started = Instant::now();
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(admin_listen) = args.admin_listen {
        config.server.admin_listen = admin_listen;
    }
    let config_load = phase_started.elapsed();

    let phase_started = Instant::now();
    let builder = wharf::build_host(&config)?;
    let services_init = phase_started.elapsed();

    let metrics = builder.metrics().clone();
    let host = builder.bind().await.context("cannot start")?;
    let ready = exec_started.elapsed();
    metrics.startup_phase("config_load", config_load.as_secs_f64());
    metrics.startup_phase("services_init", services_init.as_secs_f64());
    metrics.startup_phase("exec_to_ready", ready.as_secs_f64());
    info!(
        addr = %host.local_addr(),
        admin = %host.admin_addr(),
        config = %config.origin,
        config_load_ms = config_load.as_secs_f64() * 1e3,
        services_init_ms = services_init.as_secs_f64() * 1e3,
        exec_to_ready_ms = ready.as_secs_f64() * 1e3,
        "wharf listening"
    );
    let summary = host.run(shutdown_signal()).await;
    if summary.calls_cut > 0 {
        tracing::warn!(calls_cut = summary.calls_cut, "shutdown_timeout reached; calls cut");
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot watch SIGTERM; only SIGINT stops wharf");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    info!("shutdown signal received");
}
