//! A peer's link request at the DC of the tail it asks to link onward
//! (DESIGN.md §7.5): the request's own checks ([`Change::link`]), the
//! record's [`Supersede`] check, then the link itself, an [`Update`] with
//! [`Change::Link`] — one stepper, so each driver runs every part as the
//! request's own store and global-store effects (homingd in the request's
//! task; the simulator with each store's latency, where it once ran the
//! check at once). The check's read of the record is the update's first
//! read: a link costs one read and one compare-and-set, as a plain update
//! does (the compare-and-set on the version read catches any write made
//! in between, the confirmation's time included).
//!
//! ```text
//! checks ─ refused ─► Done(Err)
//!   └ Supersede ─ lost to a takeover ─► Done(AlreadyLinked(winner))
//!        ├ failed ─► Done(Err)
//!        └ may link ─► Update(Change::Link) ─► Done(its LinkReply) / Done(Err)
//! ```

use homing_core::{
    DcId, ErrorKind, ErrorReply, FencingToken, Key, LeasePolicy, LinkReply, RecordRead,
    ReservationId, StoreTime,
};

use crate::request::change::{Change, Changed};
use crate::request::supersede::Supersede;
use crate::request::update::Update;
use crate::step::effect::{GlobalAnswer, Stored, unasked};
use crate::step::time::NodeTime;
use crate::step::{Answer, Now, Step, Stepper};
use homing_core::mutation::Mutations;

#[derive(Debug)]
enum Phase {
    Check(Box<Supersede>),
    Link(Box<Update>),
    Done(Result<LinkReply, ErrorReply>),
}

/// One link request in progress at the DC of its tail.
#[derive(Debug)]
pub struct LinkOnward {
    dc: DcId,
    from: ReservationId,
    mutations: Mutations,
    policy: LeasePolicy,
    /// The link's change, until the supersede check lets it be made.
    change: Option<Change>,
    /// The record as the check read it, and when (store clock): the
    /// update's first read.
    read: Option<(Option<RecordRead>, StoreTime)>,
    /// Whether the supersede check linked the record to a takeover's winner.
    superseded: bool,
    phase: Phase,
}

impl LinkOnward {
    /// DC `dc`'s handling of the link `from → to` that DC `caller` asks for
    /// (`None`: a caller without a DC), `expected` being the tail's token as
    /// the caller read it; `policy`, the DC's lease policy.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dc: DcId,
        caller: Option<&DcId>,
        key: Key,
        from: ReservationId,
        to: ReservationId,
        expected: FencingToken,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> LinkOnward {
        let (change, phase) = match Change::link(caller, key, &from, to, expected) {
            Ok(change) => {
                let check = Supersede::new(dc.clone(), from.clone(), policy, mutations);
                (Some(change), Phase::Check(Box::new(check)))
            }
            Err(refused) => (None, Phase::Done(Err(refused))),
        };
        LinkOnward {
            dc,
            from,
            mutations,
            policy,
            change,
            read: None,
            superseded: false,
            phase,
        }
    }

    /// The tail asked to link onward.
    pub fn from(&self) -> &ReservationId {
        &self.from
    }

    /// Whether the record was superseded (linked to a takeover's winner)
    /// before this link could be made.
    pub fn superseded(&self) -> bool {
        self.superseded
    }

    /// What to do next.
    fn next(&mut self) -> Step<<LinkOnward as Stepper>::Output> {
        loop {
            let next = match &mut self.phase {
                Phase::Check(check) => match check.next() {
                    Step::Ask(effect) => return Step::Ask(effect),
                    Step::Done(Ok(None)) => {
                        let change = self.change.take().expect("checked once");
                        let (dc, from) = (self.dc.clone(), self.from.clone());
                        let mut update = Update::new(dc, from, change, self.policy, self.mutations);
                        let (record, at) = self.read.take().expect("the check read the record");
                        update.handle_stored(Stored::Record(record), at);
                        Phase::Link(Box::new(update))
                    }
                    Step::Done(done) => {
                        self.superseded = check.superseded();
                        Phase::Done(done.map(|winner| {
                            LinkReply::AlreadyLinked(winner.expect("a winner: None went on"))
                        }))
                    }
                },
                Phase::Link(update) => match update.next() {
                    Step::Ask(effect) => return Step::Ask(effect),
                    Step::Done(Ok(Changed::Link(reply))) => Phase::Done(Ok(reply)),
                    Step::Done(Ok(other)) => Phase::Done(Err(ErrorReply::new(
                        ErrorKind::Internal,
                        format!("a link's update answered {other:?}"),
                    ))),
                    Step::Done(Err(e)) => Phase::Done(Err(e.reply())),
                },
                Phase::Done(done) => return Step::Done(done.clone()),
            };
            self.phase = next;
        }
    }

    /// The answer to the [`Effect::Store`](crate::Effect::Store) asked at `now` (store clock).
    pub fn handle_stored(&mut self, stored: Stored, now: StoreTime) {
        match &mut self.phase {
            Phase::Check(check) => {
                if let (None, Stored::Record(record)) = (&self.read, &stored) {
                    self.read = Some((record.clone(), now));
                }
                check.handle_stored(stored, now)
            }
            Phase::Link(update) => update.handle_stored(stored, now),
            Phase::Done(_) => unasked("link", &stored),
        }
    }

    /// The answer to the [`Effect::Global`](crate::Effect::Global) asked.
    pub fn handle_global(&mut self, answer: GlobalAnswer) {
        match &mut self.phase {
            Phase::Check(check) => check.handle_global(answer),
            _ => unasked("link", &answer),
        }
    }
}

