//! The fill lease: instances that miss the same key at the same time make one origin
//! request between them. [`SharedTier::lookup_or_lease`] looks the entry up and, on a miss,
//! takes the key's lease in one atomic step (a Lua script); the holder fetches, puts the
//! entry and [`SharedTier::release`]s the lease; the others [`SharedTier::wait`] for the
//! entry, or for the lease to go. An entry this instance cannot serve but its fetch would
//! replace (older than its `max_ttl`, a chunk evicted) is a miss too: a second run of the
//! script takes the lease only if that entry is still the one there, so an entry stored
//! meanwhile is served rather than fetched again.
//!
//! A fetch may take far longer than the lease's TTL (a slow body), so a held [`Lease`] is
//! kept alive by a task that extends it every third of its TTL, only while it is still
//! this holder's (compare-and-extend on the token, as safe lock renewal does). Waiters
//! therefore wait as long as the lease lives rather than for a fixed time; a holder that
//! dies stops renewing, and its lease expires within one TTL, when a waiter takes over.
//! One round trip per renewal, none per body chunk.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::debug;
use wharf_metrics::shared::{SharedLease, SharedLookup, SharedOp};

use super::{EntryLimits, Keys, OpError, Read, SharedTier};
use crate::entry::CachedResponse;

/// Finds the meta value, or takes the lease, in one atomic step: KEYS = meta, lease;
/// ARGV = token, lease TTL in ms, and optionally a meta value to look past (one found
/// unusable, whose replacement this instance would fetch). Returns the meta value and its
/// PTTL (unless it is the one to look past), 1 (lease taken) or 0 (lease held by another
/// instance).
const LOOKUP_OR_LEASE: &str = r"
local meta = redis.call('GET', KEYS[1])
if meta and meta ~= ARGV[3] then return {meta, redis.call('PTTL', KEYS[1])} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
";

/// Deletes the lease only if it is still ours: KEYS = lease; ARGV = token.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Extends the lease to a full TTL only if it is still ours: KEYS = lease; ARGV = token,
/// TTL in ms. Returns 1 (extended) or 0 (expired, or another instance's by now).
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// The meta value and its PTTL, if that is what [`LOOKUP_OR_LEASE`] answered.
pub(super) fn meta_and_pttl(answer: &Value) -> Option<(&[u8], i64)> {
    match answer {
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(meta), Value::Int(pttl)] => Some((meta, *pttl)),
            _ => None,
        },
        _ => None,
    }
}

