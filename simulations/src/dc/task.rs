//! The simulator's one loop for a DC's tasks, each running a homing-node
//! [`Stepper`] — a host's acquire, a waiter, a watch, a page of a DC's
//! drain, every other request as homing-node's `Serve` (resolves,
//! renewals, releases, cancels, links, shortcuts, drains, inspects,
//! scans), a reconciliation of takeovers, an upkeep pass — as homingd's
//! `Node::drive` runs them: each
//! [`Effect`] becomes the task's next store operation, global write, peer
//! request, wait or pause (or is answered at once: the DC lease's cover, a
//! cancellation, a succession the DC knows, a page of successions, a
//! segment of a DC the simulation does not have), each answer reaches the
//! stepper as one [`Answer`], the events it notes are remembered, counted
//! or sent on, and what it ends with becomes the task's reply (with the
//! counters each kind keeps).

use homing_core::{LinkReply, Reply, Request, Source};
use homing_node::{
    Answer, Drain, Effect, Failure, GlobalAnswer, GlobalOp, GlobalRead, NodeEvent, NodeTime, Now,
    ReconcileEvent, Step, Stepper,
};

use super::acquire::{AcquireJob, acquire_counter};
use super::ctx::DcCtx;
use super::drain_scope::DrainScopeJob;
use super::store::{Asked, StoreCall};
use super::upkeep::upkeep_counter;
use super::waiters::AwaitJob;
use super::watch::WatchJob;
use super::{Next, peer_answer, unknown_dc};
use crate::counter::Counter;
use crate::event::NodeId;
use crate::report::Work;

/// A request or one of the DC's own passes in progress at the DC: who
/// asked, under which RPC, about which key, the stepper it runs, what it
/// waits for from a store, and the work it did (for the measurements).
#[derive(Debug)]
pub(crate) struct Task {
    /// Who asked (the DC itself for its own passes).
    pub(crate) client: NodeId,
    /// The RPC to answer under.
    pub(crate) rpc: u64,
    /// The key concerned (the trace's index), or `NO_KEY`.
    pub(crate) key: u32,
    /// The homing-node stepper it runs.
    pub(crate) kind: TaskStepper,
    /// The store operation it waits for, if any.
    pub(crate) waiting: Option<StoreCall>,
    /// What it did: round trips, writes, awaits.
    pub(crate) work: Work,
}

impl Task {
    /// A task for `client`'s request `rpc` about key `key` (the trace's
    /// index), nothing asked of the store yet.
    pub(crate) fn new(client: NodeId, rpc: u64, key: u32, kind: TaskStepper) -> Box<Task> {
        Box::new(Task {
            client,
            rpc,
            key,
            kind,
            waiting: None,
            work: Work::default(),
        })
    }
}

/// How a stepper task ended, by kind.
pub(crate) enum Ended {
    Acquire(<homing_node::Acquire as Stepper>::Output),
    Serve(Reply),
    DrainScope(<homing_node::DrainScope as Stepper>::Output),
    DrainScopePage(<homing_node::DrainScope as Stepper>::Output),
    Reconcile(<homing_node::Reconcile as Stepper>::Output),
    Upkeep,
    Await(<homing_node::AwaitVacant as Stepper>::Output),
    Watch(<homing_node::WatchRead as Stepper>::Output),
}

/// How a stepper's effect is performed.
enum Performed {
    /// As the task's next operation (it takes time).
    Later(Next),
    /// At once: this is the answer.
    Now(Answer),
}

impl TaskStepper {
    /// The acquire the task runs, if it is one.
    pub(crate) fn acquire(&self) -> Option<&AcquireJob> {
        match self {
            TaskStepper::Acquire(job) => Some(job),
            _ => None,
        }
    }

    /// The acquire the task runs, if it is one, to change.
    pub(crate) fn acquire_mut(&mut self) -> Option<&mut AcquireJob> {
        match self {
            TaskStepper::Acquire(job) => Some(job),
            _ => None,
        }
    }

    /// The waiter the task runs, if it is one.
    pub(crate) fn waiter(&self) -> Option<&AwaitJob> {
        match self {
            TaskStepper::Await(job) => Some(job),
            _ => None,
        }
    }

