//! `Resolver`: what an edge router embeds to learn which DC hosts a key's
//! actor. Cheap to clone, safe to share across tasks.
//!
//! Three caches, because three kinds of fact age differently:
//! global entries never change, so they are cached until evicted by
//! capacity; nor does membership of a chain (links never change), so the
//! furthest member of each key's chain a walk proved (its tail) is kept as
//! well, and the next walk starts there (DESIGN.md §7.2) instead of
//! following every link again; the tail's live state changes, so the whole
//! answer is cached for a short TTL (and dropped by
//! [`Resolver::report_unreachable`] when routing to it fails). A hit is one
//! lookup in the answer cache ([`crate::answer_cache`], built for the hit:
//! the other caches are moka's). Concurrent cold resolves of one key share
//! one walk (single-flight), so each hop is asked once. What a walk asks,
//! which remembered answers it uses and how it goes around a silent DC is
//! decided by homing-core's [`RouterWalk`] (the simulated routers drive the
//! same walk); this module asks the DCs and keeps the caches.
//!
//! A DC that stops answering costs one timeout, not one per request: the
//! first request to time out (or fail to connect) makes the DC *suspect*
//! ([`crate::reachability`] decides; this module only drives it). While it
//! is, requests that need it are not sent: `resolve` answers
//! [`ResolveError::Unavailable`] with `suspect: true` at once and
//! `resolve_or_stale` the remembered answer, marked stale, while one
//! background probe per DC finds out when it answers again. Requests that
//! do not need the DC are unaffected (the global read goes to the next DC).

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homing_core::chain::HOP_LIMIT_DEFAULT;
use homing_core::{
    ActorId, ChainError, DcId, FencingToken, Key, KeyRef, Learned, Mutations, Reply, Request,
    ReservationId, ReservationRef, RouterMemory, RouterPoll, RouterWalk, Shortcut, Succession,
    TailView, Walked,
};
use homing_net::{Client, DcTable, Peer, Unanswered};
use thiserror::Error;
use tracing::{info, warn};

use crate::actor_ids::{ACTOR_IDS_MAX, ActorIds};
use crate::answer_cache::AnswerCache;
use crate::reachability::{Change, DcSlot, ProbeSchedule};

/// Default time a resolved answer (the tail's live state) is served from cache.
pub const TAIL_TTL_MS_DEFAULT: u64 = 1_000;
/// Default time a `NotFound` is served from cache (DESIGN.md §7.4).
pub use homing_core::chain::RESOLVER_ABSENT_TTL_MS_DEFAULT as ABSENT_TTL_MS_DEFAULT;
/// Default capacity of each cache, in entries.
pub const CACHE_ENTRIES_DEFAULT: u64 = 1_000_000;
/// Default timeout of one request to one DC.
pub const HOP_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Default timeout of one probe of a suspect DC.
pub const PROBE_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default interval between two reads of the DC directory.
pub const DIRECTORY_REFRESH_MS_DEFAULT: u64 = 2_000;
pub use crate::reachability::{
    PROBE_INTERVAL_MAX_MS_DEFAULT, PROBE_INTERVAL_MS_DEFAULT, PROBE_JITTER_PERCENT_DEFAULT,
};
/// `resolve`'s marker for "another caller's future ran the walk" (not a u32).
const NOT_WALKED: u64 = u64::MAX;