/// What [`SharedTier::lookup_or_lease`] found.
#[derive(Debug)]
pub enum LeaseOutcome {
    /// The entry is in Redis: serve it (and promote it into memory).
    Found(CachedResponse),
    /// No entry this instance can serve, and it now holds the lease: fetch from the origin,
    /// then [`SharedTier::put`] and [`SharedTier::release`].
    Acquired(Lease),
    /// No entry this instance can serve, and another instance holds the lease:
    /// [`SharedTier::wait`] for its entry.
    Held,
    /// The tier cannot help this call (error, timeout, resting, an entry over this
    /// instance's `max_bytes`): fetch from the origin without a lease.
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

/// A held fill lease, kept alive in the background until it is given back with
/// [`SharedTier::release`]. Dropped instead, it stops being renewed and is given back in
/// the background (or, should that fail, expires within one TTL).
#[derive(Debug)]
pub struct Lease {
    /// Stops the renewal task, sent to or dropped; the task then gives the lease back.
    stop: Option<oneshot::Sender<()>>,
    /// The renewal task, awaited by [`SharedTier::release`].
    renewal: Option<JoinHandle<()>>,
}

/// Which lease a renewal task keeps alive, and for how long each time.
struct Held {
    key: String,
    token: String,
    ttl_ms: u64,
}

impl SharedTier {
    /// Looks `key` up and, on a miss, tries to take its fill lease for `lease_ttl`, in one
    /// round trip (plus the chunk reads of a hit). An entry this instance cannot serve but
    /// would replace (older than its `max_ttl`, unreadable, a chunk missing) is a miss: a
    /// second round trip takes the lease unless another entry has been stored meanwhile
    /// (then read in turn). An entry over `limits.max_bytes` is no help:
    /// [`LeaseOutcome::Skip`]. A lease taken is renewed every third of `lease_ttl` until
    /// released (see [`Lease`]).
    pub async fn lookup_or_lease(
        self: &Arc<Self>,
        key: &str,
        lease_ttl: Duration,
        limits: EntryLimits,
    ) -> LeaseOutcome {
        let keys = Keys::new(key);
        let token = self.unique_id();
        let ttl_ms = lease_ttl.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        // The meta value found unusable here, once: the script then takes the lease past it.
        let mut look_past: Option<Vec<u8>> = None;
        let lease = loop {
            let answer = self
                .lookup_script(&keys, &token, ttl_ms, look_past.as_deref())
                .await;
            let Some((meta, pttl)) = answer.as_ref().ok().and_then(meta_and_pttl) else {
                break answer;
            };
            match self.read_entry(&keys, meta, pttl, limits).await {
                Ok(Read::Entry(entry)) => {
                    self.metrics.lookup(SharedLookup::Hit);
                    return LeaseOutcome::Found(entry);
                }
                // An entry this instance's fetch would replace: that fetch is coalesced
                // under the lease, as a miss's is (not one fetch per instance).
                Ok(Read::Replaceable) if look_past.is_none() => look_past = Some(meta.to_vec()),
                // Replaced meanwhile by another such entry, or too big for this instance:
                // fetched without the lease.
                Ok(Read::Replaceable | Read::TooBig) => {
                    self.metrics.lookup(SharedLookup::Miss);
                    return LeaseOutcome::Skip;
                }
                Err(error) => {
                    self.metrics.lookup(error.lookup());
                    return LeaseOutcome::Skip;
                }
            }
        };
        let (outcome, lookup) = match lease {
            Ok(Value::Int(1)) => {
                self.metrics.lease(SharedLease::Acquired);
                let held = Held {
                    key: keys.lease,
                    token,
                    ttl_ms,
                };
                (
                    LeaseOutcome::Acquired(self.keep_alive(held)),
                    SharedLookup::Miss,
                )
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
                (LeaseOutcome::Skip, error.lookup())
            }
        };
        self.metrics.lookup(lookup);
        outcome
    }

    /// One run of [`LOOKUP_OR_LEASE`], past `look_past` if given.
    pub(super) async fn lookup_script(
        &self,
        keys: &Keys,
        token: &str,
        ttl_ms: u64,
        look_past: Option<&[u8]>,
    ) -> Result<Value, OpError> {
        let mut script = redis::cmd("EVAL");
        script
            .arg(LOOKUP_OR_LEASE)
            .arg(2)
            .arg(&keys.meta)
            .arg(&keys.lease)
            .arg(token)
            .arg(ttl_ms);
        if let Some(meta) = look_past {
            script.arg(meta);
        }
        let mut connection = self.connection.clone();
        self.run(SharedOp::Lease, async {
            script.query_async::<Value>(&mut connection).await
        })
        .await
    }

