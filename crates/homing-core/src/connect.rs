//! Connect (`Acquire`) as a sans-IO stepper, run by the DC that received the
//! request (DESIGN.md §3.1, §3.2, §3.6). The driver loops on
//! [`Connect::poll`] and answers each [`ConnectNeed`] with the matching
//! `handle_*` call; every decision — create, follow the winner, re-activate,
//! link, give up — is taken here, so the daemon and the simulator agree.
//!
//! ```text
//! read global ─ absent ─► allocate ─► write own record ─► set_if_absent ─ Inserted ─► Acquired
//!      │                                                      └ Exists(w) ─► abandon own, walk from w
//!      └ present ─► walk the chain to the tail
//!           tail here:   read record ─► activate ─► CAS ─► Acquired | HeldElsewhere | TagMismatch
//!           tail there:  live ─► HeldElsewhere / TagMismatch
//!                        vacant ─► allocate ─► write own (token = tail + 1) ─► link at tail's DC
//!                             Linked ─► confirm the succession in the global store ─► Acquired
//!                                       (another won: a takeover) ─► link own to it, walk from it
//!                             AlreadyLinked(z) ─► abandon own, walk from z;
//!                             StillActive / TokenMoved ─► abandon own, walk from the tail again
//!      a DC does not answer for a reservation the walk follows (DESIGN.md §7.5):
//!           its succession in the global store ─ present ─► follow it like a link
//!                └ absent ─► that DC's lease ─ the takeover policy allows ─► allocate ─►
//!                     write own (token = the DC's token bound + 2) ─► take over (guarded write-once)
//!                          Taken ─► Acquired; Exists(s) ─► abandon own, walk from s;
//!                          Refused ─► abandon own, fail Unreachable (the caller may retry)
//!                     └ not allowed ─► fail Unreachable
//! ```
//!
//! A recreated reservation (its predecessor in another DC) grants only once
//! the global store names it as its predecessor's successor: after the link,
//! and again (from the driver's cache, usually) before a re-activation, so a
//! mover that crashed between the link and the confirmation cannot grant
//! from a reservation a takeover superseded.
//!
//! Restarted walks are bounded by [`CONNECT_ATTEMPTS_MAX`]; each walk by its hop limit.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::DcLeaseState;
use crate::actor::ActorId;
use crate::chain::{ChainError, ChainNeed, ChainPoll, ChainWalk, Segment, Source};
use crate::dc::DcId;
use crate::fencing::FencingToken;
use crate::key::{Key, Tag};
use crate::lease::{Deadlines, LeasePolicy};
use crate::link::{Shortcut, Succession};
use crate::record::RecordRead;
use crate::record::{
    ActivateReply, DcRecord, Holding, LinkReply, PreviousRun, TailState, TailView,
};
use crate::reservation::ReservationId;
use crate::succession::{TakeOverReply, TakeoverPolicy};
use crate::succession::{confirmation_of, superseding, takeover_link_token};
use crate::time::StoreTime;

/// Most walks one connect may start (the first plus restarts after lost races).
pub const CONNECT_ATTEMPTS_MAX: u32 = 8;

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectNeed {
    /// Read the key's global entry; answer with [`Connect::handle_global`].
    GlobalEntry(Key),
    /// What the owner of `id` knows about it: the local store's segment if
    /// `id.dc()` is the local DC, else a `ResolveReservation` to that DC.
    /// Answer with [`Connect::handle_segment`].
    Reservation(ReservationId),
    /// Read the local record `id`; answer with [`Connect::handle_local_record`].
    LocalRecord(ReservationId),
    /// A fresh unique from the local allocator; answer with [`Connect::handle_allocated`].
    Allocate,
    /// Compare-and-set a local record (`expected: None` = create); answer
    /// with [`Connect::handle_written`].
    Write {
        /// The version the stored record must have.
        expected: Option<u64>,
        /// The record to write.
        record: DcRecord,
    },
    /// Write-once the global entry; answer with [`Connect::handle_set_if_absent`].
    SetIfAbsent {
        /// The key.
        key: Key,
        /// Our new reservation.
        id: ReservationId,
    },
    /// The DC of this reservation did not answer: read who succeeds it in
    /// the global store (linearizable, or a cache: a present answer never
    /// changes); answer with [`Connect::handle_successor`].
    Successor(ReservationId),
    /// Read this DC's lease state in the global store; answer with
    /// [`Connect::handle_dc_lease`].
    DcLease(DcId),
    /// Make this succession its reservation's in the global store unless it
    /// has one (write-once; a cached or present answer will do); answer with
    /// [`Connect::handle_confirmed`] and the one the store has.
    Confirm(Succession),
    /// The guarded takeover write (`GlobalStore::take_over` under
    /// `policy`); answer with [`Connect::handle_taken_over`].
    TakeOver {
        /// The takeover.
        succession: Succession,
        /// The deployment's policy.
        policy: TakeoverPolicy,
    },
    /// Ask the tail's DC to link; answer with [`Connect::handle_link`].
    Link {
        /// The key.
        key: Key,
        /// The vacant tail (owned by another DC).
        from: ReservationId,
        /// Our new reservation.
        to: ReservationId,
        /// The tail's token as read.
        expected_token: FencingToken,
    },
}

