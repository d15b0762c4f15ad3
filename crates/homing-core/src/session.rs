//! A host session: one heartbeat keeps every lease a host holds under it.
//! The DC keeps one row per session ([`SessionRecord`]), changed only by
//! compare-and-set on its `version`, as a record is. A key granted under a
//! session has [`Expiry::Session`] on its record and lives exactly as long
//! as the session does, so a renewal writes the one session row and nothing
//! per key. Transitions, each `(row, request, now) -> (next row, reply)`:
//!
//! ```text
//! open ─► Live { expires_at } ──renew (secret, before expires_at)──► Live (expires_at = max(old, received + ttl))
//!           │ close (secret)                │ now ≥ expires_at + grace (the reaper)
//!           ▼                               ▼
//!         Ended { until: now, Closed }    Ended { until: expires_at, Expired }
//! Live ──a key drained or force-released──► Live (notice_seq + 1; the key's record is Frozen at expires_at)
//! Ended ──every key reaped──► the row is deleted (its id is never reused)
//! ```
//!
//! Deadlines run from the host's send time, as every lease's do
//! ([`LeasePolicy::grant`]); `expires_at` never goes down, so a duplicated or
//! reordered renewal can never shorten a session.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dc::DcId;
use crate::label::LabelError;
use crate::lease::{Deadlines, LeasePolicy};
use crate::lease_key::LeaseKey;
use crate::reservation::{RESERVATION_ID_BYTES_MAX, ReservationId};
use crate::time::{HostTime, StoreTime};

/// `<dc>~<unique>`: the DC that keeps the session and its allocator value
/// (from the same allocator as its reservations, so never reused).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId {
    dc: DcId,
    unique: u64,
}

impl SessionId {
    /// The session `unique` of `dc`.
    pub fn new(dc: DcId, unique: u64) -> SessionId {
        SessionId { dc, unique }
    }

    /// The DC that keeps the session's row.
    pub fn dc(&self) -> &DcId {
        &self.dc
    }

    /// The allocator value, unique within the DC.
    pub fn unique(&self) -> u64 {
        self.unique
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}~{}", self.dc, self.unique)
    }
}

impl FromStr for SessionId {
    type Err = LabelError;

    /// Parses the canonical form only, by the rules of a reservation ID
    /// (`<dc>.<unique>`) with `~` in place of the dot.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &'static str| LabelError::SessionId {
            input: text.chars().take(RESERVATION_ID_BYTES_MAX + 8).collect(),
            reason,
        };
        let (dc, unique) = text
            .split_once('~')
            .ok_or_else(|| invalid("missing the `~` between dc and unique"))?;
        match format!("{dc}.{unique}").parse::<ReservationId>() {
            Ok(id) => Ok(SessionId::new(id.dc().clone(), id.unique())),
            Err(LabelError::ReservationId { reason, .. }) => Err(invalid(reason)),
            Err(other) => Err(other),
        }
    }
}

impl TryFrom<String> for SessionId {
    type Error = LabelError;
    /// The serde path: a refusal is also noted for `wire::decode`'s error.
    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse().inspect_err(crate::label::note_refused)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.to_string()
    }
}

/// A DC's row for one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session.
    pub id: SessionId,
    /// The host's secret: renew, close, acquire under the session and
    /// resync present it. Never logged, never part of a reply.
    pub secret: LeaseKey,
    /// Live or ended.
    pub state: SessionState,
    /// The last notice (a key of the session drained or force-released)
    /// numbered; the host acknowledges notices up to a number.
    pub notice_seq: u64,
    /// Bumped by every change; the store's compare-and-set checks it.
    pub version: u64,
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionState {
    /// Renewed until `expires_at` (store time); its keys live that long.
    Live {
        /// The session's expiry in store time.
        expires_at: StoreTime,
    },
    /// No more renewals; its keys lived until `until` and are vacant from
    /// `until` plus grace, reaped or not.
    Ended {
        /// When its keys stopped being held, in store time.
        until: StoreTime,
        /// Why.
        cause: SessionEnd,
    },
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionEnd {
    /// Its host closed it.
    Closed,
    /// It was not renewed in time.
    Expired,
}

/// A key of the session drained or force-released, as a renewal tells its
/// host: the host stops it by the deadlines it held before that renewal's
/// answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionNotice {
    /// The notice's number in the session (the host acknowledges up to it).
    pub seq: u64,
    /// The key's reservation.
    pub reservation: ReservationId,
}

/// The protocol (and deployment) version host sessions arrived in: a
/// homingd opens one only once the deployment version is this or later,
/// since a key held under a session is a record form earlier releases
/// cannot read.
pub const SESSIONS_VERSION: u16 = 9;