    /// The waiter the task runs, if it is one, to change.
    pub(crate) fn waiter_mut(&mut self) -> Option<&mut AwaitJob> {
        match self {
            TaskStepper::Await(job) => Some(job),
            _ => None,
        }
    }

    /// The watch the task runs, if it is one, to change.
    pub(crate) fn watch_mut(&mut self) -> Option<&mut WatchJob> {
        match self {
            TaskStepper::Watch(job) => Some(job),
            _ => None,
        }
    }

    /// Whether the task is a watch parked until the log moves.
    pub(crate) fn parked_watch(&self, generation: u64) -> bool {
        matches!(self, TaskStepper::Watch(job) if job.parked == Some(generation))
    }

    /// Whether the task is the DC's reconciliation of takeovers.
    pub(crate) fn reconciles(&self) -> bool {
        matches!(self, TaskStepper::Reconcile(_))
    }

    /// Whether the task is the DC's own work, not a request's: an upkeep
    /// pass or a reconciliation (a closing DC does not wait for them).
    pub(crate) fn in_background(&self) -> bool {
        matches!(self, TaskStepper::Reconcile(_) | TaskStepper::Upkeep(_))
    }
}

/// A task's homing-node [`Stepper`], run by [`DcCtx::step_drive`].
#[derive(Debug)]
pub(crate) enum TaskStepper {
    /// A host's acquire: homing-node's [`homing_node::Acquire`] and where
    /// it waits.
    Acquire(Box<AcquireJob>),
    /// Every other request (resolves, renewals, releases, links, drains,
    /// cancels, inspects, scans…): homing-node's [`homing_node::Serve`].
    Serve(Box<homing_node::Serve>),
    /// A page of an operator's drain of the whole DC.
    DrainScope(Box<DrainScopeJob>),
    /// A `DrainScope` request's page: homing-node's [`homing_node::DrainScope`].
    DrainScopePage(Box<homing_node::DrainScope>),
    /// The DC's reconciliation of takeovers: homing-node's
    /// [`homing_node::Reconcile`].
    Reconcile(Box<homing_node::Reconcile>),
    /// An upkeep pass, holding the DC's [`homing_node::Upkeep`] (and the
    /// proofs it remembers) until the pass ends.
    Upkeep(Box<homing_node::Upkeep>),
    /// A waiter at the holder's DC, for a peer's `Await` or a local
    /// acquire: homing-node's [`homing_node::AwaitVacant`] (`waiting.rs`).
    Await(Box<AwaitJob>),
    /// A watcher's `Watch`: homing-node's [`homing_node::WatchRead`]
    /// (`watch.rs`).
    Watch(Box<WatchJob>),
}

impl TaskStepper {
    /// The next step of the stepper.
    fn step(&mut self, now: NodeTime) -> Step<Ended> {
        match self {
            TaskStepper::Acquire(job) => job.acquire.step(now).map(Ended::Acquire),
            TaskStepper::Serve(serve) => serve.step(now).map(Ended::Serve),
            TaskStepper::DrainScope(job) => job.page.step(now).map(Ended::DrainScope),
            TaskStepper::DrainScopePage(page) => page.step(now).map(Ended::DrainScopePage),
            TaskStepper::Reconcile(reconcile) => reconcile.step(now).map(Ended::Reconcile),
            TaskStepper::Upkeep(upkeep) => upkeep.step(now).map(|()| Ended::Upkeep),
            TaskStepper::Await(job) => job.wait.step(now).map(Ended::Await),
            TaskStepper::Watch(job) => job.read.step(now).map(Ended::Watch),
        }
    }

    /// Hands `answer` to the stepper.
    fn answer(&mut self, answer: Answer, now: Now) {
        match self {
            TaskStepper::Acquire(job) => job.acquire.answer(answer, now),
            TaskStepper::Serve(serve) => serve.answer(answer, now),
            TaskStepper::DrainScope(job) => job.page.answer(answer, now),
            TaskStepper::DrainScopePage(page) => page.answer(answer, now),
            TaskStepper::Reconcile(reconcile) => reconcile.answer(answer, now),
            TaskStepper::Upkeep(upkeep) => upkeep.answer(answer, now),
            TaskStepper::Await(job) => job.wait.answer(answer, now),
            TaskStepper::Watch(job) => job.read.answer(answer, now),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        match self {
            TaskStepper::Acquire(job) => job.acquire.poll_event(),
            TaskStepper::Serve(serve) => serve.poll_event(),
            TaskStepper::DrainScope(job) => job.page.poll_event(),
            TaskStepper::DrainScopePage(page) => page.poll_event(),
            TaskStepper::Reconcile(reconcile) => reconcile.poll_event(),
            TaskStepper::Upkeep(upkeep) => upkeep.poll_event(),
            TaskStepper::Await(job) => job.wait.poll_event(),
            TaskStepper::Watch(_) => None,
        }
    }
}

/// The stepper of a task.
fn stepping(task: &mut Task) -> &mut TaskStepper {
    &mut task.kind
}

impl DcCtx<'_> {
    /// Starts a stepper task at the DC.
    pub(crate) fn step_start(&mut self, task: Box<Task>) {
        let tid = self.new_task_id();
        self.step_drive(tid, task);
    }