/// How an acquire ended: the one type from the connect stepper through the
/// wire to the host. `G` is what the caller holds when it won: a [`Grant`]
/// from the stepper and on the wire, a running `HostAgent` in the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireReply<G = Grant> {
    /// The caller holds the key.
    Acquired(G),
    /// A live actor with the same tag holds the key: connect returns it.
    HeldElsewhere(Holder),
    /// A live actor holds the key under another tag.
    TagMismatch {
        /// The live actor's tag.
        existing: Option<Tag>,
    },
}

impl<G> AcquireReply<G> {
    /// The grant if the caller won; otherwise the reply as it stands, ready
    /// to be handed on with whatever grant type the caller's caller holds.
    pub fn into_grant<H>(self) -> Result<G, AcquireReply<H>> {
        match self {
            AcquireReply::Acquired(grant) => Ok(grant),
            AcquireReply::HeldElsewhere(holder) => Err(AcquireReply::HeldElsewhere(holder)),
            AcquireReply::TagMismatch { existing } => Err(AcquireReply::TagMismatch { existing }),
        }
    }
}

/// What an acquire that won grants its caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The key (with its generated name, if none was given).
    pub key: Key,
    /// The reservation held.
    pub reservation: ReservationId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// When to renew and stop, in the caller's clock.
    pub deadlines: Deadlines,
    /// The run this one follows and how it ended (`None`: the key's first holder).
    pub previous: Option<PreviousRun>,
}

/// The live actor that holds a key someone else tried to acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The key.
    pub key: Key,
    /// The live reservation (its DC is `reservation.dc()`).
    pub reservation: ReservationId,
    /// Its actor.
    pub actor: ActorId,
    /// Its fencing token.
    pub token: FencingToken,
}

/// Why a connect failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConnectError {
    /// The chain could not be walked.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// Lost every race for the key: [`CONNECT_ATTEMPTS_MAX`] in a row, or
    /// as many as fit in the time the caller gave ([`Connect::stop_restarts`]).
    #[error("lost the key to other acquires {0} times in a row: it is contended, try again")]
    Contended(u32),
    /// The stores contradict the protocol (e.g. a reservation in a chain is missing).
    #[error("inconsistent state: {0}")]
    Inconsistent(String),
    /// A DC in the chain did not answer, and the key cannot be taken over
    /// from it (yet): its lease has not expired, or the policy forbids it.
    #[error("dc {dc} did not answer and cannot be taken over: {reason}")]
    Unreachable {
        /// The DC.
        dc: DcId,
        /// Why no takeover.
        reason: String,
    },
    /// An answer arrived that the connect did not ask for.
    #[error("answer does not match what the connect needs")]
    Unexpected,
}

/// Where a connect stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectPoll {
    /// Do this and hand back the answer.
    Need(ConnectNeed),
    /// Finished.
    Done(AcquireReply),
    /// Failed; nothing more to do.
    Failed(ConnectError),
}

/// The result of a compare-and-set, as the store reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The record was written.
    Yes,
    /// The stored version was not the expected one; nothing written.
    Conflict,
}

/// Whether our reservation is the key's first or continues a vacant tail.
#[derive(Debug, Clone)]
enum Plan {
    First,
    Recreate(TailView),
    /// A takeover of `tail`, whose DC published `token_bound`.
    TakeOver {
        tail: ReservationId,
        token_bound: u64,
    },
}

