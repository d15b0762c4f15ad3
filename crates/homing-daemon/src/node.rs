//! `Node`: one DC's request handler. It drives homing-node's steppers
//! against this DC's stores and its peers — every request as homing-node's
//! [`Serve`] but an acquire (a retry joins the one running), an await (its
//! place in the waiters' queue), a watch (its subscription to the log) and
//! a drain-scope page —, and the DC's own passes; the decisions are
//! homing-node's (and the chain walk's and record transitions',
//! homing-core's): this module performs the effects they ask for through
//! one loop, [`Node::drive`], and turns the events they note into logs
//! and metrics.

use homing_core::Grant;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use homing_core::{
    AcquireReply, ActorId, AwaitReply, DcId, DcRecord, ErrorKind, ErrorReply, EventSeq, HostTime,
    Identity, Key, KeyConfig, LeaseKey, LeasePolicy, LinkReply, LocalSegment, Namespace,
    NamespaceScope, Reply, Request, ReservationId, Role, ScanCursor, Segment, Shortcut,
    ShortcutNotice, Source, StoreTime, Succession, TakeOverReply, TakeoverPolicy, Written,
};
use homing_net::Handler;
use homing_node::{
    Acquire, AcquireEvent, AcquireRequest, AcquiresInFlight, Admit, Answer, Arrival, AwaitVacant,
    Cancellations, DrainScope, Effect, GlobalAnswer, GlobalOp, GlobalRead, JOINS_MAX, KeyQuota,
    LogFollower, Mutations, NodeConfig, NodeEvent, Now, Reconcile, ReconcileEvent, Resumption,
    Serve, Step, Stepper, StoreOp, Stored, WatchRead,
};
use homing_store::{
    DcStore, EVENTS_LIMIT_MAX, GET_MANY_KEYS_MAX, GlobalStore, SCAN_LIMIT_MAX, SetIfAbsent,
    StoreError,
};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::dc_lease::{self, DcLeaseCell, Renewer};
use crate::metrics::Metrics;
use crate::peers::{PeerError, Peers};
use crate::waiters::{Registration, WaitLimits, Waiters};

/// Most records one `Inspect` or `Scan` reply carries (homing-node's).
pub const INSPECT_RECORDS_MAX: usize = homing_node::SCAN_PAGE_RECORDS;
pub use homing_node::{WATCH_PAGES_MAX, WATCH_REPLY_BYTES_MAX};

// A key read's page is one every DC store answers.
const _: () = assert!(homing_node::KEY_RECORDS_PAGE == SCAN_LIMIT_MAX);
// A reconciliation's page is one every global store answers.
const _: () = assert!(homing_node::reconcile::PAGE_SUCCESSIONS <= GET_MANY_KEYS_MAX);

/// Reads this machine's clock as the DC store's time. Only this driver reads it.
pub fn store_now() -> StoreTime {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    StoreTime::from_ms(ms)
}

/// One DC: its stores, its peers, its policy.
pub struct Node {
    /// Its DC, lease policy and hop limit, as homing-node's steppers take them.
    config: NodeConfig,
    global: Arc<dyn GlobalStore>,
    records: Arc<dyn DcStore>,
    peers: Peers,
    metrics: Arc<Metrics>,
    /// Global entries never change, so caching them can never be stale.
    global_cache: moka::sync::Cache<Key, ReservationId>,
    /// Successions read from or written to the global store: write-once,
    /// so caching them can never be stale (DESIGN.md §7.5).
    successions: moka::sync::Cache<ReservationId, Succession>,
    /// When this DC takes over a silent DC's tails.
    takeover: TakeoverPolicy,
    /// Per key, the furthest member of its chain this DC has seen (a tail it
    /// walked to or granted): the next walk's hint. Members stay members
    /// (links never change), so a hint is never wrong, only possibly behind.
    members: moka::sync::Cache<Key, Shortcut>,
    /// A resolve's global reads of the last `absent_ttl_ms`, by key: an
    /// absent answer is reused that long, and concurrent resolves of one key
    /// share one read (DESIGN.md §7.4). Never asked by a connect: only
    /// `set_if_absent` decides a create.
    resolve_reads: Option<moka::future::Cache<Key, Option<ReservationId>>>,
    random: (std::collections::hash_map::RandomState, AtomicU64),
    /// Acquirers parked on this DC's reservations.
    waiters: Waiters,
    /// Lease keys of acquires their hosts cancelled: one still running
    /// releases its grant as it lands.
    cancelled: std::sync::Mutex<Cancellations>,
    /// Acquires running here, with the hosts' retries that joined them.
    in_flight: std::sync::Mutex<InFlight>,
    /// Bumped after every write that appends an event: parked watchers re-read.
    changes: watch::Sender<u64>,
    /// Watch requests parked now, and the most allowed at once: each
    /// re-reads the event log on every write, so the DC bounds them.
    watches_parked: Arc<AtomicU64>,
    watches_parked_max: usize,
    /// Turns true when the daemon shuts down: parked requests answer at once.
    closing: watch::Sender<bool>,
    /// This DC's lease in the global store: grants and marks wait on it.
    dc_lease: Arc<DcLeaseCell>,
    /// Keys this DC created per namespace, against `keys_per_namespace_max`.
    quota: Arc<std::sync::Mutex<KeyQuota>>,
    /// Counts of namespaces running now: each in a task of its own, so a
    /// host that gives up on its create does not cancel the count, and the
    /// creates of one namespace wait on one count (`Err`: it failed).
    quota_counts: Arc<std::sync::Mutex<QuotaCounts>>,
    /// Where the last failed reconciliation pass got to (the next pass of
    /// the same reconciliation starts there).
    resumption: std::sync::Mutex<Option<Resumption>>,
}

/// Acquires running at a node with the retries joined to each.
type InFlight = AcquiresInFlight<oneshot::Sender<Reply>>;

/// An acquire running here: answers the retries that joined it, or, if
/// dropped unanswered (its request timed out), lets them run themselves.
struct Running<'a> {
    node: &'a Node,
    key: Key,
    lease: LeaseKey,
    answered: bool,
}

