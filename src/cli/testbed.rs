//! `wharf testbed`: run the seed backends on an address until Ctrl-C/SIGTERM.
//!
//! The endpoints themselves live in the `wharf-testbed` crate; this only binds, announces the
//! address (log and stdout, for scripts) and stops on a signal.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use tracing::info;

use super::serve::shutdown_signal;

/// Serves the testbed on `listen` until SIGINT or SIGTERM, then exits cleanly (open
/// connections get `wharf_testbed::SHUTDOWN_GRACE` to finish).
pub(crate) async fn run(listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let listener = wharf_testbed::bind(listen)
        .with_context(|| format!("testbed: cannot listen on {listen}"))?;
    let addr: SocketAddr = listener
        .local_addr()
        .context("testbed: reading the bound address")?;
    info!(addr = %addr, "testbed listening");
    // Scripts read this line to learn the port (e.g. with --listen 127.0.0.1:0).
    {
        // Scoped, not dropped by hand: the lock must not live across the `await` below.
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "testbed listening on http://{addr}")
            .and_then(|()| stdout.flush())
            .context("testbed: writing the address to stdout")?;
    }
    wharf_testbed::serve(listener, shutdown_signal())
        .await
        .context("testbed: serving")?;
    info!("testbed stopped");
    Ok(())
}
