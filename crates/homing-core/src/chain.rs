//! The chain walk as a sans-IO stepper: global entry → link → … → tail.
//!
//! A driver loops: [`ChainWalk::poll`] says what the walk needs next (the
//! key's global entry, or what a DC knows about a reservation); the driver
//! fetches it from a cache, its own store or a peer DC and hands the answer
//! back with `handle_*`, saying where it came from. The walk checks every
//! answer — a DC may only speak for reservations it owns, links must
//! continue where the walk stands, no reservation may repeat, the hop count
//! is bounded — and counts hops and remote round trips.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dc::DcId;
use crate::key::Key;
use crate::record::TailView;
use crate::reservation::ReservationId;

/// Default bound on links followed in one walk.
pub const HOP_LIMIT_DEFAULT: usize = 16;
/// Largest hop limit a caller may configure.
pub const HOP_LIMIT_MAX: usize = 256;

/// A link `from → to`, immutable once written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    /// The released reservation.
    pub from: ReservationId,
    /// The reservation it continues as.
    pub to: ReservationId,
}

/// What one DC knows about a run of its own reservations: the links it
/// followed inside itself, then the tail if the chain ends there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Links in walk order; each `from` is owned by the answering DC.
    pub links: Vec<Link>,
    /// The tail, if the chain ends in the answering DC.
    pub tail: Option<TailView>,
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

/// What the walk needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// The key's global entry.
    GlobalEntry(Key),
    /// What the owning DC (`id.dc()`) knows about `id`.
    Reservation(ReservationId),
}

/// A finished walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Walked {
    /// The reservation the walk started from (the global entry for a key).
    pub entry: ReservationId,
    /// Every link followed, in order.
    pub links: Vec<Link>,
    /// Where the answer carrying each link came from (same length as `links`).
    pub link_sources: Vec<Source>,
    /// The tail and its state.
    pub tail: TailView,
    /// Where the tail's state came from.
    pub tail_source: Source,
    /// Answers that needed a network round trip.
    pub remote_round_trips: u32,
    /// Answers taken from cache.
    pub cached_answers: u32,
}

/// Where the walk stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Fetch this and hand it back.
    Need(Need),
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
    /// More links than the hop limit.
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
    segment: Segment,
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
            segment: Segment {
                links: Vec::new(),
                tail: None,
            },
        }
    }

    /// The local record to read next, `None` once the segment is complete.
    pub fn need(&self) -> Option<&ReservationId> {
        self.at.as_ref()
    }

    /// The record asked for (`None` if the store has none) at store time `now`.
    pub fn handle(
        &mut self,
        record: Option<&crate::record::DcRecord>,
        now: crate::time::StoreTime,
        policy: &crate::lease::LeasePolicy,
    ) -> Result<(), SegmentError> {
        let Some(at) = self.at.take() else {
            return Ok(());
        };
        let first = self.segment.links.is_empty();
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
        match record.view(now, policy) {
            crate::record::RecordView::Link(to) => {
                let stays = to.dc() == &self.local && self.segment.links.len() < self.hop_limit;
                self.segment.links.push(Link {
                    from: at,
                    to: to.clone(),
                });
                self.at = stays.then_some(to);
            }
            crate::record::RecordView::Tail(tail) => self.segment.tail = Some(tail),
            crate::record::RecordView::Abandoned if first => {
                return Err(SegmentError::Abandoned(at));
            }
            crate::record::RecordView::Abandoned => return Err(SegmentError::Broken(at)),
        }
        Ok(())
    }

    /// The segment; call once [`LocalSegment::need`] is `None`.
    pub fn finish(self) -> Segment {
        self.segment
    }
}

/// The stepper. See the module docs for the driving loop.
#[derive(Debug, Clone)]
pub struct ChainWalk {
    hop_limit: usize,
    entry: Option<ReservationId>,
    links: Vec<Link>,
    link_sources: Vec<Source>,
    remote_round_trips: u32,
    cached_answers: u32,
    state: Poll,
}

impl ChainWalk {
    /// A walk from a key's global entry.
    pub fn from_key(key: Key, hop_limit: usize) -> ChainWalk {
        Self::start(None, Need::GlobalEntry(key), hop_limit)
    }

    /// A walk from a known reservation (e.g. a cached global entry).
    pub fn from_reservation(id: ReservationId, hop_limit: usize) -> ChainWalk {
        Self::start(Some(id.clone()), Need::Reservation(id), hop_limit)
    }

