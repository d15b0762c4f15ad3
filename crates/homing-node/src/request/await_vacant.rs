//! Await-vacant: a waiter at the DC that owns a held reservation, answering
//! an `Await` (or the local part of an acquire with `wait_ms`), as a
//! [`Stepper`] over the DC's [`crate::Waiters`].
//!
//! ```text
//! own dc? ─► Read ─ absent ─► UnknownReservation
//!             └ Queue(Join) ─ nobody queued and no live holder ─► Vacated | Moved
//!                 ├ full ─► Overloaded
//!                 └ Read again (a change between the first read and
//!                   joining is not missed) ─► Queue(Notify) ─► Park
//! Park until the earliest of: the holder's lease turns reapable, the
//! hand-off window ends, the deadline. Woken:
//!   with a reply (a write let it go) ─► that reply
//!   without (a timer, a rouse) ─► Queue(Handoff) ─►
//!     a timer due ─ deadline ─► TimedOut
//!                 ├ holder lapsed ─► Update(expire) ─► Read again
//!                 └ otherwise ─► Read again
//!     the hand-off moved ─► Read again
//!     otherwise ─► Park again
//! ```
//!
//! The driver performs each [`Effect`] like any stepper's: a store
//! operation against its DC store (a landed write also goes through
//! [`crate::Waiters::written`], which may wake this very waiter), a
//! [`QueueOp`] with [`crate::Waiters::queue`] under the registry's lock
//! (delivering what it woke), and a park as a wait for the first of: the
//! reply delivered to this waiter's handle, the `until` instant, a rouse of
//! this waiter (its queue's hand-off moved), shutdown. When the stepper
//! ends or its caller goes away, the driver removes [`AwaitVacant::ticket`]
//! from the registry (a woken waiter has left already).

use homing_core::{
    AwaitReply, DcId, ErrorKind, ErrorReply, LeasePolicy, RecordRead, RecordView, ReservationId,
    StoreTime, TailState, Written, wire::WAIT_MS_MAX,
};

use crate::request::change::{Change, expire};
use crate::request::update::Update;
use crate::step::effect::{StoreOp, Stored, unasked};
use crate::step::event::NodeEvent;
use crate::step::failure::Failure;
use crate::step::queue::{Handoff, QueueOp, Queued, Ticket};
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::Mutations;

/// The answer to a waiter that need not wait: the record has no live holder
/// (`Vacated`) or is no longer the tail (`Moved`); `None` while held.
pub fn settled(read: &RecordRead, now: StoreTime, policy: &LeasePolicy) -> Option<AwaitReply> {
    match read.record.view(now, policy, read.session()) {
        RecordView::Link(_) | RecordView::Abandoned => Some(AwaitReply::Moved),
        RecordView::Tail(tail) => match tail.state {
            TailState::Vacant { ended } => Some(AwaitReply::Vacated { ended }),
            TailState::Active { .. } => None,
        },
    }
}

#[derive(Debug)]
enum Phase {
    /// Read the record first.
    FirstRead,
    /// Join the queue (or not, if `settled` and nobody waits).
    Joining {
        settled: Option<AwaitReply>,
    },
    /// Read the record again.
    Reread,
    /// Let the record just read wake whom it lets go.
    Notifying,
    /// Expire the lapsed holder.
    Expiring(Box<Update>),
    Parked {
        until: NodeTime,
    },
    /// Woken without a reply from the park that ran `until`: look at the
    /// queue's hand-off.
    Looking {
        until: NodeTime,
    },
    Done(Result<AwaitReply, Failure>),
    Over,
}

/// One waiter in progress.
#[derive(Debug)]
pub struct AwaitVacant {
    id: ReservationId,
    deadline: NodeTime,
    ticket: Option<Ticket>,
    /// The record as last read.
    record: Option<RecordRead>,
    /// The queue's hand-off version when last looked at.
    seen_version: u64,
    policy: LeasePolicy,
    mutations: Mutations,
    phase: Phase,
    /// Noted: a lapsed holder this waiter expired.
    expired: bool,
}

fn refused(kind: ErrorKind, message: impl Into<String>) -> Result<AwaitReply, Failure> {
    Err(Failure::Refused(ErrorReply::new(kind, message)))
}

