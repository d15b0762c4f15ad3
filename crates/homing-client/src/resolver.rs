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
//! moka lookup. Concurrent cold resolves of one key share one walk
//! (single-flight), so each hop is asked once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use homing_core::chain::HOP_LIMIT_DEFAULT;
use homing_core::{
    ActorId, ChainError, ChainWalk, DcId, ErrorKind, FencingToken, Key, Need, Poll, Reply, Request,
    ReservationId, Shortcut, Source, TailView, Walked,
};
use homing_net::{Client, Peer};
use thiserror::Error;

/// Default time a resolved answer (the tail's live state) is served from cache.
pub const TAIL_TTL_MS_DEFAULT: u64 = 1_000;
/// Default time a `NotFound` is served from cache (DESIGN.md §7.4).
pub const ABSENT_TTL_MS_DEFAULT: u64 = 250;
/// Default capacity of each cache, in entries.
pub const CACHE_ENTRIES_DEFAULT: u64 = 1_000_000;
/// Default timeout of one request to one DC.
pub const HOP_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// `resolve`'s marker for "another caller's future ran the walk" (not a u32).
const NOT_WALKED: u64 = u64::MAX;

/// How a [`Resolver`] reaches DCs and how much it remembers.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Every DC the router may ask, nearest first: the global read goes to
    /// the first that answers; each chain hop goes to the reservation's owner.
    pub dcs: Vec<(DcId, SocketAddr)>,
    /// Capacity of the global-entry and chain-member caches (each), in entries.
    pub cache_entries: u64,
    /// How long an answer's tail state is served from cache, in milliseconds.
    pub tail_ttl_ms: u64,
    /// How long a `NotFound` is served from cache, in milliseconds (0: never):
    /// a key reserved meanwhile stays unseen by this router at most that long.
    pub absent_ttl_ms: u64,
    /// Timeout of one request to one DC, in milliseconds.
    pub hop_timeout_ms: u64,
    /// Most links one resolve follows.
    pub hop_limit: usize,
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
        }
    }
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
    /// A DC needed for the answer did not answer.
    #[error("dc {dc} unavailable: {reason}")]
    Unavailable {
        /// The DC.
        dc: DcId,
        /// Why.
        reason: String,
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
    client: Client,
    dcs: Vec<Peer>,
    config: ResolverConfig,
    /// Key → global entry; immutable facts.
    entries: moka::future::Cache<Key, ReservationId>,
    /// Key → the furthest member of its chain a walk proved; members stay
    /// members, so this only ever falls behind, never becomes wrong.
    members: moka::future::Cache<Key, Shortcut>,
    /// Key → whole answer, for `tail_ttl_ms`: the hot path.
    answers: moka::future::Cache<Key, Answer>,
    /// Key → last good answer, for callers who accept stale answers.
    remembered: moka::future::Cache<Key, Answer>,
    /// Keys found absent, for `absent_ttl_ms` (`None` when that is 0).
    absent: Option<moka::future::Cache<Key, ()>>,
}

/// What the answer caches hold per key: the tail, and nothing the cache key
/// or the resolver already knows (no second copy of the key, the DC as its
/// place in the resolver's DC table rather than its name), held inline
/// rather than behind an `Arc` — per-key memory is what bounds how many keys
/// a router can keep hot (see `examples/resolve_bench.rs`: the DC's name
/// alone, once in the reservation ID, cost 64 of 265 bytes per key).
#[derive(Debug, Clone)]
struct Answer {
    /// The tail's DC: an index into `Inner::dcs`.
    dc: u32,
    /// The tail reservation's unique within that DC.
    unique: u64,
    actor: ActorId,
    token: FencingToken,
    hops: u32,
}

impl Answer {
    /// The answer to cache for `resolution`; `None` if its DC is not in
    /// `dcs` (a walk only ends at a DC it asked, which is in the table).
    fn of(resolution: Resolution, dcs: &[Peer]) -> Option<Answer> {
        let place = dcs
            .iter()
            .position(|p| &p.dc == resolution.reservation.dc())?;
        Some(Answer {
            dc: u32::try_from(place).ok()?,
            unique: resolution.reservation.unique(),
            actor: resolution.actor,
            token: resolution.token,
            hops: resolution.hops,
        })
    }

