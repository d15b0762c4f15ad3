//! A DC node's walk of a key's chain to its tail (a drain's), as a sans-IO
//! stepper around homing-core's [`ChainWalk`]: the key's entry is read from
//! the global store's latest replica (a walk must not miss a recent
//! create), each reservation from its DC — this DC's own store, another
//! DC's `ResolveReservation`. The walk starts at the chain member the node
//! remembers (its hint) and falls back to the entry when that member's DC
//! disowns it ([`Failure::disowns`]); any other failure ends the walk.
//!
//! Driver: loop on [`Walk::poll`]. `Global(op)`: perform it, answer with
//! [`Walk::handle_global`]; `Segment(id)`: ask `id`'s DC, answer with
//! [`Walk::handle_segment`]; failures included. `Done`: the tail (`None`:
//! never reserved), or why not; remember [`Walked::hint`] for the next walk.

use homing_core::{
    ChainNeed, ChainPoll, ChainWalk, DcId, ErrorKind, ErrorReply, Key, ReservationId, Segment,
    Shortcut, Source, Walked,
};

use crate::step::effect::{GlobalAnswer, GlobalOp, GlobalRead, unasked};
use crate::step::failure::Failure;

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkPoll {
    /// Read the key's entry (`GlobalOp::Entry`, the latest replica).
    Global(GlobalOp),
    /// What this reservation's DC knows of it.
    Segment(ReservationId),
    /// Finished: the chain as walked (`None`: the key was never reserved), or why not.
    Done(Result<Option<Walked>, Failure>),
}

/// One walk in progress at DC `dc`.
#[derive(Debug, Clone)]
pub struct Walk {
    dc: DcId,
    walk: ChainWalk,
    /// A failure to perform what the walk asked: it ends the walk.
    failed: Option<Failure>,
}

impl Walk {
    /// A walk of `key` at DC `dc`, at most `hop_limit` hops.
    pub fn new(dc: DcId, key: Key, hop_limit: usize) -> Walk {
        Walk {
            dc,
            walk: ChainWalk::from_key(key, hop_limit),
            failed: None,
        }
    }

    /// Starts at `hint`, the chain member the node remembers, if any.
    pub fn with_hint(mut self, hint: Option<Shortcut>) -> Walk {
        self.walk = self.walk.with_hint(hint);
        self
    }

    /// What to do next.
    pub fn poll(&self) -> WalkPoll {
        if let Some(failure) = &self.failed {
            return WalkPoll::Done(Err(failure.clone()));
        }
        match self.walk.poll() {
            ChainPoll::Need(ChainNeed::GlobalEntry(key)) => WalkPoll::Global(GlobalOp::Entry {
                key: key.clone(),
                read: GlobalRead::Latest,
            }),
            ChainPoll::Need(ChainNeed::Reservation(id)) => WalkPoll::Segment(id.clone()),
            ChainPoll::NotFound => WalkPoll::Done(Ok(None)),
            ChainPoll::Done(walked) => WalkPoll::Done(Ok(Some(walked.clone()))),
            ChainPoll::Failed(e) => WalkPoll::Done(Err(Failure::Refused(ErrorReply::new(
                ErrorKind::Inconsistent,
                e.to_string(),
            )))),
        }
    }

    /// The answer to the [`WalkPoll::Global`] asked, or why there is none.
    /// The entry is this DC's own read.
    pub fn handle_global(&mut self, answer: Result<GlobalAnswer, Failure>) {
        match answer {
            // A contradiction fails the walk: `poll` reports it.
            Ok(GlobalAnswer::Entry(entry)) => drop(self.walk.handle_global(entry, Source::Local)),
            Ok(other) => unasked("walk", &other),
            Err(failure) => self.failed = Some(failure),
        }
    }

    /// What the DC of the reservation [`WalkPoll::Segment`] named answered,
    /// or why it did not.
    pub fn handle_segment(&mut self, answer: Result<Segment, Failure>) {
        let ChainPoll::Need(ChainNeed::Reservation(id)) = self.walk.poll() else {
            panic!("walk: a segment it did not ask for");
        };
        let dc = id.dc().clone();
        let source = Source::of_dc(&self.dc, &dc);
        // A contradiction fails the walk: `poll` reports it.
        match answer {
            Ok(segment) => drop(self.walk.handle_segment(&dc, segment, source)),
            Err(failure) if failure.disowns() => drop(self.walk.handle_disowned(&dc, source)),
            Err(failure) => self.failed = Some(failure),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{FencingToken, KeyName};

    fn key() -> Key {
        Key::new(KeyName::new("k").unwrap())
    }

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn entry(walk: &mut Walk, at: &str) {
        assert!(matches!(
            walk.poll(),
            WalkPoll::Global(GlobalOp::Entry {
                read: GlobalRead::Latest,
                ..
            })
        ));
        walk.handle_global(Ok(GlobalAnswer::Entry(Some(id(at)))));
    }

    #[test]
    fn a_key_without_an_entry_was_never_reserved() {
        let mut walk = Walk::new("iad".parse().unwrap(), key(), 16);
        walk.handle_global(Ok(GlobalAnswer::Entry(None)));
        assert_eq!(walk.poll(), WalkPoll::Done(Ok(None)));
    }

    #[test]
    fn a_disowned_hint_falls_back_to_the_entry_and_silence_ends_the_walk() {
        let hint = Shortcut {
            to: id("fra.9"),
            token: FencingToken::new(3),
        };
        let disowned = ErrorReply::new(ErrorKind::UnknownReservation, "unknown fra.9");
        let mut walk = Walk::new("iad".parse().unwrap(), key(), 16).with_hint(Some(hint.clone()));
        entry(&mut walk, "iad.1");
        assert_eq!(
            walk.poll(),
            WalkPoll::Segment(id("fra.9")),
            "the hint first"
        );
        walk.handle_segment(Err(Failure::Refused(disowned.clone())));
        assert_eq!(
            walk.poll(),
            WalkPoll::Segment(id("iad.1")),
            "back to the entry"
        );

        let mut walk = Walk::new("iad".parse().unwrap(), key(), 16).with_hint(Some(hint));
        entry(&mut walk, "iad.1");
        let silent = ErrorReply::new(
            ErrorKind::Unavailable {
                dc: "fra".parse().unwrap(),
            },
            "timeout",
        );
        walk.handle_segment(Err(Failure::Unreachable(silent.clone())));
        assert_eq!(
            walk.poll(),
            WalkPoll::Done(Err(Failure::Unreachable(silent)))
        );
    }
}
