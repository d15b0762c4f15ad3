//! One vocabulary between a request's stepper and its driver (DESIGN.md
//! §7.1): the stepper says what it needs next — one [`Effect`], or that it
//! is [`Step::Done`] with its outcome — and the driver performs the effect
//! and hands back one [`Answer`], with the store clock's time it read.
//! Between steps the driver takes the [`NodeEvent`]s the stepper noted
//! (what to remember, what to log or count). So a driver runs every
//! [`Stepper`] with one loop: homingd awaiting each effect in the
//! request's task, the simulator scheduling each after its latency.
//!
//! Steppers that run this way: [`crate::Update`], [`crate::LinkOnward`],
//! [`crate::Drain`], [`crate::DrainScope`], [`crate::KeyRecords`],
//! [`crate::Reconcile`], [`crate::Upkeep`]. (Still driven through their
//! own poll enums: the acquire, the waiter and the watch, which also park,
//! sleep, ask a peer or are told of other requests' writes.)

use homing_core::{DcId, Key, ReservationId, Segment, Shortcut, StoreTime};

use crate::effect::{GlobalAnswer, GlobalOp, StoreOp, Stored};
use crate::failure::Failure;
use crate::reconcile::ReconcileEvent;
use crate::upkeep::UpkeepEvent;

/// What a stepper asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// An operation on this DC's store; answered [`Answer::Stored`].
    Store(StoreOp),
    /// An operation on the global store; answered [`Answer::Global`].
    Global(GlobalOp),
    /// What reservation `id`'s DC knows of it: this DC's own segment, or
    /// its owner's over a peer round trip; answered [`Answer::Segment`].
    Segment(ReservationId),
    /// Send `Drain { key }` to DC `dc` (a drain forwarded to its tail's
    /// DC, once); answered [`Answer::Forwarded`].
    Forward {
        /// The tail's DC.
        dc: DcId,
        /// The key.
        key: Key,
    },
}

/// What the driver answers an [`Effect`]: its result, or why there is none
/// (a failure classified as every retry needs it, [`Failure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// To [`Effect::Store`].
    Stored(Result<Stored, Failure>),
    /// To [`Effect::Global`].
    Global(Result<GlobalAnswer, Failure>),
    /// To [`Effect::Segment`].
    Segment(Result<Segment, Failure>),
    /// To [`Effect::Forward`]: the tail's DC drained the key, or why not.
    Forwarded(Result<(), Failure>),
}

/// What a stepper needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Perform this effect; hand its answer to [`Stepper::answer`].
    Ask(Effect),
    /// Finished, with this outcome; stepping again is a driver bug.
    Done(T),
}

impl<T> Step<T> {
    /// The same step, its outcome mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Step<U> {
        match self {
            Step::Ask(effect) => Step::Ask(effect),
            Step::Done(done) => Step::Done(f(done)),
        }
    }
}

/// Something a stepper noted for its node: what to remember, log or count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// A walk proved `member` of `key`'s chain: the node's hint for the
    /// key's next walk (kept if further than the one it has).
    Learned {
        /// The key.
        key: Key,
        /// The member proved.
        member: Shortcut,
    },
    /// An operator's drain stopped this lease's renewals.
    Drained(ReservationId),
    /// What a reconciliation did with one takeover of this DC's tails.
    Reconciled(ReconcileEvent),
    /// What an upkeep pass did.
    Upkeep(UpkeepEvent),
}

/// A request's handling as a sans-IO state machine (see the module doc).
pub trait Stepper {
    /// How it ends.
    type Output;

    /// What to do next.
    fn step(&mut self) -> Step<Self::Output>;

    /// The answer to the effect last asked, at `now` (store clock).
    fn answer(&mut self, answer: Answer, now: StoreTime);

    /// An event noted since the last call, oldest first.
    fn poll_event(&mut self) -> Option<NodeEvent> {
        None
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, ErrorReply, FencingToken, KeyName, LeasePolicy};

    use super::*;
    use crate::{Change, KeyRecords, LinkOnward, Mutations, Update};

    const NOW: StoreTime = StoreTime::from_ms(1);

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn key() -> Key {
        Key::new(KeyName::new("a").unwrap())
    }

    fn unreachable_store() -> (Failure, ErrorReply) {
        let dc = "iad".parse().unwrap();
        let failure = Failure::of_store(&dc, true, "connection refused");
        let reply = failure.clone().into_reply();
        assert!(matches!(reply.kind, ErrorKind::Unavailable { .. }));
        (failure, reply)
    }

    /// Steps `stepper` once, expecting an effect.
    fn asked<S: Stepper>(stepper: &mut S) -> Effect {
        match stepper.step() {
            Step::Ask(effect) => effect,
            Step::Done(_) => panic!("done before it asked anything"),
        }
    }

    #[test]
    fn an_update_whose_store_fails_ends_with_the_failures_reply() {
        let dc = "iad".parse().unwrap();
        let change = Change::ForceRelease {
            token: FencingToken::FIRST,
        };
        let mut update = Update::new(
            dc,
            id("iad.1"),
            change,
            LeasePolicy::DEFAULT,
            Mutations::NONE,
        );
        assert_eq!(
            asked(&mut update),
            Effect::Store(StoreOp::Read(id("iad.1")))
        );
        let (failure, reply) = unreachable_store();
        update.answer(Answer::Stored(Err(failure)), NOW);
        assert_eq!(update.step(), Step::Done(Err(reply)));
    }

    #[test]
    fn a_link_whose_store_fails_ends_with_the_failures_reply() {
        let (dc, caller): (DcId, DcId) = ("iad".parse().unwrap(), "fra".parse().unwrap());
        let mut link = LinkOnward::new(
            dc,
            Some(&caller),
            key(),
            id("iad.1"),
            id("fra.2"),
            FencingToken::FIRST,
            LeasePolicy::DEFAULT,
            Mutations::NONE,
        );
        assert_eq!(asked(&mut link), Effect::Store(StoreOp::Read(id("iad.1"))));
        let (failure, reply) = unreachable_store();
        link.answer(Answer::Stored(Err(failure)), NOW);
        assert_eq!(link.step(), Step::Done(Err(reply)));
    }

    #[test]
    fn a_key_read_hands_out_its_records_or_its_failure() {
        let mut read = KeyRecords::inspect(key(), 8);
        assert!(matches!(
            asked(&mut read),
            Effect::Store(StoreOp::Scan { .. })
        ));
        read.answer(Answer::Stored(Ok(Stored::Page(Vec::new()))), NOW);
        assert_eq!(read.step(), Step::Done(Ok(Vec::new())));

        let mut failed = KeyRecords::inspect(key(), 8);
        asked(&mut failed);
        let (failure, reply) = unreachable_store();
        failed.answer(Answer::Stored(Err(failure)), NOW);
        assert_eq!(failed.step(), Step::Done(Err(reply)));
    }

    #[test]
    fn a_mapped_step_keeps_its_effect_and_maps_its_outcome() {
        let effect = Effect::Segment(id("iad.1"));
        assert_eq!(
            Step::<u8>::Ask(effect.clone()).map(u16::from),
            Step::Ask(effect)
        );
        assert_eq!(Step::Done(7u8).map(u16::from), Step::Done(7u16));
    }
}
