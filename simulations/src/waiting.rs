//! Parked acquirers at the DC that owns the holder's reservation. Who is
//! woken with what — FIFO per reservation, the bounds, the hand-off window —
//! is homing-node's `Waiters`, the same registry homingd runs; this module
//! delivers its answers to simulated tasks and keeps the select loop of
//! homingd's `Node::await_vacant`.
//!
//! Each waiter is a DC task looping like the daemon's: read the record after
//! registering, notify, then "select" on its wake-up, a timer at the
//! holder's reapable time, the end of the hand-off or its deadline (where it
//! applies `expire` itself), and a change of the hand-off. Queues live in
//! memory: a crash loses them. A select with several branches ready takes
//! the wake-up first, then the timer, then the change (tokio picks at
//! random; any order is one the daemon can take).

use homing_core::{
    AwaitReply, DcRecord, ErrorKind, ErrorReply, LeasePolicy, RecordState, RecordView, Reply,
    ReservationId, StoreTime, TailState, Written, wire::WAIT_MS_MAX,
};
use homing_node::{CAS_ATTEMPTS_MAX, NodeTime, Ticket};

use crate::dc::{AwaitFailure, Next, StoreOp, Task, TaskKind, Work};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AwaitPhase {
    /// The read before registering.
    FirstRead,
    /// The read after registering (or after a wake-up of the loop).
    Reread,
    /// Applying `expire` for a lapsed holder (`update_inner`).
    Expiring { attempts: u32 },
    /// At the select.
    Parked,
}

/// One waiter at the reservation's DC.
#[derive(Debug)]
pub(crate) struct AwaitJob {
    id: ReservationId,
    pub(crate) origin: AwaitFor,
    /// When the wait ends, true µs (this DC's clock advanced `wait_ms`).
    deadline_us: u64,
    ticket: Option<Ticket>,
    /// The record as last read.
    record: Option<DcRecord>,
    seen_changed: u64,
    phase: AwaitPhase,
    /// `Some(generation)` while parked: timers of other generations are stale.
    pub(crate) parked: Option<u64>,
    /// When the parked waiter's timer is armed to fire, true µs.
    armed_us: Option<u64>,
    generation: u64,
}

/// The answer to a waiter that need not wait: the record has no live holder
/// (`Vacated`) or is no longer the tail (`Moved`); `None` while held.
fn settled(record: &DcRecord, now: StoreTime, policy: &LeasePolicy) -> Option<AwaitReply> {
    match record.view(now, policy) {
        RecordView::Link(_) | RecordView::Abandoned => Some(AwaitReply::Moved),
        RecordView::Tail(tail) => match tail.state {
            TailState::Vacant { ended } => Some(AwaitReply::Vacated { ended }),
            TailState::Active { .. } => None,
        },
    }
}

fn refused(kind: ErrorKind, message: impl Into<String>) -> Result<AwaitReply, ErrorReply> {
    Err(ErrorReply::new(kind, message))
}

/// What a waiter does after a store operation.
enum Step {
    Finish(Result<AwaitReply, ErrorReply>),
    Store(StoreOp),
    Select,
}

