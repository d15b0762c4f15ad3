//! Await-vacant: a waiter at the DC that owns a held reservation, answering
//! an `Await` (or the local part of an acquire with `wait_ms`), as a sans-IO
//! stepper over the DC's [`Waiters`].
//!
//! ```text
//! own dc? ─► Read ─ absent ─► Failed(UnknownReservation)
//!             ├ nobody queued and no live holder ─► Done(Vacated | Moved)
//!             └ register (full ─► Overloaded) ─► Read again (a change between
//!                 the first read and registering is not missed) ─► notify ─► Park
//! Park until the earliest of: the holder's lease turns reapable, the
//! hand-off window ends, the deadline. On a wake-up, in this order:
//!   woken by a write ─► Done(reply)
//!   a timer due ─ deadline ─► Done(TimedOut)
//!               ├ holder lapsed ─► Update(expire) ─► Read again
//!               └ otherwise ─► Read again
//!   the hand-off moved ─► Read again
//!   otherwise ─► Park again
//! ```
//!
//! The driver loops on [`AwaitVacant::poll`]: it performs each
//! [`StoreOp`] against its DC store and hands back the [`Stored`] answer
//! with [`AwaitVacant::handle_stored`] (a landed write also goes through
//! [`Waiters::written`], which may wake this very waiter), and on `Park`
//! waits for the first of: the reply delivered to this waiter's handle, the
//! `until` instant, a rouse of this waiter (its queue's hand-off moved); it
//! then calls [`AwaitVacant::handle_wakeup`]. When it gives up on a waiter
//! (its caller went away) it removes [`AwaitVacant::ticket`] from the
//! registry itself.

use homing_core::{
    AwaitReply, DcId, DcRecord, ErrorKind, ErrorReply, LeasePolicy, RecordState, RecordView,
    ReservationId, StoreTime, TailState, wire::WAIT_MS_MAX,
};

use crate::change::{Change, expire};
use crate::effect::{StoreOp, Stored, unasked};
use crate::mutation::Mutations;
use crate::step::{Effect, Step};
use crate::time::NodeTime;
use crate::update::Update;
use crate::waiters::{Notified, Ticket, Waiters};

/// The answer to a waiter that need not wait: the record has no live holder
/// (`Vacated`) or is no longer the tail (`Moved`); `None` while held.
pub fn settled(record: &DcRecord, now: StoreTime, policy: &LeasePolicy) -> Option<AwaitReply> {
    match record.view(now, policy) {
        RecordView::Link(_) | RecordView::Abandoned => Some(AwaitReply::Moved),
        RecordView::Tail(tail) => match tail.state {
            TailState::Vacant { ended } => Some(AwaitReply::Vacated { ended }),
            TailState::Active { .. } => None,
        },
    }
}

/// What the driver must do next.
#[derive(Debug)]
pub enum AwaitPoll {
    /// Read this DC's record, or compare-and-set it (the waiter expires a
    /// lapsed holder); answer with [`AwaitVacant::handle_stored`].
    Store(StoreOp),
    /// Wait for the waiter's reply, a rouse, or `until` (node clock); then
    /// [`AwaitVacant::handle_wakeup`].
    Park {
        /// When to wake up at the latest.
        until: NodeTime,
    },
    /// Finished: the answer to the waiter's caller.
    Done(Result<AwaitReply, ErrorReply>),
}

#[derive(Debug)]
enum Phase {
    FirstRead,
    Reread,
    Expiring(Box<Update>),
    Parked { until: NodeTime },
    Done(Result<AwaitReply, ErrorReply>),
    Over,
}

/// One waiter in progress.
#[derive(Debug)]
pub struct AwaitVacant {
    id: ReservationId,
    deadline: NodeTime,
    ticket: Option<Ticket>,
    /// The record as last read.
    record: Option<DcRecord>,
    /// The queue's hand-off version when last looked at.
    seen_version: u64,
    policy: LeasePolicy,
    mutations: Mutations,
    phase: Phase,
}

fn unknown(id: &ReservationId, dc: &DcId) -> Result<AwaitReply, ErrorReply> {
    Err(ErrorReply::new(
        ErrorKind::UnknownReservation,
        format!("no reservation {id} in dc {dc}"),
    ))
}

