//! Parked acquirers at the DC that owns the holder's reservation. Who is
//! woken with what — FIFO per reservation, the bounds, the hand-off window —
//! is homing-node's `Waiters`, and each waiter's loop (first look, join,
//! re-read, park until the earliest timer, expire a lapsed holder, time out)
//! is homing-node's `AwaitVacant`, a stepper the simulator's one loop runs
//! (`task.rs`): the same code homingd runs. This module performs its
//! registry operations and parks, and delivers wake-ups to tasks.
//!
//! A parked waiter's "select" takes its wake-up first, then a due timer,
//! then a hand-off change (tokio picks at random; any order is one the
//! daemon can take). Queues live in memory: a crash loses them.

use crate::counter::Counter;
use homing_core::{AwaitReply, DcRecord, RecordRead, Reply, ReservationId};
use homing_node::{Answer, AwaitVacant, Failure, NodeTime, Notified, QueueOp, Queued, Ticket};

use super::ctx::DcCtx;
use super::task::Task;
use super::task::TaskStepper;
use crate::event::NodeId;

/// Who waits: a peer DC's `Await` request, or an acquire of this DC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AwaitFor {
    /// Answer `Reply::Awaited` to the requesting DC.
    Remote,
    /// Resume this DC's acquire task.
    Local {
        /// The acquire's task.
        acquire: u64,
    },
}

/// One waiter at the reservation's DC.
#[derive(Debug)]
pub(crate) struct AwaitJob {
    /// homing-node's waiter.
    pub(crate) wait: AwaitVacant,
    pub(crate) origin: AwaitFor,
    /// `Some(generation)` while parked: timers of other generations are stale.
    pub(crate) parked: Option<u64>,
    generation: u64,
    /// Whether its select already ran since its last store operation or
    /// wake-up (a park then is for real).
    pub(crate) selected: bool,
}

