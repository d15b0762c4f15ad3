//! The chain walk as a sans-IO stepper: global entry → link → … → tail.
//!
//! A driver loops: [`ChainWalk::poll`] says what the walk needs next (the
//! key's global entry, or what a DC knows about a reservation); the driver
//! fetches it from a cache, its own store or a peer DC and hands the answer
//! back with `handle_*`, saying where it came from. The walk checks every
//! answer — it must be about the walk's key, a DC may only speak for
//! reservations it owns, links must continue where the walk stands, tokens
//! must rise along the chain, no reservation may repeat, the hop count is
//! bounded — and counts hops and remote round trips.
//!
//! Chains only grow, so walks take *shortcuts* (DESIGN.md §7.2): the owner
//! of a key's first reservation records a later member of the chain, and
//! answers with it; a walker may also start from a member it remembers
//! itself (a *hint*). A member stays a member forever (links never change),
//! so a shortcut can be old but never wrong — unless a DC lies. So a jump is
//! checked: the member's own DC must answer for a record of the same key
//! with at least the promised token, else the walk falls back to where it
//! jumped from and follows links. The hop limit bounds lies, not a key's
//! lifetime: an honest walk of a key moved any number of times is the entry's
//! answer, one jump, and the tail's answer.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dc::DcId;
use crate::fencing::FencingToken;
use crate::key::Key;
use crate::record::{TailState, TailView};
use crate::reservation::ReservationId;

// Their public paths from before `link`; other crates use `chain::Link`.
pub use crate::link::{Link, Shortcut};

/// Default bound on hops (links followed plus shortcuts taken) in one walk.
pub const HOP_LIMIT_DEFAULT: usize = 16;
/// Largest hop limit a caller may configure.
pub const HOP_LIMIT_MAX: usize = 256;

/// How long homingd reuses a resolve's "no global entry" (its
/// `absent_ttl_ms` default; DESIGN.md §7.4: well under a second), ms. The
/// simulated DCs use it too. A connect never reads it: only the global
/// write-once decides a create.
pub const NODE_ABSENT_TTL_MS_DEFAULT: u64 = 500;

/// How long the Resolver reuses a `NotFound` (its `absent_ttl_ms`
/// default), ms; the simulated routers use it too. A router's `NotFound`
/// may thus be this plus [`NODE_ABSENT_TTL_MS_DEFAULT`] old.
pub const RESOLVER_ABSENT_TTL_MS_DEFAULT: u64 = 250;

/// What one DC knows about a run of its own reservations: the links it
/// followed inside itself, then the tail if the chain ends there, and the
/// shortcut recorded on the first reservation asked about, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The key of every record in the segment.
    pub key: Key,
    /// Links in walk order; each `from` is owned by the answering DC.
    pub links: Vec<Link>,
    /// The tail, if the chain ends in the answering DC.
    pub tail: Option<TailView>,
    /// A later member of the chain, recorded on the first reservation.
    pub shortcut: Option<Shortcut>,
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// The caller's cache: no I/O.
    Cache,
    /// The caller's own store or DC: no network round trip.
    Local,
    /// A remote DC: one round trip.
    Remote,
}

impl Source {
    /// Where the answer came from, in words ("cache", "same reply", "round trip").
    pub fn words(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Local => "same reply",
            Source::Remote => "round trip",
        }
    }

    /// Where an answer by DC `answered_by` comes from for a caller at DC
    /// `local`: its own store, or a round trip.
    pub fn of_dc(local: &DcId, answered_by: &DcId) -> Source {
        if local == answered_by {
            Source::Local
        } else {
            Source::Remote
        }
    }
}

/// What the walk needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainNeed {
    /// The key's global entry.
    GlobalEntry(Key),
    /// What the owning DC (`id.dc()`) knows about `id`.
    Reservation(ReservationId),
}

/// A shortcut the walk took: it jumped from `from` (whose answer carried
/// the shortcut, or the entry for a walker's own hint) to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jump {
    /// Where the walk stood.
    pub from: ReservationId,
    /// The member it jumped to.
    pub to: ReservationId,
    /// Whether the member's DC confirmed it (false: the walk fell back to `from`'s links).
    pub taken: bool,
}

/// A finished walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Walked {
    /// The reservation the walk started from (the global entry for a key).
    pub entry: ReservationId,
    /// Every link followed, in order (links a shortcut skipped are not here).
    pub links: Vec<Link>,
    /// Where the answer carrying each link came from (same length as `links`).
    pub link_sources: Vec<Source>,
    /// Shortcuts tried, in order.
    pub jumps: Vec<Jump>,
    /// The tail and its state.
    pub tail: TailView,
    /// Where the tail's state came from.
    pub tail_source: Source,
    /// Answers that needed a network round trip.
    pub remote_round_trips: u32,
    /// Answers taken from cache.
    pub cached_answers: u32,
}

impl Walked {
    /// The furthest member this walk proved: the tail, as a hint for the next walk.
    pub fn hint(&self) -> Shortcut {
        Shortcut {
            to: self.tail.id.clone(),
            token: self.tail.token,
        }
    }

