//! What a DC answers about keys and its own reservations, decided once for
//! homingd and the simulator: `Resolve { key }` ([`Resolve`]: the key's
//! global entry, which is the truth, and this DC's segment of the chain when
//! the entry is its own) and `ResolveReservation { id }` ([`owned_here`],
//! then [`answered`]: a segment ending in a tail only while this DC answers
//! for its tails, homing-node's `DcLease::answers_for_tails`).

use homing_core::{DcId, ErrorKind, ErrorReply, Key, Reply, ReservationId, Segment, SegmentError};

use crate::Failure;
use crate::step::effect::{GlobalAnswer, GlobalOp, GlobalRead};
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};

/// Refuses a request about reservation `id` unless DC `dc` owns it: only
/// the owner's store has the record.
pub fn owned_here(dc: &DcId, id: &ReservationId) -> Result<(), Failure> {
    if id.dc() == dc {
        return Ok(());
    }
    let message = format!("reservation {id} is owned by dc {}, ask it", id.dc());
    Err(Failure::Refused(ErrorReply::new(
        ErrorKind::BadRequest,
        message,
    )))
}

/// DC `dc`'s segment as answered to a walker elsewhere: one ending in a
/// tail here only while the DC answers for its tails (else `Unavailable`:
/// the walker asks again, or another DC may have taken the tail over); one
/// ending in a link is always answered (links never change).
pub fn answered(dc: &DcId, segment: Segment, answers_for_tails: bool) -> Result<Segment, Failure> {
    if segment.tail.is_none() || answers_for_tails {
        return Ok(segment);
    }
    Err(Failure::Unreachable(ErrorReply::new(
        ErrorKind::Unavailable { dc: dc.clone() },
        "this dc does not answer for its tails now: its dc lease lapsed (no host it granted still acts, and other dcs may take them over) or it is applying takeovers made while it was away",
    )))
}

/// A store's answer about a segment, as a failure: an unknown reservation
/// is `UnknownReservation` (the walker's shortcut did not hold up), an
/// abandoned or broken one a contradiction.
pub fn segment_failure(e: SegmentError) -> Failure {
    let kind = match e {
        SegmentError::Unknown(_) => ErrorKind::UnknownReservation,
        SegmentError::Abandoned(_) | SegmentError::Broken(_) => ErrorKind::Inconsistent,
    };
    Failure::Refused(ErrorReply::new(kind, e.to_string()))
}

#[derive(Debug)]
enum Phase {
    /// The key's global entry, as a resolve reads it.
    Entry,
    /// This DC's segment from its own reservation (the entry).
    Segment(ReservationId),
    /// Whether the DC answers for its tails, for this segment.
    Tails(Segment),
    Done(Result<Reply, Failure>),
    Over,
}

/// A DC's answer to `Resolve { key }`, as a [`Stepper`]: the key's global
/// entry ([`GlobalRead::Resolve`]), and — when the entry is this DC's own
/// reservation — its segment ([`Effect::Segment`]), as [`answered`]
/// allows ([`Effect::AnswersForTails`]). A segment that cannot be
/// answered is left out, never an error: the entry is the truth, and the
/// walker asks the owner itself. A failed entry read is the resolve's
/// failure.
#[derive(Debug)]
pub struct Resolve {
    dc: DcId,
    key: Key,
    entry: Option<ReservationId>,
    phase: Phase,
}

impl Resolve {
    /// A resolve of `key` at DC `dc`.
    pub fn new(dc: DcId, key: Key) -> Resolve {
        Resolve {
            dc,
            key,
            entry: None,
            phase: Phase::Entry,
        }
    }

    fn reply(&mut self, segment: Option<Segment>) -> Phase {
        Phase::Done(Ok(Reply::Resolved {
            entry: self.entry.take(),
            segment,
        }))
    }
}

