//! Host names of upstreams, resolved once however many connects ask at the same time, and
//! held for a while after that (`server.resolve_hold`, by default [`NameCache::HOLD`]).
//!
//! Why: the system resolver (`getaddrinfo`) blocks, so tokio runs each lookup on a thread of
//! its blocking pool. Resolving at every connect made a wave of new connections to one name
//! a wave of threads, and `main` keeps blocking threads for a day (seed 001), so they stayed.
//! That is seed 002's pathology, a thread per waiting call, come back through the resolver:
//! 1,000 slow calls through a route to `http://localhost:PORT` left wharf with 280-304
//! threads, 85-109 through the proxy; with this cache, 6 (issue 4, `bench/RESULTS.md` stop
//! 51). Here the connects that find a lookup of their name under way wait for it, and those
//! that come within the hold of its answer take that answer.
//! nginx and HAProxy go further: both resolve a configured upstream's name once, at start.
//!
//! Past its hold, an answer is looked up again in the background by the first connect that
//! finds it old, and connects keep using it meanwhile, for at most [`NameCache::KEEP_STALE`]
//! past the hold: a name in steady use is not waited for after its first lookup (HAProxy's
//! resolvers, too, look names up outside the requests). If that lookup fails, the old answer
//! stays in use (logged as a warning) and the name is looked up again after another hold,
//! up to the same bound (HAProxy keeps the last valid answer 30 s after a failed lookup by
//! default, `hold timeout`/`hold other`): a resolver that fails for a few seconds does not
//! fail calls to origins whose addresses have not changed. Past the bound, or with no
//! earlier answer, or with a hold of zero, connects wait for the lookup, and a failed lookup
//! is given to the connects that waited for it and not kept: the next connect asks again.
//! What is done with the addresses (the proxy's SSRF check of every one, the order they are
//! tried in, timeouts) is the caller's.
//!
//! Main type: [`NameCache`]; [`NameCache::system`] is the process's, over the system
//! resolver.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use foldhash::HashMap;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// A lookup: the addresses of a name, without ports.
type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
/// How names are looked up: the system resolver, or a test's.
type LookupFn = dyn Fn(&str) -> LookupFuture + Send + Sync;

/// Resolved host names, shared by every connect of the process (or of a test).
pub struct NameCache {
    /// The lookup of each name: under way, or answered (and then held for `hold`).
    lookups: Mutex<HashMap<Box<str>, Arc<Lookup>>>,
    /// How long an answer is used, in nanoseconds: [`NameCache::HOLD`] for the system's
    /// until [`NameCache::set_hold`] (the binary sets `server.resolve_hold` at start).
    hold_nanos: AtomicU64,
    /// Names kept at most: [`NameCache::MAX_NAMES`] for the system's.
    max_names: usize,
    /// Looks one name up.
    lookup: Box<LookupFn>,
}

/// One lookup of a name, which every connect asking for it while it is under way waits for
/// (or, with an earlier answer still in its bound, does not: see [`NameCache::KEEP_STALE`]).
struct Lookup {
    answer: OnceCell<Answer>,
    /// The name's last good answer when this lookup began, if any.
    earlier: Option<Good>,
}

/// What a lookup answered, and when.
struct Answer {
    /// When this answer was settled: it is used for the hold from then.
    at: Instant,
    addresses: Result<Good, LookupFailure>,
}

/// Addresses a lookup found, and when it found them (an answer that keeps them after a
/// failed lookup keeps this time too, which bounds how long they stay in use).
#[derive(Clone)]
struct Good {
    addresses: Arc<[IpAddr]>,
    found_at: Instant,
}

impl Good {
    /// Until when these addresses may stand in for a lookup that is under way or failed.
    fn bound(&self, hold: Duration) -> Instant {
        self.found_at + hold.saturating_add(NameCache::KEEP_STALE)
    }

    /// Whether these addresses may still stand in for a lookup that is under way or failed.
    fn in_bound(&self, now: Instant, hold: Duration) -> bool {
        now < self.bound(hold)
    }
}

/// A failed lookup, kept so that each connect that waited for it gets an error of its own.
#[derive(Clone)]
struct LookupFailure {
    kind: io::ErrorKind,
    message: Arc<str>,
}

impl Lookup {
    /// Whether a connect asking now should use this lookup: it is under way, or it answered
    /// with addresses less than `hold` ago.
    fn usable(&self, now: Instant, hold: Duration) -> bool {
        match self.answer.get() {
            None => true,
            Some(answer) => answer.addresses.is_ok() && now.duration_since(answer.at) < hold,
        }
    }