impl DcCtx<'_> {
    /// A waiter (homing-node's, as the DC's endpoint made it) starts:
    /// read, then join the queue.
    pub(crate) fn await_start(
        &mut self,
        client: NodeId,
        rpc: u64,
        key: u32,
        wait: AwaitVacant,
        origin: AwaitFor,
    ) {
        let key = self.keys.of_reservation(wait.id()).unwrap_or(key);
        let job = AwaitJob {
            wait,
            origin,
            parked: None,
            generation: 0,
            selected: false,
        };
        let kind = TaskStepper::Await(Box::new(job));
        let task = Task::new(client, rpc, key, kind);
        if self.inst.endpoint.closing() {
            // homingd's `closed()` is ready at once: the wait ends now.
            self.measurements.count(Counter::WaitAnsweredAtShutdown);
            return self.await_finish(&task, Ok(AwaitReply::TimedOut));
        }
        self.step_start(task);
    }

    /// Performs waiter `tid`'s registry operation at once: homing-node's
    /// `Waiters::queue`, with the checker told of a registration.
    pub(crate) fn await_queue(&mut self, tid: u64, task: &Task, op: QueueOp) -> Answer {
        let store_now = self.dc.clock.store_time(self.world.now);
        let now = self.node_now();
        let reservation = op.reservation().clone();
        // Simulated waiters leave the queue themselves when they stop listening.
        let waiters = self.inst.endpoint.waiters_mut();
        let (queued, notified) = waiters.queue(op, store_now, now, &self.policy, || tid, |_| true);
        let job = task.kind.waiter().expect("a waiter's registry operation");
        match &queued {
            Queued::Joined(ticket, _) => {
                self.measurements.count(Counter::WaitRegistered);
                let deadline_us = self
                    .dc
                    .clock
                    .first_true_us_at_us(job.wait.deadline().as_us());
                // Invariant: a waiter joins after reading its record.
                let read = job.wait.last_read().expect("a record read");
                let id = &reservation;
                let ticket = ticket.get();
                let (at, dc) = (self.world.now, self.addr());
                (self.checker.wake).on_register(at, dc, id, task.key, ticket, deadline_us, read);
            }
            Queued::Settled(_) => self.measurements.count(Counter::WaitAnsweredAtOnce),
            Queued::Full(_) => self.measurements.count(Counter::WaitOverloaded),
            Queued::Handoff(_) => {}
        }
        self.waiters_deliver(&reservation, notified);
        Answer::Queued(queued)
    }

    /// Waiter `tid` parks until `until` (its select already ran): it waits
    /// for its timer or a wake-up.
    pub(crate) fn await_park(&mut self, tid: u64, mut task: Box<Task>, until: NodeTime) {
        let job = task.kind.waiter_mut().expect("a waiter parks");
        job.generation += 1;
        let generation = job.generation;
        job.parked = Some(generation);
        let at = self.dc.clock.first_true_us_at_us(until.as_us());
        self.inst.tasks.insert(tid, task);
        self.set_timer(tid, generation, at);
    }

    /// Waiter `tid` asks to park: the first time since its last store
    /// operation or wake-up its select runs at once (taking a reply
    /// delivered meanwhile, or looking again, as tokio's `select!` finds a
    /// ready branch), `None` after that (it parks for real).
    pub(crate) fn await_selected(&mut self, tid: u64, task: &mut Task) -> Option<Answer> {
        let job = task.kind.waiter_mut().expect("a waiter parks");
        let selected = std::mem::replace(&mut job.selected, true);
        (!selected).then(|| Answer::Woken(self.inst.woken.remove(&tid)))
    }

    /// A parked waiter's timer fired or it was roused: its select runs.
    pub(crate) fn await_select(&mut self, tid: u64, mut task: Box<Task>) {
        if let Some(job) = task.kind.waiter_mut() {
            job.parked = None;
            job.selected = false;
        }
        self.step_drive(tid, task);
    }

    /// A waiter leaves the queue (it timed out or failed; dropping its ticket).
    fn waiters_leave(&mut self, id: &ReservationId, ticket: Ticket) {
        if self.inst.endpoint.waiters_mut().leave(id, ticket).is_some() {
            self.checker.wake.on_left(self.addr(), ticket.get());
        }
    }

    /// `record` (of this DC) was just written: wakes the waiters its state
    /// lets go, as homing-node's `Waiters` decides.
    pub(crate) fn waiters_written(&mut self, record: &DcRecord) {
        let clock = self.dc.clock;
        let store_now = clock.store_time(self.world.now);
        let now = self.node_now();
        // Simulated waiters leave the queue themselves when they stop listening.
        let notified =
            self.inst
                .endpoint
                .waiters_mut()
                .written(record, store_now, now, &self.policy, |_| true);
        self.waiters_deliver(&record.id, notified);
    }

    /// `record` (of this DC) as the log follower read it: its waiters
    /// here learn of a write another homingd of the DC made (homingd's
    /// `Waiters::seen`).
    pub(crate) fn waiters_seen(&mut self, read: &RecordRead) {
        let store_now = self.dc.clock.store_time(self.world.now);
        let now = self.node_now();
        let waiters = self.inst.endpoint.waiters_mut();
        let notified = waiters.seen(read, store_now, now, &self.policy, |_| true);
        self.waiters_deliver(&read.record.id, notified);
    }

    /// Delivers what a change of `id` did to its waiters: wake-ups to their
    /// tasks, and a look again for those a moved hand-off concerns.
    /// The waiters of each of `ids` look again (a session their
    /// reservation was held under closed: see `Endpoint::note`).
    pub(crate) fn waiters_roused(&mut self, ids: Vec<ReservationId>) {
        for id in ids {
            self.waiters_deliver(&id, Notified::roused());
        }
    }

    fn waiters_deliver(&mut self, id: &ReservationId, notified: Notified<u64>) {
        let true_now = self.world.now;
        let mut wake_tasks: Vec<u64> = if notified.handoff_moved {
            self.inst.endpoint.waiters().queued(id).copied().collect()
        } else {
            Vec::new()
        };
        if notified.handoff_expired && !notified.woken.is_empty() {
            self.measurements.count(Counter::WaitHandoffExpired);
        }
        for wake in notified.woken {
            let vacated = matches!(wake.reply, AwaitReply::Vacated { .. });
            self.measurements.count(if vacated {
                Counter::WaitWokenVacated
            } else {
                Counter::WaitWokenMoved
            });
            self.checker
                .wake
                .on_wake(true_now, self.addr(), id, wake.ticket.get(), vacated);
            self.inst.woken.insert(wake.waiter, wake.reply);
            wake_tasks.push(wake.waiter);
        }
        for tid in wake_tasks {
            self.await_rouse(tid);
        }
    }

    /// A parked waiter has something to look at: run its select now.
    pub(crate) fn await_rouse(&mut self, tid: u64) {
        let Some(job) = self.inst.tasks.get(&tid).and_then(|t| t.kind.waiter()) else {
            return;
        };
        if let Some(generation) = job.parked {
            self.set_timer(tid, generation, self.world.now);
        }
    }

    /// The waiter ends: it leaves the queue (unless woken) and is answered.
    pub(crate) fn await_finish(&mut self, task: &Task, result: Result<AwaitReply, Failure>) {
        let Some(job) = task.kind.waiter() else {
            unreachable!("a waiter's task");
        };
        if let Some(ticket) = job.wait.ticket() {
            self.waiters_leave(job.wait.id(), ticket);
        }
        if matches!(result, Ok(AwaitReply::TimedOut)) {
            self.measurements.count(Counter::WaitTimedOutAtTail);
        }
        self.await_answer(task.client, task.rpc, task.key, job.origin, result);
    }

    /// The local acquire `acquire` stopped waiting (its deadline passed):
    /// its waiter ends at once, leaving the queue, and a wake-up it had not
    /// yet taken is lost with it — as when homingd drops the `await_vacant`
    /// future (the hand-off window then passes the turn on).
    pub(crate) fn await_drop(&mut self, acquire: u64) {
        let origin = AwaitFor::Local { acquire };
        let waiter = self.inst.tasks.iter().find_map(|(tid, t)| {
            (t.kind.waiter())
                .is_some_and(|job| job.origin == origin)
                .then_some(*tid)
        });
        let Some(tid) = waiter else {
            return;
        };
        let Some(task) = self.inst.tasks.remove(&tid) else {
            return;
        };
        if self.inst.woken.remove(&tid).is_some() {
            self.measurements
                .count(Counter::WaitWakeUpDroppedAtDeadline);
        }
        if let Some(job) = task.kind.waiter()
            && let Some(ticket) = job.wait.ticket()
        {
            self.waiters_leave(job.wait.id(), ticket);
        }
    }

    /// Answers a waiter: a reply on the requesting DC's stream, or the local acquire resumes.
    fn await_answer(
        &mut self,
        client: NodeId,
        rpc: u64,
        key: u32,
        origin: AwaitFor,
        result: Result<AwaitReply, Failure>,
    ) {
        match origin {
            AwaitFor::Remote => {
                let reply = match result {
                    Ok(answer) => Reply::Awaited(answer),
                    Err(e) => Reply::Error(e.into_reply()),
                };
                self.stream_reply(client, rpc, key, reply);
            }
            AwaitFor::Local { acquire } => {
                let Some(task) = self.inst.tasks.remove(&acquire) else {
                    return;
                };
                self.acquire_awaited(acquire, task, result);
            }
        }
    }
}