/// Keys one [`crate::Reply::SessionKeys`] page lists at most (a page of
/// the longest keys stays well inside a frame).
pub const SESSION_KEYS_PAGE: usize = 64;

/// Notices one session renewal's answer carries at most; the rest come
/// with the next renewals.
pub const SESSION_NOTICES_PAGE: usize = 64;

/// How many host sessions a DC store holds (the store's `session_counts`,
/// and what a `DcReport` carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionCounts {
    /// Session rows: live sessions, and ended ones whose keys are not all
    /// reaped yet.
    pub rows: u64,
    /// Keys held under them (live or frozen).
    pub keys: u64,
}

/// A key held under a session, as a resync lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionKey {
    /// Its reservation.
    pub reservation: ReservationId,
    /// The key.
    pub key: crate::key::Key,
    /// Its fencing token.
    pub token: crate::fencing::FencingToken,
    /// Whether it is frozen (drained or force-released: its host stops it
    /// by the deadlines it held when it learned so).
    pub frozen: bool,
}

/// Reply to a session renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionRenewReply {
    /// Renewed: the new deadlines, in the host's clock, and the notices
    /// numbered above the host's acknowledgement (the DC adds them from its
    /// notices index; [`SessionRecord::renew`] leaves them empty).
    Renewed {
        /// The session's new deadlines.
        deadlines: Deadlines,
        /// Keys frozen since the acknowledged notice, oldest first.
        notices: Vec<SessionNotice>,
    },
    /// The session had already run out (or ended): the host must stop
    /// every actor it runs under it now.
    Expired,
    /// The secret is not the session's: nothing changed, nothing revealed.
    NotHolder,
}

/// A session row's change: the row to write (if it changed) and the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTransition<R> {
    /// `Some` when the row must be written (compare-and-set on the old version).
    pub next: Option<SessionRecord>,
    /// What to answer.
    pub reply: R,
}

impl SessionRecord {
    /// A new session for a host that sent its open at `host_time`, received
    /// at `now`: the row to create and the host's first deadlines.
    pub fn open(
        id: SessionId,
        secret: LeaseKey,
        host_time: HostTime,
        now: StoreTime,
        policy: &LeasePolicy,
    ) -> (SessionRecord, Deadlines) {
        let grant = policy.grant(host_time, now);
        let row = SessionRecord {
            id,
            secret,
            state: SessionState::Live {
                expires_at: grant.expires_at,
            },
            notice_seq: 0,
            version: 1,
        };
        (row, grant.deadlines)
    }

    /// Until when (store time) its keys are held: the live session's
    /// expiry, or when it ended. A key is vacant from this plus grace.
    pub fn holds_until(&self) -> StoreTime {
        match self.state {
            SessionState::Live { expires_at } => expires_at,
            SessionState::Ended { until, .. } => until,
        }
    }

    /// Whether the session is live and `presented` is its secret.
    pub fn admits(&self, presented: &LeaseKey) -> bool {
        matches!(self.state, SessionState::Live { .. }) && self.secret.admits(presented)
    }

    fn changed(&self, edit: impl FnOnce(&mut SessionRecord)) -> SessionRecord {
        let mut next = self.clone();
        edit(&mut next);
        next.version = self.version + 1;
        // A session's end never moves later once ended, and a live
        // session's expiry never goes down: checked on every write.
        match (self.state, next.state) {
            (SessionState::Live { expires_at: old }, SessionState::Live { expires_at: new }) => {
                assert!(new >= old, "session expiry went down")
            }
            (SessionState::Ended { .. }, SessionState::Live { .. }) => {
                panic!("an ended session came back to life")
            }
            (SessionState::Ended { .. }, SessionState::Ended { .. }) => {
                assert_eq!(self.state, next.state, "an ended session changed its end")
            }
            (SessionState::Live { expires_at }, SessionState::Ended { until, .. }) => {
                assert!(until <= expires_at, "a session ended after its expiry")
            }
        }
        assert!(
            next.notice_seq >= self.notice_seq,
            "notice numbers went down"
        );
        next
    }

    /// The host's heartbeat, sent at `host_time`, received at `now`. Refused
    /// for another secret, an ended session, or one already past its expiry
    /// (the host must have stopped: a late renewal never revives it).
    pub fn renew(
        &self,
        presented: &LeaseKey,
        host_time: HostTime,
        now: StoreTime,
        policy: &LeasePolicy,
    ) -> SessionTransition<SessionRenewReply> {
        let unchanged = |reply| SessionTransition { next: None, reply };
        if !self.secret.admits(presented) {
            return unchanged(SessionRenewReply::NotHolder);
        }
        let SessionState::Live { expires_at } = self.state else {
            return unchanged(SessionRenewReply::Expired);
        };
        if now >= expires_at {
            return unchanged(SessionRenewReply::Expired);
        }
        let grant = policy.grant(host_time, now);
        // An older renewal arriving late must not pull the expiry back.
        let expires_at = expires_at.max(grant.expires_at);
        SessionTransition {
            next: Some(self.changed(|r| r.state = SessionState::Live { expires_at })),
            reply: SessionRenewReply::Renewed {
                deadlines: grant.deadlines,
                notices: Vec::new(),
            },
        }
    }