impl Stepper for Resolve {
    /// `Reply::Resolved`, or why the entry could not be read.
    type Output = Result<Reply, Failure>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Entry => {
                self.phase = Phase::Entry;
                let (key, read) = (self.key.clone(), GlobalRead::Resolve);
                Step::Ask(Effect::Global(GlobalOp::Entry { key, read }))
            }
            Phase::Segment(id) => {
                self.phase = Phase::Segment(id.clone());
                Step::Ask(Effect::Segment(id))
            }
            phase @ Phase::Tails(_) => {
                self.phase = phase;
                Step::Ask(Effect::AnswersForTails)
            }
            Phase::Done(done) => Step::Done(done),
            Phase::Over => panic!("resolve of {} stepped after it ended", self.key),
        }
    }

    fn answer(&mut self, answer: Answer, _now: Now) {
        self.phase = match (std::mem::replace(&mut self.phase, Phase::Over), answer) {
            (Phase::Entry, Answer::Global(Ok(GlobalAnswer::Entry(entry)))) => {
                self.entry = entry;
                match &self.entry {
                    Some(id) if id.dc() == &self.dc => Phase::Segment(id.clone()),
                    _ => self.reply(None),
                }
            }
            (Phase::Entry, Answer::Global(Err(failure))) => Phase::Done(Err(failure)),
            (Phase::Segment(_), Answer::Segment(Ok(segment))) => Phase::Tails(segment),
            (Phase::Segment(_), Answer::Segment(Err(_))) => self.reply(None),
            (Phase::Tails(segment), Answer::ForTails(answers_for_tails)) => {
                let segment = answered(&self.dc, segment, answers_for_tails);
                self.reply(segment.ok())
            }
            (phase, answer) => panic!(
                "resolve of {}: an answer it did not ask for in {phase:?}: {answer:?}",
                self.key
            ),
        };
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{LocalSegment, StoreTime};

    use super::*;
    use crate::fixture::{NOW, POLICY, held, id, key};

    fn dc(s: &str) -> DcId {
        s.parse().unwrap()
    }

    /// DC iad's segment from its live reservation `iad.1` (a tail).
    fn with_tail() -> Segment {
        let record = held("iad.1", "a", None, StoreTime::from_ms(0));
        let mut segment = LocalSegment::new(dc("iad"), id("iad.1"), 8);
        while segment.need().is_some() {
            segment
                .handle(Some(&record), StoreTime::from_ms(1), &POLICY, None)
                .unwrap();
        }
        segment.finish()
    }

    /// Steps `resolve`, answering each effect from `answers` in turn;
    /// returns the effects asked and how it ended.
    fn run(resolve: &mut Resolve, answers: Vec<Answer>) -> (Vec<Effect>, Result<Reply, Failure>) {
        let mut asked = Vec::new();
        let mut answers = answers.into_iter();
        loop {
            match resolve.step(NOW.node) {
                Step::Ask(effect) => {
                    asked.push(effect);
                    resolve.answer(answers.next().expect("an answer"), NOW);
                }
                Step::Done(done) => return (asked, done),
            }
        }
    }

    fn entry(id: Option<ReservationId>) -> Answer {
        Answer::Global(Ok(GlobalAnswer::Entry(id)))
    }

    #[test]
    fn an_entry_elsewhere_or_none_is_answered_without_a_segment() {
        for found in [None, Some(id("fra.1"))] {
            let mut resolve = Resolve::new(dc("iad"), key());
            let (asked, done) = run(&mut resolve, vec![entry(found.clone())]);
            let read = GlobalOp::Entry {
                key: key(),
                read: GlobalRead::Resolve,
            };
            assert_eq!(asked, [Effect::Global(read)]);
            let reply = Reply::Resolved {
                entry: found,
                segment: None,
            };
            assert_eq!(done, Ok(reply));
        }
    }

    #[test]
    fn an_own_entry_carries_the_segment_only_while_the_dc_answers_for_its_tails() {
        assert!(with_tail().tail.is_some());
        for answers in [true, false] {
            let mut resolve = Resolve::new(dc("iad"), key());
            let (asked, done) = run(
                &mut resolve,
                vec![
                    entry(Some(id("iad.1"))),
                    Answer::Segment(Ok(with_tail())),
                    Answer::ForTails(answers),
                ],
            );
            assert_eq!(asked[1], Effect::Segment(id("iad.1")));
            assert_eq!(asked[2], Effect::AnswersForTails);
            let reply = Reply::Resolved {
                entry: Some(id("iad.1")),
                segment: answers.then(with_tail),
            };
            assert_eq!(done, Ok(reply), "{answers}");
        }
    }

    #[test]
    fn a_failed_segment_read_still_answers_the_entry_and_a_failed_entry_read_fails() {
        let mut resolve = Resolve::new(dc("iad"), key());
        let e = ErrorReply::new(ErrorKind::Internal, "store: broken");
        let failed = Answer::Segment(Err(Failure::Refused(e)));
        let (_, done) = run(&mut resolve, vec![entry(Some(id("iad.1"))), failed]);
        let reply = Reply::Resolved {
            entry: Some(id("iad.1")),
            segment: None,
        };
        assert_eq!(done, Ok(reply));
        let dc_iad = dc("iad");
        let cut = Failure::of_store(&dc_iad, true, "global store unreachable");
        let mut resolve = Resolve::new(dc_iad, key());
        let (_, done) = run(&mut resolve, vec![Answer::Global(Err(cut.clone()))]);
        assert_eq!(done, Err(cut));
    }

    #[test]
    fn only_the_owner_answers_for_a_reservation_and_links_are_always_answered() {
        assert!(owned_here(&dc("iad"), &id("iad.1")).is_ok());
        let refused = owned_here(&dc("iad"), &id("fra.1")).unwrap_err();
        assert_eq!(refused.into_reply().kind, ErrorKind::BadRequest);
        let mut link_only = with_tail();
        link_only.tail = None;
        assert!(answered(&dc("iad"), link_only, false).is_ok());
        let lapsed = answered(&dc("iad"), with_tail(), false).unwrap_err();
        assert!(lapsed.is_unreachable());
    }

    #[test]
    fn an_unknown_reservation_is_a_refusal_of_its_own_kind_and_a_broken_one_a_contradiction() {
        let unknown = segment_failure(SegmentError::Unknown(id("iad.1")));
        assert_eq!(unknown.into_reply().kind, ErrorKind::UnknownReservation);
        let abandoned = segment_failure(SegmentError::Abandoned(id("iad.1")));
        assert!(!abandoned.is_unreachable());
        assert_eq!(abandoned.into_reply().kind, ErrorKind::Inconsistent);
    }
}
