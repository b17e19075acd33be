//! The process's open-files ledger: which descriptors idle upstream connections may hold
//! without taking one a session could need.
//!
//! The host admits at most as many sessions as its open-files limit holds at two
//! descriptors each (a proxied call: the client's connection and the upstream one), after a
//! reserve for everything else (`wharf_host`'s `fd_budget`). Idle keep-alive connections
//! are descriptors too, and they outlive the calls that opened them: a pool that kept every
//! one (as HAProxy does) could fill the limit with connections to one origin and make the
//! next session's connect to another fail with EMFILE. So idle pools borrow their
//! descriptors from this ledger: a pool keeps a returned connection only while
//! `reserved + 2 × open sessions + lent ≤ limit`, and when sessions grow into what was
//! lent the ledger recalls it: the pools close idle connections (each upstream's oldest
//! first) before a session opens a connection of its own ([`DescriptorLedger::make_room`]). Idle
//! connections use what sessions leave free, never what they need; HAProxy bounds its idle
//! connections by a share of its descriptors for the same reason
//! (`tune.pool-high-fd-ratio`).
//!
//! Pools borrow in leases of several descriptors and count their own connections under
//! their own lock, so keeping and reusing an idle connection touches no counter that the
//! cores share; only a lease, its return and a session opening or closing do.
//!
//! Without a known limit (none set, or an unlimited one) every loan is granted: pools are
//! then bounded by their own caps alone.
//!
//! Main items: [`DescriptorLedger`] (the arithmetic and the recall), [`Lender`] (what an
//! idle pool implements to be recalled from). The host counts its sessions here from the
//! guard it already holds for each ([`DescriptorLedger::session_opened`] and
//! [`DescriptorLedger::session_closed`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// No limit known: every loan is granted.
const UNLIMITED: usize = usize::MAX;

/// Descriptors a session may hold at once: its own and one upstream.
pub const FDS_PER_SESSION: usize = 2;

/// Something holding descriptors lent by the ledger that can give some back: an idle pool.
pub trait Lender: Send + Sync {
    /// Gives back lent descriptors, at least `wanted` when it holds that many: its unused
    /// lease first (all of it), then by closing idle connections, oldest first in each
    /// upstream; returns how many it gave back.
    fn recall(&self, wanted: usize) -> usize;
}

/// Descriptors lent to idle pools, weighed against the open-files limit and the sessions
/// open now.
pub struct DescriptorLedger {
    /// The open-files limit in force (`UNLIMITED` until set).
    limit: AtomicUsize,
    /// Descriptors kept for everything that is neither a session nor an idle connection.
    reserved: AtomicUsize,
    /// Sessions open now (each counted as [`FDS_PER_SESSION`] descriptors).
    sessions: AtomicUsize,
    /// Descriptors lent to pools, used or not yet.
    lent: AtomicUsize,
    /// Connections closed instead of kept idle, for want of a descriptor (a running total).
    refused: AtomicU64,
    /// Idle connections closed on a recall (a running total).
    recalled: AtomicU64,
    /// The pools that borrowed, to recall from; dead ones are dropped on the way.
    lenders: Mutex<Vec<Weak<dyn Lender>>>,
}

impl std::fmt::Debug for DescriptorLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DescriptorLedger")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("sessions", &self.sessions.load(Ordering::Relaxed))
            .field("lent", &self.lent.load(Ordering::Relaxed))
            .finish()
    }
}

static PROCESS: LazyLock<Arc<DescriptorLedger>> = LazyLock::new(DescriptorLedger::unlimited);

