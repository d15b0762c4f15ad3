//! The simulator's one loop for the tasks that run a homing-node
//! [`Stepper`] — renew, release, force-release and shortcut updates, a
//! peer's link, a drain, a page of a DC's drain, a cancel's or an
//! inspect's read of a key's records — as homingd's `Node::drive` runs
//! them: each [`Effect`] becomes the task's next store operation, global
//! write or peer request (or is answered at once: a succession the DC
//! knows, a segment of a DC the simulation does not have), each answer
//! reaches the stepper as one [`Answer`], and what the stepper ends with
//! becomes the task's reply (with the counters each kind keeps).

use homing_core::{DcRecord, ErrorKind, LinkReply, Reply, Request, StoreTime};
use homing_node::{
    Answer, Change, Effect, GlobalAnswer, GlobalOp, NodeEvent, Step, Stepper, cancel,
};

use crate::counter::Counter;
use crate::dc::{Asked, Next, StoreOp, Task, TaskKind, error};
use crate::key_read::Then;
use crate::sim::{GlobalWrite, NodeId, Sim};

/// How a stepper task ended, by kind.
pub(crate) enum Ended {
    Update(<homing_node::Update as Stepper>::Output),
    Link(<homing_node::LinkOnward as Stepper>::Output),
    Drain(<homing_node::Drain as Stepper>::Output),
    DrainScope(<homing_node::DrainScope as Stepper>::Output),
    KeyRead(<homing_node::KeyRecords as Stepper>::Output),
}

/// How a stepper's effect is performed.
enum Performed {
    /// As the task's next operation (it takes time).
    Later(Next),
    /// At once: this is the answer.
    Now(Answer),
}

impl TaskKind {
    /// The next step of the task's stepper (`None`: not a stepper task).
    fn step(&mut self) -> Option<Step<Ended>> {
        Some(match self {
            TaskKind::Update(update) => update.step().map(Ended::Update),
            TaskKind::Link(link) => link.step().map(Ended::Link),
            TaskKind::Drain(job) => job.drain.step().map(Ended::Drain),
            TaskKind::DrainScope(job) => job.page.step().map(Ended::DrainScope),
            TaskKind::KeyRead(job) => job.read.step().map(Ended::KeyRead),
            _ => return None,
        })
    }

    /// Hands `answer` to the task's stepper; `false`: not a stepper task.
    pub(crate) fn answer(&mut self, answer: Answer, now: StoreTime) -> bool {
        match self {
            TaskKind::Update(update) => update.answer(answer, now),
            TaskKind::Link(link) => link.answer(answer, now),
            TaskKind::Drain(job) => job.drain.answer(answer, now),
            TaskKind::DrainScope(job) => job.page.answer(answer, now),
            TaskKind::KeyRead(job) => job.read.answer(answer, now),
            _ => return false,
        }
        true
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        match self {
            TaskKind::Drain(job) => job.drain.poll_event(),
            TaskKind::DrainScope(job) => job.page.poll_event(),
            _ => None,
        }
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
        task.kind.answer(answer, now);
        self.step_drive(d, tid, task);
    }

    /// Runs the task's stepper until it asks for something that takes
    /// time, or ends.
    pub(crate) fn step_drive(&mut self, d: usize, tid: u64, mut task: Task) {
        let next = loop {
            let step = task.kind.step().expect("a stepper task");
            while let Some(event) = task.kind.poll_event() {
                match event {
                    NodeEvent::Learned { key, member } => self.dcs[d].remember(&key, member),
                    NodeEvent::Drained(_) => {
                        if let TaskKind::DrainScope(job) = &mut task.kind {
                            job.drained += 1;
                        }
                    }
                }
            }
            match step {
                Step::Ask(effect) => match self.effect_next(d, &task, effect) {
                    Performed::Later(next) => break next,
                    Performed::Now(answer) => {
                        let now = self.dcs[d].clock.store_time(self.now);
                        task.kind.answer(answer, now);
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
            Effect::Global(op) => unreachable!("a request's stepper asked {op:?}"),
            Effect::Segment(id) => match self.ask_segment(d, id) {
                Ok(next) => Performed::Later(next),
                Err(failure) => Performed::Now(Answer::Segment(Err(failure))),
            },
            Effect::Forward { dc, key } => {
                if let TaskKind::Drain(job) = &task.kind
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
                if let (Ok(reply), TaskKind::Link(link)) = (&done, &task.kind) {
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
                let TaskKind::DrainScope(job) = kind else {
                    unreachable!("a drain scope's task")
                };
                self.drain_scope_paged(d, *job, done);
                return Some(None);
            }
            Ended::KeyRead(Ok(records)) => {
                let TaskKind::KeyRead(job) = &task.kind else {
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
            Ended::Update(Err(e)) | Ended::KeyRead(Err(e)) => Reply::Error(e),
        };
        Some(Some(Next::Reply(reply)))
    }
}

/// Which answer a failed operation of a stepper task is, by what it asked.
pub(crate) fn failed_answer(asked: Asked, failure: homing_node::Failure) -> Answer {
    match asked {
        Asked::DcStore => Answer::Stored(Err(failure)),
        Asked::Segment => Answer::Segment(Err(failure)),
        Asked::Global => Answer::Global(Err(failure)),
    }
}