    /// Waits for the entry of `key` that another instance is fetching, polling every
    /// [`SharedTierConfig::poll_interval`](super::SharedTierConfig::poll_interval) until it
    /// appears, the lease is given back or expires, or `until`. An entry this instance
    /// cannot use but that the holder's fetch replaces (older than this instance's
    /// `max_ttl`, a chunk evicted) is waited past while the lease is held. The holder renews its lease
    /// while it fetches, so `until` is an overall bound (the proxy's `total_timeout`), not
    /// a guess of how long a fetch takes.
    pub async fn wait(
        &self,
        key: &str,
        limits: EntryLimits,
        until: tokio::time::Instant,
    ) -> WaitOutcome {
        let keys = Keys::new(key);
        // A meta value found unusable here while the lease is held: the one the holder's
        // fetch replaces, not read again at every poll (its chunks may be many).
        let mut replaced: Option<Vec<u8>> = None;
        loop {
            let next = tokio::time::Instant::now() + self.config.poll_interval;
            if next >= until {
                return WaitOutcome::GiveUp;
            }
            tokio::time::sleep_until(next).await;
            let mut connection = self.connection.clone();
            let polled = self
                .run(SharedOp::Poll, async {
                    // MULTI: the TTL left is the meta value's, not a later writer's.
                    redis::pipe()
                        .atomic()
                        .cmd("GET")
                        .arg(&keys.meta)
                        .cmd("PTTL")
                        .arg(&keys.meta)
                        .cmd("EXISTS")
                        .arg(&keys.lease)
                        .query_async::<(Option<Vec<u8>>, i64, bool)>(&mut connection)
                        .await
                })
                .await;
            match polled {
                // The entry the holder's fetch replaces, read before and unusable here:
                // still there. Not read again, lease held or not (the same meta value is
                // the same version, and its chunks do not come back).
                Ok((Some(meta), _, leased)) if replaced.as_ref() == Some(&meta) => {
                    if !leased {
                        return WaitOutcome::LeaseFree;
                    }
                }
                Ok((Some(meta), pttl, leased)) => {
                    match self.read_entry(&keys, &meta, pttl, limits).await {
                        Ok(Read::Entry(entry)) => return WaitOutcome::Found(entry),
                        Ok(Read::Replaceable) if leased => replaced = Some(meta),
                        Ok(Read::Replaceable) => return WaitOutcome::LeaseFree,
                        Ok(Read::TooBig) | Err(_) => return WaitOutcome::GiveUp,
                    }
                }
                Ok((None, _, true)) => {}
                Ok((None, _, false)) => return WaitOutcome::LeaseFree,
                Err(_) => return WaitOutcome::GiveUp,
            }
        }
    }

    /// Gives a lease back (only if still ours), so that waiting instances stop waiting:
    /// stops its renewal and returns once the lease is deleted (or that failed).
    pub async fn release(&self, mut lease: Lease) {
        if let Some(stop) = lease.stop.take() {
            let _ = stop.send(());
        }
        if let Some(renewal) = lease.renewal.take() {
            // The task gives the lease back on its way out; a panic in it has been
            // reported by tokio already, and the lease then expires within one TTL.
            let _ = renewal.await;
        }
    }

    /// Starts the task that renews `held` every third of its TTL until told to stop (or
    /// its [`Lease`] is dropped), then gives it back.
    fn keep_alive(self: &Arc<Self>, held: Held) -> Lease {
        let (stop, mut stopped) = oneshot::channel();
        let tier = self.clone();
        let every = Duration::from_millis((held.ttl_ms / 3).max(1));
        // After a failed renewal, the next try comes sooner: a lease of 1 s has two thirds
        // of a second left after one failure, not another two ticks.
        let retry = (every / 4).max(Duration::from_millis(25));
        let renewal = tokio::spawn(async move {
            let mut wait = every;
            loop {
                tokio::select! {
                    // Sent to or dropped: either way the fill is done with the lease.
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(wait) => {}
                }
                match tier.renew(&held).await {
                    Ok(true) => wait = every,
                    Ok(false) => {
                        // Expired (Redis unreachable for a whole TTL) and perhaps taken by
                        // another instance, which now fetches too: nothing left to keep.
                        debug!("shared cache: fill lease lost before the fill ended");
                        return;
                    }
                    Err(_) => wait = retry,
                }
            }
            tier.give_back(&held).await;
        });
        Lease {
            stop: Some(stop),
            renewal: Some(renewal),
        }
    }

    /// Extends `held` to a full TTL if it is still ours: `Ok(false)` when it is not.
    async fn renew(&self, held: &Held) -> Result<bool, OpError> {
        let mut connection = self.connection.clone();
        self.run_now(SharedOp::Lease, async {
            redis::cmd("EVAL")
                .arg(RENEW)
                .arg(1)
                .arg(&held.key)
                .arg(&held.token)
                .arg(held.ttl_ms)
                .query_async::<i64>(&mut connection)
                .await
        })
        .await
        .map(|extended| extended == 1)
    }

    /// Deletes `held` if it is still ours.
    async fn give_back(&self, held: &Held) {
        let mut connection = self.connection.clone();
        let _ = self
            .run(SharedOp::Release, async {
                redis::cmd("EVAL")
                    .arg(RELEASE)
                    .arg(1)
                    .arg(&held.key)
                    .arg(&held.token)
                    .query_async::<i64>(&mut connection)
                    .await
            })
            .await;
    }
}