/// What to do once our record has left the race.
#[derive(Debug, Clone)]
enum Then {
    WalkFrom(ReservationId),
    Fail(ConnectError),
}

#[derive(Debug, Clone)]
enum Phase {
    /// Boxed: a walk is several times larger than the other phases.
    Walking(Box<ChainWalk>),
    Allocating(Plan),
    Creating(Plan, DcRecord, Deadlines),
    SettingGlobal(DcRecord, Deadlines),
    Linking(DcRecord, Deadlines, TailView),
    /// Our new record, linked at the tail's DC: confirming the succession.
    Confirming(DcRecord, Deadlines, Succession),
    /// The walk needs the succession of a reservation whose DC did not answer.
    SeekingSuccessor(Box<ChainWalk>),
    /// No succession: may the tail's DC be taken over?
    JudgingDc(ReservationId),
    TakingOver(DcRecord, Deadlines, Succession),
    ReadingLocal(ReservationId),
    /// A re-activation of a recreated record (as read, as it would be
    /// written), confirming its succession first.
    /// Boxed: two records would make every phase twice as large.
    ConfirmingLocal(DcRecord, Box<DcRecord>, ActivateReply, Succession),
    Activating(DcRecord, ActivateReply),
    /// Our record lost its confirmation: recording its own succession to
    /// the winner in the global store before linking to it locally.
    Superseding(DcRecord, Succession),
    /// Our record leaves the race: abandoned, or linked to the winner.
    Leaving(DcRecord, Then),
    Finished(ConnectPoll),
}

/// One connect. See the module docs for the flow.
#[derive(Debug, Clone)]
pub struct Connect {
    local: DcId,
    key: Key,
    tag: Option<Tag>,
    holder: Holding,
    policy: LeasePolicy,
    hop_limit: usize,
    takeover: TakeoverPolicy,
    attempts: u32,
    /// No restart after a lost race: the caller's time is up.
    restarts_stopped: bool,
    /// The key's first reservation, once a walk or the global write named it.
    entry: Option<ReservationId>,
    /// What the driver should tell the entry's DC after a link.
    notice: Option<ShortcutNotice>,
    phase: Phase,
}

/// After a link, the new tail tells the DC of the key's first reservation
/// (DESIGN.md §7.2), which records it as the chain's shortcut. homingd sends
/// it again until that DC answers; until it lands, walks follow the links
/// past the last shortcut recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortcutNotice {
    /// The key.
    pub key: Key,
    /// The key's first reservation (its owner records the shortcut).
    pub entry: ReservationId,
    /// The new tail.
    pub shortcut: Shortcut,
}

impl Connect {
    /// A connect for `key` received by `local` from `holder` (its actor,
    /// lease key, and clock when it sent the request).
    pub fn new(
        local: DcId,
        key: Key,
        tag: Option<Tag>,
        holder: Holding,
        policy: LeasePolicy,
        hop_limit: usize,
    ) -> Connect {
        let walk = ChainWalk::from_key(key.clone(), hop_limit);
        Connect {
            local,
            key,
            tag,
            holder,
            policy,
            hop_limit,
            takeover: TakeoverPolicy::Automatic,
            attempts: 1,
            restarts_stopped: false,
            entry: None,
            notice: None,
            phase: Phase::Walking(Box::new(walk)),
        }
    }

    /// The host session the holder asks under, as read again: an acquire
    /// whose guarded write lost to the session's renewal reads the row
    /// anew before the connect writes again.
    pub fn set_holder_session(&mut self, row: Option<Box<crate::SessionRecord>>) {
        self.holder.session = row;
    }

    /// The caller's time is up: the next lost race ends this connect
    /// [`ConnectError::Contended`] instead of restarting it. Steps already
    /// under way finish (a restart is the one point where nothing of ours
    /// is left half done).
    pub fn stop_restarts(&mut self) {
        self.restarts_stopped = true;
    }

    /// Starts the first walk at `hint`, a member of the key's chain the
    /// driver remembers (from an earlier connect's tail), instead of walking
    /// from the entry. Call before the first answer.
    pub fn with_hint(mut self, hint: Option<Shortcut>) -> Connect {
        if let Phase::Walking(walk) = self.phase {
            self.phase = Phase::Walking(Box::new(walk.with_hint(hint)));
        }
        self
    }