/// How a [`Resolver`] reaches DCs and how much it remembers.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Every DC the router may ask, nearest first: the global read goes to
    /// the first that answers; each chain hop goes to the reservation's owner.
    /// A DC served by several homingd is listed once per address: requests
    /// go to its first address that answers, and once more to the next
    /// when one gives no answer.
    pub dcs: Vec<(DcId, SocketAddr)>,
    /// Capacity of the global-entry and chain-member caches (each), in entries.
    pub cache_entries: u64,
    /// How long an answer's tail state is served from cache, in milliseconds.
    pub tail_ttl_ms: u64,
    /// How long a `NotFound` is served from cache, in milliseconds (0: never):
    /// a key reserved meanwhile stays unseen by this router at most that long.
    pub absent_ttl_ms: u64,
    /// Timeout of one request to one DC, in milliseconds. A DC that lets it
    /// run out (or cannot be connected to) becomes suspect: not waited for
    /// again until a probe gets an answer.
    pub hop_timeout_ms: u64,
    /// Most links one resolve follows.
    pub hop_limit: usize,
    /// Timeout of one probe of a suspect DC, in milliseconds.
    pub probe_timeout_ms: u64,
    /// Wait before the first probe of a suspect DC, and the base of the
    /// backoff between probes, in milliseconds (at least 1).
    pub probe_interval_ms: u64,
    /// Longest wait between two probes of a suspect DC, in milliseconds
    /// (at least `probe_interval_ms`). A DC that answers again is routed to
    /// within about `probe_timeout_ms + probe_interval_max_ms`.
    pub probe_interval_max_ms: u64,
    /// Spread of each wait between probes, in percent either way (at most
    /// 100), so routers do not probe a DC in step.
    pub probe_jitter_percent: u8,
    /// How often the resolver asks its DCs for the DC directory and adds
    /// the DCs not in `dcs` (after them, in the order the directory lists
    /// them, each with every homingd listed), in milliseconds; 0: never
    /// (the DC table is `dcs` only). A DC in `dcs` is reached only at the
    /// addresses given there. A DC added to the deployment is routed to within about
    /// this long plus its homingd's own directory refresh.
    pub directory_refresh_ms: u64,
}

impl ResolverConfig {
    /// Defaults for everything but the DC table.
    pub fn new(dcs: Vec<(DcId, SocketAddr)>) -> ResolverConfig {
        ResolverConfig {
            dcs,
            cache_entries: CACHE_ENTRIES_DEFAULT,
            tail_ttl_ms: TAIL_TTL_MS_DEFAULT,
            absent_ttl_ms: ABSENT_TTL_MS_DEFAULT,
            hop_timeout_ms: HOP_TIMEOUT_MS_DEFAULT,
            hop_limit: HOP_LIMIT_DEFAULT,
            probe_timeout_ms: PROBE_TIMEOUT_MS_DEFAULT,
            probe_interval_ms: PROBE_INTERVAL_MS_DEFAULT,
            probe_interval_max_ms: PROBE_INTERVAL_MAX_MS_DEFAULT,
            probe_jitter_percent: PROBE_JITTER_PERCENT_DEFAULT,
            directory_refresh_ms: DIRECTORY_REFRESH_MS_DEFAULT,
        }
    }

    /// The probe schedule, with out-of-range values brought into range
    /// (interval at least 1 ms, cap at least the interval, jitter at most 100 %).
    fn probe_schedule(&self) -> ProbeSchedule {
        let interval_ms = self.probe_interval_ms.max(1);
        ProbeSchedule {
            interval_ms,
            interval_max_ms: self.probe_interval_max_ms.max(interval_ms),
            jitter_percent: self.probe_jitter_percent.min(100),
        }
    }
}

/// What a [`Resolver`] did about unreachable DCs, since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolverStats {
    /// DCs suspect now, every address of each (a gauge).
    pub dcs_suspect: u64,
    /// Times an address of a DC became suspect.
    pub suspicions: u64,
    /// Times a suspect address answered again.
    pub recoveries: u64,
    /// Requests to a DC not sent because it was suspect (each answered at
    /// once instead of waiting for a timeout).
    pub skipped_suspect: u64,
    /// Remembered answers served stale by `resolve_or_stale`.
    pub stale_answers: u64,
    /// Probes sent to suspect DCs.
    pub probes: u64,
    /// Probes that got no answer.
    pub probes_failed: u64,
    /// Requests sent once more to another address of the same DC after the
    /// first gave no answer.
    pub failovers: u64,
}

/// Where a key's actor lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The key.
    pub key: Key,
    /// The DC hosting the actor.
    pub dc: DcId,
    /// The tail reservation.
    pub reservation: ReservationId,
    /// The actor.
    pub actor: ActorId,
    /// Its fencing token.
    pub token: FencingToken,
    /// Links followed from the global entry to the tail.
    pub hops: u32,
    /// Network round trips this resolve made (0 when answered from cache).
    pub remote_round_trips: u32,
    /// Whether the whole answer came from cache.
    pub from_cache: bool,
    /// Whether this is a remembered answer served because a DC was unavailable
    /// (only from [`Resolver::resolve_or_stale`]).
    pub stale: bool,
}