impl Running<'_> {
    fn answer(mut self, reply: Reply) {
        // Finished once: a retry arriving after this must not lose the
        // entry it makes to a second finish on drop.
        self.answered = true;
        for joined in self.finish() {
            let _ = joined.send(reply.clone());
        }
    }

    fn finish(&self) -> Vec<oneshot::Sender<Reply>> {
        self.node.lock_in_flight().finish(&self.key, self.lease)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.answered {
            drop(self.finish());
        }
    }
}

/// The counts running now, by namespace: their outcome once known.
type QuotaCounts =
    std::collections::HashMap<Namespace, watch::Receiver<Option<Result<(), String>>>>;

/// What a stepper holds at its node while `Node::drive` runs it, given
/// back when the stepper ends (or its request is dropped).
#[derive(Default)]
struct Held<'a> {
    /// The key create it holds a quota slot for ([`Effect::Admit`]):
    /// settled by its set-if-absent, else given back.
    slot: Option<QuotaSlot<'a>>,
    /// A waiter's place in its queue ([`Effect::Queue`]): it leaves the
    /// queue unless a write woke it.
    registration: Option<Registration<'a>>,
    /// A watch's subscription to the DC's log moving, made before its
    /// first read ([`Effect::AwaitLog`]).
    changes: Option<watch::Receiver<u64>>,
    /// A parked watch's slot (`watches_parked_max`), taken at its first park.
    parked_watch: Option<Parked<'a>>,
}

/// A key create admitted by the quota: given back when dropped unless
/// [`QuotaSlot::settle`] says this DC's entry is the key's.
struct QuotaSlot<'a> {
    quota: &'a std::sync::Mutex<KeyQuota>,
    namespace: Namespace,
    kept: bool,
}

impl QuotaSlot<'_> {
    /// The key's global write answered: `ours` if the entry is this create's.
    fn settle(mut self, ours: bool) {
        self.kept = ours;
    }
}

impl Drop for QuotaSlot<'_> {
    fn drop(&mut self) {
        lock_quota(self.quota).settle(&self.namespace, self.kept);
    }
}

fn lock_quota(quota: &std::sync::Mutex<KeyQuota>) -> std::sync::MutexGuard<'_, KeyQuota> {
    quota.lock().expect("the quota lock is never poisoned")
}

/// What a node keeps in memory about other DCs' facts.
#[derive(Debug, Clone, Copy)]
pub struct NodeCaches {
    /// Capacity of the global-entry and chain-member caches (each), entries.
    pub entries: u64,
    /// How long a resolve's absent answer is reused, ms (0: never).
    pub absent_ttl_ms: u64,
}

/// How a request failed, before it becomes an error reply.
#[derive(Debug)]
enum Failure {
    Reply(ErrorReply),
    Store(StoreError),
    Peer(PeerError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl From<PeerError> for Failure {
    fn from(e: PeerError) -> Failure {
        Failure::Peer(e)
    }
}

impl From<homing_node::Failure> for Failure {
    fn from(f: homing_node::Failure) -> Failure {
        Failure::Reply(f.into_reply())
    }
}

fn fail(kind: ErrorKind, message: impl Into<String>) -> Failure {
    Failure::Reply(ErrorReply::new(kind, message))
}

impl Failure {
    /// homing-node's split of this failure at DC `dc`: a DC or store that
    /// could not be reached (worth retrying), an answer (a refusal, a full
    /// queue, a contradiction), or a peer's lie. A peer relaying an error
    /// is an answer.
    fn classify(self, dc: &DcId) -> homing_node::Failure {
        let unreachable = match &self {
            Failure::Store(e) => return homing_node::Failure::of_store(dc, e.is_unavailable(), e),
            Failure::Peer(PeerError::Lied { .. }) => {
                return homing_node::Failure::Lied(self.into_reply(dc));
            }
            Failure::Peer(e) => matches!(e, PeerError::Unavailable { .. }),
            Failure::Reply(e) => matches!(e.kind, ErrorKind::Unavailable { .. }),
        };
        let reply = self.into_reply(dc);
        if unreachable {
            homing_node::Failure::Unreachable(reply)
        } else {
            homing_node::Failure::Refused(reply)
        }
    }

    /// The reply for this failure at DC `dc`. A store that cannot be reached
    /// makes the DC unavailable (retryable); other store errors are internal.
    fn into_reply(self, dc: &DcId) -> ErrorReply {
        match self {
            Failure::Reply(reply) => reply,
            Failure::Store(e) => {
                homing_node::Failure::of_store(dc, e.is_unavailable(), e).into_reply()
            }
            Failure::Peer(e) => e.to_reply(),
        }
    }
}

fn outcome_of(reply: &Reply) -> &'static str {
    match reply {
        Reply::Error(e) => match e.kind {
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::UnknownReservation => "unknown_reservation",
            ErrorKind::Unavailable { .. } => "unavailable",
            ErrorKind::Inconsistent => "inconsistent",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Trimmed { .. } => "trimmed",
            ErrorKind::Internal => "internal",
            ErrorKind::QuotaExceeded { .. } => "quota_exceeded",
        },
        Reply::Awaited(AwaitReply::TimedOut) => "timed_out",
        Reply::Resolved { entry: None, .. } => "not_found",
        Reply::Acquire(AcquireReply::HeldElsewhere(_)) => "held_elsewhere",
        Reply::Acquire(AcquireReply::TagMismatch { .. }) => "tag_mismatch",
        _ => "ok",
    }
}

impl Node {
    /// A node for `dc` over the given stores and peers.
    #[allow(clippy::too_many_arguments)] // each argument is one of the DC's parts
    pub fn new(
        dc: DcId,
        global: Arc<dyn GlobalStore>,
        records: Arc<dyn DcStore>,
        peers: Peers,
        policy: LeasePolicy,
        hop_limit: usize,
        caches: NodeCaches,
        waiting: WaitLimits,
        watches_parked_max: usize,
        keys_per_namespace_max: u64,
        dc_lease: Arc<DcLeaseCell>,
        metrics: Arc<Metrics>,
    ) -> Node {
        Node {
            quota: Arc::new(std::sync::Mutex::new(KeyQuota::new(keys_per_namespace_max))),
            quota_counts: Arc::default(),
            resumption: std::sync::Mutex::default(),
            dc_lease,
            watches_parked: metrics.watches_parked_gauge(),
            watches_parked_max,
            waiters: Waiters::new(waiting, metrics.waiters_gauge()),
            cancelled: std::sync::Mutex::new(Cancellations::default()),
            in_flight: std::sync::Mutex::new(AcquiresInFlight::default()),
            changes: watch::Sender::new(0),
            closing: watch::Sender::new(false),
            config: NodeConfig {
                dc,
                policy,
                hop_limit,
                mutations: Mutations::NONE,
            },
            global,
            records,
            peers,
            metrics,
            global_cache: moka::sync::Cache::new(caches.entries),
            members: moka::sync::Cache::new(caches.entries),
            successions: moka::sync::Cache::new(caches.entries),
            takeover: TakeoverPolicy::Automatic,
            resolve_reads: (caches.absent_ttl_ms > 0).then(|| {
                moka::future::Cache::builder()
                    .max_capacity(caches.entries)
                    .time_to_live(Duration::from_millis(caches.absent_ttl_ms))
                    .build()
            }),
            random: (
                std::collections::hash_map::RandomState::new(),
                AtomicU64::new(0),
            ),
        }
    }

