//! The DC record and its state machine. A DC owns one record per reservation
//! it created; every change is a pure function `(record, request, now) ->
//! (next record, reply)`, and the store writes `next` with a compare-and-set
//! on `version`, so a stale token or a lost race is caught in the store's
//! transaction. Transitions:
//!
//! ```text
//! reserve ─► Active ──renew (same token and lease key, allow_renew)──► Active (expiry moved)
//!              │ release (same token and lease key),
//!              │ force release (same token), cancel (same lease key)
//!              │                           │ now ≥ expiry + grace (reap)
//!              ▼                           ▼
//!            Released ◄────────────────────┘
//!              │ activate (same DC): token + 1 ─► Active
//!              │ link(to, expected token)       ─► Linked { to }   (terminal)
//! Active/Released, never linked, lost the race ─► Abandoned          (terminal)
//! any but Abandoned, the global store names another successor ─► Linked { successor }
//! ```
//!
//! An `Active` record keeps the holder's [`LeaseKey`]: renew and release
//! must present it, and an acquire that presents it again (a retry whose
//! reply was lost) is answered with the same grant, renewed.

use serde::{Deserialize, Serialize};

use crate::actor::ActorId;
use crate::fencing::FencingToken;
use crate::key::{Key, Tag};
use crate::label::{LabelRule, label_type};
use crate::lease::{Deadlines, LeasePolicy};
use crate::lease_key::LeaseKey;
use crate::link::{Shortcut, Succession};
use crate::reservation::ReservationId;
use crate::session::{Expiry, SessionId, SessionRecord};
use crate::time::{HostTime, StoreTime};

/// A DC's record of one reservation it owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcRecord {
    /// The reservation; its DC is the owner of this record.
    pub id: ReservationId,
    /// The key reserved.
    pub key: Key,
    /// The tag of the current (or last) holder.
    pub tag: Option<Tag>,
    /// The current holder's fencing token.
    pub token: FencingToken,
    /// `false` once an operator drained the key: renewals are refused.
    pub allow_renew: bool,
    /// The reservation this one continues (`None` for the global entry's own).
    pub predecessor: Option<ReservationId>,
    /// Where the reservation is in its life.
    pub state: RecordState,
    /// A later member of the key's chain, recorded on the key's first
    /// reservation after every move (a hint for walkers; DESIGN.md §7.2).
    /// Boxed: most records have none, and a record travels inside enums.
    pub shortcut: Option<Box<Shortcut>>,
    /// Bumped by every transition; the store's compare-and-set checks it.
    pub version: u64,
}

/// Where a reservation is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A host holds a lease on `actor` until its expiry.
    Active {
        /// The actor the holder runs.
        actor: ActorId,
        /// Until when: a store time of its own, or its host session's;
        /// reaped after the grace period.
        expiry: Expiry,
        /// The holder's secret: renew and release present it, a retried
        /// acquire with it gets this grant again. `None` only for leases
        /// granted before lease keys existed, which no host can present.
        lease: Option<LeaseKey>,
        /// The run this grant follows, as the grant told the holder (a
        /// retried acquire is told the same). Boxed: it may carry a reason.
        previous: Option<Box<PreviousRun>>,
    },
    /// No holder; the next reserve re-activates (same DC) or links (other DC).
    Released {
        /// When it was released or reaped, in store time.
        at: StoreTime,
        /// Why.
        cause: ReleaseCause,
    },
    /// Continues as `to`. Immutable: every cached link stays true forever.
    Linked {
        /// The next reservation of the chain.
        to: ReservationId,
    },
    /// Never became part of the key's chain (it lost a race); kept as a
    /// tombstone so its ID is not reused, never served.
    Abandoned,
}

/// [`RecordState`] as stored and sent. Variants 0–3 are the layout of
/// before sessions, byte for byte, so every record a per-key lease or no
/// lease holds reads and writes as it always did (and a process of the
/// previous protocol version reads it); a key held under a session is a
/// fifth variant, written only once the deployment speaks sessions.
#[derive(Serialize)]
enum StateOut<'a> {
    Active {
        actor: &'a ActorId,
        expires_at: StoreTime,
        lease: &'a Option<LeaseKey>,
        previous: &'a Option<Box<PreviousRun>>,
    },
    Released {
        at: StoreTime,
        cause: &'a ReleaseCause,
    },
    Linked {
        to: &'a ReservationId,
    },
    Abandoned,
    ActiveInSession {
        actor: &'a ActorId,
        session: &'a SessionId,
        frozen: Option<(StoreTime, u64)>,
        lease: &'a Option<LeaseKey>,
        previous: &'a Option<Box<PreviousRun>>,
    },
}

/// [`StateOut`], owned, for reading.
#[derive(Deserialize)]
enum StateIn {
    Active {
        actor: ActorId,
        expires_at: StoreTime,
        lease: Option<LeaseKey>,
        previous: Option<Box<PreviousRun>>,
    },
    Released {
        at: StoreTime,
        cause: ReleaseCause,
    },
    Linked {
        to: ReservationId,
    },
    Abandoned,
    ActiveInSession {
        actor: ActorId,
        session: SessionId,
        frozen: Option<(StoreTime, u64)>,
        lease: Option<LeaseKey>,
        previous: Option<Box<PreviousRun>>,
    },
}

impl Serialize for RecordState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let out = match self {
            RecordState::Active {
                actor,
                expiry,
                lease,
                previous,
            } => match expiry {
                Expiry::At(expires_at) => StateOut::Active {
                    actor,
                    expires_at: *expires_at,
                    lease,
                    previous,
                },
                Expiry::Session(session) => StateOut::ActiveInSession {
                    actor,
                    session,
                    frozen: None,
                    lease,
                    previous,
                },
                Expiry::Frozen {
                    session,
                    at,
                    notice,
                } => StateOut::ActiveInSession {
                    actor,
                    session,
                    frozen: Some((*at, *notice)),
                    lease,
                    previous,
                },
            },
            RecordState::Released { at, cause } => StateOut::Released { at: *at, cause },
            RecordState::Linked { to } => StateOut::Linked { to },
            RecordState::Abandoned => StateOut::Abandoned,
        };
        out.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RecordState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match StateIn::deserialize(deserializer)? {
            StateIn::Active {
                actor,
                expires_at,
                lease,
                previous,
            } => RecordState::Active {
                actor,
                expiry: Expiry::At(expires_at),
                lease,
                previous,
            },
            StateIn::ActiveInSession {
                actor,
                session,
                frozen,
                lease,
                previous,
            } => RecordState::Active {
                actor,
                expiry: match frozen {
                    None => Expiry::Session(session),
                    Some((at, notice)) => Expiry::Frozen {
                        session,
                        at,
                        notice,
                    },
                },
                lease,
                previous,
            },
            StateIn::Released { at, cause } => RecordState::Released { at, cause },
            StateIn::Linked { to } => RecordState::Linked { to },
            StateIn::Abandoned => RecordState::Abandoned,
        })
    }
}