    /// Under `policy` (default: [`TakeoverPolicy::Automatic`]) for the tails
    /// of DCs that do not answer.
    pub fn with_takeover(mut self, policy: TakeoverPolicy) -> Connect {
        self.takeover = policy;
        self
    }

    /// Whether the need [`Connect::poll`] names is the allocation for the
    /// key's first reservation: a create that, if it wins, writes a global
    /// entry kept forever (a DC bounds those per namespace: homing-node's
    /// `KeyQuota`). False for a recreate, which writes no entry.
    pub fn creates_key(&self) -> bool {
        matches!(self.phase, Phase::Allocating(Plan::First))
    }

    /// The key this connect is for (with its generated name, if any).
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The key's first reservation, once a walk or the global write named it.
    pub fn entry(&self) -> Option<&ReservationId> {
        self.entry.as_ref()
    }

    /// The notice to send after this connect linked the key's chain to its
    /// new reservation; `None` otherwise (taken once).
    pub fn take_notice(&mut self) -> Option<ShortcutNotice> {
        self.notice.take()
    }

    /// What the connect needs next, or how it ended.
    pub fn poll(&self) -> ConnectPoll {
        match &self.phase {
            Phase::Walking(walk) => match walk.poll() {
                ChainPoll::Need(ChainNeed::GlobalEntry(key)) => {
                    ConnectPoll::Need(ConnectNeed::GlobalEntry(key.clone()))
                }
                ChainPoll::Need(ChainNeed::Reservation(id)) => {
                    ConnectPoll::Need(ConnectNeed::Reservation(id.clone()))
                }
                // `handle_global`/`handle_segment` move on from these at once.
                ChainPoll::NotFound | ChainPoll::Done(_) => {
                    ConnectPoll::Failed(ConnectError::Unexpected)
                }
                ChainPoll::Failed(e) => ConnectPoll::Failed(e.clone().into()),
            },
            Phase::Allocating(_) => ConnectPoll::Need(ConnectNeed::Allocate),
            Phase::Creating(_, record, _) => ConnectPoll::Need(ConnectNeed::Write {
                expected: None,
                record: record.clone(),
            }),
            Phase::SettingGlobal(record, _) => ConnectPoll::Need(ConnectNeed::SetIfAbsent {
                key: self.key.clone(),
                id: record.id.clone(),
            }),
            Phase::Linking(record, _, tail) => ConnectPoll::Need(ConnectNeed::Link {
                key: self.key.clone(),
                from: tail.id.clone(),
                to: record.id.clone(),
                expected_token: tail.token,
            }),
            Phase::Confirming(_, _, succession)
            | Phase::ConfirmingLocal(_, _, _, succession)
            | Phase::Superseding(_, succession) => {
                ConnectPoll::Need(ConnectNeed::Confirm(succession.clone()))
            }
            Phase::SeekingSuccessor(walk) => match walk.poll() {
                ChainPoll::Need(ChainNeed::Reservation(id)) => {
                    ConnectPoll::Need(ConnectNeed::Successor(id.clone()))
                }
                _ => ConnectPoll::Failed(ConnectError::Unexpected),
            },
            Phase::JudgingDc(tail) => ConnectPoll::Need(ConnectNeed::DcLease(tail.dc().clone())),
            Phase::TakingOver(_, _, succession) => ConnectPoll::Need(ConnectNeed::TakeOver {
                succession: succession.clone(),
                policy: self.takeover,
            }),
            Phase::ReadingLocal(id) => ConnectPoll::Need(ConnectNeed::LocalRecord(id.clone())),
            Phase::Activating(next, _) => ConnectPoll::Need(ConnectNeed::Write {
                expected: Some(next.version - 1),
                record: next.clone(),
            }),
            Phase::Leaving(left, _) => ConnectPoll::Need(ConnectNeed::Write {
                expected: Some(left.version - 1),
                record: left.clone(),
            }),
            Phase::Finished(poll) => poll.clone(),
        }
    }

    /// The key's global entry.
    pub fn handle_global(&mut self, entry: Option<ReservationId>, source: Source) {
        let Phase::Walking(walk) = &mut self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        if let Some(id) = &entry {
            self.entry = Some(id.clone());
        }
        if let Err(e) = walk.handle_global(entry, source) {
            return self.fail(e.into());
        }
        self.after_walk_step();
    }

