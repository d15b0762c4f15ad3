//! The router's walk: how an edge router resolves one key, sans-IO. The
//! Resolver (homing-client) and the simulated routers both drive it; they
//! keep only the I/O (which address of a DC, timeouts, suspicion) and the
//! storage of what the router remembers ([`RouterMemory`]).
//!
//! It wraps a [`ChainWalk`] (which checks every answer against the chain)
//! and decides what the chain walk leaves to its driver:
//!
//! - which answers to use: a remembered global entry (entries never
//!   change); a remembered `NotFound` while it is younger than the absent
//!   ttl; the furthest member a walk proved, as the hint the walk starts at;
//!   a remembered succession;
//! - the global read: the DCs in the router's order (nearest first), the
//!   next one when one gives no answer or an error; a DC that answers with
//!   the entry and owns it sends the entry's segment in the same reply,
//!   used when the walk needs exactly that reservation and checked as
//!   spoken by the DC that answered;
//! - a silent owner: a DC that gives no answer for the reservation the walk
//!   needs (or answers that it cannot now) is gone around through the
//!   reservation's succession in the global store (DESIGN.md §7.5), asked of
//!   the other DCs in order; none: the owner's silence is the answer
//!   ([`RouterPoll::Unavailable`]), never `NotFound`;
//! - what to remember: the entry, the `NotFound`, the furthest member, a
//!   succession or its absence.
//!
//! Driving loop: `poll`; on [`RouterPoll::Ask`] send the request to the DC
//! in that slot of the router's DC table and hand back
//! [`RouterWalk::handle_reply`] or, if it gave no answer (timeout, refused
//! connection, or not sent because the driver holds the DC suspect),
//! [`RouterWalk::handle_silence`]; the other polls end the walk. Time is a
//! parameter: the walk never reads a clock.
//!
//! Single-flight (concurrent resolves of one key share one walk) and the
//! answer cache stay with the driver: they are about tasks and storage.

use std::time::{Duration, Instant};

use crate::chain::{ChainError, ChainNeed, ChainPoll, ChainWalk, Source, Walked};
use crate::dc::DcId;
use crate::key::Key;
use crate::link::{Shortcut, Succession};
use crate::mutation::{Mutation, Mutations};
use crate::reachability::DcSlot;
use crate::reservation::ReservationId;
use crate::wire::{ErrorKind, Reply, Request};

/// What a router remembers about the key a walk resolves (its driver's
/// caches, seen through the walk's key).
pub trait RouterMemory {
    /// The key's global entry.
    fn entry(&self) -> Option<ReservationId>;
    /// When a walk last found the key without a global entry.
    fn absent_since(&self) -> Option<Instant>;
    /// The furthest member of the key's chain a walk proved.
    fn member(&self) -> Option<Shortcut>;
    /// The global store's succession of `at`.
    fn succession(&self, at: &ReservationId) -> Option<Succession>;
    /// When a DC last answered that `at` has no succession.
    fn no_succession_since(&self, at: &ReservationId) -> Option<Instant>;
    /// Remember `fact`.
    fn learn(&mut self, fact: Learned);
}

/// A fact a walk learned, for its driver to remember.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    /// The key's global entry (immutable: remember until evicted).
    Entry(ReservationId),
    /// The key has no global entry, as of this instant.
    Absent(Instant),
    /// A member of the key's chain past the one remembered (members stay
    /// members: remember until evicted).
    Member(Shortcut),
    /// A succession (write-once: remember until evicted).
    Succession(Succession),
    /// The reservation has no succession, as of this instant.
    NoSuccession(ReservationId, Instant),
}

/// A DC needed for the answer did not give one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The DC.
    pub dc: DcId,
    /// Why.
    pub reason: String,
    /// Not asked: the driver held the DC suspect.
    pub suspect: bool,
}