    /// This node under takeover policy `policy` (default: automatic).
    pub fn with_takeover(mut self, policy: TakeoverPolicy) -> Node {
        self.takeover = policy;
        self
    }

    /// Applies to this DC's records every takeover the global store
    /// recorded of them, as homing-node's [`Reconcile`] decides (DESIGN.md
    /// §7.5), then tells the DC lease that reconciliation `number` is done:
    /// until then nothing is granted or renewed. Called after the lease was
    /// regained (a scan that starts after the renewal sees every takeover
    /// committed before it). A pass after a failed one of the same number
    /// starts where that one got to. The number of records changed.
    pub async fn reconcile(&self, number: u64) -> Result<usize, String> {
        let (dc, policy) = (self.config.dc.clone(), self.config.policy);
        let resumption = self.lock_resumption().take();
        let mut reconcile =
            Reconcile::new(dc, number, policy, Mutations::NONE).resuming(resumption.as_ref());
        if let Some(after) = reconcile.resumes_after() {
            tracing::info!(after = %after, "reconciling takeovers from where the failed pass got to");
        }
        match self.drive(&mut reconcile).await {
            Ok(changed) => {
                self.dc_lease.with(|l| l.handle_reconciled(number));
                Ok(changed)
            }
            Err(failure) => {
                *self.lock_resumption() = reconcile.resumption();
                let e = failure.into_reply();
                Err(format!("{:?}: {}", e.kind, e.message))
            }
        }
    }

    /// Who succeeds `id` in the global store: cached once present (it
    /// never changes), read (linearizable) while absent.
    /// Where the answer came from: the cache, or the global store.
    async fn successor(&self, id: &ReservationId) -> Result<(Option<Succession>, Source), Failure> {
        if let Some(cached) = self.successions.get(id) {
            return Ok((Some(cached), Source::Cache));
        }
        let read = self
            .timed("global_successor", self.global.successor(id))
            .await?;
        if let Some(s) = &read {
            self.successions.insert(id.clone(), s.clone());
        }
        Ok((read, Source::Local))
    }

    /// Makes `succession` its reservation's in the global store unless one
    /// is; the one it has (cached: write-once).
    async fn confirm(&self, succession: Succession) -> Result<Succession, Failure> {
        let from = succession.link.from.clone();
        if let Some(cached) = self.successions.get(&from) {
            return Ok(cached);
        }
        let existing = self
            .timed(
                "global_set_successor",
                self.global.set_successor(&succession),
            )
            .await?;
        let recorded = existing.unwrap_or(succession);
        self.successions.insert(from, recorded.clone());
        Ok(recorded)
    }

    /// The reconciliation the DC lease owes, if any.
    pub fn reconciliation_owed(&self) -> Option<u64> {
        self.dc_lease.with(|l| l.reconciliation())
    }

    /// This node's DC.
    pub fn dc(&self) -> &DcId {
        &self.config.dc
    }

    /// The lease policy.
    pub fn policy(&self) -> &LeasePolicy {
        &self.config.policy
    }

    /// This node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The DC store.
    pub fn records(&self) -> &Arc<dyn DcStore> {
        &self.records
    }

    /// The global store.
    pub fn global(&self) -> &Arc<dyn GlobalStore> {
        &self.global
    }

    /// The peers.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// How many acquirers are parked here.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Watch requests parked now.
    pub fn watches_parked(&self) -> u64 {
        self.watches_parked.load(Ordering::Acquire)
    }

    /// The DC lease's renewal loop for this node.
    pub fn renewer(self: &Arc<Self>) -> Renewer {
        let (now, instant) = (self.clone(), self.clone());
        Renewer {
            dc: self.config.dc.clone(),
            cell: self.dc_lease.clone(),
            global: self.global.clone(),
            records: self.records.clone(),
            now: Arc::new(move || now.waiters.now()),
            instant: Arc::new(move |at| instant.waiters.instant(at)),
            metrics: self.metrics.clone(),
        }
    }

    /// How long this DC still counts on its DC lease, ms (0: it grants nothing).
    pub fn dc_lease_valid_ms(&self) -> u64 {
        let now = self.waiters.now();
        self.dc_lease.with(|l| l.valid_for_ms(now))
    }

    /// Refuses a host lease whose term starts at `from` (node clock) unless
    /// the DC lease covers all of it: a renewal arriving now, or an
    /// acquire's grant (homing-node's `Effect::Cover`, also after a wait).
    fn grant_covered(&self, from: homing_node::NodeTime) -> Result<(), homing_node::Failure> {
        let (now, ttl_ms) = (self.waiters.now(), self.config.policy.ttl_ms());
        self.dc_lease
            .with(|l| l.grant(&self.config.dc, from, now, ttl_ms))
    }

    /// Shutdown: parked acquirers and watchers are answered now.
    pub fn close(&self) {
        self.closing.send_replace(true);
        self.waiters.wake_all(AwaitReply::TimedOut);
    }

    /// A write of `after` landed; `event` if it appended a lifecycle event.
    /// Wakes the watchers and the waiters the change concerns.
    fn wrote(&self, event: bool, after: &DcRecord) {
        if event {
            self.changes.send_modify(|v| *v = v.wrapping_add(1));
        }
        self.waiters
            .written(after, store_now(), &self.config.policy);
    }