    /// The stepper of task `tid` was answered: it goes on.
    pub(crate) fn step_answered(&mut self, tid: u64, mut task: Box<Task>, answer: Answer) {
        let now = self.now();
        stepping(&mut task).answer(answer, now);
        self.step_drive(tid, task);
    }

    /// A peer answered what the task's stepper asked of it — a
    /// reservation's segment, a link or a forwarded drain — or did not
    /// (`Err`).
    pub(crate) fn step_peer_answer(
        &mut self,
        tid: u64,
        mut task: Box<Task>,
        reply: Result<Reply, Failure>,
    ) {
        let answer = match stepping(&mut task) {
            TaskStepper::Serve(serve) if serve.drain().is_some_and(|d| !d.asks_segment()) => {
                Answer::Forwarded(reply.and_then(|r| {
                    peer_answer(r, "drain", |r| matches!(r, Reply::Drained).then_some(()))
                }))
            }
            TaskStepper::Acquire(job) if !job.acquire.asks_segment() => {
                Answer::Linked(reply.and_then(|r| {
                    peer_answer(r, "link", |r| match r {
                        Reply::Link(link) => Some(link),
                        _ => None,
                    })
                }))
            }
            _ => Answer::Segment(reply.and_then(|r| {
                peer_answer(r, "resolve-reservation", |r| match r {
                    Reply::Reservation(segment) => Some(segment),
                    _ => None,
                })
            })),
        };
        self.step_answered(tid, task, answer);
    }

    /// Runs the task's stepper until it asks for something that takes
    /// time, or ends.
    pub(crate) fn step_drive(&mut self, tid: u64, mut task: Box<Task>) {
        // No effect performed at once moves the simulator's time: both
        // clocks read once serve the whole drive.
        let now = self.now();
        let next = loop {
            let step = stepping(&mut task).step(now.node);
            while let Some(event) = stepping(&mut task).poll_event() {
                let roused = self.inst.endpoint.note(&event);
                match event {
                    NodeEvent::SessionClosed(_) => self.waiters_roused(roused),
                    NodeEvent::Acquire(event) => self.measurements.count(acquire_counter(event)),
                    NodeEvent::Shortcut(notice) => self.tell_shortcut(task.key, notice),
                    NodeEvent::Learned { .. } | NodeEvent::QuotaSettled { .. } => {}
                    NodeEvent::Drained(_) => match stepping(&mut task) {
                        TaskStepper::DrainScope(job) => job.drained += 1,
                        _ => self.measurements.count(Counter::KeyDrained),
                    },
                    NodeEvent::Reconciled(event) => self.measurements.count(match event {
                        ReconcileEvent::Superseded(_) => Counter::TakeoversReconciled,
                        ReconcileEvent::Unknown(_) => Counter::ReconcileUnknownReservation,
                    }),
                    NodeEvent::Upkeep(event) => self.measurements.count(upkeep_counter(&event)),
                    NodeEvent::HolderExpired(_) => {
                        self.measurements.count(Counter::WaitLeaseExpiredByWaiter);
                    }
                    NodeEvent::Link {
                        reply, superseded, ..
                    } => self.measurements.count(match reply {
                        _ if superseded => Counter::LinkRefusedSuperseded,
                        LinkReply::Linked => Counter::LinkLinked,
                        LinkReply::AlreadyLinked(_) => Counter::LinkAlreadyLinked,
                        LinkReply::StillActive { .. } => Counter::LinkStillActive,
                        LinkReply::TokenMoved { .. } => Counter::LinkTokenMoved,
                        LinkReply::Abandoned => Counter::LinkAbandoned,
                        LinkReply::OtherKey => Counter::LinkOtherKey,
                    }),
                    NodeEvent::CancelFound(found) => self.measurements.count(match found {
                        Some(_) => Counter::CancelFoundAGrant,
                        None => Counter::CancelFoundNoGrant,
                    }),
                    NodeEvent::ForceReleased { .. } => {}
                }
            }
            match step {
                Step::Ask(effect) => match self.effect_next(tid, &mut task, effect) {
                    Performed::Later(next) => break next,
                    Performed::Now(answer) => stepping(&mut task).answer(answer, now),
                },
                Step::Done(ended) => match self.step_ended(task, ended) {
                    Some((answering, reply)) => {
                        task = answering;
                        break Next::Reply(reply);
                    }
                    None => return,
                },
            }
        };
        self.continue_task(tid, task, next);
    }