    /// The earlier answer a connect takes instead of waiting for this lookup: while it is
    /// under way, with a hold (a hold of zero asks for a lookup at each connect), and within
    /// the earlier answer's bound.
    fn stand_in(&self, now: Instant, hold: Duration) -> Option<Arc<[IpAddr]>> {
        let earlier = self.earlier.as_ref()?;
        (self.answer.get().is_none() && !hold.is_zero() && earlier.in_bound(now, hold))
            .then(|| earlier.addresses.clone())
    }

    /// This lookup's answer once `found` (the lookup of `name`) completes: its addresses,
    /// or, when it failed and the earlier answer is within its bound under `hold`, that
    /// answer's addresses (logged).
    async fn settle(&self, name: &str, found: LookupFuture, hold: Duration) -> Answer {
        let found = found.await;
        let at = Instant::now();
        let failure = match found {
            Ok(found) if !found.is_empty() => {
                return Answer {
                    at,
                    addresses: Ok(Good {
                        addresses: Arc::from(found),
                        found_at: at,
                    }),
                }
            }
            Ok(_) => LookupFailure {
                kind: io::ErrorKind::NotFound,
                message: format!("{name} resolved to no address").into(),
            },
            Err(error) => LookupFailure {
                kind: error.kind(),
                message: error.to_string().into(),
            },
        };
        match &self.earlier {
            Some(good) if good.in_bound(at, hold) => {
                let kept_for = good.bound(hold).saturating_duration_since(at);
                tracing::warn!(
                    name = %name,
                    error = %failure.message,
                    found_secs_ago = at.duration_since(good.found_at).as_secs(),
                    kept_at_most_secs = kept_for.as_secs(),
                    "host name lookup failed; its last addresses stay in use meanwhile"
                );
                Answer {
                    at,
                    addresses: Ok(good.clone()),
                }
            }
            _ => Answer {
                at,
                addresses: Err(failure),
            },
        }
    }
}

/// What [`NameCache::lookup_for`] gives a connect.
enum Taken {
    /// Addresses to use now (an earlier answer, while the name is looked up again).
    Now(Arc<[IpAddr]>),
    /// A lookup to wait for (or to find answered).
    Wait(Arc<Lookup>),
}

impl NameCache {
    /// How long a name's addresses are used after its lookup answered. DNS records usually live
    /// minutes or more, but `getaddrinfo` does not say for how long; HAProxy's resolvers hold a
    /// valid answer 10 s by default (`hold valid`), and so does this.
    pub const HOLD: Duration = Duration::from_secs(10);

    /// Names held at most: the proxy's origins come from its callers' URLs, so the set of names
    /// is theirs to grow. Past it, names whose answer is no longer held are dropped; if all are
    /// still held, a new name is resolved without being kept.
    pub const MAX_NAMES: usize = 4096;

    /// How long past its hold an answer is still used, while its name is looked up again in
    /// the background or after that lookup failed. HAProxy's resolvers keep the last valid
    /// answer for 30 s after a failed lookup by default; `getaddrinfo` does not tell a name
    /// that is gone from a resolver that did not answer, so the bound is short.
    pub const KEEP_STALE: Duration = Duration::from_secs(30);