/// What the walk needs, or how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterPoll {
    /// Send `request` to the DC in `slot` of the router's DC table.
    Ask {
        /// Where in the router's DC table.
        slot: DcSlot,
        /// What to send.
        request: Request,
    },
    /// The chain, walked to its tail.
    Found(Walked),
    /// The key has no global entry: it was never reserved.
    NotFound,
    /// A DC needed for the answer did not give one.
    Unavailable(Unavailable),
    /// An answer contradicted the chain or the request.
    Failed(ChainError),
}

#[derive(Debug, Clone)]
enum Phase {
    /// Reading the global entry: `next` is the slot to ask next; `last`
    /// how the DC before it failed.
    Global {
        next: usize,
        last: Option<RouterPoll>,
    },
    /// Asking owners along the chain.
    Chain,
    /// The owner in `slot` gave no answer for the reservation the walk needs.
    Silent {
        slot: usize,
        silence: Unavailable,
    },
    /// Asking the DCs other than the silent owner, from `next`, for `at`'s succession.
    Successor {
        at: ReservationId,
        silent_slot: usize,
        silence: Unavailable,
        next: usize,
    },
    Ended(RouterPoll),
}

/// One key's resolve at a router. See the module docs for the driving loop.
#[derive(Debug, Clone)]
pub struct RouterWalk {
    walk: ChainWalk,
    absent_ttl: Duration,
    phase: Phase,
    /// The slot of the last [`RouterPoll::Ask`].
    asked: usize,
    /// The `NotFound` came from memory.
    absent_reused: bool,
    mutations: Mutations,
}

impl RouterWalk {
    /// A walk of `key`'s chain, starting at the member `memory` remembers;
    /// `NotFound`s younger than `absent_ttl` are reused.
    pub fn new(
        key: Key,
        hop_limit: usize,
        absent_ttl: Duration,
        memory: &impl RouterMemory,
        mutations: Mutations,
    ) -> RouterWalk {
        RouterWalk {
            walk: ChainWalk::from_key(key, hop_limit).with_hint(memory.member()),
            absent_ttl,
            phase: Phase::Global {
                next: 0,
                last: None,
            },
            asked: 0,
            absent_reused: false,
            mutations,
        }
    }

    /// The key resolved.
    pub fn key(&self) -> &Key {
        self.walk.key()
    }

    /// Whether the walk ended `NotFound` from memory, asking no DC.
    pub fn absent_reused(&self) -> bool {
        self.absent_reused
    }

    /// What the walk needs from `dcs` (the router's DC table, nearest
    /// first), or how it ended. `now`: the router's clock.
    pub fn poll(
        &mut self,
        dcs: &[DcId],
        memory: &mut impl RouterMemory,
        now: Instant,
    ) -> RouterPoll {
        loop {
            match &mut self.phase {
                Phase::Ended(end) => return end.clone(),
                Phase::Silent { slot, silence } => {
                    let (slot, silence) = (*slot, silence.clone());
                    self.phase = Phase::Chain;
                    // `None`: a consult given up, the walk goes on; an
                    // error: the walk failed. Either way poll again.
                    if let Ok(Some(at)) = self.walk.handle_unreachable() {
                        self.around_silent(at, slot, silence, memory, now);
                    }
                }
                Phase::Successor {
                    at,
                    silent_slot,
                    silence,
                    next,
                } => {
                    if *next == *silent_slot {
                        *next += 1;
                    }
                    if *next >= dcs.len() {
                        let end = RouterPoll::Unavailable(silence.clone());
                        self.phase = Phase::Ended(end);
                        continue;
                    }
                    self.asked = *next;
                    let request = Request::Successor {
                        key: self.walk.key().clone(),
                        id: at.clone(),
                    };
                    return RouterPoll::Ask {
                        slot: DcSlot(*next),
                        request,
                    };
                }
                Phase::Global { .. } | Phase::Chain => {
                    if let Some(ask) = self.chain_step(dcs, memory, now) {
                        return ask;
                    }
                }
            }
        }
    }

