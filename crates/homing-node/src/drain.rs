//! Drain (an operator's `Drain { key }`): find the key's tail and stop its
//! renewals there, as a sans-IO stepper. A DC drains a tail it owns itself
//! and forwards the drain once to the tail's DC otherwise; a drain that
//! arrives forwarded and finds the tail moved on again answers
//! `Unavailable` naming the new tail's DC instead of forwarding again, so
//! one operator request costs at most one forward and never bounces
//! between DCs while a key moves.
//!
//! ```text
//! Walk ─ never reserved ─► Done(UnknownReservation)
//!   └ tail here ─► Update(Drain) ─► Done(ok)
//!   └ tail there ─ arrived forwarded ─► Done(Unavailable(tail's dc))
//!                └ from an operator ─► Forward to the tail's DC ─► Done(its answer)
//! ```

use homing_core::{DcId, ErrorKind, ErrorReply, Key, LeasePolicy, ReservationId, StoreTime};

use crate::change::Change;
use crate::effect::{StoreOp, Stored};
use crate::failure::Failure;
use crate::mutation::{Mutation, Mutations};
use crate::update::{Update, UpdatePoll};

/// What the driver must do next.
#[derive(Debug)]
pub enum DrainPoll {
    /// Walk the key's chain to its tail; answer with [`Drain::handle_walked`].
    Walk(Key),
    /// Read this DC's tail record, or compare-and-set it; answer with
    /// [`Drain::handle_stored`].
    Store(StoreOp),
    /// Send `Drain { key }` to the tail's DC; answer with [`Drain::handle_forwarded`].
    Forward {
        /// The tail's DC.
        dc: DcId,
        /// The key.
        key: Key,
    },
    /// Finished: drained (the reservation drained here, if here), or why not.
    Done(Result<Option<ReservationId>, ErrorReply>),
}

#[derive(Debug)]
enum Phase {
    Walk,
    Update(Box<Update>),
    Forward(DcId),
    Done(Result<Option<ReservationId>, ErrorReply>),
    Over,
}

/// One drain in progress.
#[derive(Debug)]
pub struct Drain {
    dc: DcId,
    key: Key,
    forwarded: bool,
    mutations: Mutations,
    phase: Phase,
}

impl Drain {
    /// A drain of `key` at DC `dc`; `forwarded`: it came from another DC
    /// (a node), not from an operator.
    pub fn new(dc: DcId, key: Key, forwarded: bool, mutations: Mutations) -> Drain {
        Drain {
            dc,
            key,
            forwarded,
            mutations,
            phase: Phase::Walk,
        }
    }