    /// Whether this answer's tail is `id`.
    fn names(&self, id: &ReservationId, dcs: &[Peer]) -> bool {
        self.unique == id.unique() && self.dc_id(dcs) == Some(id.dc())
    }

    fn dc_id<'a>(&self, dcs: &'a [Peer]) -> Option<&'a DcId> {
        dcs.get(self.dc as usize).map(|p| &p.dc)
    }

    /// The answer as served from cache (no round trip of this call).
    fn cached(self, key: &Key, stale: bool, dcs: &[Peer]) -> Resolution {
        // Invariant: `of` only makes answers whose index is in `dcs`, and a
        // resolver's table never changes.
        let dc = self
            .dc_id(dcs)
            .expect("a cached answer's dc is in the resolver's table")
            .clone();
        Resolution {
            key: key.clone(),
            reservation: ReservationId::new(dc.clone(), self.unique),
            dc,
            actor: self.actor,
            token: self.token,
            hops: self.hops,
            remote_round_trips: 0,
            from_cache: true,
            stale,
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
        let dcs = config
            .dcs
            .iter()
            .map(|(dc, addr)| Peer {
                addr: *addr,
                dc: dc.clone(),
            })
            .collect();
        let answers = moka::future::Cache::builder()
            .max_capacity(config.cache_entries)
            .time_to_live(Duration::from_millis(config.tail_ttl_ms))
            .build();
        let absent = (config.absent_ttl_ms > 0).then(|| {
            moka::future::Cache::builder()
                .max_capacity(config.cache_entries)
                .time_to_live(Duration::from_millis(config.absent_ttl_ms))
                .build()
        });
        Resolver {
            inner: Arc::new(Inner {
                client,
                dcs,
                entries: forever(config.cache_entries),
                members: forever(config.cache_entries),
                answers,
                remembered: forever(config.cache_entries),
                absent,
                config,
            }),
        }
    }

    /// Where `key`'s actor lives now. From cache if the answer is younger
    /// than the tail TTL; otherwise walks the chain, reusing cached entries
    /// and links, with concurrent callers for one key sharing the walk.
    ///
    /// The caller whose walk produced the answer gets `from_cache: false` and
    /// the walk's round trips; callers that waited for another's walk get
    /// the shared answer as `from_cache: true` with no round trips of their own.
    pub async fn resolve(&self, key: &Key) -> Result<Resolution, ResolveError> {
        let dcs = &self.inner.dcs;
        if let Some(hit) = self.inner.answers.get(key).await {
            return Ok(hit.cached(key, false, dcs));
        }
        if let Some(absent) = &self.inner.absent
            && absent.contains_key(key)
        {
            return Err(ResolveError::NotFound(key.clone()));
        }
        // Set only if this call's future ran the walk (single-flight); atomic
        // because the future must be Send, never contended.
        let walked_here = AtomicU64::new(NOT_WALKED);
        let answer = self
            .inner
            .answers
            .try_get_with(key.clone(), async {
                let resolution = self.inner.walk(key).await?;
                walked_here.store(u64::from(resolution.remote_round_trips), Ordering::Relaxed);
                let tail = resolution.reservation.clone();
                Answer::of(resolution, dcs).ok_or_else(|| {
                    ResolveError::Inconsistent(format!(
                        "tail {tail} is in dc {}, not in this router's dc table",
                        tail.dc()
                    ))
                })
            })
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                if let (ResolveError::NotFound(_), Some(absent)) = (&*e, &self.inner.absent) {
                    absent.insert(key.clone(), ()).await;
                }
                return Err((*e).clone());
            }
        };
        let Ok(remote_round_trips) = u32::try_from(walked_here.load(Ordering::Relaxed)) else {
            return Ok(answer.cached(key, false, dcs));
        };
        self.inner
            .remembered
            .insert(key.clone(), answer.clone())
            .await;
        Ok(Resolution {
            remote_round_trips,
            from_cache: false,
            ..answer.cached(key, false, dcs)
        })
    }

    /// Like [`Resolver::resolve`], but when a DC is unavailable and an earlier
    /// answer is remembered, returns that answer marked `stale`.
    pub async fn resolve_or_stale(&self, key: &Key) -> Result<Resolution, ResolveError> {
        match self.resolve(key).await {
            Err(ResolveError::Unavailable { dc, reason }) => {
                match self.inner.remembered.get(key).await {
                    Some(old) => Ok(old.cached(key, true, &self.inner.dcs)),
                    None => Err(ResolveError::Unavailable { dc, reason }),
                }
            }
            other => other,
        }
    }

    /// Routing to `resolution` failed: forget the cached tail state so the
    /// next resolve asks the tail's DC again (which answers with the link if
    /// the actor moved). Entries and chain members stay cached: they are immutable.
    ///
    /// Only an answer that still names the reported reservation is dropped: a
    /// late report must not throw away a newer answer that already replaced it.
    pub async fn report_unreachable(&self, resolution: &Resolution) {
        let answers = &self.inner.answers;
        if let Some(cached) = answers.get(&resolution.key).await
            && cached.names(&resolution.reservation, &self.inner.dcs)
        {
            answers.invalidate(&resolution.key).await;
        }
    }

    /// The chain of `key` hop by hop, with where each answer came from and
    /// the shortcuts taken. Always asks the tail's DC (the answer cache is
    /// bypassed), but uses the cached entry and chain member; for operators
    /// and demos, not the hot path.
    pub async fn trace(&self, key: &Key) -> Result<Walked, ResolveError> {
        let walked = self.inner.walk_chain(key).await?;
        Ok(walked)
    }

    /// Entries in the answer cache (approximate; for metrics).
    pub fn cached_answers(&self) -> u64 {
        self.inner.answers.entry_count()
    }

    /// Inserts `resolution` into the answer cache as if a walk had just
    /// produced it (served until the tail TTL runs out). For benchmarks and
    /// tests that measure or exercise the hit path without a DC; a router
    /// has no use for it. Ignored if the resolution's DC is not in this
    /// resolver's DC table.
    #[doc(hidden)]
    pub async fn prime(&self, resolution: Resolution) {
        let key = resolution.key.clone();
        if let Some(answer) = Answer::of(resolution, &self.inner.dcs) {
            self.inner.answers.insert(key, answer).await;
        }
    }

    /// Runs the caches' pending maintenance (evictions, counts) now. For
    /// benchmarks and tests; moka otherwise does it on its own schedule.
    #[doc(hidden)]
    pub async fn run_pending_tasks(&self) {
        self.inner.answers.run_pending_tasks().await;
    }
}