/// Why a key could not be resolved; each variant is a different router action.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    /// The key was never reserved (authoritative: a DC read the global store).
    #[error("key {0} not found")]
    NotFound(Key),
    /// The key's chain ends in a reservation with no live actor.
    #[error("no live actor for key {key}: tail {reservation} is vacant")]
    Vacant {
        /// The key.
        key: Key,
        /// The vacant tail.
        reservation: ReservationId,
    },
    /// A DC needed for the answer did not answer, or was not asked because
    /// it is suspect (it let a request time out and has not answered since).
    #[error("dc {dc} unavailable: {reason}")]
    Unavailable {
        /// The DC.
        dc: DcId,
        /// Why.
        reason: String,
        /// Not asked: the DC was suspect, so this was answered at once.
        suspect: bool,
    },
    /// The chain is longer than the hop limit.
    #[error("chain longer than the hop limit of {0}")]
    ChainTooLong(usize),
    /// An answer contradicts the chain or what is known immutable.
    #[error("inconsistent answer: {0}")]
    Inconsistent(String),
}

impl From<ChainError> for ResolveError {
    fn from(e: ChainError) -> ResolveError {
        match e {
            ChainError::TooLong(limit) => ResolveError::ChainTooLong(limit),
            other => ResolveError::Inconsistent(other.to_string()),
        }
    }
}

struct Inner {
    /// The DCs and their addresses, which are suspect, and the probes.
    dcs: DcTable,
    config: ResolverConfig,
    counters: Counters,
    /// Key → global entry; immutable facts.
    entries: moka::sync::Cache<Key, ReservationId>,
    /// Key → the furthest member of its chain a walk proved; members stay
    /// members, so this only ever falls behind, never becomes wrong.
    members: moka::sync::Cache<Key, Shortcut>,
    /// Key → whole answer, for `tail_ttl_ms`: the hot path.
    answers: AnswerCache<Answer, ResolveError>,
    /// The actor ids the answers share.
    actor_ids: ActorIds,
    /// Key → last good answer, for callers who accept stale answers.
    remembered: moka::future::Cache<Key, Answer>,
    /// Keys found absent, and when; kept for `absent_ttl_ms` (`None` when
    /// that is 0). The walk decides what is still fresh.
    absent: Option<moka::sync::Cache<Key, Instant>>,
    /// Reservation → its succession in the global store (DESIGN.md §7.5):
    /// write-once, asked only when the reservation's DC does not answer.
    successions: moka::sync::Cache<ReservationId, Succession>,
    /// Reservations with no succession, and when, kept for `absent_ttl_ms`:
    /// a partitioned DC's tails cost one such question per that period,
    /// not per resolve.
    no_succession: Option<moka::sync::Cache<ReservationId, Instant>>,
}

#[derive(Default)]
struct Counters {
    skipped_suspect: AtomicU64,
    stale_answers: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the answer caches hold per key: the tail, and nothing the cache key
/// or the resolver already knows (no second copy of the key, the DC as its
/// place in the resolver's DC table rather than its name), held inline
/// rather than behind an `Arc` — per-key memory is what bounds how many keys
/// a router can keep hot (see `examples/resolve_bench.rs`: the DC's name
/// alone, once in the reservation ID, cost 64 bytes per key).
#[derive(Debug, Clone)]
struct Answer {
    /// The tail's DC: an index into `Inner::dcs`.
    dc: u32,
    /// The tail reservation's unique within that DC.
    unique: u64,
    /// Shared with every answer of that actor and every one handed out (a
    /// clone is a count, not a copy; see `actor_ids.rs`).
    actor: Arc<str>,
    token: FencingToken,
    hops: u32,
}

impl Answer {
    /// The answer to cache for `resolution`; `None` if its DC is not in
    /// `dcs` (a walk only ends at a DC it asked, which is in the table).
    fn of(resolution: Resolution, dcs: &DcTable, actor_ids: &ActorIds) -> Option<Answer> {
        let place = dcs.slot(resolution.reservation.dc())?;
        Some(Answer {
            dc: u32::try_from(place.0).ok()?,
            unique: resolution.reservation.unique(),
            actor: actor_ids.get(resolution.actor.as_str()),
            token: resolution.token,
            hops: resolution.hops,
        })
    }

    /// Whether this answer's tail is `id`.
    fn names(&self, id: &ReservationId, dcs: &DcTable) -> bool {
        self.unique == id.unique() && self.dc_id(dcs) == Some(id.dc())
    }