    /// The process's cache, over the system resolver (tokio's `lookup_host`, on its
    /// blocking pool), holding answers for [`NameCache::HOLD`].
    pub fn system() -> &'static NameCache {
        static SYSTEM: OnceLock<NameCache> = OnceLock::new();
        SYSTEM.get_or_init(|| NameCache::with_lookup(Self::HOLD, Self::MAX_NAMES, system_lookup))
    }

    /// A cache over `lookup` (the addresses of a name; ports are the caller's), holding
    /// answers for `hold` and at most `max_names` names.
    pub fn with_lookup<F>(hold: Duration, max_names: usize, lookup: F) -> NameCache
    where
        F: Fn(&str) -> LookupFuture + Send + Sync + 'static,
    {
        NameCache {
            lookups: Mutex::new(HashMap::default()),
            hold_nanos: AtomicU64::new(nanos(hold)),
            max_names,
            lookup: Box::new(lookup),
        }
    }

    /// From now on, answers are used for `hold` after their lookup (answers held now
    /// included); `Duration::ZERO` looks each connect's name up again (connects at the same
    /// time still share a lookup).
    pub fn set_hold(&self, hold: Duration) {
        self.hold_nanos.store(nanos(hold), Ordering::Relaxed);
    }

    /// How long answers are used.
    pub fn hold(&self) -> Duration {
        Duration::from_nanos(self.hold_nanos.load(Ordering::Relaxed))
    }

    /// The addresses of `name` (compared without regard to ASCII case): the answer of a
    /// lookup held, or of the one under way, or of a new one; past the hold, the earlier
    /// answer while its name is looked up again (see [`NameCache::KEEP_STALE`]).
    ///
    /// # Errors
    /// The lookup's error (each caller that waited for a failed lookup gets one of the same
    /// kind and message), or `NotFound` when it answered no address.
    pub async fn addresses(&self, name: &str) -> io::Result<Arc<[IpAddr]>> {
        let lookup = match self.lookup_for(name) {
            Taken::Now(addresses) => return Ok(addresses),
            Taken::Wait(lookup) => lookup,
        };
        let answer = lookup
            .answer
            .get_or_init(|| lookup.settle(name, (self.lookup)(name), self.hold()))
            .await;
        match &answer.addresses {
            Ok(good) => Ok(good.addresses.clone()),
            Err(failure) => Err(io::Error::new(failure.kind, failure.message.to_string())),
        }
    }

    /// The lookup a connect to `name` takes part in: the one held or under way, or a new one,
    /// kept unless the cache is full of held answers; or, while an earlier answer stands in
    /// for a lookup under way, that answer.
    fn lookup_for(&self, name: &str) -> Taken {
        let key = name.to_ascii_lowercase();
        let now = Instant::now();
        let hold = self.hold();
        let mut lookups = match self.lookups.lock() {
            Ok(lookups) => lookups,
            // A panic under this lock can leave at most one lookup missing or stale.
            Err(poisoned) => poisoned.into_inner(),
        };
        let held = lookups.get(key.as_str());
        if let Some(lookup) = held {
            if lookup.usable(now, hold) {
                return match lookup.stand_in(now, hold) {
                    Some(addresses) => Taken::Now(addresses),
                    None => Taken::Wait(lookup.clone()),
                };
            }
        }
        let earlier = held.and_then(|lookup| match lookup.answer.get() {
            Some(Answer {
                addresses: Ok(good),
                ..
            }) if good.in_bound(now, hold) => Some(good.clone()),
            _ => None,
        });
        let lookup = Arc::new(Lookup {
            answer: OnceCell::new(),
            earlier,
        });
        // A stale entry of this name is replaced in place; a new name needs room.
        let replacing = held.is_some();
        if !replacing && lookups.len() >= self.max_names {
            lookups.retain(|_, held| held.usable(now, hold));
        }
        if replacing || lookups.len() < self.max_names {
            lookups.insert(key.into(), lookup.clone());
        }
        drop(lookups);
        match lookup.stand_in(now, hold) {
            // The lookup runs on its own, so that no connect waits for it.
            Some(addresses) if self.refresh_in_background(name, &lookup) => Taken::Now(addresses),
            _ => Taken::Wait(lookup),
        }
    }

    /// Starts `lookup` of `name` as a task of its own; false when there is no runtime to
    /// run it on (then the caller drives it).
    fn refresh_in_background(&self, name: &str, lookup: &Arc<Lookup>) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (found, hold) = ((self.lookup)(name), self.hold());
        let (name, lookup) = (name.to_owned(), lookup.clone());
        runtime.spawn(async move {
            lookup
                .answer
                .get_or_init(|| lookup.settle(&name, found, hold))
                .await;
        });
        true
    }

    /// Names kept now, answered or under way (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lookups.lock().map_or(0, |lookups| lookups.len())
    }
}

impl std::fmt::Debug for NameCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameCache")
            .field("hold", &self.hold())
            .field("max_names", &self.max_names)
            .finish_non_exhaustive()
    }
}

