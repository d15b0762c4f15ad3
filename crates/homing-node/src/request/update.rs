//! Update: one [`Change`] to one of this DC's records — read it, apply the
//! change's transition, compare-and-set on the version read — as a sans-IO
//! stepper. Renew, release, link, drain, the reaper, the sweeper and
//! waiters all change records this way.
//!
//! ```text
//! owner check ─► Read ─ absent ─► Failed(Unknown)
//!                  └ present ─► transition ─ no change ─► Done(reply)
//!                                   └ change ─► Write ─ landed ─► Done(reply)
//!                                                 └ conflict ─► Read again (≤ CAS_ATTEMPTS_MAX in all)
//! ```
//!
//! Drivers run it as a [`Stepper`]: perform the [`StoreOp`] it asks, hand
//! the answer back; steppers that make a change through an update step it
//! themselves and pass its effects on.
//! A landed write must also reach the DC's waiters
//! ([`crate::Waiters::written`]).

use homing_core::{
    DcId, DcRecord, ErrorKind, ErrorReply, LeasePolicy, RecordRead, ReservationId, SessionGuard,
    StoreTime, Written,
};
use thiserror::Error;

use crate::request::change::{Change, Changed};
use crate::step::effect::{StoreOp, Stored, unasked};
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::Mutations;

/// Most compare-and-set attempts on one record before answering `Overloaded`.
pub const CAS_ATTEMPTS_MAX: u32 = 16;

/// Why an update failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UpdateError {
    /// A node only changes its own DC's records.
    #[error("reservation {id} is owned by dc {}, not {dc}", id.dc())]
    NotOwned {
        /// The reservation.
        id: ReservationId,
        /// The DC that was asked.
        dc: DcId,
    },
    /// No such record in this DC.
    #[error("no reservation {id} in dc {dc}")]
    Unknown {
        /// The reservation.
        id: ReservationId,
        /// This DC.
        dc: DcId,
    },
    /// Every compare-and-set lost to a concurrent write.
    #[error("reservation {id} contended for {attempts} attempts")]
    Contended {
        /// The reservation.
        id: ReservationId,
        /// Attempts made.
        attempts: u32,
    },
    /// The store failed a read or a write (its reply, as the driver
    /// classified the failure).
    #[error("{0}")]
    Store(ErrorReply),
}

impl UpdateError {
    /// The error reply a caller gets.
    pub fn reply(&self) -> ErrorReply {
        let kind = match self {
            UpdateError::Store(reply) => return reply.clone(),
            UpdateError::NotOwned { .. } => ErrorKind::BadRequest,
            UpdateError::Unknown { .. } => ErrorKind::UnknownReservation,
            UpdateError::Contended { .. } => ErrorKind::Overloaded,
        };
        ErrorReply::new(kind, self.to_string())
    }
}

#[derive(Debug)]
enum Phase {
    Read,
    Write {
        expected: u64,
        /// Boxed: a record is several times larger than the other phases.
        record: Box<DcRecord>,
        event: bool,
        guard: Option<Box<SessionGuard>>,
        reply: Changed,
    },
    Done(Changed),
    Failed(UpdateError),
    /// The outcome was handed out.
    Over,
}

/// One record update in progress.
#[derive(Debug)]
pub struct Update {
    dc: DcId,
    id: ReservationId,
    change: Change,
    policy: LeasePolicy,
    mutations: Mutations,
    attempts: u32,
    phase: Phase,
}

impl Update {
    /// `change` of reservation `id` at DC `dc` under the DC's lease
    /// `policy`; fails at once if `id` is another DC's.
    pub fn new(
        dc: DcId,
        id: ReservationId,
        change: Change,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> Update {
        let phase = if id.dc() == &dc {
            Phase::Read
        } else {
            Phase::Failed(UpdateError::NotOwned {
                id: id.clone(),
                dc: dc.clone(),
            })
        };
        Update {
            dc,
            id,
            change,
            policy,
            mutations,
            attempts: 0,
            phase,
        }
    }

    /// The reservation being updated.
    pub fn id(&self) -> &ReservationId {
        &self.id
    }

    /// What to do next: read the record, or compare-and-set it over the
    /// version read; or done, with what the change's caller learns, or
    /// failed. The outcome is handed out once; stepping again after it is
    /// a driver bug (it panics). The steppers that make a change through
    /// an update step it with this.
    pub(crate) fn next(&mut self) -> Step<Result<Changed, UpdateError>> {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Read => {
                self.phase = Phase::Read;
                Step::Ask(Effect::Store(StoreOp::Read(self.id.clone())))
            }
            Phase::Write {
                expected,
                record,
                event,
                guard,
                reply,
            } => {
                let step = Step::Ask(Effect::Store(StoreOp::Write {
                    expected: Some(expected),
                    record: record.clone(),
                    event,
                    guard: guard.clone(),
                }));
                self.phase = Phase::Write {
                    expected,
                    record,
                    event,
                    guard,
                    reply,
                };
                step
            }
            Phase::Done(reply) => Step::Done(Ok(reply)),
            Phase::Failed(e) => Step::Done(Err(e)),
            Phase::Over => panic!("update of {} polled after it ended", self.id),
        }
    }