    /// The chain hop by hop, one line each, as `homing chain` prints it and
    /// the status page shows it: the links followed, and each shortcut tried
    /// where the walk stood when it tried it (the links a taken shortcut
    /// skips are not walked, so not shown), then the tail and the count of
    /// remote round trips.
    pub fn hops(&self) -> Vec<String> {
        let mut lines = vec![format!("global entry → {}", self.entry)];
        let jumps_from = |at: &ReservationId, lines: &mut Vec<String>| {
            for jump in self.jumps.iter().filter(|j| &j.from == at) {
                lines.push(match jump.taken {
                    true => format!(
                        "{} shortcut → {} (dc {}), skipping the links between",
                        jump.from,
                        jump.to,
                        jump.to.dc()
                    ),
                    false => format!(
                        "{} shortcut → {} did not hold up; following the links",
                        jump.from, jump.to
                    ),
                });
            }
        };
        jumps_from(&self.entry, &mut lines);
        for (link, from) in self.links.iter().zip(&self.link_sources) {
            lines.push(format!(
                "{} (dc {}) released, linked → {}   [{}]",
                link.from,
                link.from.dc(),
                link.to,
                from.words()
            ));
            jumps_from(&link.to, &mut lines);
        }
        let tail = &self.tail;
        let state = match &tail.state {
            TailState::Active { actor } => format!("active, actor {actor}"),
            TailState::Vacant { ended } => format!("vacant, last run {ended}"),
        };
        lines.push(format!(
            "{} (dc {}) tail: {state}, token {}   [{}]",
            tail.id,
            tail.id.dc(),
            tail.token,
            self.tail_source.words()
        ));
        lines.push(format!("{} remote round trip(s)", self.remote_round_trips));
        lines
    }
}

/// Where the walk stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainPoll {
    /// Fetch this and hand it back.
    Need(ChainNeed),
    /// The key has no global entry: it was never reserved.
    NotFound,
    /// Done.
    Done(Walked),
    /// The walk failed; every later call returns this error.
    Failed(ChainError),
}

/// Why a walk failed. A router treats all of these as "do not route".
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChainError {
    /// A reservation appeared twice: the chain loops.
    #[error("chain cycles at reservation {0}")]
    Cycle(ReservationId),
    /// More hops than the hop limit.
    #[error("chain longer than the hop limit of {0}")]
    TooLong(usize),
    /// An answer contradicts the walk (wrong DC, discontinuous link, …).
    #[error("inconsistent answer from dc {dc}: {reason}")]
    Inconsistent {
        /// The DC (or cache) that answered.
        dc: String,
        /// What was wrong.
        reason: String,
    },
    /// An answer arrived that the walk did not ask for.
    #[error("answer does not match what the walk needs")]
    Unexpected,
}

/// Builds the [`Segment`] a DC answers for one of its reservations: it
/// follows links that stay inside the DC in the same reply, so a chain that
/// bounces within one DC costs a resolver one round trip, not one per link.
///
/// Driver: while [`LocalSegment::need`] names a reservation, read that local
/// record and pass it to [`LocalSegment::handle`]; then take [`LocalSegment::finish`].
#[derive(Debug, Clone)]
pub struct LocalSegment {
    local: DcId,
    at: Option<ReservationId>,
    hop_limit: usize,
    key: Option<Key>,
    links: Vec<Link>,
    tail: Option<TailView>,
    shortcut: Option<Shortcut>,
}

/// Why a DC cannot answer for one of its reservations.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SegmentError {
    /// The DC has no record of the reservation asked about.
    #[error("no reservation {0} in this dc")]
    Unknown(ReservationId),
    /// A link inside the DC points at a record that does not exist or never joined a chain.
    #[error("reservation {0} is linked to but has no live record")]
    Broken(ReservationId),
    /// The reservation asked about lost its race and is no part of any chain.
    #[error("reservation {0} was abandoned")]
    Abandoned(ReservationId),
}

impl LocalSegment {
    /// Starts at `start`, which `local` owns.
    pub fn new(local: DcId, start: ReservationId, hop_limit: usize) -> LocalSegment {
        LocalSegment {
            local,
            at: Some(start),
            hop_limit: hop_limit.min(HOP_LIMIT_MAX),
            key: None,
            links: Vec::new(),
            tail: None,
            shortcut: None,
        }
    }

    /// The local record to read next, `None` once the segment is complete.
    pub fn need(&self) -> Option<&ReservationId> {
        self.at.as_ref()
    }

    /// The record asked for (`None` if the store has none) at store time
    /// `now`, with the row of its host session when it is held under one
    /// (read with it: [`crate::RecordRead`]).
    pub fn handle(
        &mut self,
        record: Option<&crate::record::DcRecord>,
        now: crate::time::StoreTime,
        policy: &crate::lease::LeasePolicy,
        session: Option<&crate::session::SessionRecord>,
    ) -> Result<(), SegmentError> {
        let Some(at) = self.at.take() else {
            return Ok(());
        };
        let first = self.key.is_none();
        let missing = |at: ReservationId| {
            if first {
                SegmentError::Unknown(at)
            } else {
                SegmentError::Broken(at)
            }
        };
        let Some(record) = record.filter(|r| r.id == at) else {
            return Err(missing(at));
        };
        match &self.key {
            None => {
                self.key = Some(record.key.clone());
                self.shortcut = record.shortcut.as_deref().cloned();
            }
            // A link inside the DC to another key's record: the store is corrupt.
            Some(key) if key != &record.key => return Err(SegmentError::Broken(at)),
            Some(_) => {}
        }
        match record.view(now, policy, session) {
            crate::record::RecordView::Link(to) => {
                let stays = to.dc() == &self.local && self.links.len() < self.hop_limit;
                self.links.push(Link {
                    from: at,
                    to: to.clone(),
                    token: record.token,
                });
                self.at = stays.then_some(to);
            }
            crate::record::RecordView::Tail(tail) => self.tail = Some(tail),
            crate::record::RecordView::Abandoned if first => {
                return Err(SegmentError::Abandoned(at));
            }
            crate::record::RecordView::Abandoned => return Err(SegmentError::Broken(at)),
        }
        Ok(())
    }

