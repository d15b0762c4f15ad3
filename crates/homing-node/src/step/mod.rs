//! One vocabulary between a request's stepper and its driver (DESIGN.md
//! §7.1): the stepper says what it needs next — one [`Effect`], or that it
//! is [`Step::Done`] with its outcome — and the driver performs the effect
//! and hands back one [`Answer`], with both clocks as it read them
//! ([`Now`]).
//! Between steps the driver takes the [`NodeEvent`]s the stepper noted
//! (what to remember, what to log or count). So a driver runs every
//! [`Stepper`] with one loop: homingd awaiting each effect in the
//! request's task, the simulator scheduling each after its latency.
//!
//! Steppers that run this way: [`crate::Acquire`], [`crate::Update`],
//! [`crate::LinkOnward`], [`crate::Drain`], [`crate::DrainScope`],
//! [`crate::KeyRecords`], [`crate::Reconcile`], [`crate::Upkeep`],
//! [`crate::AwaitVacant`], [`crate::WatchRead`], [`crate::Resolve`], and
//! [`crate::Serve`], which runs a request from arrival to reply through the
//! steppers it needs: every request a DC serves runs this way (the DC
//! lease and the log follower run loops of their own). An
//! acquire also waits: at the holder's DC ([`Effect::Await`]) or in a pause
//! ([`Effect::Pause`]), each ended by its answer (a pause's:
//! [`Answer::Resumed`]), by its time running out ([`Answer::TimedOut`]) or
//! by the node shutting down ([`Answer::Closed`]). A waiter queues at its DC's
//! registry ([`Effect::Queue`]) and parks ([`Effect::Park`]) until another
//! request's write wakes it ([`Answer::Woken`]); a watch parks until the
//! DC's event log moves ([`Effect::AwaitLog`]).

pub mod effect;
pub mod event;
pub mod failure;
pub mod queue;
pub mod time;

use homing_core::{
    AwaitReply, DcId, FencingToken, Key, LeaseKey, LinkReply, Namespace, ReservationId, Segment,
    StoreTime,
};

use crate::step::effect::{GlobalAnswer, GlobalOp, StoreOp, Stored};
use crate::step::event::NodeEvent;
use crate::step::failure::Failure;
use crate::step::queue::{QueueOp, Queued};
use crate::step::time::NodeTime;

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
    /// Before a connect that may grant: does the DC's lease cover a host
    /// lease whose term starts at `from` (node clock)? The driver asks
    /// [`crate::DcLease::grant`] with the policy's ttl; answered
    /// [`Answer::Covered`].
    Cover {
        /// Where the grant's term starts: the arrival for the first
        /// connect, the reconnect's time after a wait or a pause.
        from: NodeTime,
    },
    /// Before a connect creates a key (its first reservation, whose global
    /// entry is kept forever): may this DC create one more key in the
    /// namespace ([`crate::KeyQuota`], whose counts the driver keeps)?
    /// Answered [`Answer::Admitted`]. A granted create holds its slot until
    /// its set-if-absent answers (which settles it) or the stepper ends
    /// (which gives it back); a create tried again after a failed write or
    /// set-if-absent reuses it.
    Admit(Namespace),
    /// Send `Link` to `from`'s DC: link `from`, the key's tail there, to
    /// `to` if `from` is still fenced by `expected_token`; answered
    /// [`Answer::Linked`].
    Link {
        /// The key.
        key: Key,
        /// The tail to link.
        from: ReservationId,
        /// Its successor.
        to: ReservationId,
        /// The fencing token the tail must still have.
        expected_token: FencingToken,
    },
    /// Wait at `reservation`'s DC (a waiter here, an `Await` to a peer)
    /// for it to be vacated, `wait_ms` at most: answered
    /// [`Answer::Awaited`], or [`Answer::TimedOut`] once `until` (node
    /// clock) passes first (the driver drops the registration), or
    /// [`Answer::Closed`].
    Await {
        /// The live holder's reservation.
        reservation: ReservationId,
        /// The wait left, in milliseconds (≥ 1).
        wait_ms: u32,
        /// The stepper's own deadline.
        until: NodeTime,
    },
    /// Sleep until `until` (node clock): answered [`Answer::Resumed`], or
    /// [`Answer::Closed`] if the node shuts down first.
    Pause {
        /// When to go on.
        until: NodeTime,
    },
    /// The host's cancel of the acquire made under `lease`, in the DC's
    /// [`crate::Cancellations`] ([`crate::Cancellations::answer`]): note
    /// it (`note`: a `Cancel` arrived), or ask whether it was noted (an
    /// acquire about to answer its grant). Answered [`Answer::Cancelled`].
    Cancellation {
        /// The acquire's lease key.
        lease: LeaseKey,
        /// Note the cancel, rather than ask about it.
        note: bool,
    },
    /// A waiter's business with its DC's waiter registry, performed at
    /// once with [`crate::Waiters::queue`] (which also says what to
    /// deliver to other waiters); answered [`Answer::Queued`]. A joined
    /// waiter stays queued until it is woken, or until the driver removes
    /// its registration when the stepper ends or is dropped.
    Queue(QueueOp),
    /// Does this DC answer for its tails now
    /// ([`crate::DcLease::answers_for_tails`])? Answered
    /// [`Answer::ForTails`].
    AnswersForTails,
    /// A watch with nothing to answer waits for this DC's event log to
    /// move (a write appends an event): answered [`Answer::LogMoved`]
    /// (`Err`: the node parks as many watches as it may), or
    /// [`Answer::TimedOut`] once `until` (node clock) passes first, or
    /// [`Answer::Closed`]. A write between the watch's first read and its
    /// park must still wake it (the driver follows the log from before the
    /// first read).
    AwaitLog {
        /// The watch's deadline.
        until: NodeTime,
    },
    /// A queued waiter parks: answered [`Answer::Woken`] with the reply
    /// delivered to it, or `Woken(None)` when `until` (node clock) passes
    /// or its queue's hand-off moves (it looks again), or
    /// [`Answer::Closed`] if the node shuts down. A reply delivered before
    /// the park is taken at once.
    Park {
        /// When to look again at the latest.
        until: NodeTime,
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
    /// To [`Effect::Cover`]: covered, or the DC lease's refusal.
    Covered(Result<(), Failure>),
    /// To [`Effect::Admit`]: admitted, or the quota's refusal.
    Admitted(Result<(), Failure>),
    /// To [`Effect::Link`]: the tail's DC's answer, or why there is none.
    Linked(Result<LinkReply, Failure>),
    /// To [`Effect::Await`]: how the wait ended at the holder's DC.
    Awaited(Result<AwaitReply, Failure>),
    /// To [`Effect::Await`] or [`Effect::AwaitLog`]: its `until` passed
    /// first.
    TimedOut,
    /// To [`Effect::Pause`]: it ended.
    Resumed,
    /// To [`Effect::Await`], [`Effect::Pause`], [`Effect::Park`] or
    /// [`Effect::AwaitLog`]: the node shuts down, so nothing waits any
    /// longer.
    Closed,
    /// To [`Effect::Cancellation`]: whether the host gave up (it did, once noted).
    Cancelled(bool),
    /// To [`Effect::AnswersForTails`].
    ForTails(bool),
    /// To [`Effect::AwaitLog`]: the log moved, or the node would not
    /// park one more watch.
    LogMoved(Result<(), Failure>),
    /// To [`Effect::Queue`]: the registry's answer.
    Queued(Queued),
    /// To [`Effect::Park`]: the reply a write delivered, or `None` (a
    /// timer or a rouse: look again).
    Woken(Option<AwaitReply>),
}