    /// Reads one page of this DC's event log after `follower`'s cursor and
    /// acts on it: parked watchers re-read when there are new events, and
    /// the waiters of each reservation an event changed get the record as
    /// stored now. So the writes of other homingd of this DC (sharing its
    /// DC store) wake this one's waiters and watchers. Returns whether the
    /// next page should be read at once; a record that cannot be read is
    /// left to its waiters' own timers.
    pub async fn follow_log(&self, follower: &mut LogFollower) -> Result<bool, StoreError> {
        let page = self
            .timed(
                "dc_events",
                self.records.events(follower.after(), follower.limit()),
            )
            .await?;
        let followed = self
            .waiters
            .follow(follower, &page.events, page.oldest, page.head);
        if followed.events {
            self.changes.send_modify(|v| *v = v.wrapping_add(1));
        }
        for id in &followed.look {
            match self.timed("dc_get", self.records.get(id)).await {
                Ok(Some(record)) => {
                    let woken = self.waiters.seen(&record, store_now(), &self.config.policy);
                    self.metrics.log_follow_looked(woken);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(dc = %self.config.dc, reservation = %id, error = %e, "reading a record the event log named failed; its waiters look again on their own timers");
                }
            }
        }
        Ok(followed.more)
    }

    /// Compare-and-set of our record `next` over version `expected`
    /// (`None`: a create), then `Node::wrote` if it landed; `event`: the
    /// write appends a lifecycle event.
    pub async fn write(
        &self,
        expected: Option<u64>,
        event: bool,
        next: &DcRecord,
    ) -> Result<Written, StoreError> {
        dc_lease::publish_marks_for(&self.dc_lease, self.records.as_ref(), next).await?;
        let cas = self
            .timed("dc_cas", self.records.compare_and_set(expected, next))
            .await?;
        if !cas.landed() {
            return Ok(Written::Conflict);
        }
        self.wrote(event, next);
        Ok(Written::Yes)
    }

    /// Performs one of homing-node's DC-store operations, timed under the
    /// store operation's metric name; a landed write goes through
    /// [`Node::write`] (marks published first, waiters and watchers told).
    pub async fn perform(&self, op: StoreOp) -> Result<Stored, StoreError> {
        let records = self.records.as_ref();
        Ok(match op {
            StoreOp::Read(id) => Stored::Record(self.timed("dc_get", records.get(&id)).await?),
            StoreOp::Allocate => {
                Stored::Allocated(self.timed("dc_allocate", records.allocate()).await?)
            }
            StoreOp::Write {
                expected,
                record,
                event,
            } => Stored::Written(self.write(expected, event, &record).await?),
            StoreOp::Due {
                kind,
                until,
                after,
                limit,
            } => {
                let due = records.due(kind, until, after.as_ref(), limit);
                Stored::Due(self.timed("dc_due", due).await?)
            }
            StoreOp::Settle { id, version } => Stored::Settled(
                self.timed("dc_settle", records.settle(&id, version))
                    .await?,
            ),
            StoreOp::Events { after, limit } => {
                let page = self
                    .timed("dc_events", records.events(after, limit))
                    .await?;
                Stored::Events {
                    events: page.events,
                    oldest: page.oldest,
                    head: page.head,
                }
            }
            StoreOp::TrimEvents { before } => {
                self.timed("dc_trim_events", records.trim_events(before))
                    .await?;
                Stored::Trimmed
            }
            StoreOp::Scan {
                scope,
                name,
                after,
                limit,
            } => {
                let scan = records.scan(&scope, &name, after.as_ref(), limit);
                Stored::Page(self.timed("dc_scan", scan).await?)
            }
        })
    }

    /// A store error as homing-node's failure at this DC (unreachable store:
    /// the DC is unavailable; anything else: internal).
    pub fn store_failure(&self, e: StoreError) -> homing_node::Failure {
        Failure::Store(e).classify(&self.config.dc)
    }

    /// 128 random bits for a key name a connect did not give: the process's
    /// randomly seeded hasher over a counter.
    fn random_bits(&self) -> u128 {
        let mut bits = 0u128;
        for half in 0..2 {
            let mut h = self.random.0.build_hasher();
            h.write_u64(self.random.1.fetch_add(1, Ordering::Relaxed));
            h.write_u8(half);
            bits = (bits << 64) | u128::from(h.finish());
        }
        bits
    }

    async fn timed<T>(&self, op: &'static str, f: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let out = f.await;
        self.metrics.store(op, started.elapsed());
        out
    }

    /// The key's global entry, from cache when known (entries never change).
    pub async fn global_entry(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        self.read_global(key, GlobalRead::Latest).await
    }

    /// A resolve's read of `key`'s global entry: like [`Node::global_entry`],
    /// but an absent answer is reused for `absent_ttl_ms` and concurrent
    /// resolves of one key share one read.
    async fn resolve_entry(&self, key: &Key) -> Result<Option<ReservationId>, Failure> {
        let Some(reads) = &self.resolve_reads else {
            return Ok(self.global_entry(key).await?);
        };
        if let Some(id) = self.global_cache.get(key) {
            self.metrics.global_cache(true);
            return Ok(Some(id));
        }
        let read = async {
            let entry = self.global_entry(key).await;
            entry.map_err(|e| Failure::Store(e).into_reply(&self.config.dc))
        };
        let shared = reads.try_get_with(key.clone(), read).await;
        shared.map_err(|e| Failure::Reply((*e).clone()))
    }

    /// `key`'s global entry, from the cache (entries never change) or the
    /// store, read as `read` says.
    async fn read_global(
        &self,
        key: &Key,
        read: GlobalRead,
    ) -> Result<Option<ReservationId>, StoreError> {
        if let Some(id) = self.global_cache.get(key) {
            self.metrics.global_cache(true);
            return Ok(Some(id));
        }
        self.metrics.global_cache(false);
        let get = match read {
            GlobalRead::Latest | GlobalRead::Resolve => self.global.get(key),
            GlobalRead::Nearest => self.global.get_nearest(key),
        };
        let entry = self.timed("global_get", get).await?;
        if let Some(id) = &entry {
            self.global_cache.insert(key.clone(), id.clone());
        }
        Ok(entry)
    }

