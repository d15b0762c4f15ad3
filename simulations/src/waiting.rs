//! Parked acquirers at the DC that owns the holder's reservation, as
//! homingd's `Waiters` and `Node::await_vacant` keep them: a FIFO queue per
//! reservation, bounded per reservation and per DC (`Overloaded` beyond),
//! woken from the writes that change the record — never by polling:
//!
//! - vacant (released, or the lease lapsed past expiry + grace): the first
//!   waiter alone gets `Vacated` and the hand-off window (`handoff_ms`); if
//!   the reservation is still vacant when the window ends, the next is woken;
//! - linked or abandoned: every waiter gets `Moved`;
//! - re-activated: the waiters keep waiting (the hand-off ends).
//!
//! Each waiter is a DC task looping like the daemon's: read the record after
//! registering, notify, then "select" on its wake-up, a timer at the
//! holder's reapable time, the end of the hand-off or its deadline (where it
//! applies `expire` itself), and a change of the hand-off. Queues live in
//! memory: a crash loses them. A select with several branches ready takes
//! the wake-up first, then the timer, then the change (tokio picks at
//! random; any order is one the daemon can take).

use std::collections::VecDeque;

use homing_core::{
    AwaitReply, DcRecord, ErrorKind, ErrorReply, LeasePolicy, RecordState, RecordView, Reply,
    ReservationId, StoreTime, TailState, Written, wire::WAIT_MS_MAX,
};

use crate::dc::{AwaitFailure, CAS_ATTEMPTS_MAX, Next, StoreOp, Task, TaskKind, Work};
use crate::sim::{Event, NodeId, Sim};

/// The waiters of one reservation in one DC.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    /// Registered waiters in order: (ticket, task).
    tickets: VecDeque<(u64, u64)>,
    /// Until when (true µs) the last woken waiter has the vacant reservation to itself.
    handoff_until_us: Option<u64>,
    /// Bumped whenever the hand-off changes, so parked waiters re-arm.
    changed: u64,
}

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
    ticket: Option<u64>,
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
                if !self.dcs[d].waiters.contains_key(&id)
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
                            ticket,
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
                self.waiters_notify(d, &record);
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

    /// `Waiters::register`: queues task `tid` behind those already waiting
    /// for `id`; returns its ticket and the queue's hand-off version.
    fn waiters_register(
        &mut self,
        d: usize,
        id: &ReservationId,
        tid: u64,
    ) -> Result<(u64, u64), ErrorReply> {
        let limits = &self.scenario.waiting;
        let (per_key_max, total_max) = (limits.waiters_per_key_max, limits.waiters_max);
        let dc = &mut self.dcs[d];
        let registered = if dc.waiters_total >= total_max {
            let message = format!("{} acquirers already wait in this dc", dc.waiters_total);
            Err(ErrorReply::new(ErrorKind::Overloaded, message))
        } else {
            let ticket = dc.next_ticket;
            dc.next_ticket += 1;
            let queue = dc.waiters.entry(id.clone()).or_default();
            if queue.tickets.len() >= per_key_max {
                let message = format!("{} acquirers already wait for {id}", queue.tickets.len());
                Err(ErrorReply::new(ErrorKind::Overloaded, message))
            } else {
                queue.tickets.push_back((ticket, tid));
                let seen = queue.changed;
                dc.waiters_total += 1;
                Ok((ticket, seen))
            }
        };
        self.measurements.count(if registered.is_ok() {
            "wait_registered"
        } else {
            "wait_overloaded"
        });
        registered
    }

    /// A waiter leaves the queue (it timed out or failed; dropping its ticket).
    fn waiters_leave(&mut self, d: usize, id: &ReservationId, ticket: u64) {
        let dc = &mut self.dcs[d];
        let Some(queue) = dc.waiters.get_mut(id) else {
            return;
        };
        let before = queue.tickets.len();
        queue.tickets.retain(|(t, _)| *t != ticket);
        let left = before - queue.tickets.len();
        if queue.tickets.is_empty() {
            dc.waiters.remove(id);
        }
        dc.waiters_total -= left;
        if left > 0 {
            self.checker.wake.on_left(d as u16, ticket);
        }
    }

    /// `Waiters::notify`: `record` (of DC `d`) was written or read now; wakes
    /// the waiters its state lets go.
    pub(crate) fn waiters_notify(&mut self, d: usize, record: &DcRecord) {
        let now = self.dcs[d].clock.store_time(self.now);
        let handoff_until = self.dcs[d]
            .clock
            .true_us_after(self.now, self.scenario.waiting.handoff_ms * 1000);
        let wake_first = self.rules.waiting.wake_first;
        let true_now = self.now;
        let dc = &mut self.dcs[d];
        let Some(queue) = dc.waiters.get_mut(&record.id) else {
            return;
        };
        let mut woken = Vec::new();
        let mut bumped = false;
        let mut handoff_expired = false;
        match record.view(now, &self.policy) {
            RecordView::Link(_) | RecordView::Abandoned => {
                for (ticket, tid) in queue.tickets.drain(..) {
                    woken.push((ticket, tid, AwaitReply::Moved));
                }
            }
            RecordView::Tail(tail) => match tail.state {
                TailState::Active { .. } => {
                    if queue.handoff_until_us.take().is_some() {
                        queue.changed += 1;
                        bumped = true;
                    }
                }
                TailState::Vacant { ended } => {
                    let in_handoff = queue.handoff_until_us.is_some_and(|t| t > true_now);
                    if !in_handoff {
                        handoff_expired = queue.handoff_until_us.is_some();
                        // The first waiter takes the turn.
                        let first = if wake_first {
                            queue.tickets.pop_front()
                        } else {
                            queue.tickets.pop_back()
                        };
                        if let Some((ticket, tid)) = first {
                            woken.push((ticket, tid, AwaitReply::Vacated { ended }));
                        }
                        queue.handoff_until_us = Some(handoff_until);
                        queue.changed += 1;
                        bumped = true;
                    }
                }
            },
        }
        let rearm: Vec<u64> = if bumped {
            queue.tickets.iter().map(|(_, tid)| *tid).collect()
        } else {
            Vec::new()
        };
        if queue.tickets.is_empty() {
            dc.waiters.remove(&record.id);
        }
        dc.waiters_total -= woken.len();
        if handoff_expired && !woken.is_empty() {
            self.measurements.count("wait_handoff_expired");
        }
        let mut wake_tasks = rearm;
        for (ticket, tid, answer) in woken {
            let vacated = matches!(answer, AwaitReply::Vacated { .. });
            self.measurements.count(if vacated {
                "wait_woken_vacated"
            } else {
                "wait_woken_moved"
            });
            self.checker
                .wake
                .on_wake(true_now, d as u16, &record.id, ticket, vacated);
            self.dcs[d].woken.insert(tid, answer);
            wake_tasks.push(tid);
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
        let queue = self.dcs[d].waiters.get(&job.id);
        let handoff = queue.and_then(|q| q.handoff_until_us);
        let changed = queue.map_or(job.seen_changed, |q| q.changed);
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