/// Both clocks as the driver read them when it answered: the node's own
/// (monotonic, for timeouts and deadlines) and the store's (for record
/// times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The node clock.
    pub node: NodeTime,
    /// The store clock.
    pub store: StoreTime,
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

/// A request's handling as a sans-IO state machine (see the module doc).
pub trait Stepper {
    /// How it ends.
    type Output;

    /// What to do next at `now` (node clock).
    fn step(&mut self, now: NodeTime) -> Step<Self::Output>;

    /// The answer to the effect last asked, at `now`.
    fn answer(&mut self, answer: Answer, now: Now);

    /// An event noted since the last call, oldest first.
    fn poll_event(&mut self) -> Option<NodeEvent> {
        None
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, ErrorReply, FencingToken, LeasePolicy};

    use super::*;
    use crate::fixture::{NOW, id, key};
    use crate::{Change, KeyRecords, LinkOnward, Update};
    use homing_core::Mutations;

    fn unreachable_store() -> (Failure, ErrorReply) {
        let dc = "iad".parse().unwrap();
        let failure = Failure::of_store(&dc, true, "connection refused");
        let reply = failure.clone().into_reply();
        assert!(matches!(reply.kind, ErrorKind::Unavailable { .. }));
        (failure, reply)
    }

    /// Steps `stepper` once, expecting an effect.
    fn asked<S: Stepper>(stepper: &mut S) -> Effect {
        match stepper.step(NOW.node) {
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
        assert_eq!(update.step(NOW.node), Step::Done(Err(reply)));
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
        assert_eq!(link.step(NOW.node), Step::Done(Err(reply)));
    }

    #[test]
    fn a_key_read_hands_out_its_records_or_its_failure() {
        let mut read = KeyRecords::inspect(key(), 8);
        assert!(matches!(
            asked(&mut read),
            Effect::Store(StoreOp::Scan { .. })
        ));
        read.answer(Answer::Stored(Ok(Stored::Page(Vec::new()))), NOW);
        assert_eq!(read.step(NOW.node), Step::Done(Ok(Vec::new())));

        let mut failed = KeyRecords::inspect(key(), 8);
        asked(&mut failed);
        let (failure, reply) = unreachable_store();
        failed.answer(Answer::Stored(Err(failure)), NOW);
        assert_eq!(failed.step(NOW.node), Step::Done(Err(reply)));
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