    /// One step of the chain walk: an answer from memory (`None`: poll
    /// again), a request, or the end (kept as the phase).
    fn chain_step(
        &mut self,
        dcs: &[DcId],
        memory: &mut impl RouterMemory,
        now: Instant,
    ) -> Option<RouterPoll> {
        match self.walk.poll().clone() {
            ChainPoll::Need(ChainNeed::GlobalEntry(key)) => {
                if let Some(entry) = memory.entry() {
                    let _ = self.walk.handle_global(Some(entry), Source::Cache);
                    return None;
                }
                if memory.absent_since().is_some_and(|at| {
                    self.mutations.has(Mutation::RouterAbsentNeverStale)
                        || now.saturating_duration_since(at) < self.absent_ttl
                }) {
                    self.absent_reused = true;
                    let _ = self.walk.handle_global(None, Source::Cache);
                    return None;
                }
                let (next, last) = match &mut self.phase {
                    Phase::Global { next, last } => (*next, last.take()),
                    _ => (0, None),
                };
                if next >= dcs.len() {
                    let end = last.unwrap_or_else(|| {
                        RouterPoll::Failed(ChainError::Inconsistent {
                            dc: "router".to_string(),
                            reason: "no dc configured".to_string(),
                        })
                    });
                    self.phase = Phase::Ended(end);
                    return None;
                }
                self.phase = Phase::Global { next, last: None };
                self.asked = next;
                Some(RouterPoll::Ask {
                    slot: DcSlot(next),
                    request: Request::Resolve { key },
                })
            }
            ChainPoll::Need(ChainNeed::Reservation(id)) => {
                self.phase = Phase::Chain;
                let Some(slot) = dcs.iter().position(|dc| dc == id.dc()) else {
                    self.phase = Phase::Ended(RouterPoll::Unavailable(Unavailable {
                        dc: id.dc().clone(),
                        reason: "not in this router's dc table".to_string(),
                        suspect: false,
                    }));
                    return None;
                };
                self.asked = slot;
                Some(RouterPoll::Ask {
                    slot: DcSlot(slot),
                    request: Request::ResolveReservation { id },
                })
            }
            ChainPoll::NotFound => {
                if !self.absent_reused {
                    memory.learn(Learned::Absent(now));
                }
                self.phase = Phase::Ended(RouterPoll::NotFound);
                None
            }
            ChainPoll::Done(walked) => {
                let member = walked.hint();
                if member.is_past(memory.member().as_ref()) {
                    memory.learn(Learned::Member(member));
                }
                self.phase = Phase::Ended(RouterPoll::Found(walked));
                None
            }
            ChainPoll::Failed(e) => {
                self.phase = Phase::Ended(RouterPoll::Failed(e));
                None
            }
        }
    }

    /// The owner in `slot` of `at`, the reservation the walk stands at,
    /// gave no answer (`silence`): its remembered succession, else ask
    /// the other DCs for it, unless one answered lately that there is none.
    fn around_silent(
        &mut self,
        at: ReservationId,
        slot: usize,
        silence: Unavailable,
        memory: &impl RouterMemory,
        now: Instant,
    ) {
        if let Some(known) = memory.succession(&at) {
            let _ = self
                .walk
                .handle_successor(known.link, memory.member(), Source::Cache);
            return;
        }
        if memory
            .no_succession_since(&at)
            .is_some_and(|since| now.saturating_duration_since(since) < self.absent_ttl)
        {
            self.phase = Phase::Ended(RouterPoll::Unavailable(silence));
            return;
        }
        self.phase = Phase::Successor {
            at,
            silent_slot: slot,
            silence,
            next: 0,
        };
    }

