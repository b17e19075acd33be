//! Stopping deliverers: when a queue service's deliverer and deliveries stop, and how the
//! end of the process waits for them.
//!
//! A deliverer stops when its service is dropped (a reload replaced it) or when the process
//! stops every deliverer ([`stop_deliverers`], called by `wharf serve` after the host has
//! drained). Either way a delivery that holds a message for a backend that is down hands it
//! back to the broker, which takes a round trip: [`stop_deliverers`] waits for that, since a
//! process that exits first leaves the message with the broker until `ack_wait` runs out.
//! Main types: [`Stop`] (what a task watches) and [`Live`] (what the wait counts).

use std::sync::LazyLock;
use std::time::Duration;

use tokio::sync::watch;

/// Process-wide: every deliverer of every queue service in this process.
struct Process {
    /// Turns `true` once, when [`stop_deliverers`] is called; never back.
    stop: watch::Sender<bool>,
    /// How many deliverer loops and deliveries run now (each holds a [`Live`]).
    live: watch::Sender<usize>,
}

static PROCESS: LazyLock<Process> = LazyLock::new(|| Process {
    stop: watch::Sender::new(false),
    live: watch::Sender::new(0),
});

/// Stops every queue deliverer in this process and waits, at most `within`, until each has
/// ended: a message held while its backend is down is handed back to the broker (and the
/// broker confirmed it), so another deliverer gets it at once instead of after `ack_wait`;
/// an attempt already sent to a backend finishes. Returns how many deliverers and
/// deliveries were still running when `within` ran out (0: all ended).
///
/// For the end of the process, after the host has drained: it also stops deliverers of
/// services built later, and cannot be undone.
pub async fn stop_deliverers(within: Duration) -> usize {
    PROCESS.stop.send_replace(true);
    let mut live = PROCESS.live.subscribe();
    let _ = tokio::time::timeout(within, live.wait_for(|running| *running == 0)).await;
    let left = *live.borrow();
    left
}

/// What a queue service's tasks watch to know when to stop: the service being dropped, or
/// the process stopping every deliverer.
#[derive(Clone)]
pub(crate) struct Stop {
    /// Closes when the service is dropped (its sender is never sent on).
    service: watch::Receiver<()>,
    /// [`Process::stop`].
    process: watch::Receiver<bool>,
}

impl Stop {
    /// Watches `service` (the receiver of the service's own stop channel) and the process.
    pub(crate) fn new(service: watch::Receiver<()>) -> Self {
        Self {
            service,
            process: PROCESS.stop.subscribe(),
        }
    }

    /// Waits until the service or the process stops (at once if it has already).
    pub(crate) async fn stopped(&mut self) {
        let Self { service, process } = self;
        let service_dropped = async { while service.changed().await.is_ok() {} };
        // An error means the sender is gone, which the static never is: treat as stopped.
        let process_stopped = async {
            let _ = process.wait_for(|stopping| *stopping).await;
        };
        tokio::select! {
            () = service_dropped => {}
            () = process_stopped => {}
        }
    }
}

/// Counts one running deliverer loop or delivery until dropped, for [`stop_deliverers`]
/// to wait on. Made before the task is spawned, so the count never reads 0 while a
/// deliverer is about to start a delivery.
pub(crate) struct Live(());

impl Live {
    /// Counts one more running task.
    pub(crate) fn new() -> Self {
        PROCESS.live.send_modify(|running| *running += 1);
        Live(())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        PROCESS
            .live
            .send_modify(|running| *running = running.saturating_sub(1));
    }
}