    /// The host closes its session (it stopped every actor under it): its
    /// keys are vacant from `now` plus grace. `None` for another secret or
    /// a session already ended.
    pub fn close(&self, presented: &LeaseKey, now: StoreTime) -> Option<SessionRecord> {
        let SessionState::Live { expires_at } = self.state else {
            return None;
        };
        self.secret.admits(presented).then(|| {
            self.changed(|r| {
                r.state = SessionState::Ended {
                    until: now.min(expires_at),
                    cause: SessionEnd::Closed,
                }
            })
        })
    }

    /// The reaper: a live session past its expiry plus grace ends as
    /// expired; its keys were held until its expiry.
    pub fn expire(&self, now: StoreTime, policy: &LeasePolicy) -> Option<SessionRecord> {
        match self.state {
            SessionState::Live { expires_at } if now >= policy.reapable_at(expires_at) => {
                Some(self.changed(|r| {
                    r.state = SessionState::Ended {
                        until: expires_at,
                        cause: SessionEnd::Expired,
                    }
                }))
            }
            _ => None,
        }
    }

    /// One more notice for the host (a key frozen): the row with its
    /// `notice_seq` bumped, and the notice's number. Written in the same
    /// transaction as the frozen key, so every renewal either landed
    /// before the freeze or sees the notice.
    pub fn noticed(&self) -> (SessionRecord, u64) {
        let seq = self.notice_seq + 1;
        (self.changed(|r| r.notice_seq = seq), seq)
    }
}

/// The session row a record write depends on: its version must still be
/// `version` when the record is written, and `next` (if any) is written in
/// the same transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionGuard {
    /// The session.
    pub id: SessionId,
    /// The row's version the write was judged on.
    pub version: u64,
    /// The row to write with the record (a freeze numbers its notice);
    /// `None`: the row is only checked (a key joins the session).
    pub next: Option<SessionRecord>,
}

/// How long an active lease runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expiry {
    /// A lease of its own, renewed per key, until this store time.
    At(StoreTime),
    /// As long as the session lives (its row says until when).
    Session(SessionId),
    /// A session key drained or force-released: its host is told (notice
    /// `notice` of the session, on its renewals until it acknowledges it)
    /// and stops by the deadlines it held when the key froze; held until
    /// `at`, the session's expiry at that moment, however long the session
    /// lives on.
    Frozen {
        /// The session the key was granted under.
        session: SessionId,
        /// Held until this store time.
        at: StoreTime,
        /// The session's notice number for this freeze.
        notice: u64,
    },
}

impl Expiry {
    /// The session the lease belongs to, if any.
    pub fn session(&self) -> Option<&SessionId> {
        match self {
            Expiry::At(_) => None,
            Expiry::Session(id) | Expiry::Frozen { session: id, .. } => Some(id),
        }
    }

    /// Until when (store time) the lease is held, given the row of its
    /// session as read at the same point as the record (`None`: no such
    /// row). A session key whose row is gone or is another session's is
    /// held no longer: rows are deleted only after every key was reaped.
    pub fn holds_until(&self, session: Option<&SessionRecord>) -> StoreTime {
        match self {
            Expiry::At(at) | Expiry::Frozen { at, .. } => *at,
            Expiry::Session(id) => match session {
                Some(row) if &row.id == id => row.holds_until(),
                _ => StoreTime::from_ms(0),
            },
        }
    }