    /// The segment; call once [`LocalSegment::need`] is `None` after at
    /// least one record was handled.
    pub fn finish(self) -> Segment {
        Segment {
            // Invariant: the first handled record set the key (see the docs).
            key: self
                .key
                .expect("a segment is finished after its first record"),
            links: self.links,
            tail: self.tail,
            shortcut: self.shortcut,
        }
    }
}

/// Why the walk asks for the reservation it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Purpose {
    /// The next reservation along a link (or the start): its first record's
    /// token must exceed the last one passed.
    Follow,
    /// A shortcut or hint: its DC must answer for a record of the key with
    /// at least `token`; otherwise the walk goes on at `fallback`.
    Jump {
        token: FencingToken,
        fallback: ReservationId,
    },
    /// The start again, only for its shortcut (a hint led to a member that
    /// moved on since): whatever it answers, the walk goes on, jumping or at `resume`.
    Consult { resume: ReservationId },
}

/// The stepper. See the module docs for the driving loop.
#[derive(Debug, Clone)]
pub struct ChainWalk {
    key: Key,
    hop_limit: usize,
    /// Where the walk started: the global entry, or the reservation given.
    entry: Option<ReservationId>,
    /// The caller's own remembered member, tried right after the entry.
    hint: Option<Shortcut>,
    /// Whether the start's shortcut may still be consulted (after a hint led astray).
    may_consult: bool,
    purpose: Purpose,
    /// The highest token passed so far.
    floor: Option<FencingToken>,
    links: Vec<Link>,
    link_sources: Vec<Source>,
    jumps: Vec<Jump>,
    seen: HashSet<ReservationId>,
    remote_round_trips: u32,
    cached_answers: u32,
    state: ChainPoll,
}

impl ChainWalk {
    /// A walk from `key`'s global entry.
    pub fn from_key(key: Key, hop_limit: usize) -> ChainWalk {
        Self::start(key.clone(), None, ChainNeed::GlobalEntry(key), hop_limit)
    }

    /// A walk of `key`'s chain from a known member `id` (e.g. a cached global entry).
    pub fn from_reservation(key: Key, id: ReservationId, hop_limit: usize) -> ChainWalk {
        Self::start(key, Some(id.clone()), ChainNeed::Reservation(id), hop_limit)
    }

    fn start(
        key: Key,
        entry: Option<ReservationId>,
        need: ChainNeed,
        hop_limit: usize,
    ) -> ChainWalk {
        ChainWalk {
            key,
            hop_limit: hop_limit.min(HOP_LIMIT_MAX),
            seen: entry.iter().cloned().collect(),
            entry,
            hint: None,
            may_consult: false,
            purpose: Purpose::Follow,
            floor: None,
            links: Vec::new(),
            link_sources: Vec::new(),
            jumps: Vec::new(),
            remote_round_trips: 0,
            cached_answers: 0,
            state: ChainPoll::Need(need),
        }
    }

    /// Starts at `hint` (a member the caller remembers) once the entry is
    /// known, instead of walking from the entry. Call before the first answer.
    pub fn with_hint(mut self, hint: Option<Shortcut>) -> ChainWalk {
        self.hint = hint;
        if let (Some(entry), ChainPoll::Need(ChainNeed::Reservation(_))) =
            (self.entry.clone(), &self.state)
        {
            self.jump_from_start(entry);
        }
        self
    }

    /// What the walk needs, or its result.
    pub fn poll(&self) -> &ChainPoll {
        &self.state
    }

