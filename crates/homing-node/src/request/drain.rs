//! Drain (an operator's `Drain { key }`): find the key's tail and stop its
//! renewals there, as a sans-IO stepper. A DC drains a tail it owns itself
//! and forwards the drain once to the tail's DC otherwise; a drain that
//! arrives forwarded and finds the tail moved on again answers
//! `Unavailable` naming the new tail's DC instead of forwarding again, so
//! one operator request costs at most one forward and never bounces
//! between DCs while a key moves.
//!
//! The walk is homing-node's [`Walk`] (the entry's latest replica, the
//! node's hint, a disowned hint falls back to the entry), its effects the
//! drain's own.
//!
//! ```text
//! Walk ─ never reserved ─► Done(UnknownReservation)
//!   └ tail here ─► Update(Drain) ─► Done(ok)
//!   └ tail there ─ arrived forwarded ─► Done(Unavailable(tail's dc))
//!                └ from an operator ─► Forward to the tail's DC ─► Done(its answer)
//! ```

use homing_core::{
    DcId, ErrorKind, ErrorReply, Key, LeasePolicy, ReservationId, Segment, Shortcut, StoreTime,
};

use crate::request::change::Change;
use crate::request::update::Update;
use crate::request::walk::{Walk, WalkPoll};
use crate::step::effect::{GlobalAnswer, Stored, unasked};
use crate::step::event::NodeEvent;
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::{Mutation, Mutations};

#[derive(Debug)]
enum Phase {
    Walk(Box<Walk>),
    Update(Box<Update>),
    Forward(DcId),
    Done(Result<(), ErrorReply>),
    Over,
}

/// One drain in progress.
#[derive(Debug)]
pub struct Drain {
    dc: DcId,
    key: Key,
    forwarded: bool,
    policy: LeasePolicy,
    mutations: Mutations,
    /// The chain member the walk proved, for the node to remember.
    learned: Option<Shortcut>,
    /// The tail this drain changed here (its [`NodeEvent::Drained`]): not
    /// set when the tail was drained or ended already.
    drained: Option<ReservationId>,
    phase: Phase,
}

impl Drain {
    /// A drain of `key` at DC `dc`; `forwarded`: it came from another DC
    /// (a node), not from an operator. Its walk goes `hop_limit` hops at most;
    /// its update of the tail runs under the DC's lease `policy`.
    pub fn new(
        dc: DcId,
        key: Key,
        forwarded: bool,
        hop_limit: usize,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> Drain {
        let walk = Walk::new(dc.clone(), key.clone(), hop_limit);
        Drain {
            dc,
            key,
            forwarded,
            policy,
            mutations,
            learned: None,
            drained: None,
            phase: Phase::Walk(Box::new(walk)),
        }
    }

    /// The key drained.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Starts the walk at `hint`, the chain member the node remembers.
    pub fn with_hint(mut self, hint: Option<Shortcut>) -> Drain {
        if let Phase::Walk(walk) = self.phase {
            self.phase = Phase::Walk(Box::new(walk.with_hint(hint)));
        }
        self
    }

    /// The chain member the walk proved (its furthest), once: what the
    /// node remembers as the key's hint.
    fn take_learned(&mut self) -> Option<Shortcut> {
        self.learned.take()
    }

    /// Whether it came from another DC (a node), not from an operator.
    pub fn forwarded(&self) -> bool {
        self.forwarded
    }

    /// Whether the peer request asked is the walk's [`Effect::Segment`]
    /// (not the [`Effect::Forward`]).
    pub fn asks_segment(&self) -> bool {
        matches!(&self.phase, Phase::Walk(walk) if matches!(walk.poll(), WalkPoll::Segment(_)))
    }

    /// What to do next; `Done` is handed out once.
    fn next(&mut self) -> Step<<Drain as Stepper>::Output> {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Walk(walk) => match walk.poll() {
                WalkPoll::Global(op) => {
                    self.phase = Phase::Walk(walk);
                    Step::Ask(Effect::Global(op))
                }
                WalkPoll::Segment(id) => {
                    self.phase = Phase::Walk(walk);
                    Step::Ask(Effect::Segment(id))
                }
                WalkPoll::Done(walked) => {
                    self.learned = walked
                        .as_ref()
                        .ok()
                        .and_then(|w| w.as_ref())
                        .map(|w| w.hint());
                    self.walked(walked.map(|w| w.map(|w| w.tail.id)));
                    self.next()
                }
            },
            Phase::Update(mut update) => {
                let step = match update.next() {
                    Step::Ask(effect) => Step::Ask(effect),
                    Step::Done(Ok(changed)) => {
                        if changed.made() {
                            self.drained = Some(update.id().clone());
                        }
                        return Step::Done(Ok(()));
                    }
                    Step::Done(Err(e)) => return Step::Done(Err(e.reply())),
                };
                self.phase = Phase::Update(update);
                step
            }
            Phase::Forward(dc) => {
                self.phase = Phase::Forward(dc.clone());
                Step::Ask(Effect::Forward {
                    dc,
                    key: self.key.clone(),
                })
            }
            Phase::Done(result) => Step::Done(result),
            Phase::Over => panic!("drain of {} polled after it ended", self.key),
        }
    }

