//! A simulated DC, an actor: its durable state (records, the ID allocator —
//! durable at commit), its volatile state (its memory of the global store,
//! in-flight requests — lost in a crash), its clock, and its request
//! handling, which drives homing-node as `homing-daemon`'s `Node` does:
//! every request runs as a homing-node stepper in `task.rs`'s loop (an
//! acquire, a waiter, a watch, a drain-scope page with what the driver
//! holds for them; every other request as homing-node's `Serve`), and so
//! do the DC's own passes.
//!
//! The DC handles its events given a `DcCtx` (`ctx.rs`): itself, its
//! peers to read, the world, the global store, the checker and the
//! measurements. This module performs what takes time (global writes, peer
//! requests, pauses) and routes each answer back; the DC's other modules
//! handle the rest (its tasks in `task.rs`, store operations in
//! `store.rs`, an acquire's waits in `acquire.rs`, waiters in
//! `waiters.rs`, its lease in `lease.rs`, upkeep, drains, watches,
//! reconciliation, shutdown, and a crash and a restart in `crash.rs`).
//! The checkers read the DCs through [`DcsView`].
//!
//! Every DC-store operation takes the store's latency and applies when it
//! completes; the global write-once lands even if the DC crashed meanwhile.

use homing_core::chain::{HOP_LIMIT_DEFAULT, NODE_ABSENT_TTL_MS_DEFAULT};
use homing_core::{
    DcId, ErrorKind, ErrorReply, LeasePolicy, Mutations, Reply, Request, ReservationId,
    ShortcutNotice, TakeOverReply, TakeoverPolicy,
};
use homing_node::{
    Answer, Dispatch, EndpointConfig, Failure, GlobalAnswer, GlobalOp, Handling,
    MEMORY_ENTRIES_DEFAULT, MemoryLimits, NodeConfig, NodeTime, StoreOp as DcOp, Upkeep,
    WaitLimits,
};
use homing_store::memory::MemoryDc;

mod acquire;
mod crash;
mod ctx;
mod drain;
mod drain_scope;
mod follow;
mod instance;
pub mod lease;
mod reconcile;
mod shutdown;
mod store;
mod task;
mod upkeep;
mod waiters;
mod watch;

pub(crate) use ctx::{DcCtx, Peers, dc_view};
pub(crate) use upkeep::new_upkeep;

use crate::clock::NodeClock;
use crate::counter::Counter;
use crate::event::{Body, Event, GlobalSet, Homingd, Message, NodeId, reply_kind};
use crate::invariants::DcsView;
use crate::trace::NO_KEY;
use acquire::AcquireJob;
pub(crate) use instance::Instance;
use store::{StoreCall, StoreFaults};
use task::{Task, TaskStepper};
use waiters::AwaitFor;

/// One simulated DC: what its homingd share (its name, clocks and store)
/// and its homingd ([`Instance`]s, one or several over the shared store).
#[derive(Debug)]
pub struct Dc {
    /// Its name.
    pub id: DcId,
    /// Its index.
    pub idx: u16,
    /// Its store's clock (every homingd of the DC reads this one).
    pub clock: NodeClock,
    /// Durable: its DC store (records, expiry index, allocator, event
    /// log) — homing-store's memory backend, in its synchronous form.
    pub store: MemoryDc,
    /// Whether any of its homingd runs.
    pub up: bool,
    /// How many homingd it has.
    pub(crate) homingd: u8,
    /// How many of its homingd run.
    pub(crate) running: u8,
    /// When it last (re)started — a homingd of it after none ran —, true µs.
    pub up_since_us: u64,
    /// How each homingd's endpoint is set up at every start.
    pub(crate) endpoint_config: EndpointConfig,
    /// When its store is slow or fails.
    pub(crate) store_faults: StoreFaults,
    /// Its homingd, by instance (taken out while one of them handles an
    /// event: that one is the context's).
    pub(crate) instances: Vec<Instance>,
}

