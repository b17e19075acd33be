//! Live reload: re-read the config file, validate it, and swap services,
//! routes, backends and limits without dropping a connection or a call.
//! An invalid file is refused with the reason and the old config stays.
//! Services built anew open the connections they open ahead (`preconnect`)
//! on every core before they are swapped in.
//!
//! `[server]` settings (listeners, session limits) belong to sockets that
//! are already open: a change there is reported as needing a restart and
//! is not applied.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;
use tracing::{info, warn};
use wharf_config::{Config, ServerConfig};
use wharf_host::admin::ReloadHook;
use wharf_host::Reloader;

use crate::catalogue::{log_preconnect, Catalogue, PRECONNECT_WAIT};

/// Reloads one host from one config file.
pub struct ConfigReloader {
    path: PathBuf,
    reloader: Reloader,
    /// The `[server]` table in force and the services built from the
    /// last good config; one reload at a time.
    state: Mutex<(ServerConfig, Catalogue)>,
    /// Addresses given on the command line override the file's, now and
    /// after every reload.
    overrides: ServerOverrides,
}

/// Command-line overrides of `[server]` keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOverrides {
    /// `--listen`.
    pub listen: Option<std::net::SocketAddr>,
    /// `--admin-listen`.
    pub admin_listen: Option<std::net::SocketAddr>,
}

impl ServerOverrides {
    /// Applies the overrides to `server`, refusing them when they give both listeners the
    /// same port (the file's own addresses were checked when it was validated).
    pub fn apply(&self, server: &mut ServerConfig) -> Result<(), ListenerClash> {
        if let Some(listen) = self.listen {
            server.listen = listen;
        }
        if let Some(admin_listen) = self.admin_listen {
            server.admin_listen = admin_listen;
        }
        let overridden = self.listen.is_some() || self.admin_listen.is_some();
        if overridden && server.listeners_collide() {
            return Err(ListenerClash {
                listen: server.listen,
                admin_listen: server.admin_listen,
                listen_from: match self.listen {
                    Some(_) => "--listen",
                    None => "server.listen",
                },
                admin_from: match self.admin_listen {
                    Some(_) => "--admin-listen",
                    None => "server.admin_listen",
                },
            });
        }
        Ok(())
    }
}

/// The address flags give the service and admin listeners the same port.
#[derive(Debug, thiserror::Error)]
#[error(
    "{listen_from} {listen} and {admin_from} {admin_listen} take the same port, \
     give the admin listener its own address"
)]
pub struct ListenerClash {
    /// The service listener's address, after the overrides.
    pub listen: std::net::SocketAddr,
    /// The admin listener's address, after the overrides.
    pub admin_listen: std::net::SocketAddr,
    /// Where `listen` came from: `--listen` or `server.listen`.
    pub listen_from: &'static str,
    /// Where `admin_listen` came from: `--admin-listen` or `server.admin_listen`.
    pub admin_from: &'static str,
}

impl ConfigReloader {
    /// A reloader for the host started from `current` (read from `path`).
    pub fn new(
        path: PathBuf,
        current: &Config,
        catalogue: Catalogue,
        reloader: Reloader,
        overrides: ServerOverrides,
    ) -> Arc<Self> {
        Arc::new(Self {
            path,
            reloader,
            state: Mutex::new((current.server.clone(), catalogue)),
            overrides,
        })
    }

    /// Re-reads the file and applies it; `Err` says why it was refused.
    pub async fn reload(&self) -> Result<String, String> {
        let mut state = self.state.lock().await;
        let path = self.path.clone();
        let loaded = tokio::task::spawn_blocking(move || Config::load(&path))
            .await
            .map_err(|error| format!("reload task failed: {error}"))?;
        let mut config = match loaded {
            Ok(config) => config,
            Err(error) => {
                warn!(error = %error, "reload refused; the running config stays");
                return Err(error.to_string());
            }
        };
        if let Err(error) = self.overrides.apply(&mut config.server) {
            warn!(error = %error, "reload refused; the running config stays");
            return Err(error.to_string());
        }
        let mut set = self.reloader.service_set();
        let (catalogue, rebuilt) = Catalogue::mount_all(&config, &mut set, Some(&state.1))
            .map_err(|error| {
                warn!(error = %error, "reload refused; the running config stays");
                error.to_string()
            })?;
        // The services built anew open their connections ahead before they take calls.
        if let Some(work) =
            catalogue.preconnect_work(|name| rebuilt.built.iter().any(|built| built == name))
        {
            let report = self.reloader.on_each_core(&work, PRECONNECT_WAIT).await;
            log_preconnect(&report);
        }
        self.reloader.replace(set);
        let restart = server_changes(&state.0, &config.server);
        state.1 = catalogue;
        let mut summary = format!(
            "{}: built {:?}, kept {:?}",
            config.origin, rebuilt.built, rebuilt.kept
        );
        if !restart.is_empty() {
            summary.push_str(&format!("; [server] {restart:?} changed: restart to apply"));
            warn!(keys = ?restart, "[server] changes need a restart");
        }
        info!(built = ?rebuilt.built, kept = ?rebuilt.kept, "config reloaded");
        Ok(summary)
    }