    /// The key whose chain this walk follows.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Links followed so far.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    fn count(&mut self, source: Source) {
        match source {
            Source::Cache => self.cached_answers += 1,
            Source::Local => {}
            Source::Remote => self.remote_round_trips += 1,
        }
    }

    fn fail(&mut self, error: ChainError) -> Result<(), ChainError> {
        self.state = ChainPoll::Failed(error.clone());
        Err(error)
    }

    /// Links followed plus shortcuts tried: what the hop limit bounds.
    fn hops(&self) -> usize {
        self.links.len() + self.jumps.len()
    }

    /// The key's global entry, `None` if the key was never reserved.
    pub fn handle_global(
        &mut self,
        entry: Option<ReservationId>,
        source: Source,
    ) -> Result<(), ChainError> {
        if !matches!(self.state, ChainPoll::Need(ChainNeed::GlobalEntry(_))) {
            return self.fail(ChainError::Unexpected);
        }
        self.count(source);
        let Some(id) = entry else {
            self.state = ChainPoll::NotFound;
            return Ok(());
        };
        self.seen.insert(id.clone());
        self.entry = Some(id.clone());
        self.state = ChainPoll::Need(ChainNeed::Reservation(id.clone()));
        self.jump_from_start(id);
        Ok(())
    }

    /// With a hint naming another member, asks for it first, falling back to `start`.
    fn jump_from_start(&mut self, start: ReservationId) {
        let Some(hint) = self.hint.take() else {
            return;
        };
        if hint.to == start {
            return;
        }
        self.may_consult = true;
        self.jump(start, hint);
    }

    /// Asks for `to`'s member next, going on at `from` if it does not hold up.
    fn jump(&mut self, from: ReservationId, to: Shortcut) {
        self.seen.insert(to.to.clone());
        self.jumps.push(Jump {
            from: from.clone(),
            to: to.to.clone(),
            taken: false,
        });
        self.state = ChainPoll::Need(ChainNeed::Reservation(to.to));
        self.purpose = Purpose::Jump {
            token: to.token,
            fallback: from,
        };
    }

    /// `answered_by` says it has no usable record of the reservation the
    /// walk needs (unknown, abandoned). Fatal unless the walk was trying a
    /// shortcut, which it then gives up for the links.
    pub fn handle_disowned(
        &mut self,
        answered_by: &DcId,
        source: Source,
    ) -> Result<(), ChainError> {
        let ChainPoll::Need(ChainNeed::Reservation(at)) = self.state.clone() else {
            return self.fail(ChainError::Unexpected);
        };
        self.count(source);
        self.fall_back(answered_by, format!("has no record of {at}"))
    }

    /// The DC that owns the reservation the walk needs did not answer. The
    /// walk goes on only through the global store's succession of that
    /// reservation (DESIGN.md §7.5): `Ok(Some(id))` names it; answer with
    /// [`ChainWalk::handle_successor`]. A shortcut's or hint's target is a
    /// member of the chain all the same (it is never wrong, only possibly
    /// behind, and every move past it has a succession), so the walk stands
    /// there (its jump counted as not confirmed) rather than falling back
    /// along links the shortcut skipped, which may be more than the hop
    /// limit. A consult of the start is given up (`Ok(None)`: poll again).
    pub fn handle_unreachable(&mut self) -> Result<Option<ReservationId>, ChainError> {
        let ChainPoll::Need(ChainNeed::Reservation(at)) = self.state.clone() else {
            self.fail(ChainError::Unexpected)?;
            return Ok(None);
        };
        match std::mem::replace(&mut self.purpose, Purpose::Follow) {
            Purpose::Follow | Purpose::Jump { .. } => Ok(Some(at)),
            Purpose::Consult { resume } => {
                self.state = ChainPoll::Need(ChainNeed::Reservation(resume));
                Ok(None)
            }
        }
    }

    /// The global store's succession of the reservation the walk needs,
    /// whose DC did not answer: followed like a link that DC recorded (its
    /// token rises above the chain's so far, it continues where the walk
    /// stands, it adds a hop). `hint`: a later member the answering DC
    /// remembers for the key, jumped to (and checked) like a shortcut — the
    /// silent DC may be the one that kept the key's shortcut.
    pub fn handle_successor(
        &mut self,
        link: Link,
        hint: Option<Shortcut>,
        source: Source,
    ) -> Result<(), ChainError> {
        let ChainPoll::Need(ChainNeed::Reservation(at)) = self.state.clone() else {
            return self.fail(ChainError::Unexpected);
        };
        if self.purpose != Purpose::Follow {
            return self.fail(ChainError::Unexpected);
        }
        self.count(source);
        let inconsistent = |reason: String| ChainError::Inconsistent {
            dc: "global store".to_string(),
            reason,
        };
        if link.from != at {
            let reason = format!("succession of {} where the walk stands at {at}", link.from);
            return self.fail(inconsistent(reason));
        }
        if self.floor.is_some_and(|floor| link.token <= floor) {
            let reason = format!(
                "succession of {at} carries token {}, not above the chain's so far",
                link.token
            );
            return self.fail(inconsistent(reason));
        }
        if self.seen.contains(&link.to) {
            return self.fail(ChainError::Cycle(link.to));
        }
        if self.hops() >= self.hop_limit {
            return self.fail(ChainError::TooLong(self.hop_limit));
        }
        self.seen.insert(link.to.clone());
        self.floor = Some(link.token);
        self.state = ChainPoll::Need(ChainNeed::Reservation(link.to.clone()));
        let at = link.to.clone();
        self.links.push(link);
        self.link_sources.push(source);
        if let Some(hint) = hint
            && self.worth_jumping(&hint)
        {
            return self.checked_jump(at, hint);
        }
        Ok(())
    }

    /// A shortcut or consult that did not hold up: go on along the links.
    /// Anything else: the walk fails with `reason`.
    fn fall_back(&mut self, answered_by: &DcId, reason: String) -> Result<(), ChainError> {
        match std::mem::replace(&mut self.purpose, Purpose::Follow) {
            Purpose::Jump { fallback, .. } => {
                // The target may still be met along the links, honestly.
                if let ChainPoll::Need(ChainNeed::Reservation(target)) = &self.state {
                    self.seen.remove(target);
                }
                self.state = ChainPoll::Need(ChainNeed::Reservation(fallback));
                Ok(())
            }
            Purpose::Consult { resume } => {
                self.state = ChainPoll::Need(ChainNeed::Reservation(resume));
                Ok(())
            }
            Purpose::Follow => self.fail(ChainError::Inconsistent {
                dc: answered_by.to_string(),
                reason,
            }),
        }
    }

    /// What `answered_by` knows about the reservation the walk needs.
    pub fn handle_segment(
        &mut self,
        answered_by: &DcId,
        segment: Segment,
        source: Source,
    ) -> Result<(), ChainError> {
        let ChainPoll::Need(ChainNeed::Reservation(at)) = self.state.clone() else {
            return self.fail(ChainError::Unexpected);
        };
        self.count(source);
        if let Purpose::Consult { resume } = self.purpose.clone() {
            self.purpose = Purpose::Follow;
            self.state = ChainPoll::Need(ChainNeed::Reservation(resume.clone()));
            if segment.key == self.key
                && let Some(shortcut) = segment.shortcut
                && self.worth_jumping(&shortcut)
            {
                return self.checked_jump(resume, shortcut);
            }
            return Ok(());
        }
        if let Err(reason) = self.check(answered_by, &at, &segment) {
            return self.fall_back(answered_by, reason);
        }
        // A consult was answered above: the purpose is a jump or a follow.
        let jumped = std::mem::replace(&mut self.purpose, Purpose::Follow) != Purpose::Follow;
        if jumped && let Some(jump) = self.jumps.last_mut() {
            jump.taken = true;
        }
        let mut at = at;
        for link in segment.links {
            if self.seen.contains(&link.to) {
                return self.fail(ChainError::Cycle(link.to));
            }
            if self.hops() >= self.hop_limit {
                return self.fail(ChainError::TooLong(self.hop_limit));
            }
            self.seen.insert(link.to.clone());
            self.floor = Some(link.token);
            at = link.to.clone();
            self.links.push(link);
            self.link_sources.push(source);
        }
        if let Some(tail) = segment.tail {
            // Invariant: `entry` is set before any reservation is needed.
            let entry = self.entry.clone().expect("entry known before segments");
            self.state = ChainPoll::Done(Walked {
                entry,
                links: std::mem::take(&mut self.links),
                link_sources: std::mem::take(&mut self.link_sources),
                jumps: std::mem::take(&mut self.jumps),
                tail,
                tail_source: source,
                remote_round_trips: self.remote_round_trips,
                cached_answers: self.cached_answers,
            });
            return Ok(());
        }
        self.state = ChainPoll::Need(ChainNeed::Reservation(at.clone()));
        if let Some(shortcut) = segment.shortcut
            && self.worth_jumping(&shortcut)
        {
            return self.checked_jump(at, shortcut);
        }
        // A hint led to a member that moved on: the start's shortcut is
        // likely further along than these links.
        if jumped
            && self.may_consult
            && let Some(entry) = self.entry.clone()
        {
            self.may_consult = false;
            if self.hops() >= self.hop_limit {
                return self.fail(ChainError::TooLong(self.hop_limit));
            }
            self.state = ChainPoll::Need(ChainNeed::Reservation(entry));
            self.purpose = Purpose::Consult { resume: at };
        }
        Ok(())
    }

    /// A shortcut is worth a jump when it names a member not seen yet,
    /// further along than anything passed.
    fn worth_jumping(&self, shortcut: &Shortcut) -> bool {
        !self.seen.contains(&shortcut.to) && self.floor.is_none_or(|floor| shortcut.token > floor)
    }

    fn checked_jump(&mut self, from: ReservationId, shortcut: Shortcut) -> Result<(), ChainError> {
        if self.hops() >= self.hop_limit {
            return self.fail(ChainError::TooLong(self.hop_limit));
        }
        self.jump(from, shortcut);
        Ok(())
    }

    /// Whether `segment`, answered by `answered_by` for `at`, continues the
    /// walk: the walk's key, the DC's own reservations, links continuous,
    /// tokens rising (a jump's target at least at the promised token).
    fn check(
        &self,
        answered_by: &DcId,
        at: &ReservationId,
        segment: &Segment,
    ) -> Result<(), String> {
        if segment.key != self.key {
            return Err(format!(
                "answered for key {} where the walk is of {}",
                segment.key, self.key
            ));
        }
        if segment.links.is_empty() && segment.tail.is_none() {
            return Err(format!("empty answer for {at}"));
        }
        let mut at = at;
        let mut floor = self.floor;
        let mut promised = match &self.purpose {
            Purpose::Jump { token, .. } => Some(*token),
            _ => None,
        };
        let mut tokens_rise = |token: FencingToken, what: &ReservationId| {
            let low =
                promised.take().is_some_and(|p| token < p) || floor.is_some_and(|f| token <= f);
            floor = Some(token);
            if low {
                Err(format!(
                    "token {} of {what} is not above the chain's so far",
                    token.get()
                ))
            } else {
                Ok(())
            }
        };
        for link in &segment.links {
            if &link.from != at {
                return Err(format!(
                    "link from {} where the walk stands at {at}",
                    link.from
                ));
            }
            if link.from.dc() != answered_by {
                return Err(format!("speaks for {}, owned by another dc", link.from));
            }
            tokens_rise(link.token, &link.from)?;
            at = &link.to;
        }
        if let Some(tail) = &segment.tail {
            if &tail.id != at {
                return Err(format!("tail {} where the walk stands at {at}", tail.id));
            }
            if tail.id.dc() != answered_by {
                return Err(format!("speaks for {}, owned by another dc", tail.id));
            }
            tokens_rise(tail.token, &tail.id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencingToken;
    use crate::key::KeyName;
    use crate::record::TailState;

    fn id(text: &str) -> ReservationId {
        text.parse().unwrap()
    }

    fn dc(text: &str) -> DcId {
        DcId::new(text).unwrap()
    }

    fn token(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    fn link(from: &str, to: &str, from_token: u64) -> Link {
        Link {
            from: id(from),
            to: id(to),
            token: token(from_token),
        }
    }

    fn vacant(at: &str, at_token: u64) -> TailView {
        TailView {
            tag: None,
            id: id(at),
            token: token(at_token),
            state: TailState::Vacant {
                ended: crate::ReleaseCause::Expired,
            },
        }
    }

    fn key() -> Key {
        Key::new(KeyName::new("room").unwrap())
    }

    fn seg(links: Vec<Link>, tail: Option<TailView>) -> Segment {
        Segment {
            key: key(),
            links,
            tail,
            shortcut: None,
        }
    }

    fn shortcut(to: &str, to_token: u64) -> Option<Shortcut> {
        Some(Shortcut {
            to: id(to),
            token: token(to_token),
        })
    }

    fn needs(walk: &ChainWalk, at: &str) {
        assert_eq!(
            walk.poll(),
            &ChainPoll::Need(ChainNeed::Reservation(id(at))),
            "{walk:?}"
        );
    }

    fn done(walk: &ChainWalk) -> &Walked {
        let ChainPoll::Done(done) = walk.poll() else {
            panic!("{:?}", walk.poll())
        };
        done
    }

    #[test]
    fn walk_follows_links_across_dcs_and_counts_round_trips() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        assert_eq!(walk.poll(), &ChainPoll::Need(ChainNeed::GlobalEntry(key())));
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        needs(&walk, "iad.1");
        // iad follows its own link iad.1 → iad.5 in the same reply.
        let segment = seg(
            vec![link("iad.1", "iad.5", 1), link("iad.5", "fra.2", 2)],
            None,
        );
        walk.handle_segment(&dc("iad"), segment, Source::Remote)
            .unwrap();
        needs(&walk, "fra.2");
        walk.handle_segment(
            &dc("fra"),
            seg(vec![], Some(vacant("fra.2", 3))),
            Source::Remote,
        )
        .unwrap();
        let done = done(&walk);
        assert_eq!(done.entry, id("iad.1"));
        assert_eq!(done.links.len(), 2);
        assert_eq!(done.remote_round_trips, 2);
        assert_eq!(done.cached_answers, 1);
        assert!(done.jumps.is_empty());
    }

    #[test]
    fn missing_global_entry_is_not_found() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(None, Source::Remote).unwrap();
        assert_eq!(walk.poll(), &ChainPoll::NotFound);
    }

    #[test]
    fn a_cycle_is_detected() {
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        walk.handle_segment(
            &dc("iad"),
            seg(vec![link("iad.1", "fra.1", 1)], None),
            Source::Remote,
        )
        .unwrap();
        let err = walk
            .handle_segment(
                &dc("fra"),
                seg(vec![link("fra.1", "iad.1", 2)], None),
                Source::Remote,
            )
            .unwrap_err();
        assert_eq!(err, ChainError::Cycle(id("iad.1")));
        assert_eq!(walk.poll(), &ChainPoll::Failed(err));
    }

    #[test]
    fn the_hop_limit_is_enforced() {
        let mut walk = ChainWalk::from_reservation(key(), id("a.0"), 3);
        let links = (0..4)
            .map(|i| link(&format!("a.{i}"), &format!("a.{}", i + 1), i + 1))
            .collect();
        let err = walk
            .handle_segment(&dc("a"), seg(links, None), Source::Remote)
            .unwrap_err();
        assert_eq!(err, ChainError::TooLong(3));
    }

    #[test]
    fn a_dc_may_not_speak_for_another_dcs_reservation() {
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("fra"),
                seg(vec![link("iad.1", "fra.1", 1)], None),
                Source::Remote,
            )
            .unwrap_err();
        assert!(matches!(err, ChainError::Inconsistent { .. }), "{err}");
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("iad"),
                seg(vec![], Some(vacant("iad.2", 1))),
                Source::Remote,
            )
            .unwrap_err();
        assert!(err.to_string().contains("where the walk stands"), "{err}");
    }

    #[test]
    fn an_answer_about_another_key_fails_the_walk() {
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        let mut other = seg(vec![], Some(vacant("iad.1", 1)));
        other.key = Key::new(KeyName::new("hall").unwrap());
        let err = walk
            .handle_segment(&dc("iad"), other, Source::Remote)
            .unwrap_err();
        assert!(err.to_string().contains("key hall"), "{err}");
    }

    #[test]
    fn tokens_must_rise_along_the_chain() {
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        walk.handle_segment(
            &dc("iad"),
            seg(vec![link("iad.1", "fra.1", 4)], None),
            Source::Remote,
        )
        .unwrap();
        let err = walk
            .handle_segment(
                &dc("fra"),
                seg(vec![], Some(vacant("fra.1", 4))),
                Source::Remote,
            )
            .unwrap_err();
        assert!(err.to_string().contains("token 4"), "{err}");
    }

    #[test]
    fn a_shortcut_skips_the_links_between() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(Some(id("iad.1")), Source::Remote)
            .unwrap();
        let mut first = seg(vec![link("iad.1", "fra.1", 1)], None);
        first.shortcut = shortcut("sin.9", 900);
        walk.handle_segment(&dc("iad"), first, Source::Remote)
            .unwrap();
        needs(&walk, "sin.9");
        walk.handle_segment(
            &dc("sin"),
            seg(vec![], Some(vacant("sin.9", 901))),
            Source::Remote,
        )
        .unwrap();
        let done = done(&walk);
        assert_eq!(done.tail.id, id("sin.9"));
        assert_eq!(done.links, vec![link("iad.1", "fra.1", 1)]);
        assert_eq!(
            done.jumps,
            vec![Jump {
                from: id("fra.1"),
                to: id("sin.9"),
                taken: true
            }]
        );
        assert_eq!(done.remote_round_trips, 3);
    }

    #[test]
    fn a_silent_dc_is_passed_through_its_succession_and_a_hint_jumps_past_the_links() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(Some(id("iad.1")), Source::Remote)
            .unwrap();
        // iad, which kept the key's shortcut, does not answer.
        assert_eq!(walk.handle_unreachable(), Ok(Some(id("iad.1"))));
        // Its succession, and the answering DC's hint far along the chain.
        walk.handle_successor(
            link("iad.1", "fra.1", 1),
            shortcut("sin.9", 900),
            Source::Remote,
        )
        .unwrap();
        needs(&walk, "sin.9");
        walk.handle_segment(
            &dc("sin"),
            seg(vec![], Some(vacant("sin.9", 901))),
            Source::Remote,
        )
        .unwrap();
        let done = done(&walk);
        assert_eq!(done.links, vec![link("iad.1", "fra.1", 1)]);
        assert_eq!(done.tail.id, id("sin.9"));

        // A succession must continue where the walk stands, with a rising token.
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(Some(id("iad.1")), Source::Remote)
            .unwrap();
        walk.handle_unreachable().unwrap();
        assert!(
            walk.handle_successor(link("iad.7", "fra.1", 1), None, Source::Remote)
                .is_err()
        );
    }

    #[test]
    fn a_silent_dc_at_a_shortcuts_target_stands_the_walk_there_and_a_consult_resumes() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(Some(id("iad.1")), Source::Remote)
            .unwrap();
        let mut first = seg(vec![link("iad.1", "fra.1", 1)], None);
        first.shortcut = shortcut("sin.9", 900);
        walk.handle_segment(&dc("iad"), first, Source::Remote)
            .unwrap();
        needs(&walk, "sin.9");
        // sin is silent: the walk asks for sin.9's succession, not the
        // links the shortcut skipped.
        assert_eq!(walk.handle_unreachable(), Ok(Some(id("sin.9"))));
        walk.handle_successor(link("sin.9", "syd.3", 950), None, Source::Remote)
            .unwrap();
        needs(&walk, "syd.3");

        // A hint that led astray consults the entry; a silent entry resumes.
        let hint = shortcut("fra.2", 2);
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT).with_hint(hint);
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        needs(&walk, "fra.2");
        walk.handle_segment(
            &dc("fra"),
            seg(vec![link("fra.2", "sin.4", 2)], None),
            Source::Remote,
        )
        .unwrap();
        needs(&walk, "iad.1");
        assert_eq!(walk.handle_unreachable(), Ok(None));
        needs(&walk, "sin.4");
    }

    /// A key moved a thousand times: an honest walk is the entry's answer,
    /// one jump and the tail's answer, well inside the default hop limit.
    #[test]
    fn a_long_chain_is_walked_in_two_answers_after_the_entry() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(Some(id("a.1")), Source::Remote).unwrap();
        let mut first = seg(vec![link("a.1", "b.2", 1)], None);
        first.shortcut = shortcut("b.1000", 1000);
        walk.handle_segment(&dc("a"), first, Source::Remote)
            .unwrap();
        walk.handle_segment(
            &dc("b"),
            seg(vec![], Some(vacant("b.1000", 1000))),
            Source::Remote,
        )
        .unwrap();
        assert_eq!(done(&walk).remote_round_trips, 3);
    }

    /// Every way a shortcut's target can fail to hold up sends the walk
    /// back along the links, never to a wrong tail.
    #[test]
    fn a_shortcut_that_does_not_hold_up_falls_back_to_the_links() {
        let start = || {
            let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
            let mut first = seg(vec![link("iad.1", "fra.1", 1)], None);
            first.shortcut = shortcut("sin.9", 9);
            walk.handle_segment(&dc("iad"), first, Source::Remote)
                .unwrap();
            needs(&walk, "sin.9");
            walk
        };
        let mut other_key = seg(vec![], Some(vacant("sin.9", 9)));
        other_key.key = Key::new(KeyName::new("hall").unwrap());
        let answers = [
            ("another key", other_key),
            (
                "a token below the promise",
                seg(vec![], Some(vacant("sin.9", 8))),
            ),
            ("another reservation", seg(vec![], Some(vacant("sin.8", 9)))),
            ("an empty answer", seg(vec![], None)),
        ];
        for (what, answer) in answers {
            let mut walk = start();
            walk.handle_segment(&dc("sin"), answer, Source::Remote)
                .unwrap();
            needs(&walk, "fra.1");
            walk.handle_segment(
                &dc("fra"),
                seg(vec![], Some(vacant("fra.1", 2))),
                Source::Remote,
            )
            .unwrap();
            let done = done(&walk);
            assert_eq!(done.tail.id, id("fra.1"), "{what}");
            assert!(!done.jumps[0].taken, "{what}");
        }
        let mut walk = start();
        walk.handle_disowned(&dc("sin"), Source::Remote).unwrap();
        needs(&walk, "fra.1");
        // Without a jump pending, a DC disowning the reservation fails the walk.
        let err = walk
            .handle_disowned(&dc("fra"), Source::Remote)
            .unwrap_err();
        assert!(matches!(err, ChainError::Inconsistent { .. }), "{err}");
    }

    #[test]
    fn a_shortcut_behind_the_walk_is_not_taken() {
        let mut walk = ChainWalk::from_reservation(key(), id("iad.1"), HOP_LIMIT_DEFAULT);
        let mut first = seg(vec![link("iad.1", "fra.1", 5)], None);
        first.shortcut = shortcut("sin.9", 5);
        walk.handle_segment(&dc("iad"), first, Source::Remote)
            .unwrap();
        needs(&walk, "fra.1");
    }

    #[test]
    fn a_hint_is_tried_after_the_entry() {
        let mut walk =
            ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT).with_hint(shortcut("fra.4", 4));
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        needs(&walk, "fra.4");
        walk.handle_segment(
            &dc("fra"),
            seg(vec![], Some(vacant("fra.4", 6))),
            Source::Remote,
        )
        .unwrap();
        let done = done(&walk);
        assert_eq!(done.remote_round_trips, 1);
        assert!(done.jumps[0].taken);
    }

    /// A remembered member that moved on since: rather than follow every
    /// move made since, the walk asks the entry for its shortcut.
    #[test]
    fn a_stale_hint_consults_the_entry() {
        let mut walk =
            ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT).with_hint(shortcut("fra.4", 4));
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        walk.handle_segment(
            &dc("fra"),
            seg(vec![link("fra.4", "sin.5", 4)], None),
            Source::Remote,
        )
        .unwrap();
        needs(&walk, "iad.1");
        let mut entry = seg(vec![link("iad.1", "fra.2", 1)], None);
        entry.shortcut = shortcut("fra.700", 700);
        walk.handle_segment(&dc("iad"), entry, Source::Remote)
            .unwrap();
        needs(&walk, "fra.700");
        walk.handle_segment(
            &dc("fra"),
            seg(vec![], Some(vacant("fra.700", 700))),
            Source::Remote,
        )
        .unwrap();
        let done = done(&walk);
        assert_eq!(done.tail.id, id("fra.700"));
        assert_eq!(done.remote_round_trips, 3);
        assert_eq!(done.links, vec![link("fra.4", "sin.5", 4)]);

        // The entry knows nothing newer: on along the links from where the hint led.
        let mut walk =
            ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT).with_hint(shortcut("fra.4", 4));
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        walk.handle_segment(
            &dc("fra"),
            seg(vec![link("fra.4", "sin.5", 4)], None),
            Source::Remote,
        )
        .unwrap();
        walk.handle_segment(
            &dc("iad"),
            seg(vec![link("iad.1", "fra.2", 1)], None),
            Source::Remote,
        )
        .unwrap();
        needs(&walk, "sin.5");
    }

    #[test]
    fn local_segment_follows_links_inside_the_dc_and_stops_at_the_border() {
        use crate::record::{DcRecord, RecordState};
        use crate::{ActorId, HostTime, LeasePolicy, StoreTime};
        let policy = LeasePolicy::DEFAULT;
        let record = |at: &str, token: u64, state: RecordState| {
            let (mut r, _) = DcRecord::reserve(
                id(at),
                key(),
                None,
                FencingToken::new(token),
                None,
                &crate::Holding {
                    actor: ActorId::new("a").unwrap(),
                    lease: crate::LeaseKey::from_bytes([1; 16]).unwrap(),
                    host_time: HostTime::from_ms(0),
                    session: None,
                },
                StoreTime::from_ms(0),
                &policy,
            );
            r.state = state;
            r
        };
        let mut first = record("iad.1", 1, RecordState::Linked { to: id("iad.2") });
        first.shortcut = shortcut("sin.7", 7).map(Box::new);
        let records = [
            first,
            record("iad.2", 2, RecordState::Linked { to: id("fra.1") }),
        ];
        let mut segment = LocalSegment::new(dc("iad"), id("iad.1"), HOP_LIMIT_DEFAULT);
        let mut reads = 0;
        while let Some(at) = segment.need().cloned() {
            reads += 1;
            segment
                .handle(
                    records.iter().find(|r| r.id == at),
                    StoreTime::from_ms(1),
                    &policy,
                    None,
                )
                .unwrap();
        }
        assert_eq!(reads, 2);
        let segment = segment.finish();
        assert_eq!(
            segment.links,
            vec![link("iad.1", "iad.2", 1), link("iad.2", "fra.1", 2)]
        );
        assert_eq!(segment.tail, None);
        assert_eq!(segment.key, key());
        assert_eq!(segment.shortcut, shortcut("sin.7", 7));

        let mut unknown = LocalSegment::new(dc("iad"), id("iad.9"), HOP_LIMIT_DEFAULT);
        assert_eq!(
            unknown.handle(None, StoreTime::from_ms(1), &policy, None),
            Err(SegmentError::Unknown(id("iad.9")))
        );
    }

    #[test]
    fn answers_out_of_turn_fail_the_walk() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("iad"),
                seg(vec![], Some(vacant("iad.1", 1))),
                Source::Remote,
            )
            .unwrap_err();
        assert_eq!(err, ChainError::Unexpected);
    }
}
