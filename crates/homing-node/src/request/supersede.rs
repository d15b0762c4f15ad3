//! Before a DC's record links onward (DESIGN.md §7.5): if it continues
//! another DC's reservation, the global store must name it as that one's
//! successor. A record that lost its confirmation to a takeover (its mover
//! crashed between the link and the confirmation) never acts as a member
//! of the chain: it records its own succession to the winner, links
//! locally to it, and the link asked for is answered `AlreadyLinked` with
//! the winner. Decided here once for homingd and the simulator.

use homing_core::succession::{confirmation_of, superseding};
use homing_core::{DcId, DcRecord, ErrorReply, LeasePolicy, ReservationId, StoreTime, Succession};

use crate::Change;
use crate::request::update::Update;
use crate::step::effect::{GlobalAnswer, GlobalOp, StoreOp, Stored, unasked};
use crate::step::{Effect, Step};
use homing_core::mutation::Mutations;

#[derive(Debug)]
enum Phase {
    Read,
    Confirm(Succession),
    Supersede(Box<Update>),
    Done(Result<Option<ReservationId>, ErrorReply>),
}

/// The check a link of this DC's record makes first, as a stepper.
#[derive(Debug)]
pub struct Supersede {
    dc: DcId,
    id: ReservationId,
    policy: LeasePolicy,
    mutations: Mutations,
    record: Option<DcRecord>,
    /// The record's own succession to the winner, once asked.
    own: Option<Succession>,
    /// Whether superseding changed the record.
    superseded: bool,
    phase: Phase,
}

