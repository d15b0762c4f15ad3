//! What a DC answers about keys and its own reservations, decided once for
//! homingd and the simulator: `Resolve { key }` ([`Resolve`]: the key's
//! global entry, which is the truth, and this DC's segment of the chain when
//! the entry is its own) and `ResolveReservation { id }` ([`owned_here`],
//! then [`answered`]: a segment ending in a tail only while this DC answers
//! for its tails, homing-node's `DcLease::answers_for_tails`).

use homing_core::{DcId, ErrorKind, ErrorReply, Reply, ReservationId, Segment, SegmentError};

use crate::Failure;

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

/// What a [`Resolve`] needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvePoll {
    /// The key's global entry, read as a resolve reads it (the entry cache,
    /// a recent absence, one shared store read); answer with
    /// [`Resolve::handle_entry`].
    Entry,
    /// This DC's segment from its own reservation (the entry); answer with
    /// [`Resolve::handle_segment`].
    Segment(ReservationId),
    /// Answered: the reply is [`Resolve::reply`].
    Done,
}

/// A DC's answer to `Resolve { key }`: the key's global entry, and — when
/// the entry is this DC's own reservation — its segment, as [`answered`]
/// allows. A segment that cannot be answered is left out, never an error:
/// the entry is the truth, and the walker asks the owner itself.
#[derive(Debug)]
pub struct Resolve {
    dc: DcId,
    entry: Option<ReservationId>,
    segment: Option<Segment>,
    poll: ResolvePoll,
}

impl Resolve {
    /// A resolve at DC `dc`.
    pub fn new(dc: DcId) -> Resolve {
        Resolve {
            dc,
            entry: None,
            segment: None,
            poll: ResolvePoll::Entry,
        }
    }

    /// What to do next.
    pub fn poll(&self) -> &ResolvePoll {
        &self.poll
    }

    /// The key's global entry was read (`None`: never reserved).
    pub fn handle_entry(&mut self, entry: Option<ReservationId>) {
        self.poll = match &entry {
            Some(id) if id.dc() == &self.dc => ResolvePoll::Segment(id.clone()),
            _ => ResolvePoll::Done,
        };
        self.entry = entry;
    }

    /// This DC's segment from the entry was read (or failed); whether the
    /// DC answers for its tails now.
    pub fn handle_segment(&mut self, segment: Result<Segment, Failure>, answers_for_tails: bool) {
        let segment = segment.and_then(|s| answered(&self.dc, s, answers_for_tails));
        self.segment = segment.ok();
        self.poll = ResolvePoll::Done;
    }

    /// The reply, once [`ResolvePoll::Done`].
    pub fn reply(&self) -> Reply {
        Reply::Resolved {
            entry: self.entry.clone(),
            segment: self.segment.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{LocalSegment, StoreTime};

    use super::*;
    use crate::fixture::{POLICY, held};

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn dc(s: &str) -> DcId {
        s.parse().unwrap()
    }

    /// DC iad's segment from its live reservation `iad.1` (a tail).
    fn with_tail() -> Segment {
        let record = held("iad.1", "a", None, StoreTime::from_ms(0));
        let mut segment = LocalSegment::new(dc("iad"), id("iad.1"), 8);
        while segment.need().is_some() {
            segment
                .handle(Some(&record), StoreTime::from_ms(1), &POLICY)
                .unwrap();
        }
        segment.finish()
    }

    #[test]
    fn an_entry_elsewhere_or_none_is_answered_without_a_segment() {
        for entry in [None, Some(id("fra.1"))] {
            let mut resolve = Resolve::new(dc("iad"));
            assert_eq!(resolve.poll(), &ResolvePoll::Entry);
            resolve.handle_entry(entry.clone());
            let reply = Reply::Resolved {
                entry,
                segment: None,
            };
            assert_eq!(resolve.poll(), &ResolvePoll::Done);
            assert_eq!(resolve.reply(), reply);
        }
    }

    #[test]
    fn an_own_entry_carries_the_segment_only_while_the_dc_answers_for_its_tails() {
        assert!(with_tail().tail.is_some());
        for answers in [true, false] {
            let mut resolve = Resolve::new(dc("iad"));
            resolve.handle_entry(Some(id("iad.1")));
            assert_eq!(resolve.poll(), &ResolvePoll::Segment(id("iad.1")));
            resolve.handle_segment(Ok(with_tail()), answers);
            let reply = Reply::Resolved {
                entry: Some(id("iad.1")),
                segment: answers.then(with_tail),
            };
            assert_eq!(resolve.poll(), &ResolvePoll::Done);
            assert_eq!(resolve.reply(), reply, "{answers}");
        }
    }

    #[test]
    fn a_failed_segment_read_still_answers_the_entry() {
        let mut resolve = Resolve::new(dc("iad"));
        resolve.handle_entry(Some(id("iad.1")));
        let e = ErrorReply::new(ErrorKind::Internal, "store: broken");
        resolve.handle_segment(Err(Failure::Refused(e)), true);
        let reply = Reply::Resolved {
            entry: Some(id("iad.1")),
            segment: None,
        };
        assert_eq!(resolve.poll(), &ResolvePoll::Done);
        assert_eq!(resolve.reply(), reply);
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