    /// The answer to the walk's [`Effect::Global`], or why there is none.
    pub fn handle_global(&mut self, answer: Result<GlobalAnswer, Failure>) {
        self.walking().handle_global(answer);
    }

    /// The answer to the walk's [`Effect::Segment`], or why there is none.
    pub fn handle_segment(&mut self, answer: Result<Segment, Failure>) {
        self.walking().handle_segment(answer);
    }

    fn walking(&mut self) -> &mut Walk {
        let Phase::Walk(walk) = &mut self.phase else {
            panic!("drain of {}: a walk's answer while not walking", self.key);
        };
        walk
    }

    /// The key's tail as the walk found it (`None`: never reserved), or why not.
    fn walked(&mut self, tail: Result<Option<ReservationId>, Failure>) {
        self.phase = match tail {
            Err(failure) => Phase::Done(Err(failure.into_reply())),
            Ok(None) => Phase::Done(Err(ErrorReply::new(
                ErrorKind::UnknownReservation,
                format!("key {} was never reserved", self.key),
            ))),
            Ok(Some(tail)) if tail.dc() == &self.dc => {
                let (dc, policy) = (self.dc.clone(), self.policy);
                let update = Update::new(dc, tail, Change::Drain, policy, self.mutations);
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

    /// The answer to the store operation asked, at `now` (store clock), or why
    /// it failed (the drain fails with it).
    pub fn handle_stored(&mut self, stored: Result<Stored, Failure>, now: StoreTime) {
        let Phase::Update(update) = &mut self.phase else {
            panic!("drain: a store answer it did not ask for");
        };
        match stored {
            Ok(stored) => update.handle_stored(stored, now),
            Err(failure) => self.phase = Phase::Done(Err(failure.into_reply())),
        }
    }

    /// What the tail's DC answered the forwarded drain.
    pub fn handle_forwarded(&mut self, answer: Result<(), Failure>) {
        assert!(
            matches!(self.phase, Phase::Forward(_)),
            "drain: a forward it did not ask for"
        );
        self.phase = Phase::Done(answer.map_err(Failure::into_reply));
    }
}

/// Drained (here or at the tail's DC), or why not; a tail this DC changed
/// is noted as [`NodeEvent::Drained`].
impl Stepper for Drain {
    type Output = Result<(), ErrorReply>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        self.next()
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Stored(stored) => self.handle_stored(stored, now.store),
            Answer::Global(global) => self.handle_global(global),
            Answer::Segment(segment) => self.handle_segment(segment),
            Answer::Forwarded(forwarded) => self.handle_forwarded(forwarded),
            other => unasked("drain", &other),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        if let Some(member) = self.take_learned() {
            let key = self.key.clone();
            return Some(NodeEvent::Learned { key, member });
        }
        self.drained.take().map(NodeEvent::Drained)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::effect::StoreOp;

    fn key() -> Key {
        Key::new(homing_core::KeyName::new("k").unwrap())
    }

    /// A drain whose walk has not asked anything yet.
    fn drain(forwarded: bool, mutations: Mutations) -> Drain {
        Drain::new(
            "iad".parse().unwrap(),
            key(),
            forwarded,
            16,
            crate::fixture::POLICY,
            mutations,
        )
    }

    #[test]
    fn drain_from_an_operator_is_forwarded_once_to_the_tails_dc() {
        let mut d = drain(false, Mutations::NONE);
        assert!(matches!(
            d.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Global(_))
        ));
        d.walked(Ok(Some("fra.3".parse().unwrap())));
        let Step::Ask(Effect::Forward { dc, .. }) = d.step(NodeTime::from_us(0)) else {
            panic!("expected a forward")
        };
        assert_eq!(dc.as_str(), "fra");
        d.handle_forwarded(Ok(()));
        assert!(matches!(d.step(NodeTime::from_us(0)), Step::Done(Ok(()))));
    }

    #[test]
    fn drain_arriving_forwarded_is_never_forwarded_again() {
        let mut d = drain(true, Mutations::NONE);
        d.step(NodeTime::from_us(0));
        d.walked(Ok(Some("sin.4".parse().unwrap())));
        let Step::Done(Err(e)) = d.step(NodeTime::from_us(0)) else {
            panic!("expected a refusal")
        };
        assert!(matches!(e.kind, ErrorKind::Unavailable { ref dc } if dc.as_str() == "sin"));
    }

    #[test]
    fn drain_of_a_key_never_reserved_is_unknown() {
        let mut d = drain(false, Mutations::NONE);
        d.step(NodeTime::from_us(0));
        d.walked(Ok(None));
        let Step::Done(Err(e)) = d.step(NodeTime::from_us(0)) else {
            panic!("expected an error")
        };
        assert_eq!(e.kind, ErrorKind::UnknownReservation);
    }

    #[test]
    fn drain_of_a_local_tail_updates_it() {
        let mut d = drain(true, Mutations::NONE);
        d.step(NodeTime::from_us(0));
        d.walked(Ok(Some("iad.2".parse().unwrap())));
        assert!(
            matches!(d.step(NodeTime::from_us(0)), Step::Ask(Effect::Store(StoreOp::Read(id))) if id.to_string() == "iad.2")
        );
    }

    /// The tail drained here is noted once, when this drain changed it;
    /// a tail drained already is answered alike but noted by nobody.
    #[test]
    fn drain_notes_the_tail_it_drained_and_only_a_change() {
        let now = Now {
            node: NodeTime::from_us(1_000),
            store: StoreTime::from_ms(1),
        };
        let tail = crate::fixture::held("iad.2", "k", None, now.store);
        let drained = tail.drain(None).expect("a held tail drains");
        for (record, noted) in [(tail, true), (drained, false)] {
            let mut d = drain(true, Mutations::NONE);
            d.step(NodeTime::from_us(0));
            d.walked(Ok(Some(record.id.clone())));
            let mut answer = Stored::Record(Some(homing_core::RecordRead::alone(record.clone())));
            let outcome = loop {
                d.answer(Answer::Stored(Ok(answer)), now);
                match d.step(now.node) {
                    Step::Ask(Effect::Store(StoreOp::Write { .. })) => {
                        answer = Stored::Written(homing_core::Written::Yes)
                    }
                    Step::Ask(other) => panic!("a local drain asks {other:?}"),
                    Step::Done(outcome) => break outcome,
                }
            };
            assert_eq!(outcome, Ok(()));
            let events: Vec<_> = std::iter::from_fn(|| d.poll_event()).collect();
            let expected = noted.then(|| NodeEvent::Drained(record.id.clone()));
            assert_eq!(events, Vec::from_iter(expected), "changed: {noted}");
        }
    }

    #[test]
    fn drain_walks_from_the_nodes_hint_and_hands_back_the_member_it_proved() {
        use homing_core::{FencingToken, LocalSegment};
        let now = StoreTime::from_ms(1);
        let tail = crate::fixture::held("iad.7", "k", Some("fra.2"), now);
        let mut local = LocalSegment::new("iad".parse().unwrap(), tail.id.clone(), 16);
        while local.need().is_some() {
            local
                .handle(Some(&tail), now, &crate::fixture::POLICY, None)
                .unwrap();
        }
        let hint = Shortcut {
            to: tail.id.clone(),
            token: FencingToken::FIRST,
        };
        let mut d = drain(false, Mutations::NONE).with_hint(Some(hint));
        assert!(matches!(
            d.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Global(_))
        ));
        d.handle_global(Ok(GlobalAnswer::Entry(Some("fra.2".parse().unwrap()))));
        let Step::Ask(Effect::Segment(asked)) = d.step(NodeTime::from_us(0)) else {
            panic!("expected the hint's segment")
        };
        assert_eq!(asked, tail.id, "the hint, not the entry fra.2");
        d.handle_segment(Ok(local.finish()));
        assert!(
            matches!(d.step(NodeTime::from_us(0)), Step::Ask(Effect::Store(StoreOp::Read(id))) if id == tail.id)
        );
        assert_eq!(d.take_learned().map(|m| m.to), Some(tail.id));
    }

    #[cfg(feature = "mutations")]
    #[test]
    fn drain_mutant_forwarded_twice_forwards_a_forwarded_drain() {
        let mut d = drain(true, Mutations::NONE.with(Mutation::DrainForwardedTwice));
        d.step(NodeTime::from_us(0));
        d.walked(Ok(Some("sin.4".parse().unwrap())));
        assert!(matches!(
            d.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Forward { .. })
        ));
    }
}