impl Supersede {
    /// The check of DC `dc`'s record `id`, under the DC's lease `policy`.
    pub fn new(
        dc: DcId,
        id: ReservationId,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> Supersede {
        Supersede {
            dc,
            id,
            policy,
            mutations,
            record: None,
            own: None,
            superseded: false,
            phase: Phase::Read,
        }
    }

    /// What to do next: read the record — or, superseding it, read and
    /// compare-and-set it (an [`Update`] with [`Change::Supersede`]); make
    /// a succession its reservation's in the global store unless one is
    /// (always a [`GlobalOp::Confirm`]; write-once, so a cached answer will
    /// do); or done: `None`, the link may go on; `Some(winner)`, the record
    /// now continues as `winner` (answer the link `AlreadyLinked(winner)`);
    /// or why the record could not be superseded (the link fails with it).
    pub(crate) fn next(&mut self) -> Step<Result<Option<ReservationId>, ErrorReply>> {
        match &mut self.phase {
            Phase::Read => Step::Ask(Effect::Store(StoreOp::Read(self.id.clone()))),
            Phase::Confirm(succession) => {
                Step::Ask(Effect::Global(GlobalOp::Confirm(succession.clone())))
            }
            Phase::Supersede(update) => match update.next() {
                Step::Ask(effect) => Step::Ask(effect),
                Step::Done(Ok(changed)) => {
                    self.superseded = changed.made();
                    let own = self
                        .own
                        .as_ref()
                        .expect("a change follows the own succession");
                    self.phase = Phase::Done(Ok(Some(own.link.to.clone())));
                    self.next()
                }
                Step::Done(Err(e)) => {
                    self.phase = Phase::Done(Err(e.reply()));
                    self.next()
                }
            },
            Phase::Done(done) => Step::Done(done.clone()),
        }
    }

    /// Whether the record was superseded (linked to the winner) by this check.
    pub fn superseded(&self) -> bool {
        self.superseded
    }

    /// The answer to the [`StoreOp`] asked at `now` (store clock).
    pub fn handle_stored(&mut self, stored: Stored, now: StoreTime) {
        match (&mut self.phase, stored) {
            (Phase::Read, Stored::Record(read)) => self.handle_record(read.map(|r| r.record)),
            (Phase::Supersede(update), stored) => update.handle_stored(stored, now),
            (_, other) => unasked("supersede", &other),
        }
    }

    /// The record was read (`None`: there is none; the link's own update
    /// answers that).
    fn handle_record(&mut self, record: Option<DcRecord>) {
        self.phase = match record.as_ref().and_then(confirmation_of) {
            Some(ours) => Phase::Confirm(ours),
            None => Phase::Done(Ok(None)),
        };
        self.record = record;
    }

    /// The answer to the [`Effect::Global`] asked.
    pub fn handle_global(&mut self, answer: GlobalAnswer) {
        match answer {
            GlobalAnswer::Confirmed(recorded) => self.handle_confirmed(recorded),
            other => unasked("supersede", &other),
        }
    }

    /// The global store has `recorded` for the succession asked.
    fn handle_confirmed(&mut self, recorded: Succession) {
        assert!(
            matches!(self.phase, Phase::Confirm(_)),
            "supersede: a confirmation it did not ask for"
        );
        let record = self
            .record
            .as_ref()
            .expect("a confirmation follows a record");
        self.phase = match &self.own {
            // Ours is confirmed: the link goes on.
            None if recorded.names(&self.id) => Phase::Done(Ok(None)),
            // Lost: record our own succession to the winner first.
            None => {
                let own = superseding(record, &recorded.link.to);
                self.own = Some(own.clone());
                Phase::Confirm(own)
            }
            // Ours to the winner (or the one already there): link to it.
            Some(_) => {
                self.own = Some(recorded.clone());
                let change = Change::Supersede(recorded);
                let (dc, id) = (self.dc.clone(), self.id.clone());
                let update = Update::new(dc, id, change, self.policy, self.mutations);
                Phase::Supersede(Box::new(update))
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use homing_core::StoreTime;

    use super::*;
    use crate::fixture::held;

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn supersede(of: &str) -> Supersede {
        Supersede::new("iad".parse().unwrap(), id(of), POLICY, Mutations::NONE)
    }

    /// Drives the supersede's update of `record` to its end: a read, then a
    /// write that links the record to `winner`; the record written.
    fn relinked(check: &mut Supersede, record: DcRecord, winner: &str) -> DcRecord {
        let now = StoreTime::from_ms(1);
        assert_eq!(
            check.next(),
            Step::Ask(Effect::Store(StoreOp::Read(record.id.clone())))
        );
        check.handle_stored(
            Stored::Record(Some(homing_core::RecordRead::alone(record))),
            now,
        );
        let Step::Ask(Effect::Store(StoreOp::Write {
            record: written, ..
        })) = check.next()
        else {
            panic!("superseding writes the record")
        };
        check.handle_stored(Stored::Written(homing_core::Written::Yes), now);
        assert_eq!(check.next(), Step::Done(Ok(Some(id(winner)))));
        *written
    }

    #[test]
    fn a_record_of_the_keys_first_reservation_or_none_links_on() {
        for record in [None, Some(held("iad.1", "a", None, StoreTime::from_ms(0)))] {
            let mut check = supersede("iad.1");
            assert_eq!(
                check.next(),
                Step::Ask(Effect::Store(StoreOp::Read(id("iad.1"))))
            );
            check.handle_record(record);
            assert_eq!(check.next(), Step::Done(Ok(None)));
        }
    }

    #[test]
    fn a_confirmed_move_links_on() {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let ours = confirmation_of(&record).unwrap();
        let mut check = supersede("iad.2");
        check.handle_record(Some(record));
        assert_eq!(
            check.next(),
            Step::Ask(Effect::Global(GlobalOp::Confirm(ours.clone())))
        );
        check.handle_confirmed(ours);
        assert_eq!(check.next(), Step::Done(Ok(None)));
        assert!(!check.superseded());
    }

    /// iad.2, a move from fra.1, whose confirmation lost to lhr.3's
    /// takeover: the check, the record, and the record's own succession to
    /// lhr.3 (asked next).
    fn lost() -> (Supersede, DcRecord, Succession) {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let winner = Succession::taken_over(id("fra.1"), id("lhr.3"), 1);
        let mut check = supersede("iad.2");
        check.handle_record(Some(record.clone()));
        check.handle_confirmed(winner);
        let own = superseding(&record, &id("lhr.3"));
        (check, record, own)
    }

    #[test]
    fn a_move_that_lost_to_a_takeover_records_its_own_succession_and_links_to_the_winner() {
        let (mut check, record, own) = lost();
        assert_eq!(
            check.next(),
            Step::Ask(Effect::Global(GlobalOp::Confirm(own.clone())))
        );
        check.handle_global(GlobalAnswer::Confirmed(own.clone()));
        let linked = relinked(&mut check, record, "lhr.3");
        assert!(
            matches!(&linked.state, homing_core::RecordState::Linked { to, .. } if to == &id("lhr.3")),
            "{linked:?}"
        );
        assert!(check.superseded());
    }

    #[test]
    fn the_succession_the_store_already_has_is_the_one_linked_to() {
        let (mut check, record, _) = lost();
        // The store already says who continues iad.2 (another takeover).
        let already = Succession::taken_over(id("iad.2"), id("sin.4"), 1);
        check.handle_confirmed(already);
        let linked = relinked(&mut check, record, "sin.4");
        assert!(
            matches!(&linked.state, homing_core::RecordState::Linked { to, .. } if to == &id("sin.4")),
            "{linked:?}"
        );
    }

    #[test]
    fn a_failed_supersede_fails_the_check() {
        let (mut check, _, own) = lost();
        check.handle_confirmed(own);
        // The record is gone by the time it is superseded.
        assert_eq!(
            check.next(),
            Step::Ask(Effect::Store(StoreOp::Read(id("iad.2"))))
        );
        check.handle_stored(Stored::Record(None), StoreTime::from_ms(1));
        let Step::Done(Err(e)) = check.next() else {
            panic!("the check fails with the update")
        };
        assert_eq!(e.kind, homing_core::ErrorKind::UnknownReservation);
        assert!(!check.superseded());
    }
}