impl AwaitVacant {
    /// A waiter at DC `dc` for `id` arriving at `now`, waiting at most
    /// `wait_ms` (capped at `WAIT_MS_MAX`), judging leases by the DC's
    /// `policy`. Another DC's reservation is refused at once.
    pub fn new(
        dc: &DcId,
        id: ReservationId,
        wait_ms: u32,
        now: NodeTime,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> AwaitVacant {
        let phase = if id.dc() == dc {
            Phase::FirstRead
        } else {
            Phase::Done(Err(ErrorReply::new(
                ErrorKind::BadRequest,
                format!("reservation {id} is owned by dc {}, ask it", id.dc()),
            )))
        };
        AwaitVacant {
            deadline: now.plus_ms(u64::from(wait_ms.min(WAIT_MS_MAX))),
            id,
            ticket: None,
            record: None,
            seen_version: 0,
            policy,
            mutations,
            phase,
        }
    }

    /// The reservation awaited.
    pub fn id(&self) -> &ReservationId {
        &self.id
    }

    /// When the wait ends (node clock).
    pub fn deadline(&self) -> NodeTime {
        self.deadline
    }

    /// The registration, while the waiter is queued.
    pub fn ticket(&self) -> Option<Ticket> {
        self.ticket
    }

    /// What to do next; `Done` is handed out once.
    pub fn poll(&mut self) -> AwaitPoll {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            phase @ (Phase::FirstRead | Phase::Reread) => {
                self.phase = phase;
                AwaitPoll::Store(StoreOp::Read(self.id.clone()))
            }
            Phase::Expiring(mut update) => {
                let poll = match update.next() {
                    Step::Ask(Effect::Store(op)) => AwaitPoll::Store(op),
                    Step::Ask(other) => unreachable!("an update asks only its store: {other:?}"),
                    Step::Done(Ok(_)) => {
                        self.phase = Phase::Reread;
                        return AwaitPoll::Store(StoreOp::Read(self.id.clone()));
                    }
                    Step::Done(Err(e)) => {
                        return AwaitPoll::Done(Err(e.reply()));
                    }
                };
                self.phase = Phase::Expiring(update);
                poll
            }
            Phase::Parked { until } => {
                self.phase = Phase::Parked { until };
                AwaitPoll::Park { until }
            }
            Phase::Done(result) => AwaitPoll::Done(result),
            Phase::Over => panic!("waiter for {} polled after it ended", self.id),
        }
    }

