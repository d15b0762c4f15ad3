//! `Node`: one DC's request handler. It drives homing-node's steppers
//! against this DC's stores and its peers — every request as homing-node's
//! [`Serve`] but an acquire (a retry joins the one running), an await (its
//! place in the waiters' queue), a watch (its subscription to the log) and
//! a drain-scope page —, and the DC's own passes; the decisions are
//! homing-node's (and the chain walk's and record transitions',
//! homing-core's): this module performs the effects they ask for through
//! one loop, [`Node::drive`], and turns the events they note into logs
//! and metrics.

use homing_core::session::SESSIONS_VERSION;
use homing_core::{Grant, Mutations, Namespace};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use homing_core::{
    AcquireReply, AwaitReply, DcId, Directory, ErrorKind, ErrorReply, Identity, Key, LeaseKey,
    LeasePolicy, LinkReply, Reply, Request, Role, SessionRenewReply, ShortcutNotice, StoreTime,
    TakeoverPolicy,
};
use homing_net::Handler;
use homing_node::{
    AcquireEvent, Answer, Dispatch, Effect, Endpoint, EndpointConfig, GlobalAnswer, Handling,
    MemoryLimits, NodeConfig, NodeEvent, Now, Reconcile, ReconcileEvent, Resumption, Step, Stepper,
    UpkeepEvent,
};
use homing_store::{DcStore, EVENTS_LIMIT_MAX, GET_MANY_KEYS_MAX, GlobalStore, SCAN_LIMIT_MAX};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

mod global;
pub mod report;
mod request_error;
mod store;

pub use global::NodeCaches;

use global::SharedReads;

use request_error::RequestError;

use crate::dc_lease::{DcLeaseCell, Renewer};
use crate::metrics::Metrics;
use crate::notices::ShortcutNotices;
use crate::peers::Peers;
use crate::quota::KeyCounts;
use crate::waiters::{DcEndpoint, Registration, WaitLimits, Waiters};

/// Most records one `Inspect` or `Scan` reply carries (homing-node's).
pub const INSPECT_RECORDS_MAX: usize = homing_node::SCAN_PAGE_RECORDS;
pub use homing_node::{WATCH_PAGES_MAX, WATCH_REPLY_BYTES_MAX};

// A watch's page of events is one every DC store answers.
const _: () = assert!(homing_node::WATCH_EVENTS_PAGE == EVENTS_LIMIT_MAX);
// A key read's page is one every DC store answers.
const _: () = assert!(homing_node::KEY_RECORDS_PAGE == SCAN_LIMIT_MAX);
// A reconciliation's page is one every global store answers.
const _: () = assert!(homing_node::pass::reconcile::PAGE_SUCCESSIONS <= GET_MANY_KEYS_MAX);

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
    /// The DC as homing-node's endpoint: dispatch, retried acquires,
    /// cancellations, its memory of the global store, its waiters.
    endpoint: Arc<std::sync::Mutex<DcEndpoint>>,
    /// How long a resolve's absent answer is reused, ms: while it is above
    /// zero, concurrent resolves of a key also share one read.
    absent_ttl_ms: u64,
    /// The resolves' global reads in flight.
    shared_reads: SharedReads,
    random: (std::collections::hash_map::RandomState, AtomicU64),
    /// Acquirers parked on this DC's reservations.
    waiters: Waiters,
    /// Bumped after every write that appends an event: parked watchers re-read.
    changes: watch::Sender<u64>,
    /// Watch requests parked now, and the most allowed at once: each
    /// re-reads the event log on every write, so the DC bounds them.
    watches_parked: Arc<AtomicU64>,
    watches_parked_max: usize,
    /// Turns true when the daemon shuts down: parked requests answer at once.
    closing: watch::Sender<bool>,
    /// Shortcut notices other DCs have not answered yet.
    notices: ShortcutNotices,
    /// This DC's lease in the global store: grants and marks wait on it.
    dc_lease: Arc<DcLeaseCell>,
    /// Counts of namespaces' keys running now (the key quota's counts are
    /// the endpoint's).
    key_counts: KeyCounts,
    /// Where the last failed reconciliation pass got to (the next pass of
    /// the same reconciliation starts there).
    resumption: std::sync::Mutex<Option<Resumption>>,
    /// Whether host sessions were found allowed: the deployment version is
    /// one that reads their record form, and that form was noted written.
    sessions_allowed: std::sync::atomic::AtomicBool,
}

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
        self.node
            .lock_endpoint()
            .acquire_ended(&self.key, self.lease)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.answered {
            drop(self.finish());
        }
    }
}

