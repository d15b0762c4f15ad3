//! The simulator's one loop for the tasks that run a homing-node
//! [`Stepper`] — renew, release, force-release, cancel and shortcut
//! updates, a peer's link, a drain, a page of a DC's drain, a cancel's or
//! an inspect's read of a key's records, a reconciliation of takeovers, an
//! upkeep pass — as homingd's `Node::drive` runs them: each [`Effect`]
//! becomes the task's next store operation, global write or peer request
//! (or is answered at once: a succession the DC knows, a page of
//! successions, a segment of a DC the simulation does not have), each
//! answer reaches the stepper as one [`Answer`], the events it notes are
//! remembered or counted, and what it ends with becomes the task's reply
//! (with the counters each kind keeps).

use homing_core::{DcRecord, ErrorKind, LinkReply, Reply, Request, StoreTime};
use homing_node::{
    Answer, Change, Effect, Failure, GlobalAnswer, GlobalOp, NodeEvent, ReconcileEvent, Step,
    Stepper, cancel,
};

use crate::counter::Counter;
use crate::dc::{Asked, Next, StoreOp, Task, TaskKind, error, peer_answer};
use crate::drain::DrainJob;
use crate::drain_scope::DrainScopeJob;
use crate::key_read::{KeyRead, Then};
use crate::sim::{GlobalWrite, NodeId, Sim};
use crate::upkeep::upkeep_counter;

/// How a stepper task ended, by kind.
pub(crate) enum Ended {
    Update(<homing_node::Update as Stepper>::Output),
    Link(<homing_node::LinkOnward as Stepper>::Output),
    Drain(<homing_node::Drain as Stepper>::Output),
    DrainScope(<homing_node::DrainScope as Stepper>::Output),
    KeyRead(<homing_node::KeyRecords as Stepper>::Output),
    Reconcile(<homing_node::Reconcile as Stepper>::Output),
    Upkeep,
}

/// How a stepper's effect is performed.
enum Performed {
    /// As the task's next operation (it takes time).
    Later(Next),
    /// At once: this is the answer.
    Now(Answer),
}

impl TaskKind {
    /// Whether the task is a drain (of a key).
    pub(crate) fn drains(&self) -> bool {
        matches!(self, TaskKind::Step(s) if matches!(s.as_ref(), Stepping::Drain(_)))
    }

    /// Whether the task is the DC's reconciliation of takeovers.
    pub(crate) fn reconciles(&self) -> bool {
        matches!(self, TaskKind::Step(s) if matches!(s.as_ref(), Stepping::Reconcile(_)))
    }

    /// Whether the task is the DC's own work, not a request's: an upkeep
    /// pass or a reconciliation (a closing DC does not wait for them).
    pub(crate) fn in_background(&self) -> bool {
        matches!(self, TaskKind::Step(s)
            if matches!(s.as_ref(), Stepping::Reconcile(_) | Stepping::Upkeep(_)))
    }
}

/// A task's homing-node [`Stepper`], run by [`Sim::step_drive`].
#[derive(Debug)]
pub(crate) enum Stepping {
    /// Renew, release, force-release, cancel, shortcut: homing-node's
    /// [`homing_node::Update`].
    Update(homing_node::Update),
    /// A peer's link: homing-node's [`homing_node::LinkOnward`].
    Link(homing_node::LinkOnward),
    /// An operator's drain, or one forwarded by a peer.
    Drain(DrainJob),
    /// A page of an operator's drain of the whole DC.
    DrainScope(DrainScopeJob),
    /// A `Cancel` or an `Inspect`, reading the key's records.
    KeyRead(KeyRead),
    /// The DC's reconciliation of takeovers: homing-node's
    /// [`homing_node::Reconcile`].
    Reconcile(homing_node::Reconcile),
    /// An upkeep pass, holding the DC's [`homing_node::Upkeep`] (and the
    /// proofs it remembers) until the pass ends.
    Upkeep(homing_node::Upkeep),
}

impl Stepping {
    /// The next step of the stepper.
    fn step(&mut self) -> Step<Ended> {
        match self {
            Stepping::Update(update) => update.step().map(Ended::Update),
            Stepping::Link(link) => link.step().map(Ended::Link),
            Stepping::Drain(job) => job.drain.step().map(Ended::Drain),
            Stepping::DrainScope(job) => job.page.step().map(Ended::DrainScope),
            Stepping::KeyRead(job) => job.read.step().map(Ended::KeyRead),
            Stepping::Reconcile(reconcile) => reconcile.step().map(Ended::Reconcile),
            Stepping::Upkeep(upkeep) => upkeep.step().map(|()| Ended::Upkeep),
        }
    }