impl Dc {
    /// A running DC with empty stores and `instances` homingd; their
    /// endpoints set up by `endpoint` (rules broken on purpose: its
    /// `mutations`; their waiters bounded by its `waits`), their upkeep
    /// made by `upkeep`.
    pub fn new(
        idx: u16,
        clock: NodeClock,
        instances: u8,
        upkeep: impl Fn() -> Upkeep,
        endpoint: EndpointConfig,
    ) -> Dc {
        assert!((1..=Homingd::INSTANCES_MAX).contains(&instances));
        let instances: Vec<Instance> = (0..instances)
            .map(|i| Instance::new(Homingd::new(idx, i), upkeep(), &endpoint))
            .collect();
        Dc {
            id: endpoint.node.dc.clone(),
            idx,
            clock,
            store: MemoryDc::new(),
            up: true,
            homingd: instances.len() as u8,
            running: instances.len() as u8,
            up_since_us: 0,
            endpoint_config: endpoint,
            store_faults: StoreFaults::default(),
            instances,
        }
    }

    /// How many homingd it runs.
    pub fn instances(&self) -> u8 {
        self.homingd
    }

    /// Its homingd that runs, if any, the first from instance `from` on
    /// (where a client that found `from` silent goes next).
    pub fn running_from(&self, from: u8) -> Option<u8> {
        let n = self.instances();
        (0..n)
            .map(|k| (from + k) % n)
            .find(|&i| self.instances[usize::from(i)].up)
    }

    /// How DC `id`'s endpoint starts: homingd's defaults (its memory bounded
    /// as homingd's), `keys_per_namespace_max` keys per namespace, its
    /// waiters bounded by `waits`.
    pub(crate) fn endpoint_config(
        id: &DcId,
        policy: &LeasePolicy,
        mutations: Mutations,
        keys_per_namespace_max: u64,
        waits: WaitLimits,
    ) -> EndpointConfig {
        EndpointConfig {
            node: NodeConfig {
                dc: id.clone(),
                policy: *policy,
                hop_limit: HOP_LIMIT_DEFAULT,
                mutations,
            },
            takeover: TakeoverPolicy::Automatic,
            memory: MEMORY_LIMITS,
            keys_per_namespace_max,
            waits,
        }
    }
}

/// The simulated DCs, as the checkers read them.
impl DcsView for Vec<Dc> {
    fn store(&self, d: usize) -> &MemoryDc {
        &self[d].store
    }

    fn up(&self, d: usize) -> bool {
        self[d].up
    }

    fn clock(&self, d: usize) -> NodeClock {
        self[d].clock
    }
}

/// What a simulated DC remembers: homingd's defaults.
const MEMORY_LIMITS: MemoryLimits = MemoryLimits {
    entries: MEMORY_ENTRIES_DEFAULT,
    absent_ttl_ms: NODE_ABSENT_TTL_MS_DEFAULT,
};

/// What a driving step decided.
pub(crate) enum Next {
    Store(StoreCall),
    /// A global write-once, for the key of this index (the trace's).
    GlobalWrite(u32, GlobalOp),
    Peer(u16, Request),
    Reply(Reply),
    /// The key is held and wait time remains: await its reservation.
    Await {
        reservation: ReservationId,
        remaining_ms: u32,
    },
    /// Sleep until then (this DC's node clock), then connect again.
    Pause(NodeTime),
    /// A waiter parks until then (this DC's node clock) or a wake-up.
    Park(NodeTime),
    /// A watch parks until then (this DC's node clock) or the log moves.
    AwaitLog(NodeTime),
}

pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> Reply {
    Reply::Error(ErrorReply::new(kind, message))
}

