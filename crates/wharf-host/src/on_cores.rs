//! Start-up work done once on each of the data plane's cores before the port listens: what a
//! core's first calls should find ready, such as the upstream connections a service opens
//! ahead (`preconnect`, seed 000: a first call that also has to connect).
//!
//! Each core keeps its own idle upstream connections (`wharf_upstream::PoolShards`), read
//! through its own runtime's epoll, so such work has to run on the core itself, not on the
//! runtime that builds the host. What the work does is the service's; the host runs it on
//! every core side by side, waits a bounded time, and reports what went wrong once.
//!
//! Main items: [`CoreWork`] (what a service hands in, made with [`core_work`]),
//! [`CoreWorkReport`];
//! [`crate::HostBuilder::on_each_core`] runs it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::cores::Prepared;
use crate::warm_up::once_each;

/// Work to do once on each core: called once per core, and the future it returns runs on
/// that core's thread (so whatever it reaches for "this thread", such as its idle pool, is
/// the core's). The future yields what went wrong, one line each (empty when nothing did).
pub type CoreWork =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Vec<String>> + Send>> + Send + Sync>;

/// Work for every core from shared `state` and an async function of it: each core's run gets
/// its own clone of `state` (an `Arc` of the service, say) and runs `work(state)` there.
pub fn core_work<S, F, Fut>(state: S, work: F) -> CoreWork
where
    S: Clone + Send + Sync + 'static,
    F: Fn(S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<String>> + Send + 'static,
{
    Arc::new(move || Box::pin(work(state.clone())))
}

/// How work done on every core went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreWorkReport {
    /// Cores (or runtimes) the work ran on.
    pub cores: usize,
    /// Of those, how many had finished within the wait; the others go on in the background.
    pub finished: usize,
    /// What went wrong, once each, with how many cores had it when more than one did:
    /// `" (2 cores)"`. Only the finished cores' lines are known.
    pub failed: Vec<String>,
    /// How long the wait took.
    pub elapsed: Duration,
}

/// Where work for every core runs: each core's runtime, or this runtime (`None`) when there
/// are no cores.
pub(crate) fn homes(cores: &[Prepared]) -> Vec<Option<Handle>> {
    if cores.is_empty() {
        vec![None]
    } else {
        cores
            .iter()
            .map(|core| Some(core.handle().clone()))
            .collect()
    }
}

/// Runs `work` once on each of `homes` (a core's runtime, or this runtime for `None`) side
/// by side, and waits for them all or until `wait` has passed.
pub(crate) async fn run(
    homes: &[Option<Handle>],
    work: &CoreWork,
    wait: Duration,
) -> CoreWorkReport {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + wait;
    let tasks: Vec<_> = homes
        .iter()
        .map(|home| match home {
            Some(core) => core.spawn(work()),
            None => tokio::spawn(work()),
        })
        .collect();
    let mut finished = 0;
    let mut failed = Vec::new();
    for mut task in tasks {
        // A task still running at the deadline is left to finish: dropping its handle does
        // not cancel it.
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(lines)) => {
                finished += 1;
                failed.extend(lines);
            }
            Ok(Err(join_error)) => {
                finished += 1;
                failed.push(format!("the work ended abnormally: {join_error}"));
            }
            Err(_elapsed) => {}
        }
    }
    CoreWorkReport {
        cores: homes.len(),
        finished,
        failed: once_each(failed, "cores"),
        elapsed: started.elapsed(),
    }
}