    /// What `answered_by` knows about the reservation the walk needs.
    pub fn handle_segment(&mut self, answered_by: &DcId, segment: Segment, source: Source) {
        let Phase::Walking(walk) = &mut self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        if let Err(e) = walk.handle_segment(answered_by, segment, source) {
            return self.fail(e.into());
        }
        self.after_walk_step();
    }

    /// `answered_by` has no usable record of the reservation the walk needs
    /// (unknown or abandoned): fatal, unless the walk was trying a shortcut.
    pub fn handle_disowned(&mut self, answered_by: &DcId, source: Source) {
        let Phase::Walking(walk) = &mut self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        if let Err(e) = walk.handle_disowned(answered_by, source) {
            return self.fail(e.into());
        }
        self.after_walk_step();
    }

    /// The DC that owns the reservation the walk needs did not answer.
    /// `false` when that is not this connect's to handle (the reservation is
    /// this DC's own: its store failed; or no walk needs one): the caller
    /// treats the failure as before. `true`: poll again — the walk gave up a
    /// shortcut, or the connect now seeks the reservation's succession.
    pub fn handle_unreachable(&mut self) -> bool {
        let Phase::Walking(walk) = &mut self.phase else {
            return false;
        };
        match walk.poll() {
            ChainPoll::Need(ChainNeed::Reservation(id)) if id.dc() != &self.local => {}
            _ => return false,
        }
        match walk.handle_unreachable() {
            Ok(Some(_)) => {
                if let Phase::Walking(walk) = self.take_phase() {
                    self.phase = Phase::SeekingSuccessor(walk);
                }
            }
            Ok(None) => self.after_walk_step(),
            Err(e) => self.fail(e.into()),
        }
        true
    }

    /// The phase, leaving `Unexpected` in its place until the caller sets the next.
    fn take_phase(&mut self) -> Phase {
        std::mem::replace(
            &mut self.phase,
            Phase::Finished(ConnectPoll::Failed(ConnectError::Unexpected)),
        )
    }

    /// The global store's succession of the reservation whose DC did not
    /// answer (`None`: none), and the furthest member of the key's chain the
    /// driver remembers (a hint, checked when jumped to).
    pub fn handle_successor(
        &mut self,
        succession: Option<Succession>,
        hint: Option<Shortcut>,
        source: Source,
    ) {
        let Phase::SeekingSuccessor(walk) = &mut self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        let ChainPoll::Need(ChainNeed::Reservation(at)) = walk.poll().clone() else {
            return self.fail(ConnectError::Unexpected);
        };
        match succession {
            Some(succession) => {
                if let Err(e) = walk.handle_successor(succession.link, hint, source) {
                    return self.fail(e.into());
                }
                if let Phase::SeekingSuccessor(walk) = self.take_phase() {
                    self.phase = Phase::Walking(walk);
                }
                self.after_walk_step();
            }
            None => self.phase = Phase::JudgingDc(at),
        }
    }

    /// The lease state of the DC whose tail did not answer.
    pub fn handle_dc_lease(&mut self, state: DcLeaseState) {
        let Phase::JudgingDc(tail) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        if !self.takeover.allows(&state) {
            let reason = format!(
                "its lease is {:?}{} and the takeover policy is {}",
                state.standing,
                if state.retired { " (retired)" } else { "" },
                self.takeover.as_str()
            );
            let dc = tail.dc().clone();
            return self.fail(ConnectError::Unreachable { dc, reason });
        }
        self.phase = Phase::Allocating(Plan::TakeOver {
            tail: tail.clone(),
            token_bound: state.marks.token_bound,
        });
    }

    /// The store's answer to the takeover write.
    pub fn handle_taken_over(&mut self, reply: TakeOverReply) {
        let Phase::TakingOver(record, deadlines, succession) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        let (record, deadlines, tail) = (record.clone(), *deadlines, succession.link.from.clone());
        match reply {
            TakeOverReply::Taken => {
                self.note_move(&tail, &record);
                self.acquired(record, deadlines)
            }
            TakeOverReply::Exists(winner) if winner.names(&record.id) => {
                self.note_move(&tail, &record);
                self.acquired(record, deadlines)
            }
            TakeOverReply::Exists(winner) => self.abandon(record, Then::WalkFrom(winner.link.to)),
            TakeOverReply::Refused(state) => {
                // The DC renewed (or was never expired, or published a
                // higher token bound) after all: leave our record and let
                // the caller try again.
                let reason = format!(
                    "its lease is {:?} (token bound {}) after all",
                    state.standing, state.marks.token_bound
                );
                let dc = tail.dc().clone();
                self.abandon(record, Then::Fail(ConnectError::Unreachable { dc, reason }))
            }
        }
    }