/// Where a page of records in `(key, id)` order ended: the last record
/// returned. The next page starts strictly after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ScanCursor {
    /// The last record's key.
    pub key: Key,
    /// The last record's reservation ID.
    pub id: ReservationId,
}

impl ScanCursor {
    /// The cursor just past `record`.
    pub fn after(record: &DcRecord) -> ScanCursor {
        ScanCursor {
            key: record.key.clone(),
            id: record.id.clone(),
        }
    }
}

/// Why a record left `Active`: the previous run's end, as the next holder learns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    /// The holder released it, saying how its run ended.
    Released(RunOutcome),
    /// The lease ran out and was reaped after the grace period: the holder
    /// stopped (or was presumed stopped) without saying how.
    Expired,
    /// An operator released it without the holder (`homing release`): the
    /// holder may still be running until its hard deadline.
    Forced,
    /// The host gave up on its acquire before the grant reached it and
    /// cancelled it: no actor ran.
    Cancelled,
}

impl std::fmt::Display for ReleaseCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseCause::Released(RunOutcome::Ok) => f.write_str("released ok"),
            ReleaseCause::Released(RunOutcome::Failed { reason }) => {
                write!(f, "released failed: {reason}")
            }
            ReleaseCause::Expired => f.write_str("expired"),
            ReleaseCause::Forced => f.write_str("force-released by an operator"),
            ReleaseCause::Cancelled => f.write_str("cancelled by its host before it ran"),
        }
    }
}

/// How a holder's run ended, carried by its `Release`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunOutcome {
    /// It finished cleanly.
    #[default]
    Ok,
    /// It failed; the next holder may need to recover.
    Failed {
        /// Why, for the next holder and the operator.
        reason: FailureReason,
    },
}

/// Longest failure reason a release may carry, in bytes.
pub const FAILURE_REASON_BYTES_MAX: usize = 512;

const FAILURE_REASON_RULE: LabelRule = LabelRule {
    what: "failure reason",
    bytes_min: 1,
    bytes_max: FAILURE_REASON_BYTES_MAX,
    alphabet: None,
    segmented: false,
};

label_type!(
    /// Why a run failed: 1–512 bytes of text, no control characters.
    FailureReason,
    FAILURE_REASON_RULE
);

/// The run a new holder follows: the reservation and token it replaced and how that run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousRun {
    /// The reservation the previous holder held.
    pub reservation: ReservationId,
    /// Its token.
    pub token: FencingToken,
    /// How it ended.
    pub ended: ReleaseCause,
}

/// A transition's result: the record to write (if it changed) and the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition<R> {
    /// `Some` when the record must be written (compare-and-set on the old version).
    pub next: Option<DcRecord>,
    /// What to answer.
    pub reply: R,
}

impl<R> Transition<R> {
    fn unchanged(reply: R) -> Self {
        Transition { next: None, reply }
    }
}

/// What a reservation looks like to a resolver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TailState {
    /// A live holder runs `actor`.
    Active {
        /// The actor.
        actor: ActorId,
    },
    /// No live holder: released, or the lease lapsed.
    Vacant {
        /// How the last run ended (`Expired` also for a lapsed lease not yet reaped).
        ended: ReleaseCause,
    },
}

/// A tail as a resolver sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailView {
    /// The tail reservation.
    pub id: ReservationId,
    /// Its current fencing token.
    pub token: FencingToken,
    /// The tag of its current (or last) holder: connect checks it.
    pub tag: Option<Tag>,
    /// Whether an actor runs there.
    pub state: TailState,
}

impl TailView {
    /// The actor a resolver answers with, and may cache for its tail TTL;
    /// `None` for a vacant tail, which is never an answer nor cached: it is
    /// about to be recreated, and the next resolve must see the new link.
    pub fn answer(&self) -> Option<&ActorId> {
        match &self.state {
            TailState::Active { actor } => Some(actor),
            TailState::Vacant { .. } => None,
        }
    }
}

/// A record as a resolver sees it: a link to follow, a tail, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordView {
    /// Follow this link.
    Link(ReservationId),
    /// The end of the chain.
    Tail(TailView),
    /// Not part of any chain.
    Abandoned,
}

/// Reply to an acquire at the DC that owns the tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivateReply {
    /// The caller is the new holder.
    Activated {
        /// Its token (previous + 1, or the same for a retried acquire).
        token: FencingToken,
        /// Its deadlines, in its clock.
        deadlines: Deadlines,
        /// The run it follows.
        previous: Option<PreviousRun>,
    },
    /// Someone holds it; connect semantics return that actor.
    StillActive {
        /// The live actor.
        actor: ActorId,
        /// Its token.
        token: FencingToken,
    },
    /// A live actor holds it under another tag.
    TagMismatch {
        /// The live actor's tag.
        existing: Option<Tag>,
    },
    /// The record is not the tail: follow `to`.
    Linked {
        /// The next reservation.
        to: ReservationId,
    },
    /// The record lost its race and is no part of the chain.
    Abandoned,
}

/// Reply to a renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenewReply {
    /// Renewed; the new deadlines.
    Renewed(Deadlines),
    /// The key is drained: stop by the deadlines already given.
    Draining,
    /// The token is not the current holder's.
    StaleToken {
        /// The current token.
        current: FencingToken,
    },
    /// The lease had already run out; the holder must stop now.
    Expired,
    /// The token is current but the lease key is not the holder's: the
    /// caller is not the holder (nothing changed, nothing revealed).
    NotHolder,
}

/// Reply to a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseReply {
    /// Released (or already released under this token: idempotent).
    Released,
    /// The token is not the current holder's; nothing changed.
    StaleToken {
        /// The current token.
        current: FencingToken,
    },
    /// The token is current but the lease key is not the holder's: the
    /// caller is not the holder (nothing changed, nothing revealed).
    NotHolder,
}