    fn start(entry: Option<ReservationId>, need: Need, hop_limit: usize) -> ChainWalk {
        ChainWalk {
            hop_limit: hop_limit.min(HOP_LIMIT_MAX),
            entry,
            links: Vec::new(),
            link_sources: Vec::new(),
            remote_round_trips: 0,
            cached_answers: 0,
            state: Poll::Need(need),
        }
    }

    /// What the walk needs, or its result.
    pub fn poll(&self) -> &Poll {
        &self.state
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
        self.state = Poll::Failed(error.clone());
        Err(error)
    }

    /// The key's global entry, `None` if the key was never reserved.
    pub fn handle_global(
        &mut self,
        entry: Option<ReservationId>,
        source: Source,
    ) -> Result<(), ChainError> {
        if !matches!(self.state, Poll::Need(Need::GlobalEntry(_))) {
            return self.fail(ChainError::Unexpected);
        }
        self.count(source);
        self.state = match entry {
            None => Poll::NotFound,
            Some(id) => {
                self.entry = Some(id.clone());
                Poll::Need(Need::Reservation(id))
            }
        };
        Ok(())
    }

    /// What `answered_by` knows about the reservation the walk needs.
    pub fn handle_segment(
        &mut self,
        answered_by: &DcId,
        segment: Segment,
        source: Source,
    ) -> Result<(), ChainError> {
        let Poll::Need(Need::Reservation(mut at)) = self.state.clone() else {
            return self.fail(ChainError::Unexpected);
        };
        self.count(source);
        let inconsistent = |reason: String| ChainError::Inconsistent {
            dc: answered_by.to_string(),
            reason,
        };
        if segment.links.is_empty() && segment.tail.is_none() {
            return self.fail(inconsistent(format!("empty answer for {at}")));
        }
        for link in segment.links {
            if link.from != at {
                return self.fail(inconsistent(format!(
                    "link from {} where the walk stands at {at}",
                    link.from
                )));
            }
            if link.from.dc() != answered_by {
                return self.fail(inconsistent(format!(
                    "speaks for {}, owned by another dc",
                    link.from
                )));
            }
            if let Err(e) = self.follow(link.clone()) {
                return self.fail(e);
            }
            self.link_sources.push(source);
            at = link.to;
        }
        let Some(tail) = segment.tail else {
            self.state = Poll::Need(Need::Reservation(at));
            return Ok(());
        };
        if tail.id != at {
            return self.fail(inconsistent(format!(
                "tail {} where the walk stands at {at}",
                tail.id
            )));
        }
        if tail.id.dc() != answered_by {
            return self.fail(inconsistent(format!(
                "speaks for {}, owned by another dc",
                tail.id
            )));
        }
        // Invariant: `entry` is set before any reservation is needed.
        let entry = self.entry.clone().expect("entry known before segments");
        self.state = Poll::Done(Walked {
            entry,
            links: std::mem::take(&mut self.links),
            link_sources: std::mem::take(&mut self.link_sources),
            tail,
            tail_source: source,
            remote_round_trips: self.remote_round_trips,
            cached_answers: self.cached_answers,
        });
        Ok(())
    }

    fn follow(&mut self, link: Link) -> Result<(), ChainError> {
        let entry = self.entry.as_ref();
        let seen = |id: &ReservationId| entry == Some(id) || self.links.iter().any(|l| &l.to == id);
        if seen(&link.to) {
            return Err(ChainError::Cycle(link.to));
        }
        if self.links.len() >= self.hop_limit {
            return Err(ChainError::TooLong(self.hop_limit));
        }
        self.links.push(link);
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

    fn link(from: &str, to: &str) -> Link {
        Link {
            from: id(from),
            to: id(to),
        }
    }

    fn vacant(at: &str) -> TailView {
        TailView {
            tag: None,
            id: id(at),
            token: FencingToken::new(3),
            state: TailState::Vacant {
                ended: crate::ReleaseCause::Expired,
            },
        }
    }

    fn key() -> Key {
        Key::new(KeyName::new("room").unwrap())
    }

    #[test]
    fn walk_follows_links_across_dcs_and_counts_round_trips() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        assert_eq!(walk.poll(), &Poll::Need(Need::GlobalEntry(key())));
        walk.handle_global(Some(id("iad.1")), Source::Cache)
            .unwrap();
        assert_eq!(walk.poll(), &Poll::Need(Need::Reservation(id("iad.1"))));
        // iad follows its own link iad.1 → iad.5 in the same reply.
        let segment = Segment {
            links: vec![link("iad.1", "iad.5"), link("iad.5", "fra.2")],
            tail: None,
        };
        walk.handle_segment(&dc("iad"), segment, Source::Remote)
            .unwrap();
        assert_eq!(walk.poll(), &Poll::Need(Need::Reservation(id("fra.2"))));
        walk.handle_segment(
            &dc("fra"),
            Segment {
                links: vec![],
                tail: Some(vacant("fra.2")),
            },
            Source::Remote,
        )
        .unwrap();
        let Poll::Done(done) = walk.poll() else {
            panic!("{:?}", walk.poll())
        };
        assert_eq!(done.entry, id("iad.1"));
        assert_eq!(done.links.len(), 2);
        assert_eq!(done.remote_round_trips, 2);
        assert_eq!(done.cached_answers, 1);
    }