impl Stepper for LinkOnward {
    type Output = Result<LinkReply, ErrorReply>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        self.next()
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Stored(Ok(stored)) => self.handle_stored(stored, now.store),
            Answer::Global(Ok(global)) => self.handle_global(global),
            // A failed operation ends the link with its reply.
            Answer::Stored(Err(failure)) | Answer::Global(Err(failure)) => {
                self.phase = Phase::Done(Err(failure.into_reply()));
            }
            other => unasked("link", &other),
        }
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{DcRecord, KeyName, RecordState, Succession, Written};

    use super::*;
    use crate::fixture::{POLICY, held};
    use crate::step::Effect;
    use crate::step::effect::{GlobalOp, StoreOp};

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    /// iad's handling of DC `caller`'s link `from → to`.
    fn link(from: &str, to: &str, caller: &str) -> LinkOnward {
        let key = Key::new(KeyName::new("a").unwrap());
        let caller: DcId = caller.parse().unwrap();
        let (from, to, token) = (id(from), id(to), FencingToken::FIRST);
        let dc = "iad".parse().unwrap();
        LinkOnward::new(
            dc,
            Some(&caller),
            key,
            from,
            to,
            token,
            POLICY,
            Mutations::NONE,
        )
    }

    /// Answers the read asked next with `record`, at `now`.
    fn read(link: &mut LinkOnward, record: &DcRecord, now: StoreTime) {
        let asked = link.step(NodeTime::from_us(0));
        assert_eq!(
            asked,
            Step::Ask(Effect::Store(StoreOp::Read(record.id.clone())))
        );
        link.handle_stored(
            Stored::Record(Some(homing_core::RecordRead::alone(record.clone()))),
            now,
        );
    }

    /// Expects the write asked next and lands it; the record written.
    fn written(link: &mut LinkOnward, now: StoreTime) -> DcRecord {
        let Step::Ask(Effect::Store(StoreOp::Write { record, .. })) =
            link.step(NodeTime::from_us(0))
        else {
            panic!("an update writes the record")
        };
        link.handle_stored(Stored::Written(Written::Yes), now);
        *record
    }

    fn linked_to(record: &DcRecord, to: &str) -> bool {
        matches!(&record.state, RecordState::Linked { to: t, .. } if t == &id(to))
    }

    /// Long after the fixtures' leases were granted: they ran out.
    const LATER: StoreTime = StoreTime::from_ms(86_400_000);

    #[test]
    fn a_link_to_a_reservation_of_another_dc_than_the_callers_is_refused_before_any_read() {
        let mut link = link("iad.1", "fra.2", "lhr");
        let Step::Done(Err(e)) = link.step(NodeTime::from_us(0)) else {
            panic!("refused at once")
        };
        assert_eq!(e.kind, ErrorKind::Unauthorized);
    }

    #[test]
    fn a_tail_is_linked_from_the_checks_one_read() {
        let record = held("iad.1", "a", None, StoreTime::from_ms(0));
        let mut link = link("iad.1", "fra.2", "fra");
        // The key's first reservation: nothing to confirm.
        read(&mut link, &record, LATER);
        let written = written(&mut link, LATER);
        assert!(linked_to(&written, "fra.2"), "{written:?}");
        assert_eq!(
            link.step(NodeTime::from_us(0)),
            Step::Done(Ok(LinkReply::Linked))
        );
        assert!(!link.superseded());
    }

    #[test]
    fn a_confirmed_move_links_from_the_checks_read_and_a_write_since_is_caught() {
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let mut link = link("iad.2", "sin.5", "sin");
        read(&mut link, &record, LATER);
        let Step::Ask(Effect::Global(GlobalOp::Confirm(ours))) = link.step(NodeTime::from_us(0))
        else {
            panic!("the check confirms the move")
        };
        link.handle_global(GlobalAnswer::Confirmed(ours));
        let Step::Ask(Effect::Store(StoreOp::Write { expected, .. })) =
            link.step(NodeTime::from_us(0))
        else {
            panic!("linked from the check's read")
        };
        assert_eq!(expected, Some(record.version));
        // The record was written meanwhile: read again, then linked.
        link.handle_stored(Stored::Written(Written::Conflict), LATER);
        read(&mut link, &record, LATER);
        written(&mut link, LATER);
        assert_eq!(
            link.step(NodeTime::from_us(0)),
            Step::Done(Ok(LinkReply::Linked))
        );
    }

    #[test]
    fn a_tail_whose_move_lost_to_a_takeover_links_to_the_winner_and_answers_it() {
        // iad.2 continues fra.1, but lhr.3's takeover of fra.1 won.
        let record = held("iad.2", "a", Some("fra.1"), StoreTime::from_ms(0));
        let now = StoreTime::from_ms(1);
        let mut link = link("iad.2", "sin.5", "sin");
        read(&mut link, &record, now);
        let Step::Ask(Effect::Global(GlobalOp::Confirm(ours))) = link.step(NodeTime::from_us(0))
        else {
            panic!("the check confirms the move")
        };
        assert!(ours.names(&id("iad.2")));
        let winner = Succession::taken_over(id("fra.1"), id("lhr.3"), 1);
        link.handle_global(GlobalAnswer::Confirmed(winner));
        let Step::Ask(Effect::Global(GlobalOp::Confirm(own))) = link.step(NodeTime::from_us(0))
        else {
            panic!("the record's own succession to the winner is recorded")
        };
        link.handle_global(GlobalAnswer::Confirmed(own));
        // Superseding is its own update: it reads the record again.
        read(&mut link, &record, now);
        let written = written(&mut link, now);
        assert!(
            linked_to(&written, "lhr.3"),
            "to the winner, not sin.5: {written:?}"
        );
        let winner = LinkReply::AlreadyLinked(id("lhr.3"));
        assert_eq!(link.step(NodeTime::from_us(0)), Step::Done(Ok(winner)));
        assert!(link.superseded());
    }
}