    /// The succession the global store has for the reservation our record
    /// continues (ours, or a takeover's that won).
    pub fn handle_confirmed(&mut self, recorded: Succession) {
        match self.take_phase() {
            Phase::Superseding(record, _) => self.leave_superseded(&record, &recorded),
            Phase::Confirming(record, deadlines, ours) if recorded.names(&record.id) => {
                self.note_move(&ours.link.from, &record);
                self.acquired(record, deadlines)
            }
            Phase::ConfirmingLocal(read, next, reply, _) if recorded.names(&read.id) => {
                self.phase = Phase::Activating(*next, reply)
            }
            // A takeover won: our record never granted; it continues as the
            // winner, so every path through it leads there.
            Phase::Confirming(record, _, _) | Phase::ConfirmingLocal(record, _, _, _) => {
                self.supersede(&record, &recorded)
            }
            _ => self.fail(ConnectError::Unexpected),
        }
    }

    /// Our record lost its confirmation to `winner`: first the global
    /// store records who continues it, then it links locally.
    fn supersede(&mut self, record: &DcRecord, winner: &Succession) {
        // Neither stopped nor capped: our record must first say who
        // continues it (then the walk from the winner counts as usual).
        let ours = superseding(record, &winner.link.to);
        self.phase = Phase::Superseding(record.clone(), ours);
    }

    /// The global store's succession of our superseded record: it links to
    /// whoever that names, and the walk goes on there.
    fn leave_superseded(&mut self, record: &DcRecord, recorded: &Succession) {
        let to = recorded.link.to.clone();
        match record.supersede(recorded) {
            Some(next) => self.phase = Phase::Leaving(next, Then::WalkFrom(to)),
            None => self.walk_from(to),
        }
    }

    /// After our record succeeded `from`: what to tell the key's entry.
    fn note_move(&mut self, from: &ReservationId, record: &DcRecord) {
        self.notice = self
            .entry
            .clone()
            .filter(|entry| entry != from)
            .map(|entry| ShortcutNotice {
                key: self.key.clone(),
                entry,
                shortcut: Shortcut {
                    to: record.id.clone(),
                    token: record.token,
                },
            });
    }

    fn after_walk_step(&mut self) {
        let Phase::Walking(walk) = &self.phase else {
            return;
        };
        match walk.poll().clone() {
            ChainPoll::Need(_) | ChainPoll::Failed(_) => {}
            ChainPoll::NotFound => self.phase = Phase::Allocating(Plan::First),
            ChainPoll::Done(walked) => self.at_tail(walked.tail),
        }
    }

    fn at_tail(&mut self, tail: TailView) {
        if tail.id.dc() == &self.local {
            self.phase = Phase::ReadingLocal(tail.id);
            return;
        }
        match tail.state {
            TailState::Vacant { .. } => self.phase = Phase::Allocating(Plan::Recreate(tail)),
            TailState::Active { actor } if tail.tag == self.tag => {
                self.finish(AcquireReply::HeldElsewhere(Holder {
                    key: self.key.clone(),
                    reservation: tail.id,
                    actor,
                    token: tail.token,
                }))
            }
            TailState::Active { .. } => {
                self.finish(AcquireReply::TagMismatch { existing: tail.tag })
            }
        }
    }

    /// A fresh unique from the local allocator; `now` is the local store's clock.
    pub fn handle_allocated(&mut self, unique: u64, now: StoreTime) {
        let Phase::Allocating(plan) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        let (token, previous) = match plan {
            Plan::First => (FencingToken::FIRST, None),
            Plan::Recreate(tail) => (tail.token.next(), Some(previous_run(tail))),
            Plan::TakeOver { tail, token_bound } => {
                let link = takeover_link_token(*token_bound);
                let previous = PreviousRun {
                    reservation: tail.clone(),
                    token: link,
                    // Its DC's lease expired: the holder stopped by its deadline.
                    ended: crate::record::ReleaseCause::Expired,
                };
                (link.next(), Some(previous))
            }
        };
        let (record, deadlines) = DcRecord::reserve(
            ReservationId::new(self.local.clone(), unique),
            self.key.clone(),
            self.tag.clone(),
            token,
            previous,
            &self.holder,
            now,
            &self.policy,
        );
        self.phase = Phase::Creating(plan.clone(), record, deadlines);
    }