    fn dc_id<'a>(&self, dcs: &'a DcTable) -> Option<&'a DcId> {
        dcs.dc(DcSlot(self.dc as usize))
    }

    /// The answer as served from cache (no round trip of this call).
    fn cached(self, key: &Key, stale: bool, dcs: &DcTable) -> Resolution {
        // Invariant: `of` only makes answers whose index is in `dcs`, and a
        // resolver's table only grows.
        let dc = self
            .dc_id(dcs)
            .expect("a cached answer's dc is in the resolver's table")
            .clone();
        Resolution {
            key: key.clone(),
            reservation: ReservationId::new(dc.clone(), self.unique),
            dc,
            // Invariant: the text was an ActorId when the answer was made.
            actor: ActorId::new(&*self.actor).expect("a cached actor id is valid"),
            token: self.token,
            hops: self.hops,
            remote_round_trips: 0,
            from_cache: true,
            stale,
        }
    }
}

/// An answer and how one call got it.
struct Found {
    answer: Answer,
    /// The round trips of the walk this call ran; `None` if it ran none
    /// (a cached answer, or another caller's walk).
    walked: Option<u32>,
    /// A remembered answer served because a DC was unavailable.
    stale: bool,
}

impl Found {
    fn resolution(self, key: &Key, dcs: &DcTable) -> Resolution {
        let resolution = self.answer.cached(key, self.stale, dcs);
        match self.walked {
            Some(remote_round_trips) => Resolution {
                remote_round_trips,
                from_cache: false,
                ..resolution
            },
            None => resolution,
        }
    }

    fn resolved(self, dcs: &DcTable) -> Resolved<'_> {
        // Invariant: `Answer::of` only makes answers whose index is in
        // `dcs`, and a resolver's table only grows.
        let dc = self
            .answer
            .dc_id(dcs)
            .expect("a cached answer's dc is in the resolver's table");
        Resolved {
            dc,
            dc_slot: self.answer.dc,
            unique: self.answer.unique,
            actor: self.answer.actor,
            token: self.answer.token,
            hops: self.answer.hops,
            remote_round_trips: self.walked.unwrap_or(0),
            from_cache: self.walked.is_none(),
            stale: self.stale,
        }
    }
}

/// Where a key's actor lives, as [`Resolver::resolve_ref`] answers: a
/// [`Resolution`] whose parts are borrowed from the resolver (the DC's
/// name) or shared with its answer cache (the actor's), so that a cached
/// answer costs no allocation.
#[derive(Debug, Clone)]
pub struct Resolved<'r> {
    dc: &'r DcId,
    /// `dc`'s place in the resolver's DC table.
    dc_slot: u32,
    unique: u64,
    actor: Arc<str>,
    token: FencingToken,
    hops: u32,
    remote_round_trips: u32,
    from_cache: bool,
    stale: bool,
}

impl<'r> Resolved<'r> {
    /// The DC hosting the actor.
    pub fn dc(&self) -> &'r DcId {
        self.dc
    }

    /// The tail reservation.
    pub fn reservation(&self) -> ReservationRef<'r> {
        ReservationRef::new(self.dc, self.unique)
    }

    /// The actor's id (a valid [`ActorId`]'s text).
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Its fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Links followed from the global entry to the tail.
    pub fn hops(&self) -> u32 {
        self.hops
    }

    /// Network round trips this resolve made (0 when answered from cache).
    pub fn remote_round_trips(&self) -> u32 {
        self.remote_round_trips
    }

    /// Whether the whole answer came from cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// Whether this is a remembered answer served because a DC was
    /// unavailable (only from [`Resolver::resolve_ref_or_stale`]).
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// The same answer, owned, for `key`.
    pub fn to_resolution(&self, key: &Key) -> Resolution {
        Resolution {
            key: key.clone(),
            dc: self.dc.clone(),
            reservation: self.reservation().to_id(),
            // Invariant: the text was an ActorId when the answer was made.
            actor: ActorId::new(&*self.actor).expect("a cached actor id is valid"),
            token: self.token,
            hops: self.hops,
            remote_round_trips: self.remote_round_trips,
            from_cache: self.from_cache,
            stale: self.stale,
        }
    }
}