    /// The DC asked last (in `dcs`, the table `poll` was given) answered `reply`.
    pub fn handle_reply(
        &mut self,
        dcs: &[DcId],
        reply: Reply,
        memory: &mut impl RouterMemory,
        now: Instant,
    ) {
        let slot = self.asked;
        let Some(answered_by) = dcs.get(slot) else {
            return;
        };
        match std::mem::replace(&mut self.phase, Phase::Chain) {
            Phase::Global { next, .. } => match reply {
                Reply::Resolved { entry, segment } => {
                    if let Some(id) = &entry {
                        memory.learn(Learned::Entry(id.clone()));
                    }
                    let step = self.walk.handle_global(entry.clone(), Source::Remote);
                    // Used unless a hint sent the walk elsewhere; checked as
                    // spoken by the DC that answered, so a DC speaking for
                    // another DC's reservation is caught by the chain walk.
                    if let (Ok(()), Some(entry), Some(segment)) = (step, entry, segment)
                        && self.walk.poll() == &ChainPoll::Need(ChainNeed::Reservation(entry))
                    {
                        let _ = self
                            .walk
                            .handle_segment(answered_by, segment, Source::Local);
                    }
                }
                other => {
                    let last = Some(refused(answered_by, "resolve", other));
                    self.phase = Phase::Global {
                        next: next + 1,
                        last,
                    };
                }
            },
            Phase::Chain => match reply {
                Reply::Reservation(segment) => {
                    let _ = self
                        .walk
                        .handle_segment(answered_by, segment, Source::Remote);
                }
                // The owner has no usable record of it: a shortcut that
                // does not hold up (the walk falls back), or a contradiction.
                Reply::Error(e) if e.kind.disowns() => {
                    let _ = self.walk.handle_disowned(answered_by, Source::Remote);
                }
                other => {
                    self.phase = match refused(answered_by, "resolve_reservation", other) {
                        RouterPoll::Unavailable(silence) => Phase::Silent { slot, silence },
                        end => Phase::Ended(end),
                    }
                }
            },
            Phase::Successor {
                at,
                silent_slot,
                silence,
                next,
            } => match reply {
                Reply::Successor {
                    succession: Some(succession),
                    hint,
                } if succession.link.from == at => {
                    let hint = Shortcut::furthest(memory.member(), hint);
                    let link = succession.link.clone();
                    memory.learn(Learned::Succession(succession));
                    let _ = self.walk.handle_successor(link, hint, Source::Remote);
                }
                Reply::Successor {
                    succession: None, ..
                } => {
                    memory.learn(Learned::NoSuccession(at, now));
                    self.phase = Phase::Ended(RouterPoll::Unavailable(silence));
                }
                // Silent or confused: ask the next.
                _ => {
                    self.phase = Phase::Successor {
                        at,
                        silent_slot,
                        silence,
                        next: next + 1,
                    }
                }
            },
            // Nothing was asked: the reply is not the walk's.
            other => self.phase = other,
        }
    }

    /// The DC asked last gave no answer (`reason`; `suspect`: not sent,
    /// the driver holds it suspect).
    pub fn handle_silence(&mut self, dcs: &[DcId], reason: String, suspect: bool) {
        let slot = self.asked;
        let Some(dc) = dcs.get(slot) else {
            return;
        };
        let silence = Unavailable {
            dc: dc.clone(),
            reason,
            suspect,
        };
        self.phase = match std::mem::replace(&mut self.phase, Phase::Chain) {
            Phase::Global { .. } if self.mutations.has(Mutation::RouterSilenceIsAbsent) => {
                let _ = self.walk.handle_global(None, Source::Remote);
                Phase::Chain
            }
            Phase::Global { next, .. } => Phase::Global {
                next: next + 1,
                last: Some(RouterPoll::Unavailable(silence)),
            },
            Phase::Chain => Phase::Silent { slot, silence },
            Phase::Successor {
                at,
                silent_slot,
                silence,
                next,
            } => Phase::Successor {
                at,
                silent_slot,
                silence,
                next: next + 1,
            },
            other => other,
        };
    }
}