impl Inner {
    /// Walks the chain from the furthest member known, remembering the tail reached.
    async fn walk_chain(&self, key: &Key) -> Result<Walked, ResolveError> {
        let hint = self.members.get(key).await;
        let mut walk = ChainWalk::from_key(key.clone(), self.config.hop_limit).with_hint(hint);
        loop {
            let step = match walk.poll().clone() {
                Poll::Need(Need::GlobalEntry(key)) => self.global_step(&mut walk, &key).await?,
                Poll::Need(Need::Reservation(id)) => self.hop_step(&mut walk, &id).await?,
                Poll::NotFound => return Err(ResolveError::NotFound(key.clone())),
                Poll::Failed(e) => return Err(e.into()),
                Poll::Done(walked) => {
                    let member = walked.hint();
                    if member.is_past(self.members.get(key).await.as_ref()) {
                        self.members.insert(key.clone(), member).await;
                    }
                    return Ok(walked);
                }
            };
            step.map_err(ResolveError::from)?;
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

    /// The global read: from cache, or from the nearest DC that answers.
    async fn global_step(
        &self,
        walk: &mut ChainWalk,
        key: &Key,
    ) -> Result<Result<(), ChainError>, ResolveError> {
        if let Some(entry) = self.entries.get(key).await {
            return Ok(walk.handle_global(Some(entry), Source::Cache));
        }
        let mut last_error = None;
        for peer in &self.dcs {
            match self.ask(peer, &Request::Resolve { key: key.clone() }).await {
                Ok(Reply::Resolved { entry, segment }) => {
                    if let Some(id) = &entry {
                        self.entries.insert(key.clone(), id.clone()).await;
                    }
                    let mut step = walk.handle_global(entry.clone(), Source::Remote);
                    // A DC owning the entry answers its segment in the same round
                    // trip (used unless a hint sent the walk elsewhere). Checked
                    // as spoken by the DC that answered, so a peer speaking for
                    // another DC's reservation is caught by the walk.
                    if let (Ok(()), Some(entry), Some(segment)) = (&step, &entry, segment)
                        && walk.poll() == &Poll::Need(Need::Reservation(entry.clone()))
                    {
                        step = walk.handle_segment(&peer.dc, segment, Source::Local);
                    }
                    return Ok(step);
                }
                Ok(other) => last_error = Some(unexpected(&peer.dc, "resolve", &other)),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error
            .unwrap_or_else(|| ResolveError::Inconsistent("no dc configured".to_string())))
    }

    /// One hop: a round trip to the reservation's owner.
    async fn hop_step(
        &self,
        walk: &mut ChainWalk,
        id: &ReservationId,
    ) -> Result<Result<(), ChainError>, ResolveError> {
        let Some(peer) = self.dcs.iter().find(|p| &p.dc == id.dc()) else {
            return Err(ResolveError::Unavailable {
                dc: id.dc().clone(),
                reason: "not in this router's dc table".to_string(),
            });
        };
        match self
            .ask(peer, &Request::ResolveReservation { id: id.clone() })
            .await?
        {
            Reply::Reservation(segment) => {
                Ok(walk.handle_segment(id.dc(), segment, Source::Remote))
            }
            // The owner has no usable record of it: a shortcut that does not
            // hold up (the walk falls back), or a contradiction (it fails).
            Reply::Error(e) if e.kind.disowns() => {
                Ok(walk.handle_disowned(id.dc(), Source::Remote))
            }
            other => Err(unexpected(&peer.dc, "resolve_reservation", &other)),
        }
    }

    async fn ask(&self, peer: &Peer, request: &Request) -> Result<Reply, ResolveError> {
        let unavailable = |reason: String| ResolveError::Unavailable {
            dc: peer.dc.clone(),
            reason,
        };
        let timeout = Duration::from_millis(self.config.hop_timeout_ms);
        match tokio::time::timeout(timeout, self.client.request(peer, request)).await {
            Err(_) => Err(unavailable(format!(
                "no answer within {} ms",
                self.config.hop_timeout_ms
            ))),
            Ok(Err(e)) => Err(unavailable(e.to_string())),
            Ok(Ok(Reply::Error(e))) => match e.kind {
                ErrorKind::Unavailable { dc } => Err(ResolveError::Unavailable {
                    dc,
                    reason: e.message,
                }),
                ErrorKind::Overloaded | ErrorKind::Internal => Err(unavailable(e.to_string())),
                // Left to the walk: see `hop_step`.
                ref kind
                    if kind.disowns() && matches!(request, Request::ResolveReservation { .. }) =>
                {
                    Ok(Reply::Error(e))
                }
                _ => Err(ResolveError::Inconsistent(format!(
                    "dc {} answered {e}",
                    peer.dc
                ))),
            },
            Ok(Ok(reply)) => Ok(reply),
        }
    }
}

/// A cache whose entries stay until evicted by capacity.
fn forever<K, V>(capacity: u64) -> moka::future::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::future::Cache::builder()
        .max_capacity(capacity)
        .build()
}

fn unexpected(dc: &DcId, request: &str, reply: &Reply) -> ResolveError {
    let reply: String = format!("{reply:?}").chars().take(200).collect();
    ResolveError::Inconsistent(format!("dc {dc} answered {reply} to {request}"))
}