/// The edge router's resolver. See the module docs.
///
/// ```no_run
/// # async fn example(client: homing_net::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use homing_client::{Resolver, ResolverConfig};
/// use homing_core::{DcId, Key, KeyName};
/// // `client` presents a router certificate.
/// let resolver = Resolver::new(client, ResolverConfig::new(vec![
///     (DcId::new("iad")?, "10.0.0.1:7400".parse()?),
/// ]));
/// let at = resolver.resolve(&Key::new(KeyName::new("room-42")?)).await?;
/// println!("route to {} in {} (token {})", at.actor, at.dc, at.token);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
}

impl Resolver {
    /// A resolver sending through `client` (a router identity) to `config.dcs`.
    pub fn new(client: Client, config: ResolverConfig) -> Resolver {
        // The jitter's seed: random per resolver, so routers spread their probes.
        let seed = RandomState::new().hash_one(std::process::id());
        let dcs = DcTable::new(
            client,
            &config.dcs,
            config.probe_schedule(),
            Duration::from_millis(config.probe_timeout_ms),
            seed,
            Box::new(log_change),
        );
        let answers = AnswerCache::new(
            config.cache_entries,
            Duration::from_millis(config.tail_ttl_ms),
        );
        let refresh = Duration::from_millis(config.directory_refresh_ms);
        let resolver = Resolver {
            inner: Arc::new(Inner {
                dcs,
                counters: Counters::default(),
                entries: forever(config.cache_entries),
                members: forever(config.cache_entries),
                answers,
                actor_ids: ActorIds::new(ACTOR_IDS_MAX),
                remembered: moka::future::Cache::builder()
                    .max_capacity(config.cache_entries)
                    .build(),
                successions: forever(config.cache_entries),
                no_succession: lately(&config),
                absent: lately(&config),
                config,
            }),
        };
        if !refresh.is_zero() {
            // Ends when the resolver is dropped. Without a runtime (a
            // resolver built outside tokio) the table stays `config.dcs`.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(learn_directory_every(
                    Arc::downgrade(&resolver.inner),
                    refresh,
                ));
            }
        }
        resolver
    }

    /// Asks its DCs, in table order, for the DC directory until one gives
    /// it, and adds the DCs not in its configuration (with every homingd
    /// listed) it did not know; how many addresses it added. A DC of the previous release (which has no
    /// directory) or one that does not answer is passed over; an error
    /// (naming the last DC asked) when none gave the directory.
    pub async fn learn_directory(&self) -> Result<usize, ResolveError> {
        self.inner.learn_directory().await
    }

    /// Where `key`'s actor lives now. From cache if the answer is younger
    /// than the tail TTL; otherwise walks the chain, reusing cached entries
    /// and links, with concurrent callers for one key sharing the walk.
    ///
    /// The caller whose walk produced the answer gets `from_cache: false` and
    /// the walk's round trips; callers that waited for another's walk get
    /// the shared answer as `from_cache: true` with no round trips of their own.
    pub async fn resolve(&self, key: &Key) -> Result<Resolution, ResolveError> {
        let found = self.find(key.borrowed(), Some(key)).await?;
        Ok(found.resolution(key, &self.inner.dcs))
    }

    /// Like [`Resolver::resolve`], but borrowed: the answer shares the
    /// cached one's parts (the DC's name from the resolver's table, the
    /// actor's with the answer cache), so a cached answer is found without
    /// copying the key or allocating. What the edge router asks per request.
    pub async fn resolve_ref(&self, key: KeyRef<'_>) -> Result<Resolved<'_>, ResolveError> {
        let found = self.find(key, None).await?;
        Ok(found.resolved(&self.inner.dcs))
    }

    /// The answer for `key` (`owned`: the same key, if the caller has it as
    /// a `Key`; made from `key` on a miss otherwise).
    async fn find(&self, key: KeyRef<'_>, owned: Option<&Key>) -> Result<Found, ResolveError> {
        let now = Instant::now();
        if let Some(answer) = self.inner.answers.get(key, now) {
            return Ok(Found {
                answer,
                walked: None,
                stale: false,
            });
        }
        // A walk's state is kilobytes: boxed, so that a hit's future stays
        // small (hyper moves each HTTP/2 request's future into its own task).
        Box::pin(async move {
            match owned {
                Some(key) => self.resolve_cold(key, now).await,
                None => self.resolve_cold(&key.to_key(), now).await,
            }
        })
        .await
    }

    /// A resolve that missed the answer cache at `now`.
    async fn resolve_cold(&self, key: &Key, now: Instant) -> Result<Found, ResolveError> {
        let dcs = &self.inner.dcs;
        // Set only if this call's future ran the walk (single-flight); atomic
        // because the future must be Send, never contended.
        let walked_here = AtomicU64::new(NOT_WALKED);
        let answer = self
            .inner
            .answers
            .get_or_fill(key, now, async {
                let resolution = self.inner.walk(key).await?;
                walked_here.store(u64::from(resolution.remote_round_trips), Ordering::Relaxed);
                let tail = resolution.reservation.clone();
                let answer =
                    Answer::of(resolution, dcs, &self.inner.actor_ids).ok_or_else(|| {
                        ResolveError::Inconsistent(format!(
                            "tail {tail} is in dc {}, not in this router's dc table",
                            tail.dc()
                        ))
                    })?;
                // The TTL counts from the answer, not from the call.
                Ok((answer, Instant::now()))
            })
            .await;
        let answer = answer.map_err(|e| (*e).clone())?;
        let walked = u32::try_from(walked_here.load(Ordering::Relaxed)).ok();
        if walked.is_some() {
            self.inner
                .remembered
                .insert(key.clone(), answer.clone())
                .await;
        }
        Ok(Found {
            answer,
            walked,
            stale: false,
        })
    }

    /// Like [`Resolver::resolve`], but when a DC is unavailable and an earlier
    /// answer is remembered, returns that answer marked `stale`.
    pub async fn resolve_or_stale(&self, key: &Key) -> Result<Resolution, ResolveError> {
        let found = self.find_or_stale(key.borrowed(), Some(key)).await?;
        Ok(found.resolution(key, &self.inner.dcs))
    }

    /// [`Resolver::resolve_ref`], with stale answers as
    /// [`Resolver::resolve_or_stale`] gives them.
    pub async fn resolve_ref_or_stale(
        &self,
        key: KeyRef<'_>,
    ) -> Result<Resolved<'_>, ResolveError> {
        let found = self.find_or_stale(key, None).await?;
        Ok(found.resolved(&self.inner.dcs))
    }

    async fn find_or_stale(
        &self,
        key: KeyRef<'_>,
        owned: Option<&Key>,
    ) -> Result<Found, ResolveError> {
        let unavailable = match self.find(key, owned).await {
            Err(unavailable @ ResolveError::Unavailable { .. }) => unavailable,
            other => return other,
        };
        // Boxed for the same reason as the walk (see `find`).
        Box::pin(self.remembered_or(key, owned, unavailable)).await
    }

    /// The remembered answer for `key` (`owned`: as in `find`), marked
    /// stale, or `unavailable`.
    async fn remembered_or(
        &self,
        key: KeyRef<'_>,
        owned: Option<&Key>,
        unavailable: ResolveError,
    ) -> Result<Found, ResolveError> {
        let remembered = match owned {
            Some(key) => self.inner.remembered.get(key).await,
            None => self.inner.remembered.get(&key.to_key()).await,
        };
        match remembered {
            Some(answer) => {
                bump(&self.inner.counters.stale_answers);
                Ok(Found {
                    answer,
                    walked: None,
                    stale: true,
                })
            }
            None => Err(unavailable),
        }
    }

    /// Routing to `resolution` failed: forget the cached tail state so the
    /// next resolve asks the tail's DC again (which answers with the link if
    /// the actor moved). Entries and chain members stay cached: they are immutable.
    ///
    /// Only an answer that still names the reported reservation is dropped: a
    /// late report must not throw away a newer answer that already replaced it.
    pub async fn report_unreachable(&self, resolution: &Resolution) {
        let dcs = &self.inner.dcs;
        self.inner.answers.remove_if(&resolution.key, |cached| {
            cached.names(&resolution.reservation, dcs)
        });
    }

    /// [`Resolver::report_unreachable`] for an answer of
    /// [`Resolver::resolve_ref`] for `key`.
    pub async fn report_unreachable_ref(&self, key: KeyRef<'_>, resolved: &Resolved<'_>) {
        let tail = resolved.reservation();
        self.inner.answers.remove_if(key, |cached| {
            cached.unique == tail.unique() && cached.dc == resolved.dc_slot
        });
    }

    /// The chain of `key` hop by hop, with where each answer came from and
    /// the shortcuts taken. Always asks the tail's DC (the answer cache is
    /// bypassed), but uses the cached entry and chain member; for operators
    /// and demos, not the hot path.
    pub async fn trace(&self, key: &Key) -> Result<Walked, ResolveError> {
        let walked = self.inner.walk_chain(key).await?;
        Ok(walked)
    }

    /// What it did about unreachable DCs so far.
    pub fn stats(&self) -> ResolverStats {
        let c = &self.inner.counters;
        let t = self.inner.dcs.counters();
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ResolverStats {
            dcs_suspect: self.inner.dcs.dcs_suspect() as u64,
            suspicions: get(&t.suspicions),
            recoveries: get(&t.recoveries),
            skipped_suspect: get(&c.skipped_suspect),
            stale_answers: get(&c.stale_answers),
            probes: get(&t.probes),
            probes_failed: get(&t.probes_failed),
            failovers: get(&t.failovers),
        }
    }

    /// The DCs in its table now (configured, then learned), in table order.
    pub fn dcs(&self) -> Arc<[DcId]> {
        self.inner.dcs.dcs()
    }

    /// Whether `dc` is suspect now (not asked until a probe gets an answer);
    /// false for a DC not in the table.
    pub fn is_suspect(&self, dc: &DcId) -> bool {
        self.inner.dcs.is_suspect(dc)
    }

    /// Entries in the answer cache (approximate; for metrics).
    pub fn cached_answers(&self) -> u64 {
        self.inner.answers.len() as u64
    }

    /// Inserts `resolution` into the answer cache as if a walk had just
    /// produced it (served until the tail TTL runs out). For benchmarks and
    /// tests that measure or exercise the hit path without a DC; a router
    /// has no use for it. Ignored if the resolution's DC is not in this
    /// resolver's DC table.
    #[doc(hidden)]
    pub async fn prime(&self, resolution: Resolution) {
        let key = resolution.key.clone();
        if let Some(answer) = Answer::of(resolution, &self.inner.dcs, &self.inner.actor_ids) {
            self.inner.answers.insert(&key, answer, Instant::now());
        }
    }
}