    /// The result of the compare-and-set the connect asked for.
    pub fn handle_written(&mut self, written: Written) {
        match (
            std::mem::replace(
                &mut self.phase,
                Phase::Finished(ConnectPoll::Failed(ConnectError::Unexpected)),
            ),
            written,
        ) {
            (Phase::Creating(plan, record, deadlines), Written::Yes) => {
                self.phase = match plan {
                    Plan::First => Phase::SettingGlobal(record, deadlines),
                    Plan::Recreate(tail) => Phase::Linking(record, deadlines, tail),
                    Plan::TakeOver { tail, token_bound } => {
                        let succession =
                            Succession::taken_over(tail, record.id.clone(), token_bound);
                        Phase::TakingOver(record, deadlines, succession)
                    }
                }
            }
            (Phase::Creating(_, record, _), Written::Conflict) => {
                self.fail(ConnectError::Inconsistent(format!(
                    "allocator handed out {}, which already has a record",
                    record.id
                )))
            }
            (
                Phase::Activating(
                    next,
                    ActivateReply::Activated {
                        token,
                        deadlines,
                        previous,
                    },
                ),
                Written::Yes,
            ) => self.finish(AcquireReply::Acquired(Grant {
                key: self.key.clone(),
                reservation: next.id,
                token,
                deadlines,
                previous,
            })),
            (Phase::Activating(next, _), Written::Conflict) => {
                // Someone changed the tail between our read and write: read again.
                if self.count_attempt() {
                    self.phase = Phase::ReadingLocal(next.id);
                }
            }
            // An abandon that loses its race is left to the orphan sweeper.
            (Phase::Leaving(_, Then::WalkFrom(id)), _) => self.walk_from(id),
            (Phase::Leaving(_, Then::Fail(e)), _) => self.fail(e),
            (_, _) => self.fail(ConnectError::Unexpected),
        }
    }

    /// The reservation whose global entry it is writing now, if it is.
    pub fn creating(&self) -> Option<&ReservationId> {
        match &self.phase {
            Phase::SettingGlobal(record, _) => Some(&record.id),
            _ => None,
        }
    }

    /// The result of writing the global entry.
    pub fn handle_set_if_absent(&mut self, existing: Option<ReservationId>) {
        let Phase::SettingGlobal(record, deadlines) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        match existing {
            // Inserted, or a retried write of our own entry: ours is the entry.
            None => {
                self.entry = Some(record.id.clone());
                self.acquired(record.clone(), *deadlines)
            }
            Some(winner) if winner == record.id => {
                self.entry = Some(winner);
                self.acquired(record.clone(), *deadlines)
            }
            Some(winner) => {
                self.entry = Some(winner.clone());
                self.abandon(record.clone(), Then::WalkFrom(winner))
            }
        }
    }

    /// The local record the connect asked for, with its session's row;
    /// `now` is the local store's clock.
    pub fn handle_local_record(&mut self, read: Option<RecordRead>, now: StoreTime) {
        let Phase::ReadingLocal(id) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        let Some(RecordRead { record, session }) = read else {
            let message = format!("reservation {id} is in the chain but has no record");
            return self.fail(ConnectError::Inconsistent(message));
        };
        let out = record.activate(
            self.tag.as_ref(),
            &self.holder,
            now,
            &self.policy,
            session.as_deref(),
        );
        match (out.next, out.reply) {
            (Some(next), reply @ ActivateReply::Activated { .. }) => {
                // A recreated record confirms its succession first.
                self.phase = match confirmation_of(&record) {
                    Some(succession) => {
                        Phase::ConfirmingLocal(record, Box::new(next), reply, succession)
                    }
                    None => Phase::Activating(next, reply),
                }
            }
            (_, ActivateReply::StillActive { actor, token }) => {
                self.finish(AcquireReply::HeldElsewhere(Holder {
                    key: self.key.clone(),
                    reservation: record.id,
                    actor,
                    token,
                }))
            }
            (_, ActivateReply::TagMismatch { existing }) => {
                self.finish(AcquireReply::TagMismatch { existing })
            }
            (_, ActivateReply::Linked { to }) => {
                // Linked since the walk read it: continue from the new link.
                if self.count_attempt() {
                    self.walk_from(to);
                }
            }
            (_, ActivateReply::Abandoned) | (None, ActivateReply::Activated { .. }) => {
                self.fail(ConnectError::Inconsistent(format!(
                    "reservation {} is in the chain but abandoned",
                    record.id
                )))
            }
        }
    }