    /// The answer to the [`StoreOp`] asked, at `store_now` / `now`. A
    /// record read may register this waiter (its handle made by `handle`)
    /// and notify the queue; the driver delivers what the returned
    /// [`Notified`] says.
    pub fn handle_stored<W>(
        &mut self,
        stored: Stored,
        store_now: StoreTime,
        now: NodeTime,
        waiters: &mut Waiters<W>,
        handle: impl FnOnce() -> W,
        listening: impl FnMut(&W) -> bool,
    ) -> Notified<W> {
        let record = match stored {
            Stored::Record(record) => record,
            Stored::Written(written) => {
                let Phase::Expiring(update) = &mut self.phase else {
                    panic!("waiter for {}: a write it did not ask for", self.id);
                };
                update.handle_stored(Stored::Written(written), store_now);
                return Notified::default();
            }
            other => unasked("waiter", &other),
        };
        let dc = self.id.dc().clone();
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::FirstRead => {
                let Some(record) = record else {
                    self.phase = Phase::Done(unknown(&self.id, &dc));
                    return Notified::default();
                };
                // Free now and nobody ahead: no need to queue.
                if !waiters.has_waiters(&self.id)
                    && let Some(reply) = settled(&record, store_now, &self.policy)
                {
                    self.phase = Phase::Done(Ok(reply));
                    return Notified::default();
                }
                self.phase = match waiters.register(&self.id, handle()) {
                    Ok(ticket) => {
                        self.ticket = Some(ticket);
                        self.seen_version = waiters.handoff_version(&self.id);
                        Phase::Reread
                    }
                    Err(full) => Phase::Done(Err(ErrorReply::new(
                        ErrorKind::Overloaded,
                        full.to_string(),
                    ))),
                };
                Notified::default()
            }
            Phase::Reread => {
                let Some(record) = record else {
                    self.phase = Phase::Done(unknown(&self.id, &dc));
                    return Notified::default();
                };
                let notified = waiters.notify(&record, store_now, now, &self.policy, listening);
                self.record = Some(record);
                self.phase = Phase::Parked {
                    until: self.wake_at(store_now, now, waiters),
                };
                notified
            }
            Phase::Expiring(mut update) => {
                update.handle_stored(Stored::Record(record), store_now);
                self.phase = Phase::Expiring(update);
                Notified::default()
            }
            other => panic!(
                "waiter for {}: a record it did not ask for ({other:?})",
                self.id
            ),
        }
    }

    /// The parked waiter woke up at `now` / `store_now`: with its reply
    /// (`woken`), at its timer, or roused.
    pub fn handle_wakeup<W>(
        &mut self,
        woken: Option<AwaitReply>,
        store_now: StoreTime,
        now: NodeTime,
        waiters: &Waiters<W>,
    ) {
        let Phase::Parked { until } = self.phase else {
            panic!("waiter for {}: woken while not parked", self.id);
        };
        if let Some(reply) = woken {
            // Woken by a write: it left the queue then.
            self.ticket = None;
            self.phase = Phase::Done(Ok(reply));
            return;
        }
        let wake = self.wake_at(store_now, now, waiters);
        if until <= now || wake <= now {
            if now >= self.deadline {
                self.phase = Phase::Done(Ok(AwaitReply::TimedOut));
                return;
            }
            let lapsed = self
                .record
                .as_ref()
                .is_some_and(|r| expire(r, store_now, &self.policy, self.mutations).is_some());
            self.phase = if lapsed {
                let (dc, id) = (self.id.dc().clone(), self.id.clone());
                let update = Update::new(dc, id, Change::Expire, self.policy, self.mutations);
                Phase::Expiring(Box::new(update))
            } else {
                Phase::Reread
            };
            return;
        }
        let version = if waiters.has_waiters(&self.id) {
            waiters.handoff_version(&self.id)
        } else {
            self.seen_version
        };
        if version != self.seen_version {
            self.seen_version = version;
            self.phase = Phase::Reread;
            return;
        }
        self.phase = Phase::Parked { until: wake };
    }

    /// The earliest of: the holder's lease turning reapable (the reaper may
    /// be slower), the hand-off window's end, the deadline.
    fn wake_at<W>(&self, store_now: StoreTime, now: NodeTime, waiters: &Waiters<W>) -> NodeTime {
        let lapse = match self.record.as_ref().map(|r| &r.state) {
            Some(RecordState::Active { expires_at, .. }) => {
                let at = self.policy.reapable_at(*expires_at);
                Some(now.plus_ms(at.ms_since(store_now) + 1))
            }
            _ => None,
        };
        [lapse, waiters.handoff_until(&self.id), Some(self.deadline)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.deadline)
    }
}

#[cfg(test)]
mod tests {
    //! One DC in memory: its records, its waiter registry and several
    //! waiters, driven like homingd drives them; time jumps to the next
    //! timeout. Store and node clocks read the same here (ms and µs).

    use std::collections::BTreeMap;

    use homing_core::{FencingToken, ReleaseCause, RunOutcome, Written};

    use super::*;
    use crate::waiters::WaitLimits;

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    struct Dc {
        id: DcId,
        records: BTreeMap<ReservationId, DcRecord>,
        waiters: Waiters<usize>,
        now_us: u64,
        waits: Vec<AwaitVacant>,
        /// Delivered, not yet taken by the waiter's select.
        woken: BTreeMap<usize, AwaitReply>,
        /// Waiting for a wake-up (parked).
        parked: BTreeMap<usize, NodeTime>,
        answers: BTreeMap<usize, Result<AwaitReply, ErrorReply>>,
    }

    impl Dc {
        fn new(limits: WaitLimits) -> Dc {
            Dc {
                id: "iad".parse().unwrap(),
                records: BTreeMap::new(),
                waiters: Waiters::new(limits, Mutations::NONE),
                now_us: 1_000_000,
                waits: Vec::new(),
                woken: BTreeMap::new(),
                parked: BTreeMap::new(),
                answers: BTreeMap::new(),
            }
        }