impl DescriptorLedger {
    /// A ledger with no limit until [`DescriptorLedger::set_limit`].
    pub fn unlimited() -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(UNLIMITED),
            reserved: AtomicUsize::new(0),
            sessions: AtomicUsize::new(0),
            lent: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            recalled: AtomicU64::new(0),
            lenders: Mutex::new(Vec::new()),
        })
    }

    /// The process's ledger: the host sets its limit and counts its sessions there, the
    /// idle pools borrow from it.
    pub fn process() -> Arc<Self> {
        PROCESS.clone()
    }

    /// Sets the open-files limit (`None`: unlimited) and the descriptors reserved out of it.
    pub fn set_limit(&self, open_files_limit: Option<u64>, reserved: u64) {
        let limit = open_files_limit.map_or(UNLIMITED, |limit| {
            usize::try_from(limit).unwrap_or(UNLIMITED)
        });
        let reserved = usize::try_from(reserved).unwrap_or(UNLIMITED);
        self.reserved.store(reserved, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Release);
    }

    /// Counts a session open, and recalls lent descriptors the session may need. Each call
    /// is paired with one [`DescriptorLedger::session_closed`].
    pub fn session_opened(&self) {
        self.sessions.fetch_add(1, Ordering::AcqRel);
        self.make_room();
    }

    /// Counts a session closed (never below zero).
    pub fn session_closed(&self) {
        let _ = self
            .sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                Some(open.saturating_sub(1))
            });
    }

    /// Lends `count` descriptors when they fit beside the open sessions; `false` when not.
    pub fn lend(&self, count: usize) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        if limit == UNLIMITED {
            self.lent.fetch_add(count, Ordering::AcqRel);
            return true;
        }
        let claimed = self.claimed_besides_loans();
        self.lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                let after = lent.checked_add(count)?;
                (claimed.checked_add(after)? <= limit).then_some(after)
            })
            .is_ok()
    }

    /// Takes back `count` lent descriptors (a pool closed or gave up idle connections).
    pub fn give_back(&self, count: usize) {
        // Saturating: a pool never gives back more than it borrowed, but an underflow here
        // would turn every later loan down.
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                Some(lent.saturating_sub(count))
            });
    }

    /// Lent descriptors the open sessions need now (0 when none).
    pub fn overdrawn(&self) -> usize {
        let limit = self.limit.load(Ordering::Acquire);
        if limit == UNLIMITED {
            return 0;
        }
        let claimed = self
            .claimed_besides_loans()
            .saturating_add(self.lent.load(Ordering::Acquire));
        claimed.saturating_sub(limit)
    }

    /// Before a descriptor is opened for a session: when the open sessions need lent
    /// descriptors, recalls them from the pools. Two loads when nothing is overdrawn.
    pub fn make_room(&self) {
        let wanted = self.overdrawn();
        if wanted > 0 {
            self.recall(wanted);
        }
    }

    /// Registers a pool that borrows, so that it can be recalled from.
    pub fn register(&self, lender: Weak<dyn Lender>) {
        let mut lenders = self.lenders();
        lenders.retain(|lender| lender.strong_count() > 0);
        lenders.push(lender);
    }

    /// Asks the pools, in turn, for `wanted` descriptors; returns how many came back.
    fn recall(&self, wanted: usize) -> usize {
        // Taken out of the list first: a pool's recall takes its own lock and gives back
        // through this ledger, neither under the list's lock.
        let lenders: Vec<Arc<dyn Lender>> =
            self.lenders().iter().filter_map(Weak::upgrade).collect();
        let mut recalled = 0;
        for lender in lenders {
            if recalled >= wanted {
                break;
            }
            recalled += lender.recall(wanted - recalled);
        }
        recalled
    }

    /// The reserve plus what the open sessions may hold.
    fn claimed_besides_loans(&self) -> usize {
        let sessions = self.sessions.load(Ordering::Acquire);
        self.reserved
            .load(Ordering::Relaxed)
            .saturating_add(sessions.saturating_mul(FDS_PER_SESSION))
    }

    fn lenders(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn Lender>>> {
        self.lenders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Descriptors lent now.
    pub fn lent(&self) -> usize {
        self.lent.load(Ordering::Acquire)
    }

    /// Counts a connection a pool closed instead of keeping it idle: the ledger would not
    /// lend its descriptor.
    pub fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts idle connections a pool closed on a recall.
    pub fn count_recalled(&self, closed: usize) {
        let closed = u64::try_from(closed).unwrap_or(u64::MAX);
        self.recalled.fetch_add(closed, Ordering::Relaxed);
    }

    /// What the ledger has lent now and the running totals of refusals and recalls (for
    /// `/metrics`).
    pub fn stats(&self) -> LedgerStats {
        LedgerStats {
            lent: self.lent(),
            refused: self.refused.load(Ordering::Relaxed),
            recalled: self.recalled.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of a [`DescriptorLedger`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerStats {
    /// Descriptors lent to idle pools now (spare leases included).
    pub lent: usize,
    /// Connections closed instead of kept idle, since start.
    pub refused: u64,
    /// Idle connections closed on a recall, since start.
    pub recalled: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens `count` sessions on `ledger`.
    fn open_sessions(ledger: &DescriptorLedger, count: usize) {
        (0..count).for_each(|_| ledger.session_opened());
    }

    /// Closes `count` sessions on `ledger`.
    fn close_sessions(ledger: &DescriptorLedger, count: usize) {
        (0..count).for_each(|_| ledger.session_closed());
    }

    /// A pool stand-in holding `held` lent descriptors.
    struct Holder {
        ledger: Arc<DescriptorLedger>,
        held: Mutex<usize>,
    }

    impl Lender for Holder {
        fn recall(&self, wanted: usize) -> usize {
            let mut held = self.held.lock().unwrap();
            let given = wanted.min(*held);
            *held -= given;
            self.ledger.give_back(given);
            given
        }
    }

    fn holder(ledger: &Arc<DescriptorLedger>, borrowed: usize) -> Arc<Holder> {
        assert!(ledger.lend(borrowed), "{borrowed} should fit");
        let holder = Arc::new(Holder {
            ledger: ledger.clone(),
            held: Mutex::new(borrowed),
        });
        let weak: Weak<dyn Lender> = Arc::downgrade(&(holder.clone() as Arc<dyn Lender>));
        ledger.register(weak);
        holder
    }

    #[test]
    fn without_a_limit_every_loan_is_granted() {
        let ledger = DescriptorLedger::unlimited();
        open_sessions(&ledger, 1000);
        assert!(ledger.lend(1_000_000));
        assert_eq!(ledger.overdrawn(), 0);
    }

    #[test]
    fn loans_fit_beside_the_reserve_and_two_descriptors_per_session() {
        let ledger = DescriptorLedger::unlimited();
        ledger.set_limit(Some(100), 40);
        open_sessions(&ledger, 10);
        // 100 - 40 - 2 × 10 = 40 left to lend
        assert!(ledger.lend(32));
        assert!(!ledger.lend(16), "32 + 16 > 40");
        assert!(ledger.lend(8));
        assert!(!ledger.lend(1));
        assert_eq!(ledger.lent(), 40);
        ledger.give_back(8);
        assert!(ledger.lend(1));
        assert_eq!(ledger.lent(), 33);
    }

    #[test]
    fn a_session_opening_into_lent_descriptors_recalls_them() {
        let ledger = DescriptorLedger::unlimited();
        ledger.set_limit(Some(100), 40);
        let first = holder(&ledger, 30);
        let second = holder(&ledger, 30);
        // 60 lent: 0 left. Each session needs two of them back.
        open_sessions(&ledger, 5);
        assert_eq!(ledger.lent(), 50);
        assert_eq!(ledger.overdrawn(), 0);
        assert_eq!(
            *first.held.lock().unwrap() + *second.held.lock().unwrap(),
            50
        );
        // Closed sessions leave room to lend again.
        close_sessions(&ledger, 5);
        assert!(ledger.lend(10));
        assert!(!ledger.lend(1));
    }

    #[test]
    fn make_room_recalls_only_what_is_overdrawn_and_skips_dropped_pools() {
        let ledger = DescriptorLedger::unlimited();
        ledger.set_limit(Some(50), 10);
        let gone = holder(&ledger, 20);
        let kept = holder(&ledger, 20);
        drop(gone); // its 20 stay lent: a real pool gives them back as it closes
        ledger.give_back(20);
        // 10 + 20 lent; 20 sessions need 40: overdrawn by 20 once they are open.
        ledger.sessions.fetch_add(20, Ordering::AcqRel);
        assert_eq!(ledger.overdrawn(), 20);
        ledger.make_room();
        assert_eq!(*kept.held.lock().unwrap(), 0);
        assert_eq!(ledger.overdrawn(), 0);
    }

    #[test]
    fn refusals_and_recalls_are_counted_for_the_metrics() {
        let ledger = DescriptorLedger::unlimited();
        ledger.count_refused();
        ledger.count_recalled(3);
        assert!(ledger.lend(5));
        assert_eq!(
            ledger.stats(),
            LedgerStats {
                lent: 5,
                refused: 1,
                recalled: 3
            }
        );
    }

    #[test]
    fn sessions_never_count_below_zero() {
        let ledger = DescriptorLedger::unlimited();
        ledger.session_opened();
        ledger.sessions.store(0, Ordering::Release);
        ledger.session_closed();
        assert_eq!(ledger.sessions.load(Ordering::Acquire), 0);
    }
}