    /// This DC's answer for its own reservation `id`: links inside the DC, then the tail.
    async fn local_segment(&self, id: &ReservationId) -> Result<Segment, Failure> {
        let mut segment =
            LocalSegment::new(self.config.dc.clone(), id.clone(), self.config.hop_limit);
        while let Some(at) = segment.need().cloned() {
            let record = self.timed("dc_get", self.records.get(&at)).await?;
            segment
                .handle(record.as_ref(), store_now(), &self.config.policy)
                .map_err(homing_node::segment_failure)?;
        }
        Ok(segment.finish())
    }

    /// Whether this DC answers for its tails now (homing-node's
    /// `DcLease::answers_for_tails`).
    fn answers_for_tails(&self) -> bool {
        let now = self.waiters.now();
        self.dc_lease.with(|l| l.answers_for_tails(now))
    }

    /// What `id`'s owner knows: ourselves for our own, else a peer round
    /// trip; a failure classified for homing-node.
    async fn segment(&self, id: &ReservationId) -> Result<Segment, homing_node::Failure> {
        let segment = if id.dc() == &self.config.dc {
            self.local_segment(id).await
        } else {
            self.peers
                .resolve_reservation(id)
                .await
                .map_err(Failure::from)
        };
        segment.map_err(|f| f.classify(&self.config.dc))
    }

    /// The hint for the next walk of `key`: the furthest member remembered.
    fn hint(&self, key: &Key) -> Option<Shortcut> {
        self.members.get(key)
    }

    /// Remembers `member` of `key`'s chain if it is further along than the one known.
    fn remember(&self, key: &Key, member: Shortcut) {
        if member.is_past(self.members.get(key).as_ref()) {
            self.members.insert(key.clone(), member);
        }
    }

    /// Runs `stepper` to its end: performs each [`Effect`] it asks for and
    /// hands back the [`Answer`], and acts on the events it notes.
    pub async fn drive<S: Stepper>(&self, stepper: &mut S) -> S::Output {
        self.drive_holding(stepper, Held::default()).await
    }

    /// [`Node::drive`], the stepper holding `held` from the start.
    async fn drive_holding<'a, S: Stepper>(
        &'a self,
        stepper: &mut S,
        mut held: Held<'a>,
    ) -> S::Output {
        loop {
            let step = stepper.step(self.waiters.now());
            while let Some(event) = stepper.poll_event() {
                self.noted(event);
            }
            match step {
                Step::Ask(effect) => {
                    let answer = self.perform_effect(effect, &mut held).await;
                    let now = Now {
                        node: self.waiters.now(),
                        store: store_now(),
                    };
                    stepper.answer(answer, now);
                }
                Step::Done(done) => return done,
            }
        }
    }