/// What a stepper holds at its node while `Node::drive` runs it, given
/// back when the stepper ends (or its request is dropped).
#[derive(Default)]
struct Held<'a> {
    /// The key create it holds a quota slot for ([`Effect::Admit`]), until
    /// the stepper notes it settled; given back if the stepper is dropped first.
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

/// A key create's quota slot at the endpoint, while the acquire holds it:
/// given back if the acquire is dropped before it noted the slot settled
/// (its request was cancelled; a stepper that ends notes it itself).
struct QuotaSlot<'a> {
    node: &'a Node,
    /// `None` once the acquire noted it settled.
    namespace: Option<Namespace>,
}

impl QuotaSlot<'_> {
    /// The acquire noted the slot settled (kept or given back).
    fn settled(mut self) {
        self.namespace = None;
    }
}

impl Drop for QuotaSlot<'_> {
    fn drop(&mut self) {
        if let Some(namespace) = self.namespace.take() {
            let given_back = NodeEvent::QuotaSettled {
                namespace,
                kept: false,
            };
            // A quota note rouses nobody.
            let _ = self.node.lock_endpoint().note(&given_back);
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
            ErrorKind::SessionEnded => "session_ended",
        },
        Reply::Awaited(AwaitReply::TimedOut) => "timed_out",
        Reply::Resolved { entry: None, .. } => "not_found",
        Reply::Acquire(AcquireReply::HeldElsewhere(_)) => "held_elsewhere",
        Reply::Acquire(AcquireReply::TagMismatch { .. }) => "tag_mismatch",
        Reply::SessionRenewed(SessionRenewReply::Expired) => "expired",
        Reply::SessionRenewed(SessionRenewReply::NotHolder) => "not_holder",
        Reply::SessionClosed(false) => "not_live",
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
        let config = NodeConfig {
            dc,
            policy,
            hop_limit,
            mutations: Mutations::NONE,
        };
        let endpoint = Endpoint::new(EndpointConfig {
            node: config.clone(),
            takeover: TakeoverPolicy::Automatic,
            memory: MemoryLimits {
                entries: caches.entries,
                absent_ttl_ms: caches.absent_ttl_ms,
            },
            keys_per_namespace_max,
            waits: waiting,
        });
        let endpoint = Arc::new(std::sync::Mutex::new(endpoint));
        Node {
            key_counts: KeyCounts::default(),
            resumption: std::sync::Mutex::default(),
            sessions_allowed: std::sync::atomic::AtomicBool::new(false),
            dc_lease,
            watches_parked: metrics.watches_parked_gauge(),
            watches_parked_max,
            waiters: Waiters::new(endpoint.clone(), metrics.waiters_gauge()),
            changes: watch::Sender::new(0),
            closing: watch::Sender::new(false),
            notices: ShortcutNotices::default(),
            config,
            global,
            records,
            peers,
            metrics,
            endpoint,
            absent_ttl_ms: caches.absent_ttl_ms,
            shared_reads: SharedReads::default(),
            random: (
                std::collections::hash_map::RandomState::new(),
                AtomicU64::new(0),
            ),
        }
    }

    /// This node under takeover policy `policy` (default: automatic).
    pub fn with_takeover(self, policy: TakeoverPolicy) -> Node {
        self.lock_endpoint().set_takeover(policy);
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

    /// Takes `directory` (read from the global store) as the DC directory:
    /// DCs it lists that are not configured peers become peers (with every
    /// homingd listed), and routers asking for the directory get it.
    pub fn learn_directory(&self, directory: Directory) {
        for (dc, addr) in directory.addresses() {
            if dc != self.dc() && self.peers.learn(dc, addr) {
                tracing::info!(peer = %dc, %addr, "peer learned from the dc directory");
            }
        }
        self.lock_endpoint().set_directory(directory);
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

    /// Whether this DC can grant now (what `/readyz` asks beside the
    /// stores' health): not shutting down, not retired, its DC lease live
    /// for longer than a host lease, the takeovers of its tails applied.
    /// Why not, in words.
    pub fn readiness(&self) -> Result<(), String> {
        if *self.closing.borrow() {
            return Err("shutting down".to_string());
        }
        let now = self.waiters.now();
        let ttl_ms = self.config.policy.ttl_ms();
        self.dc_lease.with(|lease| {
            if lease.retired() {
                return Err(format!("dc {} is retired", self.config.dc));
            }
            if !lease.covers(now, ttl_ms) {
                let valid_ms = lease.valid_for_ms(now);
                return Err(format!(
                    "the dc lease is valid for {valid_ms} ms, less than a host lease ({ttl_ms} ms): granting nothing until it is renewed"
                ));
            }
            if lease.reconciliation().is_some() {
                return Err("the takeovers of this dc's tails are not applied yet".to_string());
            }
            Ok(())
        })
    }

    /// Shutdown: parked acquirers and watchers are answered now.
    pub fn close(&self) {
        self.lock_endpoint().close();
        self.closing.send_replace(true);
        self.waiters.wake_all(AwaitReply::TimedOut);
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
                if let NodeEvent::QuotaSettled { .. } = &event
                    && let Some(slot) = held.slot.take()
                {
                    slot.settled();
                }
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
        let classify = |f: RequestError| f.classify(&self.config.dc);
        let now = self.waiters.now();
        let admitting = match &effect {
            Effect::Admit(namespace) => Some(namespace.clone()),
            _ => None,
        };
        // The DC lease's lock is taken (inside the endpoint's) only for the
        // effects that look at it.
        let at_once = self
            .lock_endpoint()
            .answer_at_once(effect, now, &*self.dc_lease);
        let effect = match at_once {
            Ok(answer) => {
                if matches!(&answer, Answer::Global(Ok(GlobalAnswer::Entry(Some(_))))) {
                    self.metrics.global_cache(true);
                }
                if let (Some(namespace), Answer::Admitted(Ok(()))) = (admitting, &answer) {
                    held.slot = Some(QuotaSlot {
                        node: self,
                        namespace: Some(namespace),
                    });
                }
                return answer;
            }
            Err(effect) => effect,
        };
        match effect {
            Effect::Store(op) => {
                Answer::Stored(self.perform(op).await.map_err(|e| self.store_failure(e)))
            }
            Effect::Global(op) => Answer::Global(self.perform_global(op).await.map_err(classify)),
            Effect::Segment(id) => Answer::Segment(self.segment(&id).await),
            Effect::Forward { dc, key } => {
                let answer = self.peers.drain(&dc, &key).await;
                Answer::Forwarded(answer.map_err(|e| classify(RequestError::from(e))))
            }
            // The namespace is not counted yet: count, then the endpoint admits.
            Effect::Admit(namespace) => {
                let bound = self.lock_endpoint().count_bound();
                let (dc, records) = (&self.config.dc, &self.records);
                let (endpoint, counted_namespace) = (self.endpoint.clone(), namespace.clone());
                let keep = move |created| {
                    let mut endpoint = endpoint.lock().expect("never poisoned");
                    endpoint.counted(&counted_namespace, created);
                };
                let count = self.key_counts.count(dc, records, &namespace, bound, keep);
                let answer = match count.await {
                    Ok(created) => self.lock_endpoint().admit_counted(&namespace, created),
                    Err(failure) => Answer::Admitted(Err(failure)),
                };
                if let Answer::Admitted(Ok(())) = &answer {
                    held.slot = Some(QuotaSlot {
                        node: self,
                        namespace: Some(namespace),
                    });
                }
                answer
            }
            Effect::Link {
                key,
                from,
                to,
                expected_token,
            } => {
                let linked = self.peers.link(&key, &from, &to, expected_token).await;
                Answer::Linked(linked.map_err(|e| classify(RequestError::from(e))))
            }
            Effect::Await {
                reservation,
                wait_ms,
                until,
            } => {
                tracing::debug!(reservation = %reservation, wait_ms, "key held: waiting");
                let register = async {
                    if reservation.dc() == &self.config.dc {
                        let now = self.waiters.now();
                        let mut wait = self.lock_endpoint().await_vacant(reservation, wait_ms, now);
                        // Boxed: a wait is driven from inside a drive.
                        Box::pin(self.drive(&mut wait)).await
                    } else {
                        let remote = self.peers.await_vacant(&reservation, wait_ms).await;
                        remote.map_err(|e| classify(RequestError::from(e)))
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
            Effect::Cancellation { .. } | Effect::Cover { .. } | Effect::AnswersForTails => {
                unreachable!("the dc's endpoint answers it at once")
            }
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
        let roused = self.lock_endpoint().note(&event);
        match event {
            NodeEvent::Learned { .. } | NodeEvent::QuotaSettled { .. } => {}
            NodeEvent::SessionClosed(id) => {
                tracing::debug!(session = %id, keys_waited_for = roused.len(), "host session closed");
                roused.iter().for_each(|id| self.waiters.rouse(id));
            }
            NodeEvent::Drained(id) => tracing::info!(reservation = %id, "drained"),
            NodeEvent::Reconciled(ReconcileEvent::Superseded(succession)) => tracing::warn!(
                reservation = %succession.link.from,
                successor = %succession.link.to,
                "reconciled a takeover: another dc took this tail over while this dc's lease was expired"
            ),
            NodeEvent::Reconciled(ReconcileEvent::Unknown(id)) => tracing::warn!(reservation = %id,
                "a takeover names a reservation this dc store has no record of"),
            NodeEvent::Upkeep(event) => log_upkeep(&self.metrics, event),
            NodeEvent::Acquire(event) => log_acquire(event),
            NodeEvent::Shortcut(notice) => self.tell_shortcut(notice),
            NodeEvent::HolderExpired(id) => {
                tracing::info!(reservation = %id, "lease expired, reaped for a waiter");
            }
            NodeEvent::Link {
                from,
                reply: LinkReply::AlreadyLinked(winner),
                superseded: true,
                ..
            } => tracing::warn!(reservation = %from, successor = %winner,
                "a record whose move lost to a takeover now continues as the taker"),
            NodeEvent::Link {
                from,
                to,
                reply: LinkReply::Linked,
                ..
            } => tracing::info!(from = %from, to = %to, "linked"),
            NodeEvent::Link { .. } => {}
            NodeEvent::CancelFound(Some(id)) => tracing::info!(reservation = %id,
                "cancelling a grant: its host gave up on the acquire"),
            NodeEvent::CancelFound(None) => {}
            NodeEvent::ForceReleased { reservation, token } => tracing::warn!(
                reservation = %reservation, token = token.get(),
                "force-released by an operator: its holder may run until its hard deadline"),
        }
    }

    /// Handles `request`: the DC's endpoint says which homing-node stepper
    /// answers it (or that it joined an acquire running, or is refused);
    /// the stepper runs with what this driver holds for it.
    async fn dispatch(&self, caller: &Identity, request: Request) -> Result<Reply, RequestError> {
        if matches!(request, Request::OpenSession { .. }) {
            self.allow_sessions().await?;
        }
        let peer = caller.dc().filter(|_| caller.role() == Role::Node);
        let (join, mut joined) = oneshot::channel();
        let now = self.waiters.now();
        let mut dispatch =
            self.lock_endpoint()
                .handle_request(peer, request, now, || self.random_bits(), join);
        loop {
            match dispatch {
                Dispatch::Run(handling) => return self.run(handling).await,
                Dispatch::Refused(refused) => return Err(RequestError::Reply(refused)),
                Dispatch::Answered(reply) => return Ok(reply),
                Dispatch::Report => return Ok(Reply::DcReport(self.report().await)),
                Dispatch::Joined(request) => {
                    self.metrics.acquire_retry();
                    tracing::debug!("a retried acquire joined the one running");
                    if let Ok(reply) = joined.await {
                        return Ok(reply);
                    }
                    // The acquire it joined ended unanswered (its request
                    // timed out): this one arrives again.
                    let (join, next) = oneshot::channel();
                    joined = next;
                    let now = self.waiters.now();
                    dispatch = self.lock_endpoint().handle_acquire(request, now, join);
                }
            }
        }
    }

    /// Host sessions write a record form the previous release cannot read:
    /// the first open checks that the deployment version reads it (`homing
    /// dc version --raise` made it so) and notes the form written (from
    /// then on the version cannot be lowered); later opens go on at once.
    async fn allow_sessions(&self) -> Result<(), RequestError> {
        if self.sessions_allowed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let global = self.global.as_ref();
        let deployment = homing_store::deployment::read(global).await?;
        if deployment.version < SESSIONS_VERSION {
            let why = format!(
                "host sessions need deployment version {SESSIONS_VERSION}, and it is {}: once every homingd runs this release, raise it with `homing dc version --raise`",
                deployment.version
            );
            return Err(RequestError::Reply(ErrorReply::new(
                ErrorKind::BadRequest,
                why,
            )));
        }
        if !deployment.new_form_written {
            homing_store::deployment::note_new_form_written(global, deployment.version)
                .await
                .map_err(|e| match e {
                    homing_store::deployment::VersionChangeError::Store(e) => {
                        RequestError::Store(e)
                    }
                    other => RequestError::Reply(ErrorReply::new(
                        ErrorKind::Overloaded,
                        format!(
                            "the deployment version moved while host sessions were allowed: {other}"
                        ),
                    )),
                })?;
            tracing::info!(
                version = deployment.version,
                "host sessions allowed: their record form is noted written, so the deployment version can no longer be lowered"
            );
        }
        self.sessions_allowed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Runs a request's stepper to its reply, holding what it needs here:
    /// an acquire answers the retries that joined it, a watch subscribes to
    /// the log before its first read.
    async fn run(&self, handling: Handling) -> Result<Reply, RequestError> {
        match handling {
            Handling::Acquire(mut acquire) => {
                let (key, lease) = (acquire.key().clone(), acquire.lease());
                tracing::Span::current().record("key", tracing::field::display(&key));
                let running = Running {
                    node: self,
                    key,
                    lease,
                    answered: false,
                };
                let reply = match self.drive(&mut *acquire).await {
                    Ok(outcome) => acquire_reply(outcome),
                    Err(e) => Reply::Error(e),
                };
                running.answer(reply.clone());
                Ok(reply)
            }
            Handling::Await(mut wait) => Ok(Reply::Awaited(
                self.drive(&mut *wait).await.map_err(RequestError::from)?,
            )),
            Handling::Watch(mut read) => {
                // Subscribed before the first read: a write while it reads wakes it.
                let mut changes = self.changes.subscribe();
                changes.mark_unchanged();
                let held = Held {
                    changes: Some(changes),
                    ..Held::default()
                };
                let done = self.drive_holding(&mut *read, held).await;
                let (events, next) = done.map_err(RequestError::Reply)?;
                Ok(Reply::Events { events, next })
            }
            Handling::DrainScope(mut page) => {
                let (drained, next) = self.drive(&mut *page).await.map_err(RequestError::Reply)?;
                Ok(Reply::DrainedPage { drained, next })
            }
            Handling::Serve(mut serve) => Ok(self.drive(&mut *serve).await),
        }
    }

    pub(super) fn lock_endpoint(&self) -> std::sync::MutexGuard<'_, DcEndpoint> {
        self.endpoint
            .lock()
            .expect("the endpoint's lock is never poisoned")
    }

    fn lock_resumption(&self) -> std::sync::MutexGuard<'_, Option<Resumption>> {
        self.resumption
            .lock()
            .expect("the resumption lock is never poisoned")
    }

    /// Tells another DC's entry about the chain's new member, in the
    /// background, again until that DC answers (`notices.rs`; our own entry
    /// the acquire noted itself).
    fn tell_shortcut(&self, notice: ShortcutNotice) {
        let closing = self.closing.subscribe();
        self.notices.tell(notice, self.peers.clone(), closing);
    }

    /// Resolves once the daemon is shutting down.
    async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        // The sender lives as long as the node, so this only ends on close.
        let _ = closing.wait_for(|c| *c).await.is_ok();
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

/// Logs and metrics for one upkeep event.
fn log_upkeep(metrics: &Metrics, event: UpkeepEvent) {
    match event {
        // One line per key at debug: a dead session of a million keys
        // would write a million; the pass's count is logged at info, and
        // each key's `expired` event is in the DC's event log.
        UpkeepEvent::Reaped(id) => {
            metrics.upkeep_reaped();
            tracing::debug!(reservation = %id, "lease expired, reaped")
        }
        UpkeepEvent::Abandoned(id) => tracing::info!(reservation = %id, "orphan abandoned"),
        UpkeepEvent::Confirmed(id, settled) => {
            tracing::debug!(reservation = %id, settled, "in its chain")
        }
        UpkeepEvent::BadRecord(bad) => {
            metrics.upkeep_bad_record();
            tracing::warn!(reservation = %bad.entry, reason = %bad.reason, "unreadable record skipped by the upkeep")
        }
        UpkeepEvent::SettleFailed(id, f) => {
            tracing::warn!(reservation = %id, error = %f.into_reply(), "settling a proven member failed")
        }
        UpkeepEvent::ChangeFailed(id, f) => {
            tracing::warn!(reservation = %id, error = %f.into_reply(), "reap or abandon failed")
        }
        UpkeepEvent::ScanFailed(f) => {
            tracing::warn!(error = %f.into_reply(), "upkeep pass stopped early")
        }
        UpkeepEvent::SessionEnded(id) => {
            metrics.session_ended();
            tracing::info!(session = %id, "host session ran out: its keys reaped, its row deleted")
        }
        UpkeepEvent::SessionFailed(id, f) => {
            tracing::warn!(session = %id, error = %f.into_reply(), "ending a host session failed (tried again next pass)")
        }
        UpkeepEvent::Trimmed(before) => tracing::info!(before, "trimmed events"),
        UpkeepEvent::TrimFailed(f) => tracing::warn!(error = %f.into_reply(), "event trim failed"),
        UpkeepEvent::PassDone { active, event_head } => {
            let reaped = metrics.upkeep_reaped_since_last_pass();
            if reaped > 0 {
                tracing::info!(reaped, "upkeep pass reaped expired leases");
            }
            if let Some(active) = active {
                metrics.set_active_leases(active);
            }
            if let Some(head) = event_head {
                metrics.set_event_head(head);
            }
        }
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
        Request::Acquire { config, .. } | Request::AcquireInSession { config, .. } => {
            (config.name.as_ref().map(|n| n.to_string()), None)
        }
        Request::Renew { reservation, .. }
        | Request::Release { reservation, .. }
        | Request::ForceRelease { reservation, .. } => (None, Some(reservation.to_string())),
        Request::Link { from, .. } => (None, Some(from.to_string())),
        Request::Shortcut { entry, .. } => (None, Some(entry.to_string())),
        Request::Await { reservation, .. } => (None, Some(reservation.to_string())),
        Request::Watch { .. }
        | Request::Scan { .. }
        | Request::DrainScope { .. }
        | Request::Directory
        | Request::DcReport
        | Request::OpenSession { .. }
        | Request::RenewSession { .. }
        | Request::CloseSession { .. }
        | Request::SessionKeys { .. } => (None, None),
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
            let reply = match self.dispatch(caller, request).await {
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
        if let Reply::SessionRenewed(SessionRenewReply::Renewed { notices, .. }) = &reply {
            self.metrics.session_notices_listed(notices.len());
        }
        reply
    }
}
