//! Parked acquirers at the DC that owns the holder's reservation. Who is
//! woken with what — FIFO per reservation, the bounds, the hand-off window —
//! is homing-node's `Waiters`, and each waiter's loop (first look, register,
//! re-read, park until the earliest timer, expire a lapsed holder, time out)
//! is homing-node's `AwaitVacant`: the same code homingd runs. This module
//! performs what they ask for with simulated store operations and timers,
//! and delivers wake-ups to tasks.
//!
//! A parked waiter's "select" takes its wake-up first, then a due timer,
//! then a hand-off change (tokio picks at random; any order is one the
//! daemon can take). Queues live in memory: a crash loses them.

use crate::counter::Counter;
use homing_core::{AwaitReply, DcRecord, ErrorKind, ErrorReply, Reply, ReservationId, Written};
use homing_node::{AwaitPoll, AwaitVacant, Failure, NodeTime, Notified, Stored, Ticket};

use crate::dc::{Next, StoreOp, Task, TaskKind};
use crate::sim::{Event, NodeId, Sim};

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
    wait: AwaitVacant,
    pub(crate) origin: AwaitFor,
    /// Whether the first read is still to come back.
    first_read: bool,
    /// `Some(generation)` while parked: timers of other generations are stale.
    pub(crate) parked: Option<u64>,
    generation: u64,
}

impl Sim {
    /// The node clock of DC `d` now: its local clock, µs.
    pub(crate) fn node_now(&self, d: usize) -> NodeTime {
        NodeTime::from_us(self.dcs[d].clock.local_us(self.now))
    }

    /// A waiter for `id` starts: read, then register.
    #[allow(clippy::too_many_arguments)] // the request's origin and its content
    pub(crate) fn await_start(
        &mut self,
        d: usize,
        client: NodeId,
        rpc: u64,
        key: u32,
        id: ReservationId,
        wait_ms: u32,
        origin: AwaitFor,
    ) {
        let key = self.reservation_key.get(&id).copied().unwrap_or(key);
        let (now, mutations) = (self.node_now(d), self.rules.mutations);
        let wait = AwaitVacant::new(&self.dcs[d].id, id, wait_ms, now, self.policy, mutations);
        let job = AwaitJob {
            wait,
            origin,
            first_read: true,
            parked: None,
            generation: 0,
        };
        let task = Task::new(client, rpc, key, TaskKind::Await(Box::new(job)));
        if self.dcs[d].closing.is_some() {
            // homingd's `closed()` is ready at once: the wait ends now.
            self.measurements.count(Counter::WaitAnsweredAtShutdown);
            return self.await_finish(d, task, Ok(AwaitReply::TimedOut));
        }
        let tid = self.new_task_id(d);
        self.await_drive(d, tid, task, false);
    }