/// Reads the DC directory every `interval` while the resolver lives.
async fn learn_directory_every(inner: std::sync::Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if let Err(error) = inner.learn_directory().await {
            tracing::debug!(%error, "dc directory not read");
        }
    }
}

impl Inner {
    async fn learn_directory(&self) -> Result<usize, ResolveError> {
        let dcs = self.dcs.dcs();
        let mut last = None;
        for (slot, dc) in dcs.iter().enumerate() {
            let directory = match self.ask(DcSlot(slot), &Request::Directory).await {
                Ok(Reply::Directory(directory)) => directory,
                Ok(Reply::Error(error)) => {
                    last = Some((dc, error.to_string()));
                    continue;
                }
                Ok(_) => {
                    last = Some((
                        dc,
                        "answered a directory request with something else".into(),
                    ));
                    continue;
                }
                Err(unanswered) => {
                    last = Some((dc, unanswered.to_string()));
                    continue;
                }
            };
            let mut added = 0;
            for (dc, addr) in directory.addresses() {
                if self.dcs.learn(dc, addr) {
                    info!(%dc, %addr, "dc address learned from the dc directory");
                    added += 1;
                }
            }
            return Ok(added);
        }
        // An empty table asks no one and learns nothing.
        let Some((dc, reason)) = last else {
            return Ok(0);
        };
        Err(ResolveError::Unavailable {
            dc: dc.clone(),
            reason: format!("no dc gave the dc directory; the last: {reason}"),
            suspect: false,
        })
    }

