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