    /// A waiter's store operation completed (or failed).
    pub(crate) fn await_stored(
        &mut self,
        d: usize,
        tid: u64,
        mut task: Task,
        stored: Result<Stored, Failure>,
    ) {
        let store_now = self.dcs[d].clock.store_time(self.now);
        let now = self.node_now(d);
        let key = task.key;
        let TaskKind::Await(job) = &mut task.kind else {
            return;
        };
        let id = job.wait.id().clone();
        match stored {
            Ok(Stored::Record(record)) => {
                let dc = &mut self.dcs[d];
                // Simulated waiters leave the queue themselves when they stop listening.
                let notified = job.wait.handle_stored(
                    Stored::Record(record.clone()),
                    store_now,
                    now,
                    &mut dc.waiters,
                    || tid,
                    |_| true,
                );
                let first = std::mem::replace(&mut job.first_read, false);
                if first {
                    match (job.wait.ticket(), record) {
                        (Some(ticket), Some(record)) => {
                            self.measurements.count(Counter::WaitRegistered);
                            let deadline_us = self.dcs[d]
                                .clock
                                .first_true_us_at_us(job.wait.deadline().as_us());
                            self.checker.wake.on_register(
                                self.now,
                                d as u16,
                                &id,
                                key,
                                ticket.get(),
                                deadline_us,
                                &record,
                            );
                        }
                        _ => {
                            let AwaitPoll::Done(result) = job.wait.poll() else {
                                unreachable!("a first look that does not register is an answer");
                            };
                            match &result {
                                Ok(_) => self.measurements.count(Counter::WaitAnsweredAtOnce),
                                Err(e) if e.kind == ErrorKind::Overloaded => {
                                    self.measurements.count(Counter::WaitOverloaded);
                                }
                                Err(_) => {}
                            }
                            return self.await_finish(d, task, result);
                        }
                    }
                }
                self.waiters_deliver(d, &id, notified);
            }
            Ok(Stored::Written(written)) => {
                if written == Written::Yes {
                    self.measurements.count(Counter::WaitLeaseExpiredByWaiter);
                }
                let waiters = &mut self.dcs[d].waiters;
                let stored = Stored::Written(written);
                let notified =
                    job.wait
                        .handle_stored(stored, store_now, now, waiters, || tid, |_| true);
                self.waiters_deliver(d, &id, notified);
            }
            _ => {
                let message = "unexpected store operation";
                let result = Err(ErrorReply::new(ErrorKind::Internal, message));
                return self.await_finish(d, task, result);
            }
        }
        self.await_drive(d, tid, task, false);
    }

    /// Runs the waiter until it needs the store, parks, or ends. `selected`:
    /// its select already ran at this instant (a `Park` now is for real).
    fn await_drive(&mut self, d: usize, tid: u64, mut task: Task, mut selected: bool) {
        loop {
            let TaskKind::Await(job) = &mut task.kind else {
                return;
            };
            match job.wait.poll() {
                AwaitPoll::Store(op) => {
                    return self.dc_continue(d, tid, task, Next::Store(StoreOp::Dc(op)));
                }
                AwaitPoll::Park { .. } if !selected => {
                    selected = true;
                    let woken = self.dcs[d].woken.remove(&tid);
                    let store_now = self.dcs[d].clock.store_time(self.now);
                    let now = self.node_now(d);
                    let waiters = &self.dcs[d].waiters;
                    job.wait.handle_wakeup(woken, store_now, now, waiters);
                }
                AwaitPoll::Park { until } => {
                    job.generation += 1;
                    let generation = job.generation;
                    job.parked = Some(generation);
                    let at = self.dcs[d].clock.first_true_us_at_us(until.as_us());
                    let epoch = self.dcs[d].epoch;
                    self.dcs[d].tasks.insert(tid, task);
                    let event = Event::DcTask {
                        dc: d as u16,
                        epoch,
                        task: tid,
                        generation,
                    };
                    return self.schedule(at, event);
                }
                AwaitPoll::Done(result) => return self.await_finish(d, task, result),
            }
        }
    }

    /// A waiter leaves the queue (it timed out or failed; dropping its ticket).
    fn waiters_leave(&mut self, d: usize, id: &ReservationId, ticket: Ticket) {
        if self.dcs[d].waiters.leave(id, ticket).is_some() {
            self.checker.wake.on_left(d as u16, ticket.get());
        }
    }

    /// `record` (of DC `d`) was just written: wakes the waiters its state
    /// lets go, as homing-node's `Waiters` decides.
    pub(crate) fn waiters_written(&mut self, d: usize, record: &DcRecord) {
        let clock = self.dcs[d].clock;
        let store_now = clock.store_time(self.now);
        let now = self.node_now(d);
        // Simulated waiters leave the queue themselves when they stop listening.
        let notified = self.dcs[d]
            .waiters
            .written(record, store_now, now, &self.policy, |_| true);
        self.waiters_deliver(d, &record.id, notified);
    }