    /// Hands `answer` to the stepper.
    fn answer(&mut self, answer: Answer, now: StoreTime) {
        match self {
            Stepping::Update(update) => update.answer(answer, now),
            Stepping::Link(link) => link.answer(answer, now),
            Stepping::Drain(job) => job.drain.answer(answer, now),
            Stepping::DrainScope(job) => job.page.answer(answer, now),
            Stepping::KeyRead(job) => job.read.answer(answer, now),
            Stepping::Reconcile(reconcile) => reconcile.answer(answer, now),
            Stepping::Upkeep(upkeep) => upkeep.answer(answer, now),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        match self {
            Stepping::Drain(job) => job.drain.poll_event(),
            Stepping::DrainScope(job) => job.page.poll_event(),
            Stepping::Reconcile(reconcile) => reconcile.poll_event(),
            Stepping::Upkeep(upkeep) => upkeep.poll_event(),
            Stepping::Update(_) | Stepping::Link(_) | Stepping::KeyRead(_) => None,
        }
    }
}

/// The stepper of a task that runs one.
fn stepping(task: &mut Task) -> &mut Stepping {
    match &mut task.kind {
        TaskKind::Step(stepping) => stepping,
        other => unreachable!("not a stepper task: {other:?}"),
    }
}

impl Sim {
    /// Starts a stepper task at DC `d`.
    pub(crate) fn step_start(&mut self, d: usize, task: Task) {
        let tid = self.new_task_id(d);
        self.step_drive(d, tid, task);
    }

    /// The stepper of task `tid` was answered: it goes on.
    pub(crate) fn step_answered(&mut self, d: usize, tid: u64, mut task: Task, answer: Answer) {
        let now = self.dcs[d].clock.store_time(self.now);
        stepping(&mut task).answer(answer, now);
        self.step_drive(d, tid, task);
    }

    /// A peer answered what the task's stepper asked of it — a
    /// reservation's segment, or a forwarded drain — or did not (`Err`).
    pub(crate) fn step_peer_answer(
        &mut self,
        d: usize,
        tid: u64,
        mut task: Task,
        reply: Result<Reply, Failure>,
    ) {
        let forwarded =
            matches!(stepping(&mut task), Stepping::Drain(job) if !job.drain.asks_segment());
        let answer = if forwarded {
            Answer::Forwarded(reply.and_then(|r| {
                peer_answer(r, "drain", |r| matches!(r, Reply::Drained).then_some(()))
            }))
        } else {
            Answer::Segment(reply.and_then(|r| {
                peer_answer(r, "resolve-reservation", |r| match r {
                    Reply::Reservation(segment) => Some(segment),
                    _ => None,
                })
            }))
        };
        self.step_answered(d, tid, task, answer);
    }

    /// Runs the task's stepper until it asks for something that takes
    /// time, or ends.
    pub(crate) fn step_drive(&mut self, d: usize, tid: u64, mut task: Task) {
        let next = loop {
            let step = stepping(&mut task).step();
            while let Some(event) = stepping(&mut task).poll_event() {
                match event {
                    NodeEvent::Learned { key, member } => self.dcs[d].remember(&key, member),
                    NodeEvent::Drained(_) => {
                        if let Stepping::DrainScope(job) = stepping(&mut task) {
                            job.drained += 1;
                        }
                    }
                    NodeEvent::Reconciled(event) => self.measurements.count(match event {
                        ReconcileEvent::Superseded(_) => Counter::TakeoversReconciled,
                        ReconcileEvent::Unknown(_) => Counter::ReconcileUnknownReservation,
                    }),
                    NodeEvent::Upkeep(event) => self.measurements.count(upkeep_counter(&event)),
                }
            }
            match step {
                Step::Ask(effect) => match self.effect_next(d, &task, effect) {
                    Performed::Later(next) => break next,
                    Performed::Now(answer) => {
                        let now = self.dcs[d].clock.store_time(self.now);
                        stepping(&mut task).answer(answer, now);
                    }
                },
                Step::Done(ended) => match self.step_ended(d, &mut task, ended) {
                    Some(Some(next)) => break next,
                    Some(None) => return,
                    None => {} // the task runs another stepper now
                },
            }
        };
        self.dc_continue(d, tid, task, next);
    }