    /// Performs one of homing-node's effects, its failure classified.
    async fn perform_effect<'a>(&'a self, effect: Effect, held: &mut Held<'a>) -> Answer {
        let classify = |f: Failure| f.classify(&self.config.dc);
        match effect {
            Effect::Store(op) => {
                Answer::Stored(self.perform(op).await.map_err(|e| self.store_failure(e)))
            }
            Effect::Global(op) => Answer::Global(
                self.perform_global(op, &mut held.slot)
                    .await
                    .map_err(classify),
            ),
            Effect::Segment(id) => Answer::Segment(self.segment(&id).await),
            Effect::Forward { dc, key } => {
                let answer = self.peers.drain(&dc, &key).await;
                Answer::Forwarded(answer.map_err(|e| classify(Failure::from(e))))
            }
            Effect::Cover { from } => Answer::Covered(self.grant_covered(from)),
            Effect::Admit(namespace) => {
                let admitted = self.admit_key(&namespace).await;
                Answer::Admitted(
                    admitted
                        .map(|granted| held.slot = Some(granted))
                        .map_err(classify),
                )
            }
            Effect::Link {
                key,
                from,
                to,
                expected_token,
            } => {
                let linked = self.peers.link(&key, &from, &to, expected_token).await;
                Answer::Linked(linked.map_err(|e| classify(Failure::from(e))))
            }
            Effect::Await {
                reservation,
                wait_ms,
                until,
            } => {
                tracing::debug!(reservation = %reservation, wait_ms, "key held: waiting");
                let register = async {
                    if reservation.dc() == &self.config.dc {
                        // Boxed: a wait is driven from inside a drive.
                        Box::pin(self.await_vacant(&reservation, wait_ms)).await
                    } else {
                        let remote = self.peers.await_vacant(&reservation, wait_ms).await;
                        remote.map_err(|e| classify(Failure::from(e)))
                    }
                };
                // Our own deadline bounds the wait, also when the tail's DC
                // went silent with our registration: the host is answered in
                // time. A shutdown does not wait for it either (a remote
                // wait may last WAIT_MS_MAX).
                let awaited = tokio::time::timeout_at(self.waiters.instant(until), register);
                tokio::select! {
                    awaited = awaited => match awaited {
                        Ok(result) => Answer::Awaited(result),
                        Err(_) => Answer::TimedOut,
                    },
                    _ = self.closed() => Answer::Closed,
                }
            }
            Effect::Pause { until } => tokio::select! {
                _ = tokio::time::sleep_until(self.waiters.instant(until)) => Answer::Resumed,
                _ = self.closed() => Answer::Closed,
            },
            Effect::Cancellation { lease, note } => {
                let now = self.waiters.now();
                let mut cancelled = self.cancelled.lock().expect("never poisoned");
                Answer::Cancelled(cancelled.answer(lease, note, now))
            }
            Effect::AnswersForTails => Answer::ForTails(self.answers_for_tails()),
            Effect::Queue(op) => {
                let (queued, joined) = self.waiters.queue(op, store_now(), &self.config.policy);
                if joined.is_some() {
                    held.registration = joined;
                }
                Answer::Queued(queued)
            }
            Effect::AwaitLog { until } => {
                if held.parked_watch.is_none() {
                    let max = self.watches_parked_max;
                    let Some(slot) = Parked::take(&self.watches_parked, max) else {
                        let why = format!(
                            "{max} watches are parked at this dc (watches_parked_max); retry later"
                        );
                        let full = ErrorReply::new(ErrorKind::Overloaded, why);
                        return Answer::LogMoved(Err(homing_node::Failure::Refused(full)));
                    };
                    held.parked_watch = Some(slot);
                }
                // Invariant: `Node::watch` subscribes before it drives.
                let changes = held
                    .changes
                    .as_mut()
                    .expect("a watch subscribed to the log");
                tokio::select! {
                    _ = changes.changed() => {
                        changes.mark_unchanged();
                        Answer::LogMoved(Ok(()))
                    }
                    _ = tokio::time::sleep_until(self.waiters.instant(until)) => Answer::TimedOut,
                    _ = self.closed() => Answer::Closed,
                }
            }
            Effect::Park { until } => {
                // Invariant: a waiter parks only once queued.
                let parked = held
                    .registration
                    .as_mut()
                    .expect("a parked waiter is registered");
                tokio::select! {
                    reply = &mut parked.woken => {
                        Answer::Woken(Some(reply.unwrap_or(AwaitReply::TimedOut)))
                    }
                    _ = tokio::time::sleep_until(self.waiters.instant(until)) => Answer::Woken(None),
                    _ = parked.rouse.notified() => Answer::Woken(None),
                    _ = self.closed() => Answer::Closed,
                }
            }
        }
    }

    /// What a stepper noted: a chain member to remember, a drain, a
    /// reconciled takeover, an upkeep pass's or an acquire's work to log
    /// and count, a new member to tell another DC's entry of.
    fn noted(&self, event: NodeEvent) {
        match event {
            NodeEvent::Learned { key, member } => self.remember(&key, member),
            NodeEvent::Drained(id) => tracing::info!(reservation = %id, "drained"),
            NodeEvent::Reconciled(ReconcileEvent::Superseded(succession)) => tracing::warn!(
                reservation = %succession.link.from,
                successor = %succession.link.to,
                "reconciled a takeover: another dc took this tail over while this dc's lease was expired"
            ),
            NodeEvent::Reconciled(ReconcileEvent::Unknown(id)) => tracing::warn!(reservation = %id,
                "a takeover names a reservation this dc store has no record of"),
            NodeEvent::Upkeep(event) => crate::upkeep::report(self, event),
            NodeEvent::Acquire(event) => log_acquire(event),
            NodeEvent::Shortcut(notice) => self.tell_shortcut(notice),
            NodeEvent::HolderExpired(id) => {
                tracing::info!(reservation = %id, "lease expired, reaped for a waiter");
            }
            NodeEvent::Link {
                from,
                reply: LinkReply::AlreadyLinked(winner),
                superseded: true,
            } => tracing::warn!(reservation = %from, successor = %winner,
                "a record whose move lost to a takeover now continues as the taker"),
            NodeEvent::Link {
                from,
                reply: LinkReply::Linked,
                ..
            } => tracing::info!(from = %from, "linked"),
            NodeEvent::Link { .. } => {}
            NodeEvent::CancelFound(Some(id)) => tracing::info!(reservation = %id,
                "cancelling a grant: its host gave up on the acquire"),
            NodeEvent::CancelFound(None) => {}
            NodeEvent::ForceReleased { reservation, token } => tracing::warn!(
                reservation = %reservation, token = token.get(),
                "force-released by an operator: its holder may run until its hard deadline"),
        }
    }

    /// An acquire, or a host's retry of one still running here, which
    /// joins it and gets its reply ([`homing_node::retries`]).
    async fn acquire_or_join(
        &self,
        config: KeyConfig,
        actor: ActorId,
        lease: LeaseKey,
        host_time: HostTime,
        wait_ms: u32,
    ) -> Result<Reply, Failure> {
        let key = config.key(self.random_bits());
        tracing::Span::current().record("key", tracing::field::display(&key));
        loop {
            let (joined, answer) = oneshot::channel();
            let arrival = self.lock_in_flight().arrive(&key, lease, joined);
            match arrival {
                Arrival::Run => break,
                Arrival::Joined => {
                    self.metrics.acquire_retry();
                    tracing::debug!("a retried acquire joined the one running");
                    if let Ok(reply) = answer.await {
                        return Ok(reply);
                    }
                    // The acquire it joined ended unanswered (its request
                    // timed out): this one runs.
                }
                Arrival::Full => {
                    return Err(Failure::Reply(ErrorReply::new(
                        ErrorKind::Overloaded,
                        format!("more than {JOINS_MAX} retries of one acquire are waiting for it"),
                    )));
                }
            }
        }
        let running = Running {
            node: self,
            key: key.clone(),
            lease,
            answered: false,
        };
        let request = AcquireRequest {
            key,
            tag: config.tag,
            actor,
            lease,
            host_time,
            wait_ms,
        };
        let reply = match self.acquire(request).await {
            Ok(reply) => reply,
            Err(failure) => Reply::Error(failure.into_reply(&self.config.dc)),
        };
        running.answer(reply.clone());
        Ok(reply)
    }

    fn lock_resumption(&self) -> std::sync::MutexGuard<'_, Option<Resumption>> {
        self.resumption
            .lock()
            .expect("the resumption lock is never poisoned")
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight
            .lock()
            .expect("the in-flight lock is never poisoned")
    }

    /// Connect for `actor`; with `wait_ms`, a key held by a live actor is
    /// awaited (at the holder's DC) and then taken, until the wait runs out,
    /// as homing-node's [`Acquire`] decides.
    async fn acquire(&self, request: AcquireRequest) -> Result<Reply, Failure> {
        let hint = self.hint(&request.key);
        let mut acquire = Acquire::new(
            self.config.dc.clone(),
            request,
            self.waiters.now(),
            self.config.policy,
            self.config.hop_limit,
            Mutations::NONE,
        )
        .with_takeover(self.takeover)
        .with_hint(hint);
        let outcome = self.drive(&mut acquire).await;
        outcome.map(acquire_reply).map_err(Failure::Reply)
    }

    /// Tells another DC's entry about the chain's new member, in the
    /// background (our own entry the acquire noted itself). Best effort: a
    /// lost notice only leaves walks a few links longer until the next move.
    fn tell_shortcut(&self, notice: ShortcutNotice) {
        let entry = notice.entry.clone();
        let peers = self.peers.clone();
        tokio::spawn(async move {
            match peers.shortcut(notice).await {
                Ok(noted) => tracing::debug!(entry = %entry, noted, "shortcut told"),
                Err(e) => tracing::info!(entry = %entry, error = %e, "shortcut not told"),
            }
        });
    }

    /// Resolves once the daemon is shutting down.
    async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        // The sender lives as long as the node, so this only ends on close.
        let _ = closing.wait_for(|c| *c).await.is_ok();
    }

    /// Parks until our reservation `id` has no live holder (answering
    /// `Vacated` to the first waiter, in registration order), is linked
    /// onwards (`Moved`), or `wait_ms` passes (`TimedOut`), as homing-node's
    /// [`AwaitVacant`] decides.
    async fn await_vacant(
        &self,
        id: &ReservationId,
        wait_ms: u32,
    ) -> Result<AwaitReply, homing_node::Failure> {
        let now = self.waiters.now();
        let (dc, policy) = (&self.config.dc, self.config.policy);
        let mut wait = AwaitVacant::new(dc, id.clone(), wait_ms, now, policy, Mutations::NONE);
        self.drive(&mut wait).await
    }

    /// This DC's events after `after` in `scope`; waits up to `wait_ms` for
    /// one when there are none (homing-node's [`WatchRead`] decides).
    async fn watch(
        &self,
        scope: &NamespaceScope,
        after: EventSeq,
        wait_ms: u32,
    ) -> Result<Reply, Failure> {
        let now = self.waiters.now();
        let mut read = WatchRead::new(scope.clone(), after, wait_ms, now, EVENTS_LIMIT_MAX);
        // Subscribed before the first read: a write while it reads wakes it.
        let mut changes = self.changes.subscribe();
        changes.mark_unchanged();
        let held = Held {
            changes: Some(changes),
            ..Held::default()
        };
        let done = self.drive_holding(&mut read, held).await;
        let (events, next) = done.map_err(Failure::Reply)?;
        Ok(Reply::Events { events, next })
    }

    /// Drains one page of this DC's live leases in `scope`.
    async fn drain_scope(
        &self,
        scope: &NamespaceScope,
        after: Option<&ScanCursor>,
    ) -> Result<Reply, Failure> {
        let (dc, scope, after) = (self.config.dc.clone(), scope.clone(), after.cloned());
        let limit = SCAN_LIMIT_MAX;
        let mut page =
            DrainScope::new(dc, scope, after, limit, self.config.policy, Mutations::NONE);
        let (drained, next) = self.drive(&mut page).await.map_err(Failure::Reply)?;
        Ok(Reply::DrainedPage { drained, next })
    }

    /// Admits the create of a key in `namespace`, as homing-node's
    /// [`KeyQuota`] decides (counting the namespace in the DC store first,
    /// once per process).
    async fn admit_key(&self, namespace: &Namespace) -> Result<QuotaSlot<'_>, Failure> {
        let mut admit = lock_quota(&self.quota).admit(namespace);
        if admit == Admit::Count {
            let mut outcome = self.count_keys(namespace);
            let counted = outcome.wait_for(Option::is_some).await;
            if let Ok(done) = counted
                && let Some(Err(reason)) = done.as_ref()
            {
                return Err(Failure::Store(StoreError::Unavailable {
                    backend: "dc",
                    reason: format!("counting the keys of namespace {namespace:?}: {reason}"),
                }));
            }
            admit = lock_quota(&self.quota).admit(namespace);
        }
        match admit {
            Admit::Granted => Ok(QuotaSlot {
                quota: &self.quota,
                namespace: namespace.clone(),
                kept: false,
            }),
            Admit::Refused(reply) => Err(Failure::Reply(reply)),
            Admit::Count => Err(fail(
                ErrorKind::Internal,
                "key quota: a counted namespace asked to be counted again",
            )),
        }
    }

    /// The count of `namespace`'s keys in the DC store, started in a task of
    /// its own unless one runs (one per namespace; the task ends even if
    /// every create waiting on it gave up).
    fn count_keys(&self, namespace: &Namespace) -> watch::Receiver<Option<Result<(), String>>> {
        let mut counts = self.quota_counts.lock().expect("never poisoned");
        if let Some(running) = counts.get(namespace) {
            return running.clone();
        }
        let (done, outcome) = watch::channel(None);
        counts.insert(namespace.clone(), outcome.clone());
        let (records, quota, counts) = (
            self.records.clone(),
            self.quota.clone(),
            self.quota_counts.clone(),
        );
        let bound = lock_quota(&self.quota).count_bound();
        let namespace = namespace.clone();
        tokio::spawn(async move {
            let counted = records.keys_created(&namespace, bound).await;
            let result = match counted {
                Ok(created) => {
                    tracing::info!(
                        namespace = namespace.as_str(),
                        created,
                        "counted the keys this dc created in a namespace"
                    );
                    lock_quota(&quota).counted(&namespace, created);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            };
            counts.lock().expect("never poisoned").remove(&namespace);
            done.send_replace(Some(result));
        });
        outcome
    }

    /// Performs one of homing-node's global-store operations, timed under
    /// its metric name; what never changes (entries, successions) is read
    /// from and kept in this node's caches. `slot`: the quota slot of the
    /// key create a set-if-absent settles, if any.
    async fn perform_global(
        &self,
        op: GlobalOp,
        slot: &mut Option<QuotaSlot<'_>>,
    ) -> Result<GlobalAnswer, Failure> {
        Ok(match op {
            GlobalOp::Entry {
                key,
                read: GlobalRead::Resolve,
            } => GlobalAnswer::Entry(self.resolve_entry(&key).await?),
            GlobalOp::Entry { key, read } => {
                GlobalAnswer::Entry(self.read_global(&key, read).await?)
            }
            GlobalOp::SetIfAbsent { key, id } => {
                let set = self.global.set_if_absent(&key, &id);
                let existing = match self.timed("global_set_if_absent", set).await? {
                    SetIfAbsent::Inserted => None,
                    SetIfAbsent::Exists(existing) => Some(existing),
                };
                if let Some(slot) = slot.take() {
                    // Inserted, or a retried write of our own entry.
                    slot.settle(existing.as_ref().is_none_or(|winner| winner == &id));
                }
                self.global_cache
                    .insert(key, existing.clone().unwrap_or(id));
                GlobalAnswer::SetIfAbsent(existing)
            }
            GlobalOp::Successor { id, key } => {
                let (succession, source) = self.successor(&id).await?;
                let hint = self.hint(&key);
                GlobalAnswer::Successor {
                    succession,
                    source,
                    hint,
                }
            }
            GlobalOp::Confirm(succession) => {
                GlobalAnswer::Confirmed(self.confirm(succession).await?)
            }
            GlobalOp::SuccessionsOf { dc, after, limit } => {
                let page = self.global.successions_of(&dc, after.as_ref(), limit);
                let page = self.timed("global_successions_of", page).await?;
                for succession in &page {
                    let from = succession.link.from.clone();
                    self.successions.insert(from, succession.clone());
                }
                GlobalAnswer::Successions(page)
            }
            GlobalOp::DcLease(dc) => {
                let state = self.global.dc_lease(&dc);
                GlobalAnswer::DcLease(self.timed("global_dc_lease", state).await?)
            }
            GlobalOp::TakeOver { succession, policy } => {
                let take_over = self.global.take_over(&succession, policy);
                let reply = self.timed("global_take_over", take_over).await?;
                let from = &succession.link.from;
                match &reply {
                    TakeOverReply::Taken => {
                        self.successions.insert(from.clone(), succession.clone());
                        tracing::warn!(
                            reservation = %from,
                            successor = %succession.link.to,
                            token = succession.link.token.get(),
                            "took over a tail of a dc whose lease expired"
                        );
                    }
                    TakeOverReply::Exists(existing) => {
                        self.successions.insert(from.clone(), existing.clone());
                    }
                    TakeOverReply::Refused(state) => tracing::info!(
                        reservation = %from,
                        standing = ?state.standing,
                        "takeover refused by the global store: the dc renewed its lease"
                    ),
                }
                GlobalAnswer::TakenOver(reply)
            }
        })
    }

    /// Serves `request`: an acquire, an await, a watch or a drain-scope
    /// page with the driver state it holds, every other request as
    /// homing-node's [`Serve`] decides.
    async fn serve(&self, caller: &Identity, request: Request) -> Result<Reply, Failure> {
        match request {
            Request::Acquire {
                config,
                actor,
                lease,
                host_time,
                wait_ms,
            } => {
                self.acquire_or_join(config, actor, lease, host_time, wait_ms)
                    .await
            }
            Request::Await {
                reservation,
                wait_ms,
            } => Ok(Reply::Awaited(
                self.await_vacant(&reservation, wait_ms).await?,
            )),
            Request::Watch {
                scope,
                after,
                wait_ms,
            } => self.watch(&scope, after, wait_ms).await,
            Request::DrainScope { scope, after } => self.drain_scope(&scope, after.as_ref()).await,
            request => {
                let peer = caller.dc().filter(|_| caller.role() == Role::Node);
                let mut serve = Serve::new(&self.config, peer, request, |key| self.hint(key));
                Ok(self.drive(&mut serve).await)
            }
        }
    }
}