    /// Delivers what a change of `id` did to its waiters: wake-ups to their
    /// tasks, and a look again for those a moved hand-off concerns.
    fn waiters_deliver(&mut self, d: usize, id: &ReservationId, notified: Notified<u64>) {
        let true_now = self.now;
        let mut wake_tasks: Vec<u64> = if notified.handoff_moved {
            self.dcs[d].waiters.queued(id).copied().collect()
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
                .on_wake(true_now, d as u16, id, wake.ticket.get(), vacated);
            self.dcs[d].woken.insert(wake.waiter, wake.reply);
            wake_tasks.push(wake.waiter);
        }
        for tid in wake_tasks {
            self.await_rouse(d, tid);
        }
    }

    /// A parked waiter has something to look at: run its select now.
    pub(crate) fn await_rouse(&mut self, d: usize, tid: u64) {
        let Some(TaskKind::Await(job)) = self.dcs[d].tasks.get(&tid).map(|t| &t.kind) else {
            return;
        };
        if let Some(generation) = job.parked {
            let epoch = self.dcs[d].epoch;
            self.schedule(
                self.now,
                Event::DcTask {
                    dc: d as u16,
                    epoch,
                    task: tid,
                    generation,
                },
            );
        }
    }

    /// A parked waiter's timer fired or it was roused: its select runs.
    pub(crate) fn await_select(&mut self, d: usize, tid: u64, mut task: Task) {
        if let TaskKind::Await(job) = &mut task.kind {
            job.parked = None;
        }
        self.await_drive(d, tid, task, false);
    }

    /// The waiter ends: it leaves the queue (unless woken) and is answered.
    pub(crate) fn await_finish(
        &mut self,
        d: usize,
        task: Task,
        result: Result<AwaitReply, ErrorReply>,
    ) {
        let TaskKind::Await(job) = &task.kind else {
            return;
        };
        if let Some(ticket) = job.wait.ticket() {
            self.waiters_leave(d, job.wait.id(), ticket);
        }
        if matches!(result, Ok(AwaitReply::TimedOut)) {
            self.measurements.count(Counter::WaitTimedOutAtTail);
        }
        self.await_answer(d, task.client, task.rpc, task.key, job.origin, result);
    }

    /// The local acquire `acquire` stopped waiting (its deadline passed):
    /// its waiter ends at once, leaving the queue, and a wake-up it had not
    /// yet taken is lost with it — as when homingd drops the `await_vacant`
    /// future (the hand-off window then passes the turn on).
    pub(crate) fn await_drop(&mut self, d: usize, acquire: u64) {
        let origin = AwaitFor::Local { acquire };
        let waiter = self.dcs[d].tasks.iter().find_map(|(tid, t)| match &t.kind {
            TaskKind::Await(job) if job.origin == origin => Some(*tid),
            _ => None,
        });
        let Some(tid) = waiter else {
            return;
        };
        let Some(task) = self.dcs[d].tasks.remove(&tid) else {
            return;
        };
        if self.dcs[d].woken.remove(&tid).is_some() {
            self.measurements
                .count(Counter::WaitWakeUpDroppedAtDeadline);
        }
        if let TaskKind::Await(job) = &task.kind
            && let Some(ticket) = job.wait.ticket()
        {
            self.waiters_leave(d, job.wait.id(), ticket);
        }
    }

    /// Answers a waiter: a reply on the requesting DC's stream, or the local acquire resumes.
    fn await_answer(
        &mut self,
        d: usize,
        client: NodeId,
        rpc: u64,
        key: u32,
        origin: AwaitFor,
        result: Result<AwaitReply, ErrorReply>,
    ) {
        match origin {
            AwaitFor::Remote => {
                let reply = match result {
                    Ok(answer) => Reply::Awaited(answer),
                    Err(e) => Reply::Error(e),
                };
                self.stream_reply(d, client, rpc, key, reply);
            }
            AwaitFor::Local { acquire } => {
                let Some(task) = self.dcs[d].tasks.remove(&acquire) else {
                    return;
                };
                // A local failure is unavailable only if its kind says so
                // (homingd's `Failure::Reply`).
                let result = result.map_err(Failure::from_reply);
                self.acquire_awaited(d, acquire, task, result);
            }
        }
    }
}