/// How a DC's reply other than the one asked for ends the ask: a DC that
/// cannot answer now is unavailable; anything else contradicts the request.
fn refused(answered_by: &DcId, request: &str, reply: Reply) -> RouterPoll {
    let inconsistent = |reason: String| {
        RouterPoll::Failed(ChainError::Inconsistent {
            dc: answered_by.to_string(),
            reason,
        })
    };
    match reply {
        Reply::Error(e) => match e.kind {
            ErrorKind::Unavailable { dc } => RouterPoll::Unavailable(Unavailable {
                dc,
                reason: e.message,
                suspect: false,
            }),
            ErrorKind::Overloaded | ErrorKind::Internal => RouterPoll::Unavailable(Unavailable {
                dc: answered_by.clone(),
                reason: e.to_string(),
                suspect: false,
            }),
            _ => inconsistent(format!("answered {e} to {request}")),
        },
        other => {
            let reply: String = format!("{other:?}").chars().take(200).collect();
            inconsistent(format!("answered {reply} to {request}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::{HOP_LIMIT_DEFAULT, Segment};
    use crate::fencing::FencingToken;
    use crate::key::KeyName;
    use crate::link::{Link, SuccessionCause};
    use crate::record::{TailState, TailView};
    use crate::wire::ErrorReply;
    use std::collections::BTreeMap;

    const TTL: Duration = Duration::from_millis(250);

    /// A router's memory of the key `room`.
    #[derive(Default)]
    struct Remembered {
        entry: Option<ReservationId>,
        absent: Option<Instant>,
        member: Option<Shortcut>,
        successions: BTreeMap<ReservationId, Succession>,
        no_succession: BTreeMap<ReservationId, Instant>,
        learned: Vec<Learned>,
    }

    impl RouterMemory for Remembered {
        fn entry(&self) -> Option<ReservationId> {
            self.entry.clone()
        }
        fn absent_since(&self) -> Option<Instant> {
            self.absent
        }
        fn member(&self) -> Option<Shortcut> {
            self.member.clone()
        }
        fn succession(&self, at: &ReservationId) -> Option<Succession> {
            self.successions.get(at).cloned()
        }
        fn no_succession_since(&self, at: &ReservationId) -> Option<Instant> {
            self.no_succession.get(at).copied()
        }
        fn learn(&mut self, fact: Learned) {
            match &fact {
                Learned::Entry(id) => self.entry = Some(id.clone()),
                Learned::Absent(at) => self.absent = Some(*at),
                Learned::Member(m) => self.member = Some(m.clone()),
                Learned::Succession(s) => {
                    self.successions.insert(s.link.from.clone(), s.clone());
                }
                Learned::NoSuccession(id, at) => {
                    self.no_succession.insert(id.clone(), *at);
                }
            }
            self.learned.push(fact);
        }
    }

    fn id(text: &str) -> ReservationId {
        text.parse().unwrap()
    }

    fn dcs() -> Vec<DcId> {
        ["iad", "fra", "sin"]
            .iter()
            .map(|d| DcId::new(d).unwrap())
            .collect()
    }

    fn key() -> Key {
        Key::new(KeyName::new("room").unwrap())
    }

    fn live(at: &str, token: u64) -> TailView {
        TailView {
            tag: None,
            id: id(at),
            token: FencingToken::new(token),
            state: TailState::Active {
                actor: crate::ActorId::new("10.0.0.1:9000").unwrap(),
            },
        }
    }

    fn tail_segment(at: &str, token: u64) -> Segment {
        Segment {
            key: key(),
            links: vec![],
            tail: Some(live(at, token)),
            shortcut: None,
        }
    }

    fn link(from: &str, to: &str, token: u64) -> Link {
        Link {
            from: id(from),
            to: id(to),
            token: FencingToken::new(token),
        }
    }

    fn knowing_entry(at: &str) -> Remembered {
        Remembered {
            entry: Some(id(at)),
            ..Remembered::default()
        }
    }

    fn walk(memory: &Remembered) -> RouterWalk {
        RouterWalk::new(key(), HOP_LIMIT_DEFAULT, TTL, memory, Mutations::NONE)
    }

    fn asks(poll: RouterPoll, slot: usize) -> Request {
        match poll {
            RouterPoll::Ask { slot: s, request } if s.0 == slot => request,
            other => panic!("expected an ask of slot {slot}, got {other:?}"),
        }
    }

    fn found(poll: RouterPoll) -> Walked {
        match poll {
            RouterPoll::Found(walked) => walked,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    fn unavailable() -> Reply {
        Reply::Error(ErrorReply::new(
            ErrorKind::Unavailable {
                dc: DcId::new("fra").unwrap(),
            },
            "dc lease lapsed",
        ))
    }

    #[test]
    fn a_cold_walk_reads_the_entry_and_uses_its_segment_from_the_dc_that_owns_it() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = Remembered::default();
        let mut w = walk(&memory);
        let request = asks(w.poll(&dcs, &mut memory, now), 0);
        assert_eq!(request, Request::Resolve { key: key() });
        let reply = Reply::Resolved {
            entry: Some(id("iad.1")),
            segment: Some(tail_segment("iad.1", 1)),
        };
        w.handle_reply(&dcs, reply, &mut memory, now);
        let walked = found(w.poll(&dcs, &mut memory, now));
        assert_eq!(walked.tail.id, id("iad.1"));
        assert_eq!(memory.entry, Some(id("iad.1")));
        assert_eq!(memory.member.as_ref().map(|m| &m.to), Some(&id("iad.1")));
        // The next walk starts from memory: it asks only the tail's owner.
        let mut w = walk(&memory);
        let request = asks(w.poll(&dcs, &mut memory, now), 0);
        assert_eq!(request, Request::ResolveReservation { id: id("iad.1") });
    }

    #[test]
    fn a_segment_is_checked_as_spoken_by_the_dc_that_answered() {
        // iad answers the global read with fra's reservation and a segment
        // for it: iad cannot speak for fra's reservation.
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = Remembered::default();
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 0);
        let reply = Reply::Resolved {
            entry: Some(id("fra.1")),
            segment: Some(tail_segment("fra.1", 1)),
        };
        w.handle_reply(&dcs, reply, &mut memory, now);
        match w.poll(&dcs, &mut memory, now) {
            RouterPoll::Failed(ChainError::Inconsistent { dc, reason }) => {
                assert_eq!(dc, "iad");
                assert!(reason.contains("owned by another dc"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_global_read_goes_to_the_next_dc_and_silence_is_never_not_found() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = Remembered::default();
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 0);
        w.handle_silence(&dcs, "timed out".to_string(), false);
        asks(w.poll(&dcs, &mut memory, now), 1);
        w.handle_reply(&dcs, unavailable(), &mut memory, now);
        asks(w.poll(&dcs, &mut memory, now), 2);
        w.handle_silence(&dcs, "suspect".to_string(), true);
        match w.poll(&dcs, &mut memory, now) {
            RouterPoll::Unavailable(u) => {
                assert_eq!(u.dc.as_str(), "sin");
                assert!(u.suspect);
            }
            other => panic!("{other:?}"),
        }
        assert!(memory.learned.is_empty(), "{:?}", memory.learned);
    }

    #[test]
    fn a_not_found_is_reused_for_the_absent_ttl_and_not_after() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = Remembered::default();
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 0);
        let reply = Reply::Resolved {
            entry: None,
            segment: None,
        };
        w.handle_reply(&dcs, reply, &mut memory, now);
        assert_eq!(w.poll(&dcs, &mut memory, now), RouterPoll::NotFound);
        assert!(!w.absent_reused());
        assert_eq!(memory.absent, Some(now));
        let soon = now + TTL / 2;
        let mut w = walk(&memory);
        assert_eq!(w.poll(&dcs, &mut memory, soon), RouterPoll::NotFound);
        assert!(w.absent_reused());
        let later = now + TTL;
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, later), 0);
    }

    #[test]
    fn a_silent_owner_is_gone_around_through_its_succession_asked_of_the_others() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = knowing_entry("fra.1");
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 1);
        w.handle_silence(&dcs, "timed out".to_string(), false);
        // The silent owner (slot 1) is not asked; iad gives no answer, sin does.
        let request = asks(w.poll(&dcs, &mut memory, now), 0);
        assert_eq!(
            request,
            Request::Successor {
                key: key(),
                id: id("fra.1")
            }
        );
        w.handle_silence(&dcs, "timed out".to_string(), false);
        asks(w.poll(&dcs, &mut memory, now), 2);
        let succession = Succession {
            link: link("fra.1", "sin.4", 3),
            cause: SuccessionCause::TakenOver,
        };
        let reply = Reply::Successor {
            succession: Some(succession.clone()),
            hint: None,
        };
        w.handle_reply(&dcs, reply, &mut memory, now);
        let request = asks(w.poll(&dcs, &mut memory, now), 2);
        assert_eq!(request, Request::ResolveReservation { id: id("sin.4") });
        w.handle_reply(
            &dcs,
            Reply::Reservation(tail_segment("sin.4", 4)),
            &mut memory,
            now,
        );
        assert_eq!(found(w.poll(&dcs, &mut memory, now)).links.len(), 1);
        assert_eq!(memory.successions.get(&id("fra.1")), Some(&succession));
        // Remembered: the next walk around fra asks nobody for it.
        let mut memory = Remembered {
            member: None,
            ..memory
        };
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 1);
        w.handle_reply(&dcs, unavailable(), &mut memory, now);
        let request = asks(w.poll(&dcs, &mut memory, now), 2);
        assert_eq!(request, Request::ResolveReservation { id: id("sin.4") });
    }

    #[test]
    fn no_succession_leaves_the_owners_silence_as_the_answer_for_the_absent_ttl() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = knowing_entry("fra.1");
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 1);
        w.handle_silence(&dcs, "timed out".to_string(), false);
        asks(w.poll(&dcs, &mut memory, now), 0);
        let none = Reply::Successor {
            succession: None,
            hint: None,
        };
        w.handle_reply(&dcs, none, &mut memory, now);
        let silent = |poll: RouterPoll| match poll {
            RouterPoll::Unavailable(u) => assert_eq!(u.dc.as_str(), "fra"),
            other => panic!("{other:?}"),
        };
        silent(w.poll(&dcs, &mut memory, now));
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 1);
        w.handle_silence(&dcs, "suspect".to_string(), true);
        silent(w.poll(&dcs, &mut memory, now));
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now + TTL), 1);
        w.handle_silence(&dcs, "suspect".to_string(), true);
        asks(w.poll(&dcs, &mut memory, now + TTL), 0);
    }

    #[test]
    fn an_unexpected_reply_fails_the_walk() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = knowing_entry("iad.1");
        let mut w = walk(&memory);
        asks(w.poll(&dcs, &mut memory, now), 0);
        w.handle_reply(&dcs, Reply::Drained, &mut memory, now);
        assert!(matches!(
            w.poll(&dcs, &mut memory, now),
            RouterPoll::Failed(ChainError::Inconsistent { .. })
        ));
    }

    #[test]
    fn a_reservation_outside_the_table_is_unavailable() {
        let (dcs, now) = (dcs(), Instant::now());
        let mut memory = knowing_entry("syd.1");
        let mut w = walk(&memory);
        match w.poll(&dcs, &mut memory, now) {
            RouterPoll::Unavailable(u) => assert_eq!(u.dc.as_str(), "syd"),
            other => panic!("{other:?}"),
        }
    }
}