    /// A per-key expiry the store indexes for the reaper: `At` and `Frozen`
    /// (a live session's keys are found through their session instead).
    pub fn indexed_at(&self) -> Option<StoreTime> {
        match self {
            Expiry::At(at) | Expiry::Frozen { at, .. } => Some(*at),
            Expiry::Session(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn secret(byte: u8) -> LeaseKey {
        LeaseKey::from_bytes([byte; 16]).unwrap()
    }

    fn open_at(now: u64) -> SessionRecord {
        let id = SessionId::new(DcId::new("iad").unwrap(), 9);
        SessionRecord::open(
            id,
            secret(1),
            HostTime::from_ms(5),
            StoreTime::from_ms(now),
            &POLICY,
        )
        .0
    }

    #[test]
    fn session_ids_are_written_dc_tilde_unique_and_parsed_back() {
        let id: SessionId = "iad~42".parse().unwrap();
        assert_eq!((id.dc().as_str(), id.unique()), ("iad", 42));
        assert_eq!(id.to_string(), "iad~42");
        for (bad, reason) in [
            ("iad.42", "missing the `~`"),
            ("iad~", "decimal digits"),
            ("iad~007", "leading zeros"),
            ("iad~1~2", "decimal digits"),
        ] {
            let err = bad.parse::<SessionId>().unwrap_err().to_string();
            assert!(
                err.contains(reason) && err.contains("session"),
                "{bad}: {err}"
            );
        }
        assert!("IAD~1".parse::<SessionId>().is_err());
    }

    #[test]
    fn a_renewal_moves_the_expiry_from_the_receipt_and_answers_in_the_host_clock() {
        let row = open_at(1_000);
        assert_eq!(row.holds_until(), StoreTime::from_ms(11_000));
        let t = row.renew(
            &secret(1),
            HostTime::from_ms(3_000),
            StoreTime::from_ms(4_000),
            &POLICY,
        );
        let next = t.next.unwrap();
        assert_eq!(next.holds_until(), StoreTime::from_ms(14_000));
        assert_eq!(next.version, 2);
        let SessionRenewReply::Renewed { deadlines, .. } = t.reply else {
            panic!("{:?}", t.reply)
        };
        assert_eq!(
            deadlines,
            POLICY
                .grant(HostTime::from_ms(3_000), StoreTime::from_ms(0))
                .deadlines
        );
    }

    #[test]
    fn a_renewal_is_refused_for_another_secret_after_expiry_and_once_ended() {
        let row = open_at(1_000);
        let at = |ms| StoreTime::from_ms(ms);
        let host = HostTime::from_ms(0);
        assert_eq!(
            row.renew(&secret(2), host, at(2_000), &POLICY).reply,
            SessionRenewReply::NotHolder
        );
        assert_eq!(
            row.renew(&secret(1), host, at(11_000), &POLICY).reply,
            SessionRenewReply::Expired
        );
        let closed = row.close(&secret(1), at(3_000)).unwrap();
        assert_eq!(closed.holds_until(), at(3_000));
        assert_eq!(
            closed.renew(&secret(1), host, at(3_001), &POLICY).reply,
            SessionRenewReply::Expired
        );
        assert_eq!(closed.close(&secret(1), at(3_002)), None);
        assert_eq!(row.close(&secret(2), at(3_000)), None);
    }

    #[test]
    fn the_reaper_ends_a_session_only_after_expiry_plus_grace_keeping_its_expiry() {
        let row = open_at(1_000);
        assert_eq!(row.expire(StoreTime::from_ms(12_999), &POLICY), None);
        let ended = row.expire(StoreTime::from_ms(13_000), &POLICY).unwrap();
        assert_eq!(
            ended.state,
            SessionState::Ended {
                until: StoreTime::from_ms(11_000),
                cause: SessionEnd::Expired
            }
        );
        assert_eq!(ended.expire(StoreTime::from_ms(99_000), &POLICY), None);
    }

    #[test]
    fn a_session_key_is_held_as_long_as_its_own_session_row_says() {
        let row = open_at(1_000);
        let key = Expiry::Session(row.id.clone());
        assert_eq!(key.holds_until(Some(&row)), StoreTime::from_ms(11_000));
        assert_eq!(key.holds_until(None), StoreTime::from_ms(0));
        let mut other = row.clone();
        other.id = "iad~10".parse().unwrap();
        assert_eq!(key.holds_until(Some(&other)), StoreTime::from_ms(0));
        let frozen = Expiry::Frozen {
            session: row.id.clone(),
            at: StoreTime::from_ms(7),
            notice: 1,
        };
        assert_eq!(frozen.holds_until(Some(&row)), StoreTime::from_ms(7));
        assert_eq!(key.indexed_at(), None);
        assert_eq!(frozen.indexed_at(), Some(StoreTime::from_ms(7)));
    }

    proptest! {
        // Duplicated and reordered renewals never shorten a session: the
        // expiry after any sequence of renewals is the latest granted.
        #[test]
        fn renewals_in_any_order_never_lower_the_expiry(
            arrivals in proptest::collection::vec((0u64..20_000, 0u64..10_000), 1..20)
        ) {
            let mut row = open_at(0);
            let mut latest = row.holds_until();
            for (received, host) in arrivals {
                let t = row.renew(&secret(1), HostTime::from_ms(host), StoreTime::from_ms(received), &POLICY);
                if let Some(next) = t.next {
                    prop_assert!(next.holds_until() >= row.holds_until());
                    latest = latest.max(StoreTime::from_ms(received).plus_ms(POLICY.ttl_ms()));
                    prop_assert_eq!(next.holds_until(), latest);
                    row = next;
                }
            }
        }
    }
}