    /// How DC `d` performs `effect` for `task`: as the task's next
    /// operation, or answered at once.
    fn effect_next(&mut self, d: usize, task: &Task, effect: Effect) -> Performed {
        match effect {
            Effect::Store(op) => Performed::Later(Next::Store(StoreOp::Dc(op))),
            Effect::Global(GlobalOp::Entry { key, read }) => {
                Performed::Later(Next::Store(StoreOp::GlobalGet { key, read }))
            }
            Effect::Global(GlobalOp::Confirm(succession)) => {
                match self.dcs[d].succession_of(&succession.link.from) {
                    Some(recorded) => {
                        Performed::Now(Answer::Global(Ok(GlobalAnswer::Confirmed(recorded))))
                    }
                    None => {
                        let key = self.keys[task.key as usize].clone();
                        Performed::Later(Next::GlobalWrite(key, GlobalWrite::Confirm(succession)))
                    }
                }
            }
            // Read at once, as the acquire's succession reads are: what a
            // read decides is checked where writes land.
            Effect::Global(GlobalOp::SuccessionsOf { dc, after, limit }) => {
                let answer = self.global_reachable(d).map(|()| {
                    let page = self.successions_of(&dc, after, limit);
                    for succession in &page {
                        self.dcs[d].keep_succession(succession);
                    }
                    GlobalAnswer::Successions(page)
                });
                Performed::Now(Answer::Global(answer.map_err(Failure::Unreachable)))
            }
            Effect::Global(op) => unreachable!("a request's stepper asked {op:?}"),
            Effect::Segment(id) => match self.ask_segment(d, id) {
                Ok(next) => Performed::Later(next),
                Err(failure) => Performed::Now(Answer::Segment(Err(failure))),
            },
            Effect::Forward { dc, key } => {
                if let TaskKind::Step(stepping) = &task.kind
                    && let Stepping::Drain(job) = stepping.as_ref()
                    && job.forwarded
                {
                    let detail = format!("a forwarded drain of {key} was forwarded again to {dc}");
                    self.checker.on_drain_forwarded_again(task.key, detail);
                }
                self.measurements.count(Counter::DrainForwarded);
                // Invariant: the walk named the tail's DC, one of ours.
                let to = self.dc_index[&dc];
                Performed::Later(Next::Peer(to, Request::Drain { key }))
            }
        }
    }

    /// What the task does after its stepper ended: `Some(Some(next))` its
    /// reply, `Some(None)` nothing more, `None` it runs the stepper it was
    /// given now.
    fn step_ended(&mut self, d: usize, task: &mut Task, ended: Ended) -> Option<Option<Next>> {
        let reply = match ended {
            Ended::Update(Ok(changed)) => match changed.into_reply() {
                Some(reply) => reply,
                None => error(ErrorKind::Internal, "a change without a reply"),
            },
            Ended::Link(done) => {
                if let (Ok(reply), Stepping::Link(link)) = (&done, stepping(task)) {
                    self.measurements.count(match reply {
                        _ if link.superseded() => Counter::LinkRefusedSuperseded,
                        LinkReply::Linked => Counter::LinkLinked,
                        LinkReply::AlreadyLinked(_) => Counter::LinkAlreadyLinked,
                        LinkReply::StillActive { .. } => Counter::LinkStillActive,
                        LinkReply::TokenMoved { .. } => Counter::LinkTokenMoved,
                        LinkReply::Abandoned => Counter::LinkAbandoned,
                        LinkReply::OtherKey => Counter::LinkOtherKey,
                    });
                }
                done.map_or_else(Reply::Error, Reply::Link)
            }
            Ended::Drain(done) => {
                self.measurements.count(match &done {
                    Ok(_) => Counter::DrainDone,
                    Err(_) => Counter::DrainRefused,
                });
                if task.client == NodeId::Dc(d as u16) {
                    return Some(None); // the operator's own drain: nobody to answer
                }
                done.map_or_else(Reply::Error, |_| Reply::Drained)
            }
            Ended::DrainScope(done) => {
                let kind = std::mem::replace(&mut task.kind, TaskKind::Segment);
                let TaskKind::Step(stepping) = kind else {
                    unreachable!("a stepper task")
                };
                let Stepping::DrainScope(job) = *stepping else {
                    unreachable!("a drain scope's task")
                };
                self.drain_scope_paged(d, job, done);
                return Some(None);
            }
            Ended::KeyRead(Ok(records)) => {
                let Stepping::KeyRead(job) = stepping(task) else {
                    unreachable!("a key read's task")
                };
                match job.then {
                    Then::Inspect => {
                        let records = records.into_iter().map(DcRecord::redacted).collect();
                        Reply::Inspected { records }
                    }
                    Then::Cancel(lease) => match cancel::target(&records, &lease) {
                        Some(id) => {
                            self.measurements.count(Counter::CancelFoundAGrant);
                            task.kind = self.update_task(d, id, Change::Cancel { lease });
                            return None;
                        }
                        None => {
                            self.measurements.count(Counter::CancelFoundNoGrant);
                            Reply::Cancelled(false)
                        }
                    },
                }
            }
            Ended::Reconcile(done) => {
                let Stepping::Reconcile(reconcile) = stepping(task) else {
                    unreachable!("a reconciliation's task")
                };
                self.reconciled(d, reconcile, done);
                return Some(None);
            }
            Ended::Upkeep => {
                let kind = std::mem::replace(&mut task.kind, TaskKind::Segment);
                if let TaskKind::Step(stepping) = kind
                    && let Stepping::Upkeep(upkeep) = *stepping
                {
                    self.dcs[d].upkeep = Some(upkeep);
                }
                return Some(None);
            }
            Ended::Update(Err(e)) | Ended::KeyRead(Err(e)) => Reply::Error(e),
        };
        Some(Some(Next::Reply(reply)))
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