        fn clocks(&self) -> (StoreTime, NodeTime) {
            (
                StoreTime::from_ms(self.now_us / 1000),
                NodeTime::from_us(self.now_us),
            )
        }

        fn hold(&mut self, unique: u64) -> ReservationId {
            let (store_now, _) = self.clocks();
            let id = ReservationId::new(self.id.clone(), unique);
            let name = format!("k{unique}");
            let record = crate::fixture::held(&id.to_string(), &name, None, store_now);
            self.records.insert(id.clone(), record);
            id
        }

        fn write(&mut self, record: DcRecord) {
            let (store_now, now) = self.clocks();
            self.records.insert(record.id.clone(), record.clone());
            let notified = self
                .waiters
                .written(&record, store_now, now, &POLICY, |_| true);
            self.deliver(&record.id, notified);
        }

        fn deliver(&mut self, id: &ReservationId, notified: Notified<usize>) {
            let mut rouse: Vec<usize> = Vec::new();
            if notified.handoff_moved {
                rouse.extend(self.waiters.queued(id).copied());
            }
            for wake in notified.woken {
                self.woken.insert(wake.waiter, wake.reply);
                rouse.push(wake.waiter);
            }
            for w in rouse {
                if self.parked.remove(&w).is_some() {
                    self.wakeup(w);
                }
            }
        }

        fn start(&mut self, id: &ReservationId, wait_ms: u32) -> usize {
            let (_, now) = self.clocks();
            self.waits.push(AwaitVacant::new(
                &self.id,
                id.clone(),
                wait_ms,
                now,
                POLICY,
                Mutations::NONE,
            ));
            let w = self.waits.len() - 1;
            self.drive(w, false);
            w
        }

        fn wakeup(&mut self, w: usize) {
            self.drive(w, false);
        }

        /// A waiter's store operation, at once.
        fn perform(&mut self, op: StoreOp) -> Stored {
            match op {
                StoreOp::Read(id) => Stored::Record(self.records.get(&id).cloned()),
                StoreOp::Write {
                    expected, record, ..
                } => {
                    let current = self.records.get(&record.id).map(|r| r.version);
                    Stored::Written(if current == expected {
                        self.write(*record);
                        Written::Yes
                    } else {
                        Written::Conflict
                    })
                }
                other => panic!("a waiter asked {other:?}"),
            }
        }

        /// Runs waiter `w` until it parks or ends; store operations are
        /// instant. Its select runs once after every wake-up and store
        /// operation, as a driver's `select!` would.
        fn drive(&mut self, w: usize, mut selected: bool) {
            loop {
                let (store_now, now) = self.clocks();
                match self.waits[w].poll() {
                    AwaitPoll::Store(op) => {
                        let id = self.waits[w].id().clone();
                        let stored = self.perform(op);
                        let notified = self.waits[w].handle_stored(
                            stored,
                            store_now,
                            now,
                            &mut self.waiters,
                            || w,
                            |_| true,
                        );
                        self.deliver(&id, notified);
                        selected = false;
                    }
                    AwaitPoll::Park { .. } if !selected => {
                        selected = true;
                        let woken = self.woken.remove(&w);
                        self.waits[w].handle_wakeup(woken, store_now, now, &self.waiters);
                    }
                    AwaitPoll::Park { until } => {
                        self.parked.insert(w, until);
                        return;
                    }
                    AwaitPoll::Done(answer) => {
                        self.answers.insert(w, answer);
                        return;
                    }
                }
            }
        }

        /// Jumps to the earliest parked timer and fires it.
        fn next_timeout(&mut self) {
            let (w, until) = self
                .parked
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(w, u)| (*w, *u))
                .expect("someone is parked");
            self.now_us = self.now_us.max(until.as_us());
            self.parked.remove(&w);
            self.wakeup(w);
        }