    /// Walks the chain from the furthest member known, remembering what
    /// the walk learned (homing-core's `RouterWalk` decides; this only asks).
    async fn walk_chain(&self, key: &Key) -> Result<Walked, ResolveError> {
        let dcs = &*self.dcs.dcs();
        let mut memory = KeyMemory { inner: self, key };
        let absent_ttl = Duration::from_millis(self.config.absent_ttl_ms);
        let mut walk = RouterWalk::new(
            key.clone(),
            self.config.hop_limit,
            absent_ttl,
            &memory,
            Mutations::NONE,
        );
        loop {
            match walk.poll(dcs, &mut memory, Instant::now()) {
                RouterPoll::Ask { slot, request } => match self.ask(slot, &request).await {
                    Ok(reply) => walk.handle_reply(dcs, reply, &mut memory, Instant::now()),
                    Err(unanswered) => {
                        let suspect = matches!(unanswered, Unanswered::Suspect { .. });
                        walk.handle_silence(dcs, unanswered.to_string(), suspect);
                    }
                },
                RouterPoll::Found(walked) => return Ok(walked),
                RouterPoll::NotFound => return Err(ResolveError::NotFound(key.clone())),
                RouterPoll::Unavailable(u) => {
                    return Err(ResolveError::Unavailable {
                        dc: u.dc,
                        reason: u.reason,
                        suspect: u.suspect,
                    });
                }
                RouterPoll::Failed(e) => return Err(e.into()),
            }
        }
    }