    /// The tail DC's answer to our link request.
    pub fn handle_link(&mut self, reply: LinkReply) {
        let Phase::Linking(record, deadlines, tail) = &self.phase else {
            return self.fail(ConnectError::Unexpected);
        };
        let (record, deadlines, token, tail) =
            (record.clone(), *deadlines, tail.token, tail.id.clone());
        match reply {
            LinkReply::Linked => {
                let succession = Succession::moved(tail, record.id.clone(), token);
                self.phase = Phase::Confirming(record, deadlines, succession);
            }
            LinkReply::AlreadyLinked(next) => self.abandon(record, Then::WalkFrom(next)),
            // Re-read the tail: its new holder's tag (a re-activation may
            // change it; the reply does not carry it) decides HeldElsewhere
            // or TagMismatch. Vacant again at a newer token: its previous run.
            LinkReply::StillActive { .. } | LinkReply::TokenMoved { .. } => {
                self.abandon(record, Then::WalkFrom(tail))
            }
            LinkReply::Abandoned => self.fail(ConnectError::Inconsistent(format!(
                "tail {tail} answered that it is abandoned"
            ))),
            LinkReply::OtherKey => self.fail(ConnectError::Inconsistent(format!(
                "tail {tail} answered that it is of another key than {}",
                self.key
            ))),
        }
    }

    /// Our own `record`, granted: the grant tells the run it recorded.
    fn acquired(&mut self, record: DcRecord, deadlines: Deadlines) {
        self.finish(AcquireReply::Acquired(Grant {
            key: self.key.clone(),
            previous: record.previous_run(),
            reservation: record.id,
            token: record.token,
            deadlines,
        }));
    }

    /// Abandons our record, then goes on: a walk counts as a restart (past
    /// the bound the record is still abandoned, then the connect fails); a
    /// failure keeps its own error.
    fn abandon(&mut self, record: DcRecord, then: Then) {
        let then = match then {
            Then::WalkFrom(id) => match self.restart() {
                Ok(()) => Then::WalkFrom(id),
                Err(e) => Then::Fail(e),
            },
            fail @ Then::Fail(_) => fail,
        };
        self.leave(record, then);
    }

    /// Abandons our record (if it is still ours to abandon), then goes on.
    fn leave(&mut self, record: DcRecord, then: Then) {
        match record.abandon() {
            Some(abandoned) => self.phase = Phase::Leaving(abandoned, then),
            None => match then {
                Then::WalkFrom(id) => self.walk_from(id),
                Then::Fail(e) => self.fail(e),
            },
        }
    }

    fn walk_from(&mut self, id: ReservationId) {
        let walk = ChainWalk::from_reservation(self.key.clone(), id, self.hop_limit);
        self.phase = Phase::Walking(Box::new(walk));
    }

    /// Counts a restart; false (and failed) once the bound is reached or
    /// restarts were stopped.
    fn count_attempt(&mut self) -> bool {
        match self.restart() {
            Ok(()) => true,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// Counts a restart, unless the bound is reached or restarts were stopped.
    fn restart(&mut self) -> Result<(), ConnectError> {
        if self.attempts >= CONNECT_ATTEMPTS_MAX || self.restarts_stopped {
            return Err(ConnectError::Contended(self.attempts));
        }
        self.attempts += 1;
        Ok(())
    }

    fn finish(&mut self, outcome: AcquireReply) {
        self.phase = Phase::Finished(ConnectPoll::Done(outcome));
    }

    fn fail(&mut self, error: ConnectError) {
        self.phase = Phase::Finished(ConnectPoll::Failed(error));
    }
}

/// The run a recreate follows: the vacant tail it links from.
fn previous_run(tail: &TailView) -> PreviousRun {
    let ended = match &tail.state {
        TailState::Vacant { ended } => ended.clone(),
        // Only a vacant tail is recreated; a lapsed one ended by expiry.
        TailState::Active { .. } => crate::record::ReleaseCause::Expired,
    };
    PreviousRun {
        reservation: tail.id.clone(),
        token: tail.token,
        ended,
    }
}
