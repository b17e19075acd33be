//! The open-files budget: how many sessions this process can hold without
//! running out of file descriptors.
//!
//! A proxied HTTP/1.1 call holds two descriptors, the client's connection and
//! the upstream one. With `max_connections` above half the process's open-files
//! limit, the calls beyond it would not wait: their upstream connect fails with
//! EMFILE and the client gets a 502 (issue 4's 10000-slow run, before this
//! module). So, as HAProxy derives `maxconn` from `ulimit -n`, the host raises
//! its soft limit to the hard one at start and caps the sessions it accepts to
//! what the limit allows; connections beyond that wait in the kernel's accept
//! queue, as they do beyond `max_connections` (SPEC §2), and a warning at start
//! says so. HTTP/2 sessions can carry many calls each; those are bounded by the
//! services' bulkheads, not by this budget.
//!
//! Idle upstream connections hold descriptors too: they borrow them from the
//! process's open-files ledger (`wharf_limits::descriptors`), which this
//! module gives the limit and the reserve, and which recalls them as sessions
//! need them.
//!
//! Main items: [`session_limit`] (what the host uses), [`sessions_within`]
//! (the arithmetic, pure).

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tracing::{info, warn};
use wharf_limits::descriptors::{self, DescriptorLedger};

use crate::h1::pipes::SPLICE_PIPE_FDS;

/// Descriptors kept out of the session budget whatever the config: listeners, the runtime's
/// epoll and wake-up fds, stdio, log files, Redis and NATS connections, health probes, and a
/// margin for files opened while serving (TLS keys on reload); and the cache's sealed body
/// files, at most `wharf_cache::MAX_SEALED_FILES` (the host does not depend on the cache; a
/// test of wharf-proxy, which uses both, holds the two equal). A proxy service may come with a
/// reload, so room for its files is kept even when none is configured.
const ALWAYS_RESERVED_FDS: u64 = 128 + SEALED_BODY_FDS;

/// Descriptors kept out of the session budget: [`ALWAYS_RESERVED_FDS`], and with
/// `server.splice_bodies` the pipes that splice response bodies. Without it no pipe is ever
/// opened, and `[server]` changes need a restart, so their share goes to sessions (64 more
/// on a limit of 20,000).
pub(crate) fn reserved_fds(splice_bodies: bool) -> u64 {
    if splice_bodies {
        ALWAYS_RESERVED_FDS + SPLICE_PIPE_FDS
    } else {
        ALWAYS_RESERVED_FDS
    }
}

/// Descriptors the cache's sealed body files may hold.
pub const SEALED_BODY_FDS: u64 = 128;

/// Descriptors one session may hold at once: its own and one upstream.
pub(crate) const FDS_PER_SESSION: u64 = descriptors::FDS_PER_SESSION as u64;

/// The sessions to admit at once: `configured` (`max_connections`), lowered
/// to what the open-files limit allows after raising the soft limit to the
/// hard one, beside the descriptors reserved (`splice_bodies`: see
/// [`reserved_fds`]). Logs a warning when it lowers the value.
pub(crate) fn session_limit(configured: usize, splice_bodies: bool) -> usize {
    let limit = raise_nofile_limit();
    let reserved = reserved_fds(splice_bodies);
    DescriptorLedger::process().set_limit(limit, reserved);
    let effective = sessions_within(configured, limit, reserved);
    if effective < configured {
        warn!(
            max_connections = configured,
            open_files_limit = limit.unwrap_or(u64::MAX),
            sessions = effective,
            "max_connections is above what the open-files limit allows (2 per proxied call \
             + {reserved} reserved): admitting at most this many sessions at once, \
             the rest wait in the accept queue; raise `ulimit -n` to admit more"
        );
    } else if let Some(limit) = limit {
        info!(
            open_files_limit = limit,
            sessions = effective,
            "open-files limit fits max_connections"
        );
    }
    effective
}

/// The sessions that fit an open-files limit (`None`: unlimited) beside `reserved`
/// descriptors, never more than `configured` and never fewer than one.
pub(crate) fn sessions_within(
    configured: usize,
    open_files_limit: Option<u64>,
    reserved: u64,
) -> usize {
    let Some(limit) = open_files_limit else {
        return configured.max(1);
    };
    let fit = limit.saturating_sub(reserved) / FDS_PER_SESSION;
    let fit = usize::try_from(fit).unwrap_or(usize::MAX);
    configured.min(fit).max(1)
}

/// Raises the soft open-files limit to the hard one and returns the soft
/// limit now in force (`None`: unlimited). Not being allowed to raise it is
/// not an error: the budget is then computed from the current soft limit.
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_fit_the_open_files_limit() {
        // (configured, limit, splice_bodies, expected)
        let cases = [
            (10_000, None, false, 10_000),
            (10_000, Some(1_048_576), false, 10_000),
            // issue 4's machine: a hard limit of 20000 holds 9872 proxied calls, 9808 when
            // the splice pipes are reserved too
            (10_000, Some(20_000), false, 9_872),
            (20_000, Some(20_000), false, 9_872),
            (10_000, Some(20_000), true, 9_808),
            (100, Some(1024), false, 100),
            (10_000, Some(1024), false, 384),
            (10_000, Some(1024), true, 320),
            // a limit below the reserve still admits one session
            (10_000, Some(64), false, 1),
            (10_000, Some(64), true, 1),
            (0, None, true, 1),
        ];
        for (configured, limit, splice_bodies, expected) in cases {
            assert_eq!(
                sessions_within(configured, limit, reserved_fds(splice_bodies)),
                expected,
                "max_connections {configured}, limit {limit:?}, splice_bodies {splice_bodies}"
            );
        }
    }

    #[test]
    fn raising_the_limit_never_lowers_it() {
        let before = getrlimit(Resource::Nofile).current;
        let after = raise_nofile_limit();
        match (before, after) {
            (Some(before), Some(after)) => assert!(after >= before, "{before} -> {after}"),
            (None, after) => assert_eq!(after, None),
            (Some(_), None) => {}
        }
    }
}
