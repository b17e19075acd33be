//! The fill lease: instances that miss the same key at the same time make one origin
//! request between them. [`SharedTier::lookup_or_lease`] looks the entry up and, on a miss,
//! takes the key's lease in one atomic step (a Lua script); the holder fetches, puts the
//! entry and [`SharedTier::release`]s the lease; the others [`SharedTier::wait`] for the
//! entry, or for the lease to go.

use std::time::Duration;

use redis::Value;
use tracing::debug;
use wharf_metrics::shared::{SharedLease, SharedLookup, SharedOp};

use super::{Keys, OpError, SharedTier};
use crate::entry::CachedResponse;

/// Finds the meta value, or takes the lease, in one atomic step: KEYS = meta, lease;
/// ARGV = token, lease TTL in ms. Returns the meta value, 1 (lease taken) or 0 (lease held
/// by another instance).
const LOOKUP_OR_LEASE: &str = r"
local meta = redis.call('GET', KEYS[1])
if meta then return meta end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
";

/// Deletes the lease only if it is still ours: KEYS = lease; ARGV = token.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// What [`SharedTier::lookup_or_lease`] found.
#[derive(Debug)]
pub enum LeaseOutcome {
    /// The entry is in Redis: serve it (and promote it into memory).
    Found(CachedResponse),
    /// No entry, and this instance now holds the lease: fetch from the origin, then
    /// [`SharedTier::put`] and [`SharedTier::release`].
    Acquired(Lease),
    /// No entry, and another instance holds the lease: [`SharedTier::wait`] for its entry.
    Held,
    /// The tier cannot help this call (error, timeout, resting, unusable entry): fetch from
    /// the origin without a lease.
    Skip,
}

/// What [`SharedTier::wait`] saw.
#[derive(Debug)]
pub enum WaitOutcome {
    /// The other instance's entry arrived.
    Found(CachedResponse),
    /// The lease is gone without an entry (the other fetch failed or was not cacheable):
    /// try [`SharedTier::lookup_or_lease`] again.
    LeaseFree,
    /// The deadline passed, or the tier failed: fetch from the origin.
    GiveUp,
}

/// A held fill lease, given back with [`SharedTier::release`] (or left to expire).
#[derive(Debug)]
pub struct Lease {
    key: String,
    token: String,
}

impl SharedTier {
    /// Looks `key` up and, on a miss, tries to take its fill lease for `lease_ttl`, in one
    /// round trip (plus the chunk reads of a hit).
    pub async fn lookup_or_lease(
        &self,
        key: &str,
        lease_ttl: Duration,
        max_bytes: u64,
    ) -> LeaseOutcome {
        let keys = Keys::new(key);
        let token = self.unique_id();
        let ttl_ms = lease_ttl.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let mut connection = self.connection.clone();
        let answer = self
            .run(SharedOp::Lease, async {
                redis::cmd("EVAL")
                    .arg(LOOKUP_OR_LEASE)
                    .arg(2)
                    .arg(&keys.meta)
                    .arg(&keys.lease)
                    .arg(&token)
                    .arg(ttl_ms)
                    .query_async::<Value>(&mut connection)
                    .await
            })
            .await;
        let (outcome, lookup) = match answer {
            Ok(Value::BulkString(meta)) => {
                let found = self.read_entry(&keys, &meta, max_bytes).await;
                self.count_lookup(&found);
                return match found {
                    Ok(Some(entry)) => LeaseOutcome::Found(entry),
                    _ => LeaseOutcome::Skip,
                };
            }
            Ok(Value::Int(1)) => {
                self.metrics.lease(SharedLease::Acquired);
                let lease = Lease {
                    key: keys.lease,
                    token,
                };
                (LeaseOutcome::Acquired(lease), SharedLookup::Miss)
            }
            Ok(Value::Int(0)) => {
                self.metrics.lease(SharedLease::Held);
                (LeaseOutcome::Held, SharedLookup::Miss)
            }
            Ok(other) => {
                debug!(answer = ?other, "shared cache: unexpected lease answer");
                self.metrics.lease(SharedLease::Error);
                (LeaseOutcome::Skip, SharedLookup::Miss)
            }
            Err(error) => {
                self.metrics.lease(SharedLease::Error);
                let lookup = match error {
                    OpError::Skipped => SharedLookup::Skipped,
                    OpError::Failed => SharedLookup::Error,
                };
                (LeaseOutcome::Skip, lookup)
            }
        };
        self.metrics.lookup(lookup);
        outcome
    }

    /// Waits for the entry of `key` that another instance is fetching, polling every
    /// [`SharedTierConfig::poll_interval`](super::SharedTierConfig::poll_interval) until it
    /// appears, the lease is given back or expires, or `until`.
    pub async fn wait(
        &self,
        key: &str,
        max_bytes: u64,
        until: tokio::time::Instant,
    ) -> WaitOutcome {
        let keys = Keys::new(key);
        loop {
            let next = tokio::time::Instant::now() + self.config.poll_interval;
            if next >= until {
                return WaitOutcome::GiveUp;
            }
            tokio::time::sleep_until(next).await;
            let mut connection = self.connection.clone();
            let polled = self
                .run(SharedOp::Poll, async {
                    redis::pipe()
                        .cmd("GET")
                        .arg(&keys.meta)
                        .cmd("EXISTS")
                        .arg(&keys.lease)
                        .query_async::<(Option<Vec<u8>>, bool)>(&mut connection)
                        .await
                })
                .await;
            match polled {
                Ok((Some(meta), _)) => {
                    return match self.read_entry(&keys, &meta, max_bytes).await {
                        Ok(Some(entry)) => WaitOutcome::Found(entry),
                        _ => WaitOutcome::GiveUp,
                    };
                }
                Ok((None, true)) => {}
                Ok((None, false)) => return WaitOutcome::LeaseFree,
                Err(_) => return WaitOutcome::GiveUp,
            }
        }
    }

    /// Gives a lease back (only if still ours), so that waiting instances stop waiting.
    pub async fn release(&self, lease: Lease) {
        let mut connection = self.connection.clone();
        let _ = self
            .run(SharedOp::Release, async {
                redis::cmd("EVAL")
                    .arg(RELEASE)
                    .arg(1)
                    .arg(&lease.key)
                    .arg(&lease.token)
                    .query_async::<i64>(&mut connection)
                    .await
            })
            .await;
    }
}