        fn release(&mut self, id: &ReservationId) {
            let (store_now, _) = self.clocks();
            let t = self.records[id].release(
                FencingToken::FIRST,
                &homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
                RunOutcome::Ok,
                store_now,
            );
            self.write(t.next.unwrap());
        }
    }

    fn limits() -> WaitLimits {
        WaitLimits {
            per_key: 2,
            total: 10,
            handoff_ms: 1_000,
        }
    }

    #[test]
    fn await_a_vacant_reservation_nobody_waits_for_is_answered_without_queueing() {
        let mut dc = Dc::new(limits());
        let id = dc.hold(1);
        dc.release(&id);
        let w = dc.start(&id, 5_000);
        assert!(matches!(
            dc.answers[&w],
            Ok(AwaitReply::Vacated {
                ended: ReleaseCause::Released(RunOutcome::Ok)
            })
        ));
        assert!(dc.waiters.is_empty());
    }

    #[test]
    fn await_release_wakes_the_first_waiter_then_the_next_after_the_handoff() {
        let mut dc = Dc::new(limits());
        let id = dc.hold(1);
        let first = dc.start(&id, 60_000);
        let second = dc.start(&id, 60_000);
        assert_eq!(dc.parked.len(), 2);
        dc.release(&id);
        assert!(matches!(dc.answers[&first], Ok(AwaitReply::Vacated { .. })));
        assert!(!dc.answers.contains_key(&second), "second waits its turn");
        // Nobody takes the reservation: the window ends, the next is woken.
        let handoff_ends = dc.waiters.handoff_until(&id).unwrap();
        dc.next_timeout();
        assert!(dc.now_us >= handoff_ends.as_us());
        assert!(matches!(
            dc.answers[&second],
            Ok(AwaitReply::Vacated { .. })
        ));
        assert!(dc.waiters.is_empty());
    }

    #[test]
    fn await_a_lapsed_holder_is_expired_by_the_waiter_without_a_reaper() {
        let mut dc = Dc::new(limits());
        let id = dc.hold(1);
        let w = dc.start(&id, 60_000);
        dc.next_timeout();
        let Ok(AwaitReply::Vacated { ended }) = &dc.answers[&w] else {
            panic!("{:?}", dc.answers)
        };
        assert_eq!(*ended, ReleaseCause::Expired);
        assert!(matches!(
            dc.records[&id].state,
            RecordState::Released { .. }
        ));
        let reapable = POLICY.reapable_at(StoreTime::from_ms(1_000 + 10_000));
        assert!(
            dc.now_us / 1000 >= reapable.as_ms(),
            "not before its lease lapsed"
        );
    }

    #[test]
    fn await_the_deadline_answers_timed_out_and_leaves_the_queue() {
        let mut dc = Dc::new(limits());
        let id = dc.hold(1);
        let w = dc.start(&id, 500);
        dc.next_timeout();
        assert_eq!(dc.answers[&w], Ok(AwaitReply::TimedOut));
        assert_eq!(dc.now_us, 1_000_000 + 500_000);
        // The driver removes the registration of a waiter that ended.
        let ticket = dc.waits[w].ticket().unwrap();
        assert_eq!(dc.waiters.leave(&id, ticket), Some(w));
        assert!(dc.waiters.is_empty());
    }

    #[test]
    fn await_a_full_queue_is_overloaded_and_a_link_moves_everyone() {
        let mut dc = Dc::new(limits());
        let id = dc.hold(1);
        let a = dc.start(&id, 60_000);
        let b = dc.start(&id, 60_000);
        let c = dc.start(&id, 60_000);
        assert_eq!(
            dc.answers[&c].as_ref().unwrap_err().kind,
            ErrorKind::Overloaded
        );
        let lapsed = StoreTime::from_ms(100_000);
        let record = &dc.records[&id];
        let linked = record
            .link(
                &record.key,
                &"fra.1".parse().unwrap(),
                FencingToken::FIRST,
                lapsed,
                &POLICY,
            )
            .next
            .unwrap();
        dc.write(linked);
        assert_eq!(dc.answers[&a], Ok(AwaitReply::Moved));
        assert_eq!(dc.answers[&b], Ok(AwaitReply::Moved));
    }

    #[test]
    fn await_another_dcs_reservation_is_refused_and_an_unknown_one_too() {
        let mut dc = Dc::new(limits());
        let other = dc.start(&"fra.1".parse().unwrap(), 1_000);
        assert_eq!(
            dc.answers[&other].as_ref().unwrap_err().kind,
            ErrorKind::BadRequest
        );
        let unknown = dc.start(&"iad.9".parse().unwrap(), 1_000);
        assert_eq!(
            dc.answers[&unknown].as_ref().unwrap_err().kind,
            ErrorKind::UnknownReservation
        );
    }
}
