//! The descriptors an [`IdlePool`] lends its idle connections: borrowed from the process's
//! [`DescriptorLedger`] a lease at a time, given back when the pool holds fewer connections
//! than its lease, and recalled (oldest idle connections closed first) when the open sessions
//! need them. Keeping, reusing and closing the connections is the pool's ([`super`]).

use wharf_limits::descriptors::{DescriptorLedger, Lender};

use super::{IdlePool, Slots};

/// Descriptors a pool borrows from the ledger at a time, so that keeping and reusing idle
/// connections seldom touches the counter the cores share.
const LEASE: usize = 16;

/// Borrows a descriptor for one more idle connection (`total` held now) when the lease
/// (`lent`) has none spare: a lease, or at least one; `false` when the ledger has none.
pub(super) fn borrow_one(total: usize, lent: &mut usize, ledger: &DescriptorLedger) -> bool {
    if total < *lent {
        return true;
    }
    for count in [LEASE, 1] {
        if ledger.lend(count) {
            *lent += count;
            return true;
        }
    }
    false
}

impl Slots {
    /// Gives back what the lease holds beyond the idle connections and one spare lease.
    pub(super) fn return_spare(&mut self, ledger: &DescriptorLedger) {
        let spare = self.lent - self.total;
        if spare > 2 * LEASE {
            ledger.give_back(spare - LEASE);
            self.lent -= spare - LEASE;
        }
    }
}

impl Lender for IdlePool {
    fn recall(&self, wanted: usize) -> usize {
        let mut closed = Vec::new();
        let given = {
            let mut slots = self.lock();
            // The spare lease first: it closes nothing.
            let mut freed = slots.lent - slots.total;
            let Slots { by_key, total, .. } = &mut *slots;
            for upstream in by_key.values_mut() {
                if freed >= wanted {
                    break;
                }
                let closing = (wanted - freed).min(upstream.idle.len());
                // Oldest first: the likeliest to have been closed by the upstream anyway.
                closed.extend(upstream.idle.drain(..closing));
                *total -= closing;
                freed += closing;
            }
            let given = freed.min(slots.lent);
            slots.lent -= given;
            given
        };
        self.ledger.give_back(given);
        if !closed.is_empty() {
            self.ledger.count_recalled(closed.len());
        }
        drop(closed);
        given
    }
}