/// `duration` in nanoseconds, saturating (a hold of centuries is forever).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The system resolver, on tokio's blocking pool.
#[allow(clippy::disallowed_methods)] // the one place that calls the system resolver
fn system_lookup(name: &str) -> LookupFuture {
    let name = name.to_owned();
    Box::pin(async move {
        let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
        Ok(found.map(|address| address.ip()).collect())
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A cache whose lookups are counted, each taking `delay` and answering `answer`.
    fn counted(
        hold: Duration,
        max_names: usize,
        delay: Duration,
        answer: fn(&str) -> io::Result<Vec<IpAddr>>,
    ) -> (Arc<NameCache>, Arc<AtomicUsize>) {
        let lookups = Arc::new(AtomicUsize::new(0));
        let counter = lookups.clone();
        let cache = NameCache::with_lookup(hold, max_names, move |name| {
            counter.fetch_add(1, Ordering::SeqCst);
            let name = name.to_owned();
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                answer(&name)
            })
        });
        (Arc::new(cache), lookups)
    }

    fn loopback(_: &str) -> io::Result<Vec<IpAddr>> {
        Ok(vec![Ipv4Addr::LOCALHOST.into()])
    }

    fn unknown(name: &str) -> io::Result<Vec<IpAddr>> {
        Err(io::Error::other(format!("no such name {name}")))
    }

    const HOLD_10S: Duration = Duration::from_secs(10);
    const LOOKUP_TIME: Duration = Duration::from_millis(20);

    #[tokio::test(start_paused = true)]
    async fn connects_at_the_same_time_share_one_lookup() {
        let (cache, lookups) = counted(HOLD_10S, 16, LOOKUP_TIME, loopback);
        let asks: Vec<_> = (0..100)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.addresses("origin.test").await })
            })
            .collect();
        for ask in asks {
            let addresses = ask.await.unwrap().unwrap();
            assert_eq!(&addresses[..], &[IpAddr::from(Ipv4Addr::LOCALHOST)]);
        }
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            1,
            "one lookup for 100 connects"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_held_then_looked_up_again() {
        let (cache, lookups) = counted(HOLD_10S, 16, LOOKUP_TIME, loopback);
        cache.addresses("origin.test").await.unwrap();
        tokio::time::advance(Duration::from_secs(9)).await;
        cache.addresses("Origin.TEST").await.unwrap();
        assert_eq!(lookups.load(Ordering::SeqCst), 1, "held 10 s, any case");
        tokio::time::advance(Duration::from_secs(2)).await;
        cache.addresses("origin.test").await.unwrap();
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            2,
            "looked up again after 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_hold_can_be_changed_and_zero_holds_nothing() {
        let (cache, lookups) = counted(HOLD_10S, 16, LOOKUP_TIME, loopback);
        cache.set_hold(Duration::ZERO);
        assert_eq!(cache.hold(), Duration::ZERO);
        cache.addresses("origin.test").await.unwrap();
        cache.addresses("origin.test").await.unwrap();
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            2,
            "no hold: asked each time"
        );
        // Still one lookup for connects at the same time.
        let (a, b) = tokio::join!(
            cache.addresses("origin.test"),
            cache.addresses("origin.test")
        );
        a.unwrap();
        b.unwrap();
        assert_eq!(lookups.load(Ordering::SeqCst), 3);
        // A longer hold applies to the answer already held.
        cache.set_hold(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(30)).await;
        cache.addresses("origin.test").await.unwrap();
        assert_eq!(lookups.load(Ordering::SeqCst), 3, "held 60 s now");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_reaches_every_waiter_and_is_not_held() {
        let (cache, lookups) = counted(HOLD_10S, 16, LOOKUP_TIME, unknown);
        let (first, second) =
            tokio::join!(cache.addresses("gone.test"), cache.addresses("gone.test"));
        for result in [first, second] {
            let error = result.unwrap_err();
            assert_eq!(error.to_string(), "no such name gone.test");
        }
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            1,
            "the two waited for one lookup"
        );
        cache.addresses("gone.test").await.unwrap_err();
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            2,
            "a failure is asked again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_address_is_an_error() {
        let (cache, _) = counted(HOLD_10S, 16, LOOKUP_TIME, |_| Ok(Vec::new()));
        let error = cache.addresses("empty.test").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(error.to_string(), "empty.test resolved to no address");
    }

    #[tokio::test(start_paused = true)]
    async fn names_are_bounded_and_stale_ones_make_room() {
        let (cache, lookups) = counted(HOLD_10S, 2, LOOKUP_TIME, loopback);
        cache.addresses("a.test").await.unwrap();
        cache.addresses("b.test").await.unwrap();
        // Full of held answers: a third name is resolved but not kept.
        cache.addresses("c.test").await.unwrap();
        cache.addresses("c.test").await.unwrap();
        assert_eq!(cache.len(), 2);
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            4,
            "c.test asked twice, not kept"
        );
        // Once the held answers are stale, they make room.
        tokio::time::advance(Duration::from_secs(11)).await;
        cache.addresses("c.test").await.unwrap();
        cache.addresses("c.test").await.unwrap();
        assert_eq!(lookups.load(Ordering::SeqCst), 5, "c.test kept now");
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_does_not_strand_the_others() {
        let (cache, lookups) = counted(HOLD_10S, 16, Duration::from_secs(1), loopback);
        let impatient =
            tokio::time::timeout(Duration::from_millis(10), cache.addresses("slow.test"));
        let patient = cache.addresses("slow.test");
        let (impatient, patient) = tokio::join!(impatient, patient);
        assert!(impatient.is_err(), "the first gave up");
        patient.unwrap();
        // The lookup the first began went with it; the second began its own.
        assert_eq!(lookups.load(Ordering::SeqCst), 2);
    }

    /// A cache (hold 10 s) whose lookups take a second each and answer `script` in turn, the
    /// last entry from then on; and the count of lookups begun.
    fn scripted(script: Vec<io::Result<Vec<IpAddr>>>) -> (Arc<NameCache>, Arc<AtomicUsize>) {
        let script: Vec<Result<Vec<IpAddr>, String>> = script
            .into_iter()
            .map(|answer| answer.map_err(|error| error.to_string()))
            .collect();
        let lookups = Arc::new(AtomicUsize::new(0));
        let counter = lookups.clone();
        let cache = NameCache::with_lookup(HOLD_10S, 16, move |_| {
            let turn = counter.fetch_add(1, Ordering::SeqCst);
            let answer = script[turn.min(script.len() - 1)].clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                answer.map_err(io::Error::other)
            })
        });
        (Arc::new(cache), lookups)
    }

    /// `cache`'s addresses for `name` if they come without waiting (paused time would
    /// otherwise move on to the timeout).
    async fn at_once(cache: &NameCache, name: &str) -> Option<io::Result<Arc<[IpAddr]>>> {
        tokio::time::timeout(Duration::from_millis(1), cache.addresses(name))
            .await
            .ok()
    }

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    #[tokio::test(start_paused = true)]
    async fn past_its_hold_an_answer_is_used_while_its_name_is_looked_up_again() {
        let (cache, lookups) = scripted(vec![Ok(vec![A]), Ok(vec![B])]);
        assert_eq!(&cache.addresses("origin.test").await.unwrap()[..], &[A]);
        tokio::time::advance(HOLD_10S).await;
        for _ in 0..3 {
            let addresses = at_once(&cache, "origin.test")
                .await
                .expect("not waited for");
            assert_eq!(&addresses.unwrap()[..], &[A], "the old answer meanwhile");
        }
        assert_eq!(
            lookups.load(Ordering::SeqCst),
            2,
            "one lookup again, in the background"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let addresses = at_once(&cache, "origin.test").await.expect("held");
        assert_eq!(&addresses.unwrap()[..], &[B], "the new answer once it came");
        assert_eq!(lookups.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_keeps_the_last_answer_for_a_while_then_fails() {
        let (cache, lookups) = scripted(vec![Ok(vec![A]), Err(io::Error::other("resolver down"))]);
        // Found at 1 s, held until 11 s. Each hold, a lookup again fails and the old
        // answer stays, until 30 s past the hold.
        cache.addresses("origin.test").await.unwrap();
        for (round, lookups_then) in [(1, 2), (2, 3), (3, 4)] {
            tokio::time::advance(HOLD_10S).await;
            let addresses = at_once(&cache, "origin.test")
                .await
                .expect("not waited for");
            assert_eq!(&addresses.unwrap()[..], &[A], "round {round}");
            tokio::time::sleep(Duration::from_secs(2)).await; // the lookup has failed
            let addresses = at_once(&cache, "origin.test").await.expect("held again");
            assert_eq!(
                &addresses.unwrap()[..],
                &[A],
                "round {round}, after the failure"
            );
            assert_eq!(
                lookups.load(Ordering::SeqCst),
                lookups_then,
                "round {round}"
            );
        }
        // 47 s now, 46 s after the answer was found: past 10 + 30 s, the failure is the answer.
        tokio::time::advance(HOLD_10S).await;
        let error = cache.addresses("origin.test").await.unwrap_err();
        assert_eq!(error.to_string(), "resolver down");
        assert_eq!(lookups.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn the_system_resolver_knows_loopback_literals() {
        let addresses = NameCache::system().addresses("127.0.0.1").await.unwrap();
        assert_eq!(&addresses[..], &[IpAddr::from(Ipv4Addr::LOCALHOST)]);
    }
}
