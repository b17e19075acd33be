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
//! A failed lookup is given to the connects that waited for it and not kept: the next
//! connect asks again. What is done with the addresses (the proxy's SSRF check of every
//! one, the order they are tried in, timeouts) is the caller's.
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

/// One lookup of a name, which every connect asking for it while it is under way waits for.
#[derive(Default)]
struct Lookup {
    answer: OnceCell<Answer>,
}

/// What a lookup answered, and when.
struct Answer {
    at: Instant,
    addresses: Result<Arc<[IpAddr]>, LookupFailure>,
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
    /// lookup held, or of the one under way, or of a new one.
    ///
    /// # Errors
    /// The lookup's error (each caller that waited for a failed lookup gets one of the same
    /// kind and message), or `NotFound` when it answered no address.
    pub async fn addresses(&self, name: &str) -> io::Result<Arc<[IpAddr]>> {
        let lookup = self.lookup_for(name);
        let answer = lookup
            .answer
            .get_or_init(|| async {
                let addresses = match (self.lookup)(name).await {
                    Ok(found) if found.is_empty() => Err(LookupFailure {
                        kind: io::ErrorKind::NotFound,
                        message: format!("{name} resolved to no address").into(),
                    }),
                    Ok(found) => Ok(Arc::from(found)),
                    Err(error) => Err(LookupFailure {
                        kind: error.kind(),
                        message: error.to_string().into(),
                    }),
                };
                Answer {
                    at: Instant::now(),
                    addresses,
                }
            })
            .await;
        match &answer.addresses {
            Ok(addresses) => Ok(addresses.clone()),
            Err(failure) => Err(io::Error::new(failure.kind, failure.message.to_string())),
        }
    }

    /// The lookup a connect to `name` takes part in: the one held or under way, or a new one,
    /// kept unless the cache is full of held answers.
    fn lookup_for(&self, name: &str) -> Arc<Lookup> {
        let key = name.to_ascii_lowercase();
        let now = Instant::now();
        let hold = self.hold();
        let mut lookups = match self.lookups.lock() {
            Ok(lookups) => lookups,
            // A panic under this lock can leave at most one lookup missing or stale.
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(lookup) = lookups.get(key.as_str()) {
            if lookup.usable(now, hold) {
                return lookup.clone();
            }
        }
        let lookup = Arc::new(Lookup::default());
        // A stale entry of this name is replaced in place; a new name needs room.
        let replacing = lookups.contains_key(key.as_str());
        if !replacing && lookups.len() >= self.max_names {
            lookups.retain(|_, held| held.usable(now, hold));
        }
        if replacing || lookups.len() < self.max_names {
            lookups.insert(key.into(), lookup.clone());
        }
        lookup
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

    #[tokio::test]
    async fn the_system_resolver_knows_loopback_literals() {
        let addresses = NameCache::system().addresses("127.0.0.1").await.unwrap();
        assert_eq!(&addresses[..], &[IpAddr::from(Ipv4Addr::LOCALHOST)]);
    }
}