    async fn walk(&self, key: &Key) -> Result<Resolution, ResolveError> {
        let walked = self.walk_chain(key).await?;
        let Some(actor) = walked.tail.answer().cloned() else {
            return Err(ResolveError::Vacant {
                key: key.clone(),
                reservation: walked.tail.id,
            });
        };
        let TailView { id, token, .. } = walked.tail;
        Ok(Resolution {
            key: key.clone(),
            dc: id.dc().clone(),
            reservation: id,
            actor,
            token,
            hops: walked.links.len() as u32,
            remote_round_trips: walked.remote_round_trips,
            from_cache: false,
            stale: false,
        })
    }

    /// One request to the DC in `slot`, unless it is suspect (then not
    /// sent). Timeouts and connect failures make it suspect.
    async fn ask(&self, slot: DcSlot, request: &Request) -> Result<Reply, Unanswered> {
        let timeout = Duration::from_millis(self.config.hop_timeout_ms);
        let asked = self.dcs.ask(slot, request, timeout).await;
        if let Err(Unanswered::Suspect { .. }) = &asked {
            bump(&self.counters.skipped_suspect);
        }
        asked
    }
}

/// What the resolver remembers about one key, as its walk sees it.
struct KeyMemory<'a> {
    inner: &'a Inner,
    key: &'a Key,
}

impl RouterMemory for KeyMemory<'_> {
    fn entry(&self) -> Option<ReservationId> {
        self.inner.entries.get(self.key)
    }

    fn absent_since(&self) -> Option<Instant> {
        self.inner.absent.as_ref()?.get(self.key)
    }

    fn member(&self) -> Option<Shortcut> {
        self.inner.members.get(self.key)
    }

    fn succession(&self, at: &ReservationId) -> Option<Succession> {
        self.inner.successions.get(at)
    }

    fn no_succession_since(&self, at: &ReservationId) -> Option<Instant> {
        self.inner.no_succession.as_ref()?.get(at)
    }

    fn learn(&mut self, fact: Learned) {
        let inner = self.inner;
        match fact {
            Learned::Entry(id) => inner.entries.insert(self.key.clone(), id),
            Learned::Absent(at) => {
                if let Some(absent) = &inner.absent {
                    absent.insert(self.key.clone(), at);
                }
            }
            Learned::Member(member) => inner.members.insert(self.key.clone(), member),
            Learned::Succession(succession) => {
                let at = succession.link.from.clone();
                inner.successions.insert(at, succession);
            }
            Learned::NoSuccession(at, since) => {
                if let Some(none) = &inner.no_succession {
                    none.insert(at, since);
                }
            }
        }
    }
}

/// Logs an address's change between answering and suspect, once per change.
fn log_change(peer: &Peer, change: &Change) {
    let (dc, addr) = (&peer.dc, peer.addr);
    if change.suspect {
        warn!(
            %dc,
            %addr,
            dc_suspect = change.dc_changed,
            "dc suspect: no answer; not waited for until a probe gets one"
        );
    } else {
        let suspect_ms = change.suspect_for.as_millis() as u64;
        info!(%dc, %addr, suspect_ms, "dc answers again");
    }
}

/// A cache of what was found lately: entries live `absent_ttl_ms`
/// (`None` when that is 0).
fn lately<K, V>(config: &ResolverConfig) -> Option<moka::sync::Cache<K, V>>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    (config.absent_ttl_ms > 0).then(|| {
        moka::sync::Cache::builder()
            .max_capacity(config.cache_entries)
            .time_to_live(Duration::from_millis(config.absent_ttl_ms))
            .build()
    })
}

/// A cache whose entries stay until evicted by capacity.
fn forever<K, V>(capacity: u64) -> moka::sync::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder().max_capacity(capacity).build()
}