    /// How the DC performs `effect` for `task`: as the task's next
    /// operation, or answered at once. Cut from the global store, the
    /// succession and DC-lease reads fail at once; entries, confirms,
    /// takeovers and set-if-absent writes find out where they land.
    fn effect_next(&mut self, tid: u64, task: &mut Task, effect: Effect) -> Performed {
        let resolve = matches!(
            effect,
            Effect::Global(GlobalOp::Entry {
                read: GlobalRead::Resolve,
                ..
            })
        );
        let now = self.node_now();
        let inst = &mut *self.inst;
        let effect = match inst.endpoint.answer_at_once(effect, now, &inst.lease.lease) {
            Ok(answer) => {
                if resolve && answer == Answer::Global(Ok(GlobalAnswer::Entry(None))) {
                    self.measurements.count(Counter::ResolveAbsentReusedAtDc);
                }
                if matches!(answer, Answer::Covered(Err(_))) {
                    self.measurements.count(Counter::GrantRefusedByDcLease);
                }
                return Performed::Now(answer);
            }
            Err(effect) => effect,
        };
        match effect {
            Effect::Store(op) => {
                if let Some(job) = task.kind.waiter_mut() {
                    job.selected = false;
                }
                Performed::Later(Next::Store(StoreCall::Dc(op)))
            }
            Effect::Global(op) => self.global_next(task, op),
            Effect::Segment(id) => match self.ask_segment(id) {
                Ok(next) => Performed::Later(next),
                Err(failure) => Performed::Now(Answer::Segment(Err(failure))),
            },
            Effect::Forward { dc, key } => {
                if let TaskStepper::Serve(serve) = &task.kind
                    && serve.drain().is_some_and(Drain::forwarded)
                {
                    let detail = format!("a forwarded drain of {key} was forwarded again to {dc}");
                    self.checker.on_drain_forwarded_again(task.key, detail);
                }
                self.measurements.count(Counter::DrainForwarded);
                // Invariant: the walk named the tail's DC, one of ours.
                let to = self.peers.index[&dc];
                Performed::Later(Next::Peer(to, Request::Drain { key }))
            }
            // The namespace is not counted yet: the DC's store counts it
            // (at once: a count only reads), then the endpoint admits.
            Effect::Admit(namespace) => {
                let endpoint = &mut self.inst.endpoint;
                let created = (self.dc.store).keys_created(&namespace, endpoint.count_bound());
                Performed::Now(endpoint.admit_counted(&namespace, created))
            }
            Effect::Link {
                key,
                from,
                to,
                expected_token,
            } => match self.peers.index.get(from.dc()) {
                Some(&dc) => {
                    let link = Request::Link {
                        key,
                        from,
                        to,
                        expected_token,
                    };
                    Performed::Later(Next::Peer(dc, link))
                }
                None => Performed::Now(Answer::Linked(Err(unknown_dc(from.dc())))),
            },
            Effect::Await {
                reservation,
                wait_ms,
                ..
            } => Performed::Later(Next::Await {
                reservation,
                remaining_ms: wait_ms,
            }),
            Effect::Pause { until } => Performed::Later(Next::Pause(until)),
            Effect::Cancellation { .. } | Effect::Cover { .. } | Effect::AnswersForTails => {
                unreachable!("the dc's endpoint answers it at once")
            }
            Effect::Queue(op) => Performed::Now(self.await_queue(tid, task, op)),
            Effect::AwaitLog { until } => Performed::Later(Next::AwaitLog(until)),
            Effect::Park { until } => match self.await_selected(tid, task) {
                Some(answer) => Performed::Now(answer),
                None => Performed::Later(Next::Park(until)),
            },
        }
    }