/// Reply to `link(tail, to, expected_token)` at the tail's DC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkReply {
    /// The tail now continues as `to` (or already did: idempotent).
    Linked,
    /// The tail was already linked elsewhere: follow `0` and retry there.
    AlreadyLinked(ReservationId),
    /// A live actor holds the tail: return it to the caller.
    StillActive {
        /// The live actor.
        actor: ActorId,
        /// Its token.
        token: FencingToken,
    },
    /// The tail's token moved since the caller read it (re-activated): re-read.
    TokenMoved {
        /// The current token.
        current: FencingToken,
    },
    /// The record is not part of a chain.
    Abandoned,
    /// The record is of another key than the link asked about: the caller
    /// walked a chain that is not this record's.
    OtherKey,
}

/// Who asks for a lease: the actor it will run, its lease key, and its
/// clock when it asked (the grant's deadlines are in that clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The actor.
    pub actor: ActorId,
    /// The holder's secret for this logical acquire.
    pub lease: LeaseKey,
    /// The host's clock when it sent the acquire.
    pub host_time: HostTime,
    /// The host session the key is asked under, as read when the acquire
    /// began (live, and the host presented its secret); `None`: a lease of
    /// the key's own. The write that grants under it is guarded by this
    /// row's version ([`crate::SessionGuard`]).
    pub session: Option<Box<SessionRecord>>,
}

impl Holding {
    /// What a grant to this holder received at `now` writes and answers:
    /// a lease of its own for the ttl, or the session's hold (the key lives
    /// as long as the session, and the deadlines are the session's as it
    /// stood).
    fn term(&self, now: StoreTime, policy: &LeasePolicy) -> (Expiry, Deadlines) {
        match &self.session {
            None => {
                let grant = policy.grant(self.host_time, now);
                (Expiry::At(grant.expires_at), grant.deadlines)
            }
            Some(row) => (
                Expiry::Session(row.id.clone()),
                policy.until(self.host_time, now, row.holds_until()),
            ),
        }
    }
}

impl DcRecord {
    /// A fresh reservation with `holder` as holder: the DC's first write
    /// for a key it creates. `token` is [`FencingToken::FIRST`] for a key's
    /// first reservation, or the old tail's token + 1 when recreating, and
    /// `previous` the old tail's run.
    #[allow(clippy::too_many_arguments)] // each argument is one field of the new record
    pub fn reserve(
        id: ReservationId,
        key: Key,
        tag: Option<Tag>,
        token: FencingToken,
        previous: Option<PreviousRun>,
        holder: &Holding,
        now: StoreTime,
        policy: &LeasePolicy,
    ) -> (DcRecord, Deadlines) {
        let (expiry, deadlines) = holder.term(now, policy);
        let record = DcRecord {
            id,
            key,
            tag,
            token,
            allow_renew: true,
            predecessor: previous.as_ref().map(|p| p.reservation.clone()),
            state: RecordState::Active {
                actor: holder.actor.clone(),
                expiry,
                lease: Some(holder.lease),
                previous: previous.map(Box::new),
            },
            shortcut: None,
            version: 1,
        };
        (record, deadlines)
    }

    /// The session an active lease was granted under, if any: its row must
    /// be read with the record (at the same point) to judge the lease.
    pub fn session(&self) -> Option<&SessionId> {
        match &self.state {
            RecordState::Active { expiry, .. } => expiry.session(),
            _ => None,
        }
    }

    /// Until when (store time) an active lease is held — reapable from then
    /// plus grace; `None` for a record that holds no lease. `session` is the
    /// row of [`DcRecord::session`], read with the record.
    pub fn held_until(&self, session: Option<&SessionRecord>) -> Option<StoreTime> {
        match &self.state {
            RecordState::Active { expiry, .. } => Some(expiry.holds_until(session)),
            _ => None,
        }
    }