    #[test]
    fn missing_global_entry_is_not_found() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        walk.handle_global(None, Source::Remote).unwrap();
        assert_eq!(walk.poll(), &Poll::NotFound);
    }

    #[test]
    fn a_cycle_is_detected() {
        let mut walk = ChainWalk::from_reservation(id("iad.1"), HOP_LIMIT_DEFAULT);
        walk.handle_segment(
            &dc("iad"),
            Segment {
                links: vec![link("iad.1", "fra.1")],
                tail: None,
            },
            Source::Remote,
        )
        .unwrap();
        let err = walk
            .handle_segment(
                &dc("fra"),
                Segment {
                    links: vec![link("fra.1", "iad.1")],
                    tail: None,
                },
                Source::Remote,
            )
            .unwrap_err();
        assert_eq!(err, ChainError::Cycle(id("iad.1")));
        assert_eq!(walk.poll(), &Poll::Failed(err));
    }

    #[test]
    fn the_hop_limit_is_enforced() {
        let mut walk = ChainWalk::from_reservation(id("a.0"), 3);
        let links = (0..4)
            .map(|i| link(&format!("a.{i}"), &format!("a.{}", i + 1)))
            .collect();
        let err = walk
            .handle_segment(&dc("a"), Segment { links, tail: None }, Source::Remote)
            .unwrap_err();
        assert_eq!(err, ChainError::TooLong(3));
    }

    #[test]
    fn a_dc_may_not_speak_for_another_dcs_reservation() {
        let mut walk = ChainWalk::from_reservation(id("iad.1"), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("fra"),
                Segment {
                    links: vec![link("iad.1", "fra.1")],
                    tail: None,
                },
                Source::Remote,
            )
            .unwrap_err();
        assert!(matches!(err, ChainError::Inconsistent { .. }), "{err}");
        let mut walk = ChainWalk::from_reservation(id("iad.1"), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("iad"),
                Segment {
                    links: vec![],
                    tail: Some(vacant("iad.2")),
                },
                Source::Remote,
            )
            .unwrap_err();
        assert!(err.to_string().contains("where the walk stands"), "{err}");
    }

    #[test]
    fn local_segment_follows_links_inside_the_dc_and_stops_at_the_border() {
        use crate::record::{DcRecord, RecordState};
        use crate::{ActorId, HostTime, LeasePolicy, StoreTime};
        let policy = LeasePolicy::DEFAULT;
        let record = |at: &str, state: RecordState| {
            let (mut r, _) = DcRecord::reserve(
                id(at),
                key(),
                None,
                FencingToken::FIRST,
                None,
                ActorId::new("a").unwrap(),
                HostTime::from_ms(0),
                StoreTime::from_ms(0),
                &policy,
            );
            r.state = state;
            r
        };
        let records = [
            record("iad.1", RecordState::Linked { to: id("iad.2") }),
            record("iad.2", RecordState::Linked { to: id("fra.1") }),
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
                )
                .unwrap();
        }
        assert_eq!(reads, 2);
        let segment = segment.finish();
        assert_eq!(
            segment.links,
            vec![link("iad.1", "iad.2"), link("iad.2", "fra.1")]
        );
        assert_eq!(segment.tail, None);

        let mut unknown = LocalSegment::new(dc("iad"), id("iad.9"), HOP_LIMIT_DEFAULT);
        assert_eq!(
            unknown.handle(None, StoreTime::from_ms(1), &policy),
            Err(SegmentError::Unknown(id("iad.9")))
        );
    }

    #[test]
    fn answers_out_of_turn_fail_the_walk() {
        let mut walk = ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
        let err = walk
            .handle_segment(
                &dc("iad"),
                Segment {
                    links: vec![],
                    tail: Some(vacant("iad.1")),
                },
                Source::Remote,
            )
            .unwrap_err();
        assert_eq!(err, ChainError::Unexpected);
    }
}