fn unknown(id: &ReservationId, dc: &DcId) -> Result<AwaitReply, Failure> {
    refused(
        ErrorKind::UnknownReservation,
        format!("no reservation {id} in dc {dc}"),
    )
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
            Phase::Done(refused(
                ErrorKind::BadRequest,
                format!("reservation {id} is owned by dc {}, ask it", id.dc()),
            ))
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
            expired: false,
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

    /// The record as last read, with its session's row, if one was.
    pub fn last_read(&self) -> Option<&RecordRead> {
        self.record.as_ref()
    }

    fn read(&self) -> Step<Result<AwaitReply, Failure>> {
        Step::Ask(Effect::Store(StoreOp::Read(self.id.clone())))
    }

    /// Woken without a reply at `now`, from the park that ran until
    /// `until`, with the queue's hand-off as it is now.
    fn looked(&mut self, until: NodeTime, handoff: Handoff, now: Now) -> Phase {
        let wake = self.wake_at(now, handoff.until);
        if until <= now.node || wake <= now.node {
            if now.node >= self.deadline {
                return Phase::Done(Ok(AwaitReply::TimedOut));
            }
            let lapsed = self
                .record
                .as_ref()
                .is_some_and(|r| expire(r, now.store, &self.policy, self.mutations).is_some());
            return if lapsed {
                let (dc, id) = (self.id.dc().clone(), self.id.clone());
                let update = Update::new(dc, id, Change::Expire, self.policy, self.mutations);
                Phase::Expiring(Box::new(update))
            } else {
                Phase::Reread
            };
        }
        let version = handoff.version.unwrap_or(self.seen_version);
        if version != self.seen_version {
            self.seen_version = version;
            return Phase::Reread;
        }
        Phase::Parked { until: wake }
    }

    /// The earliest of: the holder's lease turning reapable (the reaper may
    /// be slower), the hand-off window's end (`handoff_until`), the
    /// deadline.
    fn wake_at(&self, now: Now, handoff_until: Option<NodeTime>) -> NodeTime {
        let held = (self.record.as_ref()).and_then(|r| r.record.held_until(r.session()));
        let lapse = held.map(|held| {
            let at = self.policy.reapable_at(held);
            now.node.plus_ms(at.ms_since(now.store) + 1)
        });
        [lapse, handoff_until, Some(self.deadline)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.deadline)
    }
}

impl Stepper for AwaitVacant {
    /// The waiter's answer, or why there is none (a refusal, a full queue,
    /// a store that failed).
    type Output = Result<AwaitReply, Failure>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            phase @ (Phase::FirstRead | Phase::Reread) => {
                self.phase = phase;
                self.read()
            }
            Phase::Joining { settled } => {
                let reservation = self.id.clone();
                self.phase = Phase::Joining {
                    settled: settled.clone(),
                };
                Step::Ask(Effect::Queue(QueueOp::Join {
                    reservation,
                    settled,
                }))
            }
            Phase::Notifying => {
                // Invariant: a record was read before notifying.
                let record = self.record.clone().expect("a record read");
                self.phase = Phase::Notifying;
                Step::Ask(Effect::Queue(QueueOp::Notify(Box::new(record))))
            }
            Phase::Expiring(mut update) => match update.next() {
                Step::Ask(effect) => {
                    self.phase = Phase::Expiring(update);
                    Step::Ask(effect)
                }
                Step::Done(Ok(_)) => {
                    self.phase = Phase::Reread;
                    self.read()
                }
                Step::Done(Err(e)) => Step::Done(Err(Failure::from_reply(e.reply()))),
            },
            Phase::Parked { until } => {
                self.phase = Phase::Parked { until };
                Step::Ask(Effect::Park { until })
            }
            Phase::Looking { until } => {
                self.phase = Phase::Looking { until };
                Step::Ask(Effect::Queue(QueueOp::Handoff(self.id.clone())))
            }
            Phase::Done(result) => Step::Done(result),
            Phase::Over => panic!("waiter for {} stepped after it ended", self.id),
        }
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        let phase = std::mem::replace(&mut self.phase, Phase::Over);
        self.phase = match (phase, answer) {
            (Phase::Expiring(mut update), answer @ Answer::Stored(_)) => {
                if answer == Answer::Stored(Ok(Stored::Written(Written::Yes))) {
                    self.expired = true;
                }
                update.answer(answer, now);
                Phase::Expiring(update)
            }
            (Phase::FirstRead | Phase::Reread, Answer::Stored(Err(failure))) => {
                Phase::Done(Err(failure))
            }
            (Phase::FirstRead | Phase::Reread, Answer::Stored(Ok(Stored::Record(None)))) => {
                Phase::Done(unknown(&self.id, self.id.dc()))
            }
            (Phase::FirstRead, Answer::Stored(Ok(Stored::Record(Some(record))))) => {
                let settled = settled(&record, now.store, &self.policy);
                self.record = Some(record);
                Phase::Joining { settled }
            }
            (Phase::Reread, Answer::Stored(Ok(Stored::Record(Some(record))))) => {
                self.record = Some(record);
                Phase::Notifying
            }
            (Phase::Joining { .. }, Answer::Queued(queued)) => match queued {
                Queued::Settled(reply) => Phase::Done(Ok(reply)),
                Queued::Joined(ticket, handoff) => {
                    self.ticket = Some(ticket);
                    self.seen_version = handoff.version.unwrap_or(self.seen_version);
                    Phase::Reread
                }
                Queued::Full(full) => Phase::Done(refused(ErrorKind::Overloaded, full.to_string())),
                other => unasked("waiter's join", &other),
            },
            (Phase::Notifying, Answer::Queued(Queued::Handoff(handoff))) => Phase::Parked {
                until: self.wake_at(now, handoff.until),
            },
            (Phase::Parked { .. }, Answer::Woken(Some(reply))) => {
                // Woken by a write: it left the queue then.
                self.ticket = None;
                Phase::Done(Ok(reply))
            }
            (Phase::Parked { until }, Answer::Woken(None)) => Phase::Looking { until },
            (Phase::Parked { .. }, Answer::Closed) => Phase::Done(Ok(AwaitReply::TimedOut)),
            (Phase::Looking { until }, Answer::Queued(Queued::Handoff(handoff))) => {
                self.looked(until, handoff, now)
            }
            (phase, answer) => panic!(
                "waiter for {}: an answer it did not ask for in {phase:?}: {answer:?}",
                self.id
            ),
        };
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        std::mem::take(&mut self.expired).then(|| NodeEvent::HolderExpired(self.id.clone()))
    }
}