/// One of the bounded slots of parked watches, given back when dropped.
struct Parked<'a>(&'a AtomicU64);

impl<'a> Parked<'a> {
    /// A slot of `parked`, if fewer than `max` are taken.
    fn take(parked: &'a AtomicU64, max: usize) -> Option<Parked<'a>> {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        parked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Parked(parked))
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One log line per acquire event worth an operator's eye.
fn log_acquire(event: AcquireEvent) {
    match event {
        AcquireEvent::ConnectRetried => {
            tracing::info!("connect failed while waiting; trying again")
        }
        AcquireEvent::WaitReregister | AcquireEvent::WaitCutShort => {
            tracing::info!(?event, "wait interrupted; registering again")
        }
        AcquireEvent::GrantCancelled => {
            tracing::info!("grant cancelled: its host gave up on the acquire")
        }
        AcquireEvent::ShortcutNotNoted => {
            tracing::info!("the chain's new member not noted in this dc's entry")
        }
        other => tracing::debug!(event = ?other, "acquire"),
    }
}

fn acquire_reply(outcome: AcquireReply) -> Reply {
    if let AcquireReply::Acquired(Grant {
        reservation,
        token,
        previous,
        ..
    }) = &outcome
    {
        match previous {
            Some(p) => tracing::info!(reservation = %reservation, token = token.get(),
                previous = %p.reservation, previous_ended = %p.ended, "acquired"),
            None => tracing::info!(reservation = %reservation, token = token.get(), "acquired"),
        }
    }
    Reply::Acquire(outcome)
}

fn request_span(dc: &DcId, caller: &Identity, request: &Request) -> tracing::Span {
    let (key, reservation) = match request {
        Request::Resolve { key }
        | Request::Drain { key }
        | Request::Inspect { key }
        | Request::Cancel { key, .. } => (Some(key.to_string()), None),
        Request::ResolveReservation { id } => (None, Some(id.to_string())),
        Request::Successor { key, id } => (Some(key.to_string()), Some(id.to_string())),
        Request::Acquire { config, .. } => (config.name.as_ref().map(|n| n.to_string()), None),
        Request::Renew { reservation, .. }
        | Request::Release { reservation, .. }
        | Request::ForceRelease { reservation, .. } => (None, Some(reservation.to_string())),
        Request::Link { from, .. } => (None, Some(from.to_string())),
        Request::Shortcut { entry, .. } => (None, Some(entry.to_string())),
        Request::Await { reservation, .. } => (None, Some(reservation.to_string())),
        Request::Watch { .. } | Request::Scan { .. } | Request::DrainScope { .. } => (None, None),
    };
    tracing::info_span!(
        "request",
        kind = request.kind(),
        dc = %dc,
        caller = %caller,
        key = key.as_deref().unwrap_or(""),
        reservation = reservation.as_deref().unwrap_or(""),
    )
}

#[async_trait]
impl Handler for Node {
    async fn handle(&self, caller: &Identity, request: Request) -> Reply {
        let kind = request.kind();
        let started = Instant::now();
        let span = request_span(&self.config.dc, caller, &request);
        let reply = async {
            let reply = match self.serve(caller, request).await {
                Ok(reply) => reply,
                Err(failure) => Reply::Error(failure.into_reply(&self.config.dc)),
            };
            if let Reply::Error(e) = &reply {
                tracing::warn!(error = %e, "request failed");
            } else {
                tracing::debug!("request served");
            }
            reply
        }
        .instrument(span)
        .await;
        self.metrics
            .request(kind, outcome_of(&reply), started.elapsed());
        reply
    }
}