impl Sim {
    /// A waiter for `id` (owned here) starts: read, then register.
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
        if id.dc() != &self.dcs[d].id {
            let message = format!("reservation {id} is owned by dc {}, ask it", id.dc());
            let result = refused(ErrorKind::BadRequest, message);
            return self.await_answer(d, client, rpc, key, origin, result);
        }
        let key = self.reservation_key.get(&id).copied().unwrap_or(key);
        let wait_us = u64::from(wait_ms.min(WAIT_MS_MAX)) * 1000;
        let job = AwaitJob {
            id: id.clone(),
            origin,
            deadline_us: self.dcs[d].clock.true_us_after(self.now, wait_us),
            ticket: None,
            record: None,
            seen_changed: 0,
            phase: AwaitPhase::FirstRead,
            parked: None,
            armed_us: None,
            generation: 0,
        };
        let task = Task {
            client,
            rpc,
            key,
            kind: TaskKind::Await(Box::new(job)),
            waiting: None,
            work: Work::default(),
        };
        let tid = self.new_task_id(d);
        self.dc_continue(d, tid, task, Next::Store(StoreOp::Get(id)));
    }

    /// A waiter's store operation completed.
    pub(crate) fn await_store_done(&mut self, d: usize, tid: u64, mut task: Task, op: StoreOp) {
        let step = self.await_step(d, tid, &mut task, op);
        match step {
            Step::Finish(result) => self.await_finish(d, task, result),
            Step::Store(op) => self.dc_continue(d, tid, task, Next::Store(op)),
            Step::Select => self.await_select(d, tid, task),
        }
    }

    fn await_step(&mut self, d: usize, tid: u64, task: &mut Task, op: StoreOp) -> Step {
        let now = self.dcs[d].clock.store_time(self.now);
        let policy = self.policy;
        let key = task.key;
        let TaskKind::Await(job) = &mut task.kind else {
            return Step::Finish(refused(ErrorKind::Internal, "not a waiter"));
        };
        let record = match &op {
            StoreOp::Get(id) => self.dcs[d].records.get(id).cloned(),
            _ => None,
        };
        match (op, job.phase) {
            (StoreOp::Get(id), AwaitPhase::FirstRead) => {
                let Some(record) = record else {
                    return Step::Finish(refused(ErrorKind::UnknownReservation, id.to_string()));
                };
                // Free now and nobody ahead: no need to queue.
                if !self.dcs[d].waiters.has_waiters(&id)
                    && let Some(answer) = settled(&record, now, &policy)
                {
                    self.measurements.count("wait_answered_at_once");
                    return Step::Finish(Ok(answer));
                }
                match self.waiters_register(d, &id, tid) {
                    Ok((ticket, seen)) => {
                        job.ticket = Some(ticket);
                        job.seen_changed = seen;
                        job.phase = AwaitPhase::Reread;
                        self.checker.wake.on_register(
                            self.now,
                            d as u16,
                            &id,
                            key,
                            ticket.get(),
                            job.deadline_us,
                            &record,
                        );
                        Step::Store(StoreOp::Get(id))
                    }
                    Err(e) => Step::Finish(Err(e)),
                }
            }
            (StoreOp::Get(id), AwaitPhase::Reread) => {
                let Some(record) = record else {
                    return Step::Finish(refused(ErrorKind::UnknownReservation, id.to_string()));
                };
                // Read after registering, so a change between the two is not missed.
                job.record = Some(record.clone());
                self.waiters_notify(d, &record, false);
                Step::Select
            }
            (StoreOp::Get(id), AwaitPhase::Expiring { attempts }) => {
                let Some(record) = record else {
                    return Step::Finish(refused(ErrorKind::UnknownReservation, id.to_string()));
                };
                match (self.rules.expire)(&record, now, &policy) {
                    None => {
                        job.phase = AwaitPhase::Reread;
                        Step::Store(StoreOp::Get(id))
                    }
                    Some(next) => {
                        job.phase = AwaitPhase::Expiring { attempts };
                        Step::Store(StoreOp::Cas {
                            expected: Some(record.version),
                            record: next,
                        })
                    }
                }
            }
            (StoreOp::Cas { expected, record }, AwaitPhase::Expiring { attempts }) => {
                let id = record.id.clone();
                match self.cas(d, expected, record) {
                    Written::Yes => {
                        self.measurements.count("wait_lease_expired_by_waiter");
                        job.phase = AwaitPhase::Reread;
                        Step::Store(StoreOp::Get(id))
                    }
                    Written::Conflict if attempts + 1 >= CAS_ATTEMPTS_MAX => {
                        let message = format!("reservation {id} contended");
                        Step::Finish(refused(ErrorKind::Overloaded, message))
                    }
                    Written::Conflict => {
                        job.phase = AwaitPhase::Expiring {
                            attempts: attempts + 1,
                        };
                        Step::Store(StoreOp::Get(id))
                    }
                }
            }
            _ => Step::Finish(refused(ErrorKind::Internal, "unexpected store operation")),
        }
    }

    /// Queues task `tid` behind those already waiting for `id`; returns its
    /// ticket and the queue's hand-off version.
    fn waiters_register(
        &mut self,
        d: usize,
        id: &ReservationId,
        tid: u64,
    ) -> Result<(Ticket, u64), ErrorReply> {
        let waiters = &mut self.dcs[d].waiters;
        let registered = waiters
            .register(id, tid)
            .map(|ticket| (ticket, waiters.handoff_version(id)))
            .map_err(|full| ErrorReply::new(ErrorKind::Overloaded, full.to_string()));
        self.measurements.count(if registered.is_ok() {
            "wait_registered"
        } else {
            "wait_overloaded"
        });
        registered
    }

    /// A waiter leaves the queue (it timed out or failed; dropping its ticket).
    fn waiters_leave(&mut self, d: usize, id: &ReservationId, ticket: Ticket) {
        if self.dcs[d].waiters.leave(id, ticket).is_some() {
            self.checker.wake.on_left(d as u16, ticket.get());
        }
    }

    /// `record` (of DC `d`) was read, or `written`, now: wakes the waiters
    /// its state lets go, as homing-node's `Waiters` decides.
    pub(crate) fn waiters_notify(&mut self, d: usize, record: &DcRecord, written: bool) {
        let clock = self.dcs[d].clock;
        let now = clock.store_time(self.now);
        let mono = NodeTime::from_us(clock.local_us(self.now));
        let true_now = self.now;
        let waiters = &mut self.dcs[d].waiters;
        // Simulated waiters leave the queue themselves when they stop listening.
        let notified = if written {
            waiters.written(record, now, mono, &self.policy, |_| true)
        } else {
            waiters.notify(record, now, mono, &self.policy, |_| true)
        };
        let mut wake_tasks: Vec<u64> = if notified.handoff_moved {
            waiters.queued(&record.id).copied().collect()
        } else {
            Vec::new()
        };
        if notified.handoff_expired && !notified.woken.is_empty() {
            self.measurements.count("wait_handoff_expired");
        }
        for wake in notified.woken {
            let vacated = matches!(wake.reply, AwaitReply::Vacated { .. });
            self.measurements.count(if vacated {
                "wait_woken_vacated"
            } else {
                "wait_woken_moved"
            });
            self.checker
                .wake
                .on_wake(true_now, d as u16, &record.id, wake.ticket.get(), vacated);
            self.dcs[d].woken.insert(wake.waiter, wake.reply);
            wake_tasks.push(wake.waiter);
        }
        for tid in wake_tasks {
            self.await_rouse(d, tid);
        }
    }

    /// A parked waiter has something to look at: run its select now.
    fn await_rouse(&mut self, d: usize, tid: u64) {
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

    /// The waiter's select: its wake-up, then a due timer, then a hand-off
    /// change; otherwise it parks until the earliest of its timers.
    pub(crate) fn await_select(&mut self, d: usize, tid: u64, mut task: Task) {
        let now_store = self.dcs[d].clock.store_time(self.now);
        let policy = self.policy;
        let clock = self.dcs[d].clock;
        let TaskKind::Await(job) = &mut task.kind else {
            return;
        };
        job.parked = None;
        let fired = job.armed_us.take().is_some_and(|at| at <= self.now);
        if let Some(answer) = self.dcs[d].woken.remove(&tid) {
            job.ticket = None;
            return self.await_finish(d, task, Ok(answer));
        }
        // Wake up when the holder's lease becomes reapable (the reaper may be
        // slower) or when a hand-off window ends.
        let lapse = match job.record.as_ref().map(|r| &r.state) {
            Some(RecordState::Active { expires_at, .. }) => {
                let at = policy.reapable_at(*expires_at);
                Some(clock.true_us_after(self.now, (at.ms_since(now_store) + 1) * 1000))
            }
            _ => None,
        };
        let waiters = &self.dcs[d].waiters;
        let handoff = waiters
            .handoff_until(&job.id)
            .map(|until| clock.first_true_us_at_us(until.as_us()));
        let changed = if waiters.has_waiters(&job.id) {
            waiters.handoff_version(&job.id)
        } else {
            job.seen_changed
        };
        let wake = [lapse, handoff, Some(job.deadline_us)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(job.deadline_us);
        if fired || wake <= self.now {
            if self.now >= job.deadline_us {
                return self.await_finish(d, task, Ok(AwaitReply::TimedOut));
            }
            let id = job.id.clone();
            let lapsed = job
                .record
                .as_ref()
                .is_some_and(|r| (self.rules.expire)(r, now_store, &policy).is_some());
            job.phase = if lapsed {
                AwaitPhase::Expiring { attempts: 0 }
            } else {
                AwaitPhase::Reread
            };
            return self.dc_continue(d, tid, task, Next::Store(StoreOp::Get(id)));
        }
        if changed != job.seen_changed {
            job.seen_changed = changed;
            job.phase = AwaitPhase::Reread;
            let id = job.id.clone();
            return self.dc_continue(d, tid, task, Next::Store(StoreOp::Get(id)));
        }
        job.generation += 1;
        let generation = job.generation;
        job.parked = Some(generation);
        job.armed_us = Some(wake);
        job.phase = AwaitPhase::Parked;
        let epoch = self.dcs[d].epoch;
        self.dcs[d].tasks.insert(tid, task);
        self.schedule(
            wake,
            Event::DcTask {
                dc: d as u16,
                epoch,
                task: tid,
                generation,
            },
        );
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
        if let Some(ticket) = job.ticket {
            self.waiters_leave(d, &job.id, ticket);
        }
        if matches!(result, Ok(AwaitReply::TimedOut)) {
            self.measurements.count("wait_timed_out_at_tail");
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
            self.measurements.count("wait_wake_up_dropped_at_deadline");
        }
        if let TaskKind::Await(job) = &task.kind
            && let Some(ticket) = job.ticket
        {
            self.waiters_leave(d, &job.id, ticket);
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
                let Some(mut task) = self.dcs[d].tasks.remove(&acquire) else {
                    return;
                };
                // A local failure is unavailable only if its kind says so
                // (homingd's `Failure::Reply`).
                let result = result.map_err(|e| match e.kind {
                    ErrorKind::Unavailable { .. } => AwaitFailure::Unavailable,
                    _ => AwaitFailure::Refused(e),
                });
                let next = self.acquire_awaited(d, &mut task, result);
                self.dc_continue(d, acquire, task, next);
            }
        }
    }
}
