//! Before a DC's record links onward (DESIGN.md §7.5): if it continues
//! another DC's reservation, the global store must name it as that one's
//! successor. A record that lost its confirmation to a takeover (its mover
//! crashed between the link and the confirmation) never acts as a member
//! of the chain: it records its own succession to the winner, links
//! locally to it, and the link asked for is answered `AlreadyLinked` with
//! the winner. Decided here once for homingd and the simulator.

use homing_core::succession::{confirmation_of, superseding};
use homing_core::{DcRecord, ReservationId, Succession};

use crate::Change;
use crate::effect::{StoreOp, Stored, unasked};

/// What a [`Supersede`] needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupersedePoll {
    /// Read the record (answer with [`Supersede::handle_stored`]).
    Store(StoreOp),
    /// Make this succession its reservation's in the global store unless
    /// one is (write-once; a cached answer will do: it never changes);
    /// answer with the one the store has ([`Supersede::handle_confirmed`]).
    Confirm(Succession),
    /// Make this change to the record (an [`crate::Update`]); answer with
    /// [`Supersede::handle_changed`].
    Change(Change),
    /// Done: `None`, the link may go on; `Some(winner)`, the record now
    /// continues as `winner` (answer the link `AlreadyLinked(winner)`).
    Done(Option<ReservationId>),
}

/// The check a link of this DC's record makes first, as a stepper.
#[derive(Debug)]
pub struct Supersede {
    id: ReservationId,
    record: Option<DcRecord>,
    /// The record's own succession to the winner, once asked.
    own: Option<Succession>,
    poll: SupersedePoll,
}

impl Supersede {
    /// The check of this DC's record `id`.
    pub fn new(id: ReservationId) -> Supersede {
        Supersede {
            poll: SupersedePoll::Store(StoreOp::Read(id.clone())),
            id,
            record: None,
            own: None,
        }
    }

    /// What to do next.
    pub fn poll(&self) -> &SupersedePoll {
        &self.poll
    }

    /// The answer to the [`StoreOp`] asked.
    pub fn handle_stored(&mut self, stored: Stored) {
        match stored {
            Stored::Record(record) => self.handle_record(record),
            other => unasked("supersede", &other),
        }
    }

    /// The record was read (`None`: there is none; the link's own update
    /// answers that).
    fn handle_record(&mut self, record: Option<DcRecord>) {
        self.poll = match record.as_ref().and_then(confirmation_of) {
            Some(ours) => SupersedePoll::Confirm(ours),
            None => SupersedePoll::Done(None),
        };
        self.record = record;
    }

    /// The global store has `recorded` for the succession asked.
    pub fn handle_confirmed(&mut self, recorded: Succession) {
        let record = self
            .record
            .as_ref()
            .expect("a confirmation follows a record");
        self.poll = match &self.own {
            // Ours is confirmed: the link goes on.
            None if recorded.names(&self.id) => SupersedePoll::Done(None),
            // Lost: record our own succession to the winner first.
            None => {
                let own = superseding(record, &recorded.link.to);
                self.own = Some(own.clone());
                SupersedePoll::Confirm(own)
            }
            // Ours to the winner (or the one already there): link to it.
            Some(_) => {
                self.own = Some(recorded.clone());
                SupersedePoll::Change(Change::Supersede(recorded))
            }
        };
    }

    /// The record was superseded (or needed no change).
    pub fn handle_changed(&mut self) {
        let own = self
            .own
            .as_ref()
            .expect("a change follows the own succession");
        self.poll = SupersedePoll::Done(Some(own.link.to.clone()));
    }
}

#[cfg(test)]
mod tests {
    use homing_core::StoreTime;

    use super::*;
    use crate::fixture::held;

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    #[test]
    fn a_record_of_the_keys_first_reservation_or_none_links_on() {
        for record in [None, Some(held("iad.1", "a", None, StoreTime::from_ms(0)))] {
            let mut check = Supersede::new(id("iad.1"));
            assert_eq!(
                check.poll(),
                &SupersedePoll::Store(StoreOp::Read(id("iad.1")))
            );
            check.handle_record(record);
            assert_eq!(check.poll(), &SupersedePoll::Done(None));
        }
    }

    #[test]
    fn a_confirmed_move_links_on() {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let ours = confirmation_of(&record).unwrap();
        let mut check = Supersede::new(id("iad.2"));
        check.handle_record(Some(record));
        assert_eq!(check.poll(), &SupersedePoll::Confirm(ours.clone()));
        check.handle_confirmed(ours);
        assert_eq!(check.poll(), &SupersedePoll::Done(None));
    }

    #[test]
    fn a_move_that_lost_to_a_takeover_records_its_own_succession_and_links_to_the_winner() {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let winner = Succession::taken_over(id("fra.1"), id("lhr.3"), 1);
        let mut check = Supersede::new(id("iad.2"));
        check.handle_record(Some(record.clone()));
        check.handle_confirmed(winner);
        let own = superseding(&record, &id("lhr.3"));
        assert_eq!(check.poll(), &SupersedePoll::Confirm(own.clone()));
        check.handle_confirmed(own.clone());
        assert_eq!(check.poll(), &SupersedePoll::Change(Change::Supersede(own)));
        check.handle_changed();
        assert_eq!(check.poll(), &SupersedePoll::Done(Some(id("lhr.3"))));
    }

    #[test]
    fn the_succession_the_store_already_has_is_the_one_linked_to() {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let winner = Succession::taken_over(id("fra.1"), id("lhr.3"), 1);
        let mut check = Supersede::new(id("iad.2"));
        check.handle_record(Some(record));
        check.handle_confirmed(winner);
        // The store already says who continues iad.2 (another takeover).
        let already = Succession::taken_over(id("iad.2"), id("sin.4"), 1);
        check.handle_confirmed(already.clone());
        assert_eq!(
            check.poll(),
            &SupersedePoll::Change(Change::Supersede(already))
        );
        check.handle_changed();
        assert_eq!(check.poll(), &SupersedePoll::Done(Some(id("sin.4"))));
    }
}