    /// What to do next; `Done` is handed out once.
    pub fn poll(&mut self) -> DrainPoll {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Walk => {
                self.phase = Phase::Walk;
                DrainPoll::Walk(self.key.clone())
            }
            Phase::Update(mut update) => {
                let poll = match update.poll() {
                    UpdatePoll::Store(op) => DrainPoll::Store(op),
                    UpdatePoll::Done(_) => return DrainPoll::Done(Ok(Some(update.id().clone()))),
                    UpdatePoll::Failed(e) => return DrainPoll::Done(Err(e.reply())),
                };
                self.phase = Phase::Update(update);
                poll
            }
            Phase::Forward(dc) => {
                self.phase = Phase::Forward(dc.clone());
                DrainPoll::Forward {
                    dc,
                    key: self.key.clone(),
                }
            }
            Phase::Done(result) => DrainPoll::Done(result),
            Phase::Over => panic!("drain of {} polled after it ended", self.key),
        }
    }

    /// The key's tail as the walk found it (`None`: never reserved), or why not.
    pub fn handle_walked(&mut self, tail: Result<Option<ReservationId>, Failure>) {
        assert!(
            matches!(self.phase, Phase::Walk),
            "drain: a walk it did not ask for"
        );
        self.phase = match tail {
            Err(failure) => Phase::Done(Err(failure.into_reply())),
            Ok(None) => Phase::Done(Err(ErrorReply::new(
                ErrorKind::UnknownReservation,
                format!("key {} was never reserved", self.key),
            ))),
            Ok(Some(tail)) if tail.dc() == &self.dc => {
                let update = Update::new(self.dc.clone(), tail, Change::Drain, self.mutations);
                Phase::Update(Box::new(update))
            }
            // Forwarded once already: the chain moved on; the operator retries.
            Ok(Some(tail))
                if self.forwarded && !self.mutations.has(Mutation::DrainForwardedTwice) =>
            {
                Phase::Done(Err(ErrorReply::new(
                    ErrorKind::Unavailable {
                        dc: tail.dc().clone(),
                    },
                    format!("tail {tail} moved away during the drain"),
                )))
            }
            Ok(Some(tail)) => Phase::Forward(tail.dc().clone()),
        };
    }

    /// The answer to the [`StoreOp`] asked, at `now` (store clock), or why
    /// it failed (the drain fails with it).
    pub fn handle_stored(
        &mut self,
        stored: Result<Stored, Failure>,
        now: StoreTime,
        policy: &LeasePolicy,
    ) {
        let Phase::Update(update) = &mut self.phase else {
            panic!("drain: a store answer it did not ask for");
        };
        match stored {
            Ok(stored) => update.handle_stored(stored, now, policy),
            Err(failure) => self.phase = Phase::Done(Err(failure.into_reply())),
        }
    }

    /// What the tail's DC answered the forwarded drain.
    pub fn handle_forwarded(&mut self, answer: Result<(), Failure>) {
        assert!(
            matches!(self.phase, Phase::Forward(_)),
            "drain: a forward it did not ask for"
        );
        self.phase = Phase::Done(answer.map(|()| None).map_err(Failure::into_reply));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(homing_core::KeyName::new("k").unwrap())
    }

    fn drain(forwarded: bool, mutations: Mutations) -> Drain {
        Drain::new("iad".parse().unwrap(), key(), forwarded, mutations)
    }

    #[test]
    fn drain_from_an_operator_is_forwarded_once_to_the_tails_dc() {
        let mut d = drain(false, Mutations::NONE);
        assert!(matches!(d.poll(), DrainPoll::Walk(_)));
        d.handle_walked(Ok(Some("fra.3".parse().unwrap())));
        let DrainPoll::Forward { dc, .. } = d.poll() else {
            panic!("expected a forward")
        };
        assert_eq!(dc.as_str(), "fra");
        d.handle_forwarded(Ok(()));
        assert!(matches!(d.poll(), DrainPoll::Done(Ok(None))));
    }

    #[test]
    fn drain_arriving_forwarded_is_never_forwarded_again() {
        let mut d = drain(true, Mutations::NONE);
        d.poll();
        d.handle_walked(Ok(Some("sin.4".parse().unwrap())));
        let DrainPoll::Done(Err(e)) = d.poll() else {
            panic!("expected a refusal")
        };
        assert!(matches!(e.kind, ErrorKind::Unavailable { ref dc } if dc.as_str() == "sin"));
    }

    #[test]
    fn drain_of_a_key_never_reserved_is_unknown() {
        let mut d = drain(false, Mutations::NONE);
        d.poll();
        d.handle_walked(Ok(None));
        let DrainPoll::Done(Err(e)) = d.poll() else {
            panic!("expected an error")
        };
        assert_eq!(e.kind, ErrorKind::UnknownReservation);
    }

    #[test]
    fn drain_of_a_local_tail_updates_it() {
        let mut d = drain(true, Mutations::NONE);
        d.poll();
        d.handle_walked(Ok(Some("iad.2".parse().unwrap())));
        assert!(
            matches!(d.poll(), DrainPoll::Store(StoreOp::Read(id)) if id.to_string() == "iad.2")
        );
    }

    #[cfg(feature = "mutations")]
    #[test]
    fn drain_mutant_forwarded_twice_forwards_a_forwarded_drain() {
        let mut d = drain(true, Mutations::NONE.with(Mutation::DrainForwardedTwice));
        d.poll();
        d.handle_walked(Ok(Some("sin.4".parse().unwrap())));
        assert!(matches!(d.poll(), DrainPoll::Forward { .. }));
    }
}