impl DcCtx<'_> {
    fn store_delay_us(&mut self, base_ms: f64, jitter_ms: f64) -> u64 {
        let jitter = if jitter_ms > 0.0 {
            self.world.rng.below((jitter_ms * 1000.0) as u64 + 1)
        } else {
            0
        };
        let factor = self.dc.store_faults.factor(self.world.now);
        (((base_ms * 1000.0) as u64 + jitter) as f64 * factor) as u64 + 1
    }

    /// A request arrives at the DC (or a reply to one of its peer requests).
    pub(crate) fn receive(&mut self, message: Message) {
        if !self.inst.up {
            return;
        }
        match message.body {
            Body::Reply(reply) => self.peer_reply(message.from, message.rpc, reply),
            Body::Request(request) => {
                self.handle_request(message.from, message.rpc, message.key, request)
            }
        }
    }

    fn handle_request(&mut self, client: NodeId, rpc: u64, key: u32, request: Request) {
        let peer = match client {
            NodeId::Dc(c) => Some(self.dc_at(c.d()).id.clone()),
            _ => None,
        };
        let (now, rng) = (self.node_now(), &mut self.world.rng);
        let bits = || u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
        let dispatch = (self.inst.endpoint).handle_request(
            peer.as_ref(),
            request,
            now,
            bits,
            (client, rpc, key),
        );
        let kind = match dispatch {
            Dispatch::Refused(refused) => {
                if self.inst.endpoint.closing() {
                    self.measurements.count(Counter::DcRefusedShuttingDown);
                }
                return self.reply_to(client, rpc, key, Reply::Error(refused));
            }
            Dispatch::Answered(reply) => return self.reply_to(client, rpc, key, reply),
            // Nothing simulated asks for one (an operator's `homing dc
            // status`); homingd measures its stores and peers for it.
            Dispatch::Report => {
                let why = "a dc report is measured by homingd; the simulator has no stores or peers to time";
                return self.reply_to(client, rpc, key, error(ErrorKind::BadRequest, why));
            }
            Dispatch::Joined(_) => {
                self.measurements.count(Counter::AcquireRetryJoined);
                return;
            }
            Dispatch::Run(Handling::Acquire(acquire)) => {
                TaskStepper::Acquire(Box::new(AcquireJob {
                    acquire: *acquire,
                    awaiting: None,
                    generation: 0,
                    paused: false,
                }))
            }
            Dispatch::Run(Handling::Await(wait)) => {
                return self.await_start(client, rpc, key, *wait, AwaitFor::Remote);
            }
            Dispatch::Run(Handling::Watch(read)) => {
                return self.watch_start(client, rpc, *read);
            }
            Dispatch::Run(Handling::DrainScope(page)) => TaskStepper::DrainScopePage(page),
            Dispatch::Run(Handling::Serve(serve)) => TaskStepper::Serve(serve),
        };
        self.step_start(Task::new(client, rpc, key, kind));
    }

    pub(crate) fn new_task_id(&mut self) -> u64 {
        self.inst.next_task += 1;
        self.inst.next_task
    }

    pub(crate) fn reply_to(&mut self, client: NodeId, rpc: u64, key: u32, reply: Reply) {
        self.world.send(Message {
            from: self.me(),
            to: client,
            rpc,
            key,
            body: Body::Reply(reply),
        });
    }

    /// Sends a request to `to` on a QUIC stream (see
    /// [`World::stream_send`]) and arms its timeout; returns the RPC id.
    pub(crate) fn stream_request(
        &mut self,
        to: NodeId,
        key: u32,
        request: Request,
        timeout_us: u64,
    ) -> u64 {
        let from = self.me();
        let (rpc, message) = (self.world).request_message(from, to, key, request, timeout_us);
        self.stream_send(message);
        rpc
    }

    /// Answers a parked request on its QUIC stream.
    pub(crate) fn stream_reply(&mut self, client: NodeId, rpc: u64, key: u32, reply: Reply) {
        let message = Message {
            from: self.me(),
            to: client,
            rpc,
            key,
            body: Body::Reply(reply),
        };
        if !self.stream_send(message)
            && let NodeId::Dc(o) = client
        {
            self.checker
                .wake
                .on_reply_undeliverable(self.world.now, o, rpc);
        }
    }

    /// Sends on a QUIC stream; `false` if the connection died under it.
    /// A message to a DC that is down is lost: it rides a connection to the
    /// dead process, which its restarted successor resets.
    fn stream_send(&mut self, message: Message) -> bool {
        if let NodeId::Dc(t) = message.to
            && !self.homingd_up(t)
        {
            return true;
        }
        self.world.stream_send(message)
    }

    /// Answers a request: on its QUIC stream if it was `parked` (waited).
    fn answer(&mut self, parked: bool, client: NodeId, rpc: u64, key: u32, reply: Reply) {
        if parked {
            self.stream_reply(client, rpc, key, reply);
        } else {
            self.reply_to(client, rpc, key, reply);
        }
    }

    /// Parks the task on its next need, or answers.
    pub(crate) fn continue_task(&mut self, tid: u64, mut task: Box<Task>, next: Next) {
        let (base, jitter) = (
            self.scenario.stores.dc_op_ms,
            self.scenario.stores.dc_op_jitter_ms,
        );
        let next = match next {
            Next::Store(op @ StoreCall::Dc(DcOp::Write { .. })) => {
                let Some((t, op)) = self.marks_for_write(tid, task, op) else {
                    return;
                };
                task = t;
                Next::Store(op)
            }
            Next::Store(op @ StoreCall::GlobalGet { .. }) if self.cut_from_global() => {
                let ms = self.scenario.stores.global_read_ms;
                return self.global_fails_after(tid, task, Some(op), ms);
            }
            Next::GlobalWrite(..) if self.cut_from_global() => {
                let ms = self.scenario.stores.global_write_ms;
                return self.global_fails_after(tid, task, None, ms);
            }
            next => next,
        };
        match next {
            Next::Store(op) => {
                let delay = match op {
                    StoreCall::GlobalGet { .. } => {
                        let ms = self.scenario.stores.global_read_ms;
                        self.store_delay_us(ms, 0.0)
                    }
                    _ => self.store_delay_us(base, jitter),
                };
                task.waiting = Some(op);
                let epoch = self.inst.epoch;
                self.inst.tasks.insert(tid, task);
                self.world.schedule(
                    self.world.now + delay,
                    Event::Store {
                        dc: self.addr(),
                        epoch,
                        task: tid,
                    },
                );
            }
            Next::GlobalWrite(key, write) => {
                task.work.global_writes += 1;
                let ms = self.scenario.stores.global_write_ms;
                let delay = self.store_delay_us(ms, 0.0);
                let set = GlobalSet {
                    dc: self.addr(),
                    epoch: self.inst.epoch,
                    task: tid,
                    key,
                    write,
                };
                self.inst.tasks.insert(tid, task);
                self.world
                    .schedule(self.world.now + delay, Event::GlobalSet(Box::new(set)));
            }
            Next::Peer(to, request) => {
                task.work.peer_rtts += 1;
                if matches!(request, Request::Link { .. }) {
                    task.work.links += 1;
                }
                let to = self.peer_homingd(to);
                let rpc = self
                    .world
                    .request(self.me(), NodeId::Dc(to), task.key, request);
                self.inst.peer_rpcs.insert(rpc, (tid, to));
                self.inst.tasks.insert(tid, task);
            }
            Next::Reply(reply) => {
                if task.kind.acquire().is_some() {
                    self.measurements.note_acquire_work(task.rpc, task.work);
                }
                let mut answered = vec![(task.client, task.rpc, task.key)];
                let mut parked = false;
                if let Some(job) = task.kind.acquire() {
                    let (key, lease) = (job.acquire.key(), job.acquire.lease());
                    answered.extend(self.inst.endpoint.acquire_ended(key, lease));
                    parked = job.acquire.waits();
                }
                // Invariant: `answered` starts with the task's own client.
                let (&last, first) = answered.split_last().expect("the task's own client");
                for &(client, rpc, key) in first {
                    self.answer(parked, client, rpc, key, reply.clone());
                }
                let (client, rpc, key) = last;
                self.answer(parked, client, rpc, key, reply);
            }
            // A closing DC's `closed()` is ready at once: no new wait or pause.
            Next::Await { .. } | Next::Pause(_) if self.inst.endpoint.closing() => {
                self.acquire_closed(tid, task);
            }
            Next::Await {
                reservation,
                remaining_ms,
            } => self.acquire_await(tid, task, reservation, remaining_ms),
            Next::Park(until) => self.await_park(tid, task, until),
            Next::AwaitLog(until) => self.watch_park(tid, task, until),
            Next::Pause(until) => {
                let Some(job) = task.kind.acquire_mut() else {
                    unreachable!("only an acquire pauses");
                };
                job.paused = true;
                job.generation += 1;
                let generation = job.generation;
                let at = self.dc.clock.first_true_us_at_us(until.as_us());
                self.inst.tasks.insert(tid, task);
                self.set_timer(tid, generation, at);
            }
        }
    }

    /// A global read or write of task `tid` fails after `ms`: the DC is cut
    /// off from the global store.
    fn global_fails_after(
        &mut self,
        tid: u64,
        mut task: Box<Task>,
        op: Option<StoreCall>,
        ms: f64,
    ) {
        let delay = self.store_delay_us(ms, 0.0);
        task.waiting = op;
        let epoch = self.inst.epoch;
        self.inst.tasks.insert(tid, task);
        let dc = self.addr();
        self.world.schedule(
            self.world.now + delay,
            Event::GlobalFailed {
                dc,
                epoch,
                task: tid,
            },
        );
    }

    /// How the DC asks what `id`'s DC knows of it: a read of its own
    /// store, or a `ResolveReservation` to that peer; `Err` when the
    /// simulation has no such DC ([`unknown_dc`]).
    pub(crate) fn ask_segment(&self, id: ReservationId) -> Result<Next, Failure> {
        if id.dc() == &self.dc.id {
            return Ok(Next::Store(StoreCall::Segment(id)));
        }
        match self.peers.index.get(id.dc()) {
            Some(&to) => Ok(Next::Peer(to, Request::ResolveReservation { id })),
            None => Err(unknown_dc(id.dc())),
        }
    }

    /// Tells another DC's entry about the chain's new member, not waiting
    /// for the answer (homingd: a background task; its own entry the
    /// acquire noted itself).
    pub(crate) fn tell_shortcut(&mut self, key: u32, notice: ShortcutNotice) {
        let Some(&to) = self.peers.index.get(notice.entry.dc()) else {
            return;
        };
        self.measurements.count(Counter::ShortcutNotices);
        let request = Request::Shortcut {
            key: notice.key,
            entry: notice.entry,
            shortcut: notice.shortcut,
        };
        let to = self.peer_homingd(to);
        self.world.request(self.me(), NodeId::Dc(to), key, request);
    }

    /// The global write-once lands; then the DC that asked (if it still
    /// runs) learns what the store has now and goes on.
    pub(crate) fn global_set_lands(&mut self, set: GlobalSet) {
        self.world.current_key = set.key;
        // The write is decided here, whether or not its DC still waits for it.
        let now_us = self.world.now;
        let landed = match &set.write {
            GlobalOp::SetIfAbsent { key, id } => {
                let existing = self.global.set_if_absent(key, id, now_us);
                if existing.is_none() {
                    let view = dc_view!(self);
                    self.checker.on_global_set(&view, now_us, set.key, id);
                }
                GlobalAnswer::SetIfAbsent(existing)
            }
            GlobalOp::Confirm(succession) => {
                GlobalAnswer::Confirmed(self.global.confirm(succession))
            }
            GlobalOp::TakeOver { succession, policy } => {
                let reply = self.global.take_over(succession, *policy, now_us);
                if reply.is_none() {
                    self.measurements.count(Counter::Takeovers);
                    if set.key != NO_KEY {
                        self.checker.on_taken_over(&dc_view!(self), now_us, set.key);
                    }
                }
                GlobalAnswer::TakenOver(reply.unwrap_or(TakeOverReply::Taken))
            }
            read => unreachable!("a global read is not a write: {read:?}"),
        };
        if !self.inst.up || self.inst.epoch != set.epoch {
            return;
        }
        let now = self.node_now();
        let landed = self.inst.endpoint.learn(&set.write, landed, now);
        let Some(task) = self.inst.tasks.remove(&set.task) else {
            return;
        };
        self.step_answered(set.task, task, Answer::Global(Ok(landed)));
    }

    fn peer_reply(&mut self, from: NodeId, rpc: u64, reply: Reply) {
        let Some((tid, _)) = self.inst.peer_rpcs.remove(&rpc) else {
            return;
        };
        let Some(task) = self.inst.tasks.remove(&tid) else {
            return;
        };
        self.world.current_key = task.key;
        if !matches!(from, NodeId::Dc(_)) {
            return;
        }
        if self.inst.await_rpcs.remove(&rpc).is_some() {
            self.checker.wake.on_origin_done(self.addr(), rpc);
            // Any answer of the peer, even an error of kind `Unavailable`, is
            // a refusal (`PeerError::Refused`), not an unreachable DC.
            let result = peer_answer(reply, "await", |r| match r {
                Reply::Awaited(answer) => Some(answer),
                _ => None,
            });
            return self.acquire_awaited(tid, task, result);
        }
        self.step_peer_answer(tid, task, Ok(reply));
    }

    pub(crate) fn timeout(&mut self, rpc: u64) {
        if let Some(&(_, peer)) = self.inst.peer_rpcs.get(&rpc) {
            self.peer_silent(peer);
        }
        self.rpc_failed(
            rpc,
            Counter::DcPeerTimeout,
            "a peer dc did not answer in time",
        );
    }

    /// The QUIC connection a parked `Await` rode died (idle timeout, or a
    /// stateless `reset` from the tail's restarted DC).
    pub(crate) fn connection_lost(&mut self, rpc: u64, reset: bool) {
        if !self.inst.up {
            return;
        }
        let (counter, why) = if reset {
            (
                Counter::WaitConnectionReset,
                "the restarted peer dc reset the connection",
            )
        } else {
            (
                Counter::WaitConnectionLost,
                "the connection to the peer dc timed out",
            )
        };
        self.rpc_failed(rpc, counter, why);
    }

    fn rpc_failed(&mut self, rpc: u64, counter: Counter, why: &str) {
        let Some((tid, peer)) = self.inst.peer_rpcs.remove(&rpc) else {
            return;
        };
        self.measurements.count(counter);
        let Some(task) = self.inst.tasks.remove(&tid) else {
            return;
        };
        self.world.current_key = task.key;
        // The peer that did not answer is the one unavailable (homingd's
        // `PeerError::Unavailable { dc }`), not this DC.
        let unavailable = ErrorKind::Unavailable {
            dc: self.dc_at(peer.d()).id.clone(),
        };
        if self.inst.await_rpcs.remove(&rpc).is_some() {
            self.checker.wake.on_origin_done(self.addr(), rpc);
            let lost = ErrorReply::new(unavailable, why);
            return self.acquire_awaited(tid, task, Err(Failure::Unreachable(lost)));
        }
        let e = ErrorReply::new(unavailable, why);
        self.step_peer_answer(tid, task, Err(Failure::Unreachable(e)));
    }

    /// Sets a timer of the DC's task `tid` at `at` (true time), for its
    /// `generation` (a timer of another generation is stale when it fires)
    /// and the DC's current epoch (a crash voids it).
    pub(crate) fn set_timer(&mut self, tid: u64, generation: u64, at: u64) {
        let timer = Event::DcTask {
            dc: self.addr(),
            epoch: self.inst.epoch,
            task: tid,
            generation,
        };
        self.world.schedule(at, timer);
    }

    /// A DC timer of task `tid` (a waiter's wake-up, an acquire's pause) fired.
    pub(crate) fn task_timer(&mut self, epoch: u32, tid: u64, generation: u64) {
        if !self.inst.up || self.inst.epoch != epoch {
            return;
        }
        let current = match self.inst.tasks.get(&tid).map(|t| &t.kind) {
            Some(kind) if kind.parked_watch(generation) => true,
            Some(kind) => match (kind.waiter(), kind.acquire()) {
                (Some(job), _) => job.parked == Some(generation),
                (_, Some(job)) => job.generation == generation,
                _ => false,
            },
            None => false,
        };
        if !current {
            return;
        }
        // Invariant: the task was just found in the map.
        let mut task = self.inst.tasks.remove(&tid).expect("task present");
        if let Some(job) = task.kind.acquire_mut() {
            job.paused = false;
        }
        self.world.current_key = task.key;
        if task.kind.waiter().is_some() {
            return self.await_select(tid, task);
        }
        if task.kind.watch_mut().is_some() {
            return self.watch_ended(tid, task, Answer::TimedOut);
        }
        if task
            .kind
            .acquire()
            .is_some_and(|job| job.awaiting.is_some())
        {
            return self.acquire_deadline(tid, task);
        }
        // An acquire's pause ended: it connects again.
        self.step_answered(tid, task, Answer::Resumed);
    }
}

/// Why a request to `dc` got no answer when the simulation has no such
/// DC: unreachable, as homingd's peer table answers for a DC it does not know.
pub(crate) fn unknown_dc(dc: &DcId) -> Failure {
    let why = format!("dc {dc} unavailable: not a dc of this simulation");
    Failure::Unreachable(ErrorReply::new(
        ErrorKind::Unavailable { dc: dc.clone() },
        why,
    ))
}

/// A peer's `reply` to `asked`: its error reply as a refusal, else what
/// `pick` takes from it, else (a reply of the wrong kind) a contradiction.
pub(crate) fn peer_answer<T>(
    reply: Reply,
    asked: &str,
    pick: impl FnOnce(Reply) -> Option<T>,
) -> Result<T, Failure> {
    let kind = reply_kind(&reply);
    match reply {
        Reply::Error(e) => Err(Failure::Refused(e)),
        other => pick(other).ok_or_else(|| {
            Failure::Refused(ErrorReply::new(
                ErrorKind::Inconsistent,
                format!("{asked} answered {kind}"),
            ))
        }),
    }
}