    /// How the DC performs the global-store operation `op` for `task`, one
    /// its endpoint's memory did not answer: a read
    /// of an entry or a write takes the store's time, and a succession, a
    /// page of them or a DC lease is read at once (what a read decides is
    /// checked where writes land). Cut from the global store, those reads
    /// fail at once; entries, confirms, takeovers and set-if-absent writes
    /// find out where they land.
    fn global_next(&mut self, task: &Task, op: GlobalOp) -> Performed {
        let now = self.node_now();
        let read = match &op {
            GlobalOp::Entry { key, read } => {
                let (key, read) = (key.clone(), *read);
                return Performed::Later(Next::Store(StoreCall::GlobalGet { key, read }));
            }
            GlobalOp::SetIfAbsent { key, .. } => {
                let at = self.keys.number(key);
                return Performed::Later(Next::GlobalWrite(at, op));
            }
            GlobalOp::Confirm(_) | GlobalOp::TakeOver { .. } => {
                return Performed::Later(Next::GlobalWrite(task.key, op));
            }
            GlobalOp::Successor { id, .. } => GlobalAnswer::Successor {
                succession: self.global.successor(id),
                source: Source::Local,
                hint: None,
            },
            GlobalOp::DcLease(dc) => {
                GlobalAnswer::DcLease(self.global.lease_state(dc, self.world.now))
            }
            GlobalOp::SuccessionsOf { dc, after, limit } => {
                GlobalAnswer::Successions(self.global.successions_of(dc, after.clone(), *limit))
            }
        };
        let answer = match self.global_reachable() {
            Ok(()) => Ok(self.inst.endpoint.learn(&op, read, now)),
            Err(cut) => Err(Failure::Unreachable(cut)),
        };
        Performed::Now(Answer::Global(answer))
    }

    /// What the task does after its stepper ended: answer its reply
    /// (`Some`), or nothing more.
    fn step_ended(&mut self, task: Box<Task>, ended: Ended) -> Option<(Box<Task>, Reply)> {
        let reply = match ended {
            Ended::Acquire(done) => done.map_or_else(Reply::Error, Reply::Acquire),
            Ended::Serve(reply) => {
                if let TaskStepper::Serve(serve) = &task.kind
                    && serve.kind() == "drain"
                {
                    self.measurements.count(match &reply {
                        Reply::Error(_) => Counter::DrainRefused,
                        _ => Counter::DrainDone,
                    });
                    if task.client == self.me() {
                        return None; // the operator's own drain: nobody to answer
                    }
                }
                reply
            }
            Ended::DrainScope(done) => {
                let TaskStepper::DrainScope(job) = task.kind else {
                    unreachable!("a drain scope's task")
                };
                self.drain_scope_paged(*job, done);
                return None;
            }
            Ended::DrainScopePage(done) => match done {
                Ok((drained, next)) => Reply::DrainedPage { drained, next },
                Err(e) => Reply::Error(e),
            },
            Ended::Reconcile(done) => {
                let TaskStepper::Reconcile(reconcile) = &task.kind else {
                    unreachable!("a reconciliation's task")
                };
                self.reconciled(reconcile, done);
                return None;
            }
            Ended::Upkeep => {
                if let TaskStepper::Upkeep(upkeep) = task.kind {
                    self.inst.upkeep = Some(*upkeep);
                }
                return None;
            }
            Ended::Watch(done) => match done {
                Ok((events, next)) => Reply::Events { events, next },
                Err(e) => Reply::Error(e),
            },
            Ended::Await(result) => {
                self.await_finish(&task, result);
                return None;
            }
        };
        Some((task, reply))
    }
}

/// Which answer a failed operation of a stepper task is, by what it asked.
pub(crate) fn failed_answer(asked: Asked, failure: Failure) -> Answer {
    match asked {
        Asked::DcStore => Answer::Stored(Err(failure)),
        Asked::Segment => Answer::Segment(Err(failure)),
        Asked::Global => Answer::Global(Err(failure)),
    }
}