    /// The answer to the [`StoreOp`] asked, at `now` (store clock).
    pub fn handle_stored(&mut self, stored: Stored, now: StoreTime) {
        match stored {
            Stored::Record(record) => self.handle_record(record, now),
            Stored::Written(written) => self.handle_written(written),
            other => unasked("update", &other),
        }
    }

    /// The store failed the operation asked: the update fails with it.
    pub fn handle_failure(&mut self, failure: Failure) {
        self.phase = Phase::Failed(UpdateError::Store(failure.into_reply()));
    }

    /// The record as read at `now` (store clock): applies the change.
    fn handle_record(&mut self, read: Option<RecordRead>, now: StoreTime) {
        assert!(
            matches!(self.phase, Phase::Read),
            "update of {}: a record it did not ask for",
            self.id
        );
        let Some(read) = read else {
            self.phase = Phase::Failed(UpdateError::Unknown {
                id: self.id.clone(),
                dc: self.dc.clone(),
            });
            return;
        };
        let out = self.change.apply(&read, now, &self.policy, self.mutations);
        let record = &read.record;
        self.phase = match out.next {
            None => Phase::Done(out.reply),
            Some(next) => {
                assert_eq!(next.id, self.id, "a transition keeps the record's id");
                Phase::Write {
                    expected: record.version,
                    event: homing_core::event::derive(Some(record), &next).is_some(),
                    guard: guard_of(&read, &next).map(Box::new),
                    record: Box::new(next),
                    reply: out.reply,
                }
            }
        };
    }

    /// The outcome of the compare-and-set asked for.
    fn handle_written(&mut self, written: Written) {
        let Phase::Write { reply, .. } = std::mem::replace(&mut self.phase, Phase::Over) else {
            panic!("update of {}: a write it did not ask for", self.id);
        };
        self.attempts += 1;
        self.phase = match written {
            Written::Yes => Phase::Done(reply),
            Written::Conflict if self.attempts >= CAS_ATTEMPTS_MAX => {
                Phase::Failed(UpdateError::Contended {
                    id: self.id.clone(),
                    attempts: self.attempts,
                })
            }
            Written::Conflict => Phase::Read,
        };
    }
}

/// The session row a write of `next` over the record `read` depends on: a
/// freeze numbers its notice in the row (written with it); a key joining a
/// session checks the row's version. `None` for every other write.
fn guard_of(read: &RecordRead, next: &DcRecord) -> Option<SessionGuard> {
    let id = homing_core::record::needs_guard(Some(&read.record), next)?;
    let row = read.session().filter(|row| row.id == id)?;
    let frozen = matches!(
        &next.state,
        homing_core::RecordState::Active {
            expiry: homing_core::Expiry::Frozen { .. },
            ..
        }
    );
    Some(SessionGuard {
        id,
        version: row.version,
        next: frozen.then(|| row.noticed().0),
    })
}