    /// The live holder's actor, if a lease is held at `now` (until expiry plus
    /// grace, the DC treats the lease as held: the host may still be running).
    /// `session` is the row of [`DcRecord::session`], read with the record.
    pub fn live_actor(
        &self,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> Option<&ActorId> {
        match &self.state {
            RecordState::Active { actor, expiry, .. }
                if now < policy.reapable_at(expiry.holds_until(session)) =>
            {
                Some(actor)
            }
            _ => None,
        }
    }

    /// How the last run ended, if no lease is held at `now`.
    pub fn ended(
        &self,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> Option<ReleaseCause> {
        match &self.state {
            RecordState::Released { cause, .. } => Some(cause.clone()),
            RecordState::Active { .. } if self.live_actor(now, policy, session).is_none() => {
                Some(ReleaseCause::Expired)
            }
            _ => None,
        }
    }

    /// How a resolver sees this record at `now`.
    pub fn view(
        &self,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> RecordView {
        match &self.state {
            RecordState::Linked { to } => RecordView::Link(to.clone()),
            RecordState::Abandoned => RecordView::Abandoned,
            RecordState::Active { .. } | RecordState::Released { .. } => {
                let live = self.live_actor(now, policy, session);
                let state = match (live, self.ended(now, policy, session)) {
                    (Some(actor), _) => TailState::Active {
                        actor: actor.clone(),
                    },
                    (None, ended) => TailState::Vacant {
                        ended: ended.unwrap_or(ReleaseCause::Expired),
                    },
                };
                RecordView::Tail(TailView {
                    id: self.id.clone(),
                    token: self.token,
                    tag: self.tag.clone(),
                    state,
                })
            }
        }
    }

    fn changed(&self, edit: impl FnOnce(&mut DcRecord)) -> DcRecord {
        let mut next = self.clone();
        edit(&mut next);
        next.version = self.version + 1;
        // Tokens never go down, links never change: checked on every write.
        assert!(next.token >= self.token, "fencing token decreased");
        if let RecordState::Linked { to } = &self.state {
            assert_eq!(
                next.state,
                RecordState::Linked { to: to.clone() },
                "link changed"
            );
        }
        next
    }

    /// Acquire at the tail's own DC: return the live actor (tag permitting),
    /// or re-activate a vacant tail for `holder` with token + 1. A live
    /// lease whose key `holder` presents is its own grant, asked for again
    /// (a lost reply): the same token, renewed — unless the key is drained,
    /// which a renewal could not extend either.
    /// `session` is the row of [`DcRecord::session`], read with the record.
    pub fn activate(
        &self,
        tag: Option<&Tag>,
        holder: &Holding,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> Transition<ActivateReply> {
        match &self.state {
            RecordState::Linked { to } => {
                return Transition::unchanged(ActivateReply::Linked { to: to.clone() });
            }
            RecordState::Abandoned => return Transition::unchanged(ActivateReply::Abandoned),
            RecordState::Active { .. } | RecordState::Released { .. } => {}
        }
        if let Some(again) = self.grant_again(holder, now, policy) {
            return again;
        }
        if let Some(live) = self.live_actor(now, policy, session) {
            let reply = if self.tag.as_ref() == tag {
                ActivateReply::StillActive {
                    actor: live.clone(),
                    token: self.token,
                }
            } else {
                ActivateReply::TagMismatch {
                    existing: self.tag.clone(),
                }
            };
            return Transition::unchanged(reply);
        }
        let previous = PreviousRun {
            reservation: self.id.clone(),
            token: self.token,
            ended: self
                .ended(now, policy, session)
                .unwrap_or(ReleaseCause::Expired),
        };
        let (expiry, deadlines) = holder.term(now, policy);
        let token = self.token.next();
        let next = self.changed(|r| {
            r.token = token;
            r.tag = tag.cloned();
            r.allow_renew = true;
            r.state = RecordState::Active {
                actor: holder.actor.clone(),
                expiry,
                lease: Some(holder.lease),
                previous: Some(Box::new(previous.clone())),
            };
        });
        Transition {
            next: Some(next),
            reply: ActivateReply::Activated {
                token,
                deadlines,
                previous: Some(previous),
            },
        }
    }

    /// The grant `holder` already has here, renewed exactly as its
    /// renewal would be: `None` unless `holder` presents this live lease's
    /// key and the renewal is granted (not past expiry, not drained).
    fn grant_again(
        &self,
        holder: &Holding,
        now: StoreTime,
        policy: &LeasePolicy,
    ) -> Option<Transition<ActivateReply>> {
        if !self.held_under(&holder.lease) {
            return None;
        }
        if let Some(row) = &holder.session {
            // Under a session: granted again while the key is still held
            // under that same session and it lives; nothing to write (the
            // session's renewals hold the key).
            let RecordState::Active {
                expiry: Expiry::Session(id),
                ..
            } = &self.state
            else {
                return None;
            };
            if id != &row.id || !row.admits(&row.secret) || now >= row.holds_until() {
                return None;
            }
            return Some(Transition::unchanged(ActivateReply::Activated {
                token: self.token,
                deadlines: policy.until(holder.host_time, now, row.holds_until()),
                previous: self.previous_run(),
            }));
        }
        let renewed = self.renew(self.token, &holder.lease, holder.host_time, now, policy);
        let RenewReply::Renewed(deadlines) = renewed.reply else {
            return None;
        };
        Some(Transition {
            next: renewed.next,
            reply: ActivateReply::Activated {
                token: self.token,
                deadlines,
                previous: self.previous_run(),
            },
        })
    }

    /// The run an active lease's grant follows, as the grant told it.
    pub fn previous_run(&self) -> Option<PreviousRun> {
        match &self.state {
            RecordState::Active { previous, .. } => previous.as_deref().cloned(),
            _ => None,
        }
    }

    /// Whether this is a live lease granted under `presented` (a lease of
    /// before lease keys is held under none).
    pub fn held_under(&self, presented: &LeaseKey) -> bool {
        matches!(&self.state, RecordState::Active { lease: Some(lease), .. } if lease.admits(presented))
    }

    /// Renew the holder's lease. Refused for a stale token, a lease key that
    /// is not the holder's, a drained key, or a lease already past its
    /// expiry (the host must have stopped). A key held under a session is
    /// renewed by its session only: a per-key renewal of it is not its
    /// holder's (`NotHolder`).
    pub fn renew(
        &self,
        token: FencingToken,
        presented: &LeaseKey,
        host_time: HostTime,
        now: StoreTime,
        policy: &LeasePolicy,
    ) -> Transition<RenewReply> {
        if token != self.token {
            return Transition::unchanged(RenewReply::StaleToken {
                current: self.token,
            });
        }
        let RecordState::Active { expiry, .. } = &self.state else {
            return Transition::unchanged(RenewReply::Expired);
        };
        let Expiry::At(expires_at) = expiry else {
            return Transition::unchanged(RenewReply::NotHolder);
        };
        if !self.held_under(presented) {
            return Transition::unchanged(RenewReply::NotHolder);
        }
        if now >= *expires_at {
            return Transition::unchanged(RenewReply::Expired);
        }
        if !self.allow_renew {
            return Transition::unchanged(RenewReply::Draining);
        }
        let grant = policy.grant(host_time, now);
        let next = self.changed(|r| {
            if let RecordState::Active { expiry, .. } = &mut r.state {
                *expiry = Expiry::At(grant.expires_at);
            }
        });
        Transition {
            next: Some(next),
            reply: RenewReply::Renewed(grant.deadlines),
        }
    }

    /// The holder stops gracefully, saying how its run ended; it must
    /// present its token and lease key.
    pub fn release(
        &self,
        token: FencingToken,
        presented: &LeaseKey,
        outcome: RunOutcome,
        now: StoreTime,
    ) -> Transition<ReleaseReply> {
        match &self.state {
            RecordState::Active { .. } if token == self.token => {
                if self.held_under(presented) {
                    self.released(now, ReleaseCause::Released(outcome))
                } else {
                    Transition::unchanged(ReleaseReply::NotHolder)
                }
            }
            _ => self.released_already(token),
        }
    }

    /// An operator releases the lease under `token` without its holder
    /// (who may still run until its hard deadline: it is an admin act).
    pub fn force_release(&self, token: FencingToken, now: StoreTime) -> Transition<ReleaseReply> {
        match &self.state {
            RecordState::Active { .. } if token == self.token => {
                self.released(now, ReleaseCause::Forced)
            }
            _ => self.released_already(token),
        }
    }

    /// A host that gave up on its acquire cancels the grant it may have
    /// been made, by its lease key: `Some` if this live lease is that grant.
    pub fn cancel(&self, presented: &LeaseKey, now: StoreTime) -> Option<DcRecord> {
        self.held_under(presented)
            .then(|| self.released(now, ReleaseCause::Cancelled).next)
            .flatten()
    }

    fn released(&self, now: StoreTime, cause: ReleaseCause) -> Transition<ReleaseReply> {
        Transition {
            next: Some(self.changed(|r| r.state = RecordState::Released { at: now, cause })),
            reply: ReleaseReply::Released,
        }
    }

    /// A release of a record that is not an active lease under `token`:
    /// refused for another token; otherwise a retried release, or the lease
    /// was reaped first, and there is nothing to undo.
    fn released_already(&self, token: FencingToken) -> Transition<ReleaseReply> {
        if token != self.token {
            return Transition::unchanged(ReleaseReply::StaleToken {
                current: self.token,
            });
        }
        Transition::unchanged(ReleaseReply::Released)
    }

    /// The reaper: a lease past expiry + grace becomes `Released(Expired)`.
    /// `session` is the row of [`DcRecord::session`], read with the record.
    pub fn expire(
        &self,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> Option<DcRecord> {
        match &self.state {
            RecordState::Active { expiry, .. }
                if now >= policy.reapable_at(expiry.holds_until(session)) =>
            {
                Some(self.changed(|r| {
                    r.state = RecordState::Released {
                        at: now,
                        cause: ReleaseCause::Expired,
                    }
                }))
            }
            _ => None,
        }
    }

    /// Drain: refuse further renewals so the holder stops by its deadlines.
    /// A key held under a session freezes at the session's expiry as read
    /// (`session`, the row of [`DcRecord::session`]): renewals of the session
    /// no longer extend it. It carries the session's next notice number; the
    /// store writes the freeze together with the session row that numbered
    /// it ([`SessionRecord::noticed`]), so every renewal either landed before
    /// the freeze (and the freeze is at or past what it granted) or sees the
    /// notice.
    pub fn drain(&self, session: Option<&SessionRecord>) -> Option<DcRecord> {
        if let Some(id) = self.session()
            && session.is_none_or(|row| &row.id != id)
        {
            // Its session's row is gone: not held, nothing to drain.
            return None;
        }
        match &self.state {
            RecordState::Active { expiry, .. } if self.allow_renew => Some(self.changed(|r| {
                r.allow_renew = false;
                if let (Expiry::Session(id), RecordState::Active { expiry: frozen, .. }) =
                    (expiry, &mut r.state)
                {
                    *frozen = Expiry::Frozen {
                        session: id.clone(),
                        at: expiry.holds_until(session),
                        notice: session.map_or(0, |s| s.notice_seq + 1),
                    };
                }
            })),
            _ => None,
        }
    }

    /// The compare-and-set at the tail: continue this reservation as `to`,
    /// provided it is vacant and still carries `expected_token`.
    /// `session` is the row of [`DcRecord::session`], read with the record.
    pub fn link(
        &self,
        key: &Key,
        to: &ReservationId,
        expected_token: FencingToken,
        now: StoreTime,
        policy: &LeasePolicy,
        session: Option<&SessionRecord>,
    ) -> Transition<LinkReply> {
        if key != &self.key {
            return Transition::unchanged(LinkReply::OtherKey);
        }
        match &self.state {
            RecordState::Linked { to: existing } if existing == to => {
                Transition::unchanged(LinkReply::Linked)
            }
            RecordState::Linked { to: existing } => {
                Transition::unchanged(LinkReply::AlreadyLinked(existing.clone()))
            }
            RecordState::Abandoned => Transition::unchanged(LinkReply::Abandoned),
            RecordState::Active { .. } | RecordState::Released { .. } => {
                if let Some(actor) = self.live_actor(now, policy, session) {
                    return Transition::unchanged(LinkReply::StillActive {
                        actor: actor.clone(),
                        token: self.token,
                    });
                }
                if expected_token != self.token {
                    return Transition::unchanged(LinkReply::TokenMoved {
                        current: self.token,
                    });
                }
                assert_ne!(to, &self.id, "a reservation cannot link to itself");
                Transition {
                    next: Some(self.changed(|r| r.state = RecordState::Linked { to: to.clone() })),
                    reply: LinkReply::Linked,
                }
            }
        }
    }

    /// Records `shortcut`, a later member of this linked reservation's
    /// chain of `key`, if it is further along than the one recorded (tokens
    /// only rise). `None` when nothing changes: another key, not linked, not
    /// past this record's token, or not newer.
    pub fn note_shortcut(&self, key: &Key, shortcut: &Shortcut) -> Option<DcRecord> {
        let linked = matches!(self.state, RecordState::Linked { .. });
        let newer = shortcut.is_past(self.shortcut.as_deref());
        let ahead = shortcut.token > self.token && shortcut.to != self.id;
        (key == &self.key && linked && newer && ahead)
            .then(|| self.changed(|r| r.shortcut = Some(Box::new(shortcut.clone()))))
    }

    /// This record as shown outside its DC's store (inspect, scan): an
    /// active lease's key is left out, so no answer ever reveals it.
    pub fn redacted(mut self) -> DcRecord {
        if let RecordState::Active { lease, .. } = &mut self.state {
            *lease = None;
        }
        self
    }

    /// This record after the global store named `succession` as its
    /// successor (DESIGN.md §7.5): linked to the successor it names.
    /// `None` when nothing changes (already linked to it, abandoned, or the
    /// succession is of another reservation). Two cases: a mover whose
    /// confirmation lost to a takeover links its own, never granted
    /// reservation to the taker; a DC that returns from expiry applies the
    /// takeovers of its tails — even over a link it made whose mover lost,
    /// since that mover linked itself to the same taker, every cached path
    /// still leads there.
    pub fn supersede(&self, succession: &Succession) -> Option<DcRecord> {
        let to = &succession.link.to;
        if succession.link.from != self.id || to == &self.id {
            return None;
        }
        match &self.state {
            RecordState::Linked { to: existing } if existing == to => None,
            RecordState::Abandoned => None,
            RecordState::Active { .. } | RecordState::Released { .. } => {
                Some(self.changed(|r| r.state = RecordState::Linked { to: to.clone() }))
            }
            // The one change of a link (`changed` refuses it): the global
            // store's succession outranks a link whose mover lost.
            RecordState::Linked { .. } => {
                let mut next = self.clone();
                next.state = RecordState::Linked { to: to.clone() };
                next.version = self.version + 1;
                Some(next)
            }
        }
    }

    /// Mark a record that lost its race (global entry or link went to
    /// another reservation). Only a record that is not linked can be abandoned.
    pub fn abandon(&self) -> Option<DcRecord> {
        match &self.state {
            RecordState::Active { .. } | RecordState::Released { .. } => {
                Some(self.changed(|r| r.state = RecordState::Abandoned))
            }
            RecordState::Linked { .. } | RecordState::Abandoned => None,
        }
    }
}

/// A record as read from its DC's store, with the row of the session it is
/// held under when it is (read just after it: a session's expiry only
/// moves later until it ends, so a row read later never makes the record
/// look less held than it was). Every judgement of whether the lease is
/// held goes through here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRead {
    /// The record.
    pub record: DcRecord,
    /// Its session's row (`None`: a per-key lease, no lease, or the row is
    /// gone). Boxed: most records have none, and a read travels in enums.
    pub session: Option<Box<SessionRecord>>,
}

impl RecordRead {
    /// A record with no session row beside it.
    pub fn alone(record: DcRecord) -> RecordRead {
        RecordRead {
            record,
            session: None,
        }
    }

    /// The session row, borrowed, for the record's judgements.
    pub fn session(&self) -> Option<&SessionRecord> {
        self.session.as_deref()
    }
}

/// Whether writing `new` over `old` needs its session row checked: the
/// record joins a session or freezes.
pub fn needs_guard(old: Option<&DcRecord>, new: &DcRecord) -> Option<SessionId> {
    let expiry = |r: &DcRecord| match &r.state {
        RecordState::Active { expiry, .. } => Some(expiry.clone()),
        _ => None,
    };
    let (before, after) = (old.and_then(expiry), expiry(new)?);
    let same_token = old.is_some_and(|o| o.token == new.token);
    match after {
        Expiry::At(_) => None,
        Expiry::Session(s) if same_token && before == Some(Expiry::Session(s.clone())) => None,
        Expiry::Frozen { .. } if same_token && before == Some(after.clone()) => None,
        Expiry::Session(s) | Expiry::Frozen { session: s, .. } => Some(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dc::DcId;
    use crate::key::KeyName;

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn id(text: &str) -> ReservationId {
        text.parse().unwrap()
    }

    fn actor(text: &str) -> ActorId {
        ActorId::new(text).unwrap()
    }

    /// Each actor's lease key, from its name.
    fn lease(name: &str) -> LeaseKey {
        let mut bytes = [0x33; 16];
        for (i, b) in name.bytes().enumerate() {
            bytes[i % 16] ^= b;
        }
        LeaseKey::from_bytes(bytes).unwrap()
    }

    fn holding(name: &str, at_ms: u64) -> Holding {
        Holding {
            actor: actor(name),
            lease: lease(name),
            host_time: HostTime::from_ms(at_ms),
            session: None,
        }
    }

    fn key() -> Key {
        Key::new(KeyName::new("room").unwrap())
    }

    fn fresh(at_ms: u64) -> DcRecord {
        DcRecord::reserve(
            ReservationId::new(DcId::new("iad").unwrap(), 1),
            key(),
            None,
            FencingToken::FIRST,
            None,
            &holding("a1", at_ms),
            StoreTime::from_ms(at_ms),
            &POLICY,
        )
        .0
    }

    fn t(ms: u64) -> StoreTime {
        StoreTime::from_ms(ms)
    }

    /// `fresh` held under a session opened at `at_ms` (ttl 10 s).
    fn in_session(at_ms: u64) -> (DcRecord, crate::session::SessionRecord) {
        let (session, _) = crate::session::SessionRecord::open(
            "iad~9".parse().unwrap(),
            lease("host"),
            HostTime::from_ms(at_ms),
            t(at_ms),
            &POLICY,
        );
        let mut record = fresh(at_ms);
        if let RecordState::Active { expiry, .. } = &mut record.state {
            *expiry = Expiry::Session(session.id.clone());
        }
        (record, session)
    }

    #[test]
    fn a_session_key_lives_while_its_session_does_and_is_renewed_only_through_it() {
        let (record, session) = in_session(0);
        assert!(
            record
                .live_actor(t(11_999), &POLICY, Some(&session))
                .is_some()
        );
        assert!(
            record
                .live_actor(t(12_000), &POLICY, Some(&session))
                .is_none()
        );
        // The session renewed at 8 s: the key lives on with no write of its own.
        let renewed = session
            .renew(&lease("host"), HostTime::from_ms(8_000), t(8_000), &POLICY)
            .next
            .unwrap();
        assert!(
            record
                .live_actor(t(19_999), &POLICY, Some(&renewed))
                .is_some()
        );
        assert_eq!(record.expire(t(19_999), &POLICY, Some(&renewed)), None);
        assert!(record.expire(t(20_000), &POLICY, Some(&renewed)).is_some());
        // No session row (reaped and deleted) or another session's: vacant
        // (past the grace counted from the store clock's epoch).
        assert!(record.live_actor(t(2_000), &POLICY, None).is_none());
        // A per-key renewal of a session key is not its holder's.
        let per_key = record.renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert_eq!(per_key.reply, RenewReply::NotHolder);
        assert_eq!(per_key.next, None);
    }

    #[test]
    fn a_drained_session_key_freezes_at_the_sessions_expiry_however_long_the_session_lives() {
        let (record, session) = in_session(0);
        let drained = record.drain(Some(&session)).unwrap();
        let RecordState::Active { expiry, .. } = &drained.state else {
            panic!("{:?}", drained.state)
        };
        assert_eq!(
            expiry,
            &Expiry::Frozen {
                session: session.id.clone(),
                at: t(10_000),
                notice: 1,
            }
        );
        assert!(!drained.allow_renew);
        let renewed = session
            .renew(&lease("host"), HostTime::from_ms(8_000), t(8_000), &POLICY)
            .next
            .unwrap();
        // The hard deadline the host held at the freeze ends before 10 s:
        // the key is vacant from 10 s plus grace, the session's renewals notwithstanding.
        assert!(
            drained
                .live_actor(t(11_999), &POLICY, Some(&renewed))
                .is_some()
        );
        assert!(
            drained
                .live_actor(t(12_000), &POLICY, Some(&renewed))
                .is_none()
        );
        assert!(drained.expire(t(12_000), &POLICY, Some(&renewed)).is_some());
        assert_eq!(
            drained.drain(Some(&renewed)),
            None,
            "draining twice writes nothing"
        );
        assert_eq!(crate::due::Due::of(&drained).map(|d| d.at), Some(t(10_000)));
        assert_eq!(
            crate::due::Due::of(&record),
            None,
            "a live session's key is found through its session"
        );
    }

    #[test]
    fn renew_keeps_the_token_and_moves_expiry() {
        let r = fresh(0);
        let out = r.renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(5_000),
            t(5_000),
            &POLICY,
        );
        let next = out.next.unwrap();
        assert_eq!(next.token, FencingToken::FIRST);
        assert_eq!(next.version, r.version + 1);
        assert!(
            matches!(next.state, RecordState::Active { expiry: Expiry::At(at), .. } if at == t(15_000))
        );
        assert!(matches!(out.reply, RenewReply::Renewed(_)));
    }

    #[test]
    fn renew_with_a_stale_token_changes_nothing() {
        let r = fresh(0);
        let out = r.renew(
            FencingToken::new(7),
            &lease("a1"),
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert_eq!(out.next, None);
        assert_eq!(
            out.reply,
            RenewReply::StaleToken {
                current: FencingToken::FIRST
            }
        );
    }

    #[test]
    fn renew_after_expiry_is_refused_even_within_grace() {
        let out = fresh(0).renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(10_000),
            t(10_000),
            &POLICY,
        );
        assert_eq!((out.next, out.reply), (None, RenewReply::Expired));
    }

    #[test]
    fn drained_key_refuses_renewal() {
        let drained = fresh(0).drain(None).unwrap();
        assert!(!drained.allow_renew);
        let out = drained.renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert_eq!((out.next, out.reply), (None, RenewReply::Draining));
        assert_eq!(drained.drain(None), None, "draining twice writes nothing");
    }

    #[test]
    fn reaper_waits_for_expiry_plus_grace() {
        let r = fresh(0);
        assert_eq!(r.expire(t(11_999), &POLICY, None), None);
        let reaped = r.expire(t(12_000), &POLICY, None).unwrap();
        assert_eq!(
            reaped.state,
            RecordState::Released {
                at: t(12_000),
                cause: ReleaseCause::Expired
            }
        );
    }

    #[test]
    fn reactivation_in_the_same_dc_bumps_the_token() {
        let released = fresh(0)
            .release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(1))
            .next
            .unwrap();
        let out = released.activate(None, &holding("a2", 2), t(2), &POLICY, None);
        let next = out.next.unwrap();
        assert_eq!(next.token, FencingToken::new(2));
        let ActivateReply::Activated { previous, .. } = &out.reply else {
            panic!("not activated: {:?}", out.reply);
        };
        assert_eq!(
            previous.as_ref().unwrap(),
            &PreviousRun {
                reservation: id("iad.1"),
                token: FencingToken::FIRST,
                ended: ReleaseCause::Released(RunOutcome::Ok)
            }
        );
        assert!(
            matches!(out.reply, ActivateReply::Activated { token, .. } if token == FencingToken::new(2))
        );
        // The old holder's release is now stale.
        assert_eq!(
            next.release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(3))
                .reply,
            ReleaseReply::StaleToken {
                current: FencingToken::new(2)
            }
        );
    }

    #[test]
    fn activate_returns_the_live_actor_or_a_tag_mismatch() {
        let r = fresh(0);
        let same = r.activate(None, &holding("other", 1), t(1), &POLICY, None);
        assert_eq!(same.next, None);
        assert_eq!(
            same.reply,
            ActivateReply::StillActive {
                actor: actor("a1"),
                token: FencingToken::FIRST
            }
        );
        let tag = Tag::new("v2").unwrap();
        let other = r.activate(Some(&tag), &holding("other", 1), t(1), &POLICY, None);
        assert_eq!(other.reply, ActivateReply::TagMismatch { existing: None });
    }

    #[test]
    fn an_acquire_retried_with_the_holders_lease_key_gets_the_same_grant_renewed() {
        let released = fresh(0)
            .release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(1))
            .next
            .unwrap();
        let first = released.activate(None, &holding("a2", 2), t(2), &POLICY, None);
        let granted = first.next.unwrap();
        let ActivateReply::Activated {
            token, previous, ..
        } = first.reply.clone()
        else {
            panic!("not activated: {:?}", first.reply);
        };
        // The reply was lost; a2 asks again with the same lease key.
        let again = granted.activate(None, &holding("a2", 3_000), t(3_000), &POLICY, None);
        let ActivateReply::Activated {
            token: token_again,
            previous: previous_again,
            deadlines,
        } = again.reply
        else {
            panic!("a retry must be granted again: {:?}", again.reply);
        };
        assert_eq!((token_again, &previous_again), (token, &previous));
        assert_eq!(
            deadlines,
            POLICY.grant(HostTime::from_ms(3_000), t(3_000)).deadlines
        );
        let renewed = again.next.unwrap();
        assert!(
            matches!(renewed.state, RecordState::Active { expiry: Expiry::At(at), .. }
            if at == t(13_000))
        );
        // Anyone else still sees the holder, never the grant.
        let other = renewed.activate(None, &holding("a3", 4_000), t(4_000), &POLICY, None);
        assert_eq!(other.next, None);
        assert!(matches!(other.reply, ActivateReply::StillActive { .. }));
        // A drained lease cannot be extended by a retry either.
        let drained = renewed.drain(None).unwrap();
        let retry = drained.activate(None, &holding("a2", 5_000), t(5_000), &POLICY, None);
        assert_eq!(retry.next, None);
        assert!(matches!(retry.reply, ActivateReply::StillActive { .. }));
    }

    #[test]
    fn the_token_alone_renews_and_releases_nothing() {
        let r = fresh(0);
        let stranger = lease("b1");
        let renew = r.renew(
            FencingToken::FIRST,
            &stranger,
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert_eq!((renew.next, renew.reply), (None, RenewReply::NotHolder));
        let release = r.release(FencingToken::FIRST, &stranger, RunOutcome::Ok, t(1));
        assert_eq!(
            (release.next, release.reply),
            (None, ReleaseReply::NotHolder)
        );
        assert_eq!(r.cancel(&stranger, t(1)), None);
        // A lease granted before lease keys existed: no host can present it.
        let mut legacy = r.clone();
        if let RecordState::Active { lease, .. } = &mut legacy.state {
            *lease = None;
        }
        let renew = legacy.renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert_eq!(renew.reply, RenewReply::NotHolder);
        // The holder itself can.
        let renew = r.renew(
            FencingToken::FIRST,
            &lease("a1"),
            HostTime::from_ms(1),
            t(1),
            &POLICY,
        );
        assert!(matches!(renew.reply, RenewReply::Renewed(_)));
    }

    #[test]
    fn an_operator_force_releases_by_token_and_a_host_cancels_by_lease_key() {
        let r = fresh(0);
        let stale = r.force_release(FencingToken::new(9), t(1));
        assert_eq!(stale.next, None);
        assert!(matches!(stale.reply, ReleaseReply::StaleToken { .. }));
        let forced = r.force_release(FencingToken::FIRST, t(1));
        assert_eq!(forced.reply, ReleaseReply::Released);
        assert!(matches!(
            forced.next.unwrap().state,
            RecordState::Released {
                cause: ReleaseCause::Forced,
                ..
            }
        ));
        let cancelled = r.cancel(&lease("a1"), t(1)).unwrap();
        assert!(matches!(
            cancelled.state,
            RecordState::Released {
                cause: ReleaseCause::Cancelled,
                ..
            }
        ));
        assert_eq!(cancelled.cancel(&lease("a1"), t(2)), None, "once");
    }

    #[test]
    fn link_cas_outcomes() {
        let to = id("fra.9");
        let live = fresh(0);
        assert!(matches!(
            live.link(&key(), &to, FencingToken::FIRST, t(1), &POLICY, None)
                .reply,
            LinkReply::StillActive { .. }
        ));
        let released = live
            .release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(1))
            .next
            .unwrap();
        assert_eq!(
            released
                .link(&key(), &to, FencingToken::new(5), t(2), &POLICY, None)
                .reply,
            LinkReply::TokenMoved {
                current: FencingToken::FIRST
            }
        );
        let linked = released
            .link(&key(), &to, FencingToken::FIRST, t(2), &POLICY, None)
            .next
            .unwrap();
        assert_eq!(linked.state, RecordState::Linked { to: to.clone() });
        assert_eq!(
            linked
                .link(&key(), &to, FencingToken::FIRST, t(3), &POLICY, None)
                .reply,
            LinkReply::Linked
        );
        assert_eq!(
            linked
                .link(
                    &key(),
                    &id("sin.4"),
                    FencingToken::FIRST,
                    t(3),
                    &POLICY,
                    None
                )
                .reply,
            LinkReply::AlreadyLinked(to.clone())
        );
        assert_eq!(
            linked.abandon(),
            None,
            "a linked record is part of the chain forever"
        );
        assert_eq!(
            linked.view(t(3), &POLICY, None),
            RecordView::Link(to.clone())
        );
        let other = Key::new(KeyName::new("hall").unwrap());
        assert_eq!(
            released
                .link(&other, &to, FencingToken::FIRST, t(2), &POLICY, None)
                .reply,
            LinkReply::OtherKey,
            "a link is only made for the record's own key"
        );
    }

    #[test]
    fn a_shortcut_is_recorded_on_a_linked_record_only_when_further_along() {
        let released = fresh(0)
            .release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(1))
            .next
            .unwrap();
        let shortcut = |to: &str, token: u64| Shortcut {
            to: id(to),
            token: FencingToken::new(token),
        };
        assert_eq!(
            released.note_shortcut(&key(), &shortcut("fra.2", 2)),
            None,
            "not linked: it is the tail"
        );
        let linked = released
            .link(
                &key(),
                &id("fra.2"),
                FencingToken::FIRST,
                t(2),
                &POLICY,
                None,
            )
            .next
            .unwrap();
        let noted = linked.note_shortcut(&key(), &shortcut("sin.3", 5)).unwrap();
        assert_eq!(noted.shortcut.as_deref(), Some(&shortcut("sin.3", 5)));
        assert_eq!(noted.version, linked.version + 1);
        assert_eq!(
            noted.note_shortcut(&key(), &shortcut("fra.7", 4)),
            None,
            "older"
        );
        assert_eq!(
            noted.note_shortcut(&key(), &shortcut("fra.7", 5)),
            None,
            "not newer"
        );
        let hall = Key::new(KeyName::new("hall").unwrap());
        assert_eq!(
            noted.note_shortcut(&hall, &shortcut("fra.7", 9)),
            None,
            "another key"
        );
        assert_eq!(
            linked.note_shortcut(&key(), &shortcut("fra.7", 1)),
            None,
            "not past the record's own token"
        );
        assert!(noted.note_shortcut(&key(), &shortcut("fra.7", 6)).is_some());
    }

    #[test]
    fn a_failed_release_is_kept_and_shown_to_the_next_holder() {
        let reason = FailureReason::new("worker crashed: OOM").unwrap();
        let failed = RunOutcome::Failed { reason };
        let released = fresh(0)
            .release(FencingToken::FIRST, &lease("a1"), failed.clone(), t(1))
            .next
            .unwrap();
        let RecordView::Tail(tail) = released.view(t(2), &POLICY, None) else {
            panic!("not a tail");
        };
        assert_eq!(
            tail.state,
            TailState::Vacant {
                ended: ReleaseCause::Released(failed.clone())
            }
        );
        // A retried release with another outcome does not rewrite the first.
        assert_eq!(
            released
                .release(FencingToken::FIRST, &lease("a1"), RunOutcome::Ok, t(3))
                .next,
            None
        );
        // A lapsed, not yet reaped lease reads as expired.
        let RecordView::Tail(lapsed) = fresh(0).view(t(12_000), &POLICY, None) else {
            panic!("not a tail");
        };
        assert_eq!(
            lapsed.state,
            TailState::Vacant {
                ended: ReleaseCause::Expired
            }
        );
        assert!(FailureReason::new("").is_err());
        assert!(FailureReason::new("x".repeat(FAILURE_REASON_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn an_expired_lease_can_be_linked_without_waiting_for_the_reaper() {
        let out = fresh(0).link(
            &key(),
            &id("fra.9"),
            FencingToken::FIRST,
            t(12_000),
            &POLICY,
            None,
        );
        assert_eq!(out.reply, LinkReply::Linked);
    }
}