    /// The reload as an admin `POST /reload` hook.
    pub fn hook(self: &Arc<Self>) -> ReloadHook {
        let this = self.clone();
        Arc::new(move || {
            let this = this.clone();
            Box::pin(async move { this.reload().await })
        })
    }
}

/// `[server]` keys whose value differs (they need a restart).
fn server_changes(old: &ServerConfig, new: &ServerConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |key: &'static str, differs: bool| {
        if differs {
            changed.push(key);
        }
    };
    check("listen", old.listen != new.listen);
    check("admin_listen", old.admin_listen != new.admin_listen);
    check(
        "max_connections",
        old.max_connections != new.max_connections,
    );
    check(
        "header_read_timeout",
        old.header_read_timeout != new.header_read_timeout,
    );
    check(
        "max_header_bytes",
        old.max_header_bytes != new.max_header_bytes,
    );
    check("idle_timeout", old.idle_timeout != new.idle_timeout);
    check(
        "shutdown_timeout",
        old.shutdown_timeout != new.shutdown_timeout,
    );
    check("cpu_steering", old.cpu_steering != new.cpu_steering);
    check("busy_poll_us", old.busy_poll != new.busy_poll);
    check("keep_warm", old.keep_warm != new.keep_warm);
    check("splice_bodies", old.splice_bodies != new.splice_bodies);
    check("resolve_hold", old.resolve_hold != new.resolve_hold);
    check("tls_cert/tls_key", old.tls != new.tls);
    check("listen_unix", old.listen_unix != new.listen_unix);
    check("admin_token", old.admin_token != new.admin_token);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(keys: &str) -> ServerConfig {
        let text =
            format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{keys}");
        Config::from_toml_str(&text, "test.toml")
            .unwrap_or_else(|error| panic!("{error}"))
            .server
    }

    #[test]
    fn address_flags_are_checked_against_each_other_and_the_file() {
        let flags = |listen: Option<&str>, admin_listen: Option<&str>| ServerOverrides {
            listen: listen.map(|a| a.parse().unwrap()),
            admin_listen: admin_listen.map(|a| a.parse().unwrap()),
        };
        let clash = |overrides: ServerOverrides| {
            let mut server = ServerConfig::default();
            overrides
                .apply(&mut server)
                .map_err(|error| error.to_string())
        };
        assert_eq!(
            clash(flags(Some("127.0.0.1:7000"), Some("127.0.0.1:7000"))).unwrap_err(),
            "--listen 127.0.0.1:7000 and --admin-listen 127.0.0.1:7000 take the same port, \
             give the admin listener its own address"
        );
        // The default admin_listen is 127.0.0.1:9901.
        assert_eq!(
            clash(flags(Some("0.0.0.0:9901"), None)).unwrap_err(),
            "--listen 0.0.0.0:9901 and server.admin_listen 127.0.0.1:9901 take the same port, \
             give the admin listener its own address"
        );
        assert!(clash(flags(Some("127.0.0.1:0"), Some("127.0.0.1:0"))).is_ok());
        assert!(clash(flags(Some("127.0.0.1:7000"), None)).is_ok());
        assert!(clash(flags(None, None)).is_ok());
    }

    #[test]
    fn every_server_key_a_reload_cannot_apply_is_named() {
        let before = server("");
        assert_eq!(server_changes(&before, &server("")), Vec::<&str>::new());
        // The addresses are set by the table above, and the TLS files must exist to be
        // checked; every other key, one at a time.
        for (line, key) in [
            ("max_connections = 7", "max_connections"),
            ("header_read_timeout = \"1s\"", "header_read_timeout"),
            ("max_header_bytes = \"16KiB\"", "max_header_bytes"),
            ("idle_timeout = \"1s\"", "idle_timeout"),
            ("shutdown_timeout = \"1s\"", "shutdown_timeout"),
            ("cpu_steering = true", "cpu_steering"),
            ("busy_poll_us = 50", "busy_poll_us"),
            ("keep_warm = \"200ms\"", "keep_warm"),
            ("splice_bodies = true", "splice_bodies"),
            ("resolve_hold = \"1m\"", "resolve_hold"),
            ("listen_unix = \"/tmp/wharf-reload.sock\"", "listen_unix"),
            ("admin_token = \"0123456789abcdef\"", "admin_token"),
        ] {
            let after = server(&format!("{line}\n"));
            assert_eq!(server_changes(&before, &after), [key], "{line}");
        }
    }
}