#[cfg(test)]
mod tests {
    //! One DC in memory: its records, its waiter registry and several
    //! waiters, driven like homingd drives them; time jumps to the next
    //! timeout. Store and node clocks read the same here (ms and µs).

    use std::collections::BTreeMap;

    use homing_core::{DcRecord, FencingToken, ReleaseCause, RunOutcome, Written};

    use super::*;
    use crate::dc::waiters::{Notified, WaitLimits, Waiters};

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
        answers: BTreeMap<usize, Result<AwaitReply, Failure>>,
        /// What the waiters noted.
        events: Vec<NodeEvent>,
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
                events: Vec::new(),
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
                StoreOp::Read(id) => Stored::Record(
                    self.records
                        .get(&id)
                        .cloned()
                        .map(homing_core::RecordRead::alone),
                ),
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

        /// Runs waiter `w` until it parks or ends; store and registry
        /// operations are instant. A park right after a store operation
        /// looks at once (as a driver's `select!` finds a reply or a rouse
        /// already there); a park after that waits.
        fn drive(&mut self, w: usize, mut selected: bool) {
            loop {
                let (store_now, node) = self.clocks();
                let now = Now {
                    node,
                    store: store_now,
                };
                let step = self.waits[w].step(node);
                self.events
                    .extend(std::iter::from_fn(|| self.waits[w].poll_event()));
                let answer = match step {
                    Step::Ask(Effect::Store(op)) => {
                        selected = false;
                        Answer::Stored(Ok(self.perform(op)))
                    }
                    Step::Ask(Effect::Queue(op)) => {
                        let (queued, notified) =
                            self.waiters
                                .queue(op, store_now, node, &POLICY, || w, |_| true);
                        let id = self.waits[w].id().clone();
                        self.deliver(&id, notified);
                        Answer::Queued(queued)
                    }
                    Step::Ask(Effect::Park { .. }) if !selected => {
                        selected = true;
                        Answer::Woken(self.woken.remove(&w))
                    }
                    Step::Ask(Effect::Park { until }) => {
                        self.parked.insert(w, until);
                        return;
                    }
                    Step::Ask(other) => panic!("a waiter asked {other:?}"),
                    Step::Done(answer) => {
                        self.answers.insert(w, answer);
                        return;
                    }
                };
                self.waits[w].answer(answer, now);
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
        assert_eq!(dc.events, [NodeEvent::HolderExpired(id.clone())]);
        assert!(matches!(
            dc.records[&id].state,
            homing_core::RecordState::Released { .. }
        ));
        let reapable = POLICY.reapable_at(StoreTime::from_ms(1_000 + 10_000));
        assert!(
            dc.now_us / 1000 >= reapable.as_ms(),
            "not before its lease lapsed"
        );
    }

    #[test]
    fn await_a_newcomer_to_a_vacant_reservation_queues_behind_those_waiting() {
        let mut dc = Dc::new(WaitLimits {
            per_key: 3,
            ..limits()
        });
        let id = dc.hold(1);
        let first = dc.start(&id, 60_000);
        let second = dc.start(&id, 60_000);
        dc.release(&id);
        assert!(matches!(dc.answers[&first], Ok(AwaitReply::Vacated { .. })));
        // Vacant, and the first has the hand-off window: the newcomer does
        // not jump the queue (nor past the second, still waiting).
        let newcomer = dc.start(&id, 60_000);
        assert!(!dc.answers.contains_key(&newcomer), "{:?}", dc.answers);
        assert_eq!(dc.waiters.len(), 2);
        dc.next_timeout();
        assert!(matches!(
            dc.answers[&second],
            Ok(AwaitReply::Vacated { .. })
        ));
        assert!(!dc.answers.contains_key(&newcomer), "second's turn first");
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
            dc.answers[&c].clone().unwrap_err().into_reply().kind,
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
                None,
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
            dc.answers[&other].clone().unwrap_err().into_reply().kind,
            ErrorKind::BadRequest
        );
        let unknown = dc.start(&"iad.9".parse().unwrap(), 1_000);
        assert_eq!(
            dc.answers[&unknown].clone().unwrap_err().into_reply().kind,
            ErrorKind::UnknownReservation
        );
    }
}