impl Stepper for Update {
    type Output = Result<Changed, ErrorReply>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        self.next().map(|done| done.map_err(|e| e.reply()))
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Stored(Ok(stored)) => self.handle_stored(stored, now.store),
            Answer::Stored(Err(failure)) => self.handle_failure(failure),
            other => unasked("update", &other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{FencingToken, ReleaseReply, RunOutcome};

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn held() -> DcRecord {
        crate::fixture::held("iad.1", "k", None, StoreTime::from_ms(0))
    }

    fn release() -> Change {
        Change::Release {
            token: FencingToken::FIRST,
            lease: homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
            outcome: RunOutcome::Ok,
        }
    }

    fn update(id: ReservationId) -> Update {
        Update::new(iad(), id, release(), POLICY, Mutations::NONE)
    }

    fn iad() -> DcId {
        "iad".parse().unwrap()
    }

    #[test]
    fn update_another_dcs_reservation_is_refused_without_io() {
        let fra = "fra".parse().unwrap();
        let mut u = Update::new(
            fra,
            "iad.1".parse().unwrap(),
            release(),
            POLICY,
            Mutations::NONE,
        );
        let Step::Done(Err(e)) = u.next() else {
            panic!("expected a refusal")
        };
        assert_eq!(e.reply().kind, ErrorKind::BadRequest);
    }

    #[test]
    fn update_reads_transitions_and_writes_over_the_version_read() {
        let record = held();
        let mut u = update(record.id.clone());
        assert!(matches!(u.next(), Step::Ask(Effect::Store(StoreOp::Read(id))) if id == record.id));
        u.handle_record(
            Some(homing_core::RecordRead::alone(record.clone())),
            StoreTime::from_ms(1),
        );
        let Step::Ask(Effect::Store(StoreOp::Write {
            guard: _,
            expected,
            record: next,
            event,
        })) = u.next()
        else {
            panic!("expected a write")
        };
        assert_eq!(expected, Some(record.version));
        assert!(event, "a release is a lifecycle event");
        assert!(next.version > record.version);
        u.handle_written(Written::Yes);
        assert!(matches!(
            u.next(),
            Step::Done(Ok(Changed::Release(ReleaseReply::Released)))
        ));
    }

    /// A force release of a live session key freezes it as a drain does —
    /// the session's next renewal lists it, so its host is told — and the
    /// freeze is written with the row that numbers the notice. One whose
    /// session ran out is released as any other key. (It used to be refused
    /// `BadRequest`: released outright, its host would never be told.)
    #[test]
    fn a_live_session_key_force_released_is_frozen_one_whose_session_ran_out_is_released() {
        let row = crate::fixture::session();
        let record = crate::fixture::held_in_session(&row, 10);
        let read = homing_core::RecordRead {
            record: record.clone(),
            session: Some(Box::new(row.clone())),
        };
        let force = |read: homing_core::RecordRead, now| {
            let change = Change::ForceRelease {
                token: FencingToken::FIRST,
            };
            let mut u = Update::new(iad(), record.id.clone(), change, POLICY, Mutations::NONE);
            u.next();
            u.handle_record(Some(read), now);
            u.next()
        };
        let Step::Ask(Effect::Store(StoreOp::Write {
            record: frozen,
            guard: Some(guard),
            ..
        })) = force(read.clone(), StoreTime::from_ms(2))
        else {
            panic!("expected a guarded write")
        };
        assert!(matches!(
            &frozen.state,
            homing_core::RecordState::Active {
                expiry: homing_core::Expiry::Frozen { notice: 1, .. },
                ..
            }
        ));
        assert_eq!(guard.next.map(|row| row.notice_seq), Some(1));
        // Long after the session's expiry plus grace: nobody holds it.
        let late = StoreTime::from_ms(10_000_000);
        let Step::Ask(Effect::Store(StoreOp::Write {
            record: released, ..
        })) = force(read, late)
        else {
            panic!("expected a write")
        };
        assert!(matches!(
            released.state,
            homing_core::RecordState::Released { .. }
        ));
    }

    #[test]
    fn update_without_a_change_answers_without_writing() {
        let record = held();
        let released = record
            .release(
                FencingToken::FIRST,
                &homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
                RunOutcome::Ok,
                StoreTime::from_ms(1),
            )
            .next
            .unwrap();
        let mut u = update(record.id.clone());
        u.next();
        // Releasing twice: the same answer, nothing to write.
        u.handle_record(
            Some(homing_core::RecordRead::alone(released)),
            StoreTime::from_ms(2),
        );
        assert!(matches!(u.next(), Step::Done(Ok(_))));
    }

    #[test]
    fn update_of_an_unknown_record_fails_as_unknown() {
        let mut u = update("iad.9".parse().unwrap());
        u.next();
        u.handle_record(None, StoreTime::from_ms(1));
        let Step::Done(Err(e)) = u.next() else {
            panic!("expected a failure")
        };
        assert_eq!(e.reply().kind, ErrorKind::UnknownReservation);
    }

    #[test]
    fn update_rereads_on_conflict_and_gives_up_after_the_bound() {
        let record = held();
        let mut u = update(record.id.clone());
        for attempt in 1..=CAS_ATTEMPTS_MAX {
            assert!(
                matches!(u.next(), Step::Ask(Effect::Store(StoreOp::Read(_)))),
                "attempt {attempt}"
            );
            u.handle_record(
                Some(homing_core::RecordRead::alone(record.clone())),
                StoreTime::from_ms(1),
            );
            assert!(matches!(
                u.next(),
                Step::Ask(Effect::Store(StoreOp::Write { .. }))
            ));
            u.handle_written(Written::Conflict);
        }
        let Step::Done(Err(e)) = u.next() else {
            panic!("expected contention")
        };
        assert_eq!(e.reply().kind, ErrorKind::Overloaded);
    }
}
