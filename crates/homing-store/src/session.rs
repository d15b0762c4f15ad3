//! Host sessions in the DC store: the session rows, the record writes that
//! depend on a session row, and the three indexes every backend derives in
//! the same transaction as the write they follow:
//!
//! - *session keys*: `(session, reservation)` for every record held under a
//!   session (`Expiry::Session` or `Expiry::Frozen`), so the keys of a dead
//!   session are reaped in pages, O(its keys), and a host can resync;
//! - *session notices*: `(session, notice)` for every frozen key, so a
//!   renewal lists the notices its host has not acknowledged without
//!   reading the session's other keys;
//! - *sessions due*: `(at, session)` for every row — a live session at its
//!   expiry, an ended one at its end — so the reaper reads only sessions
//!   that are due.
//!
//! A record joins a session (its expiry becomes `Session`) or freezes only
//! through [`crate::DcStore::compare_and_set_in_session`], which checks the
//! session row's version in the same transaction: a key never joins a
//! session that ended meanwhile, and a freeze is ordered with every renewal
//! (see `homing_core::DcRecord::drain`). A plain compare-and-set of such a
//! record is a caller bug ([`StoreError::SessionGuardMissing`]).

use homing_core::{DcRecord, Expiry, RecordState, ReservationId, SessionId, SessionRecord, wire};

use crate::error::StoreError;

/// What [`crate::DcStore::compare_and_set_session`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCas {
    /// The row was written.
    Written,
    /// The stored version was not the expected one; nothing was written.
    Conflict {
        /// The row as stored now (`None`: no such session).
        current: Option<SessionRecord>,
    },
}

impl SessionCas {
    /// Resolves a conflict seen by a write whose earlier attempt may have
    /// landed unseen (an answer lost, the request resent): if the stored row
    /// is exactly `row`, that attempt wrote it (rows carry their version, so
    /// an equal row is this write), and the answer is `Written`.
    pub fn after_unknown_outcome(self, row: &SessionRecord) -> SessionCas {
        match self {
            SessionCas::Conflict {
                current: Some(current),
            } if &current == row => SessionCas::Written,
            other => other,
        }
    }
}

pub use homing_core::SessionGuard;

/// What [`crate::DcStore::compare_and_set_in_session`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per write, never stored
pub enum GuardedCas {
    /// The record (and the session row, if given) were written.
    Written,
    /// The record's version was not the expected one; nothing was written.
    RecordConflict {
        /// The record as stored now.
        current: Option<DcRecord>,
    },
    /// The session row moved (or is gone); nothing was written.
    SessionMoved {
        /// The row as stored now.
        current: Option<SessionRecord>,
    },
}

/// How many host sessions a DC store holds ([`crate::DcStore::session_counts`]).
pub use homing_core::SessionCounts;

/// Where a page of due sessions ended: the last row returned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SessionCursor {
    /// The row's due time.
    pub at: homing_core::StoreTime,
    /// The session.
    pub id: SessionId,
}

impl SessionCursor {
    /// The cursor just past `row`.
    pub fn after(row: &SessionRecord) -> SessionCursor {
        SessionCursor {
            at: row.holds_until(),
            id: row.id.clone(),
        }
    }
}

/// The format byte of a stored session row.
const SESSION_FORMAT: u8 = 0x01;

/// A session's stored name: its text form.
pub fn session_bytes(id: &SessionId) -> Vec<u8> {
    id.to_string().into_bytes()
}

/// Parses a stored session name.
pub fn decode_session_id(bytes: &[u8]) -> Result<SessionId, StoreError> {
    let text = std::str::from_utf8(bytes).map_err(|e| StoreError::corrupt("session id", e))?;
    text.parse()
        .map_err(|e| StoreError::corrupt("session id", e))
}

/// Encodes a session row (a format byte, then postcard).
pub fn encode_session(row: &SessionRecord) -> Result<Vec<u8>, StoreError> {
    let bytes = wire::encode(row).map_err(|e| StoreError::corrupt("session", e))?;
    Ok([&[SESSION_FORMAT][..], &bytes].concat())
}

/// Decodes a stored session row.
pub fn decode_session(bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    match bytes.split_first() {
        Some((&SESSION_FORMAT, rest)) => {
            wire::decode(rest).map_err(|e| StoreError::corrupt("session", e))
        }
        _ => Err(StoreError::corrupt("session", "unknown format byte")),
    }
}

/// Where a page of every session row ([`crate::DcStore::sessions`]) starts
/// in a byte-keyed table of rows by [`session_bytes`]: strictly after
/// `after`'s name.
pub fn sessions_start(after: Option<&SessionId>) -> Vec<u8> {
    after.map_or_else(Vec::new, |id| {
        crate::keyspace::successor(&session_bytes(id))
    })
}

/// The prefix of every index entry of `session` in the session-keys and
/// session-notices indexes: its name, then `0x00` (names hold no zero byte).
pub fn session_prefix(session: &SessionId) -> Vec<u8> {
    let mut out = session_bytes(session);
    out.push(0);
    out
}

/// The session-keys index entry of `id` under `session`.
pub fn session_key_entry(session: &SessionId, id: &ReservationId) -> Vec<u8> {
    let mut out = session_prefix(session);
    out.extend_from_slice(&crate::keyspace::id_bytes(id));
    out
}

/// The session-keys range `[start, end)` of `session`'s keys strictly
/// after `after`.
pub fn session_keys_range(
    session: &SessionId,
    after: Option<&ReservationId>,
) -> (Vec<u8>, Vec<u8>) {
    let prefix = session_prefix(session);
    let start = match after {
        Some(after) => crate::keyspace::successor(&session_key_entry(session, after)),
        None => prefix.clone(),
    };
    (start, prefix_end(&prefix))
}

/// The session-notices index entry of notice `notice` of `session`.
pub fn session_notice_entry(session: &SessionId, notice: u64) -> Vec<u8> {
    let mut out = session_prefix(session);
    out.extend_from_slice(&notice.to_be_bytes());
    out
}

/// The session-notices range `[start, end)` of `session`'s notices
/// numbered above `after`.
pub fn session_notices_range(session: &SessionId, after: u64) -> (Vec<u8>, Vec<u8>) {
    let prefix = session_prefix(session);
    let start = match after.checked_add(1) {
        Some(first) => session_notice_entry(session, first),
        None => prefix_end(&prefix),
    };
    (start, prefix_end(&prefix))
}

/// The sessions-due index entry of `row`: its due time as 8 big-endian
/// bytes, then its name, so "due by `t`" is one byte range.
pub fn session_due_entry(row: &SessionRecord) -> Vec<u8> {
    session_due_bytes(&SessionCursor::after(row))
}

fn session_due_bytes(cursor: &SessionCursor) -> Vec<u8> {
    let mut out = cursor.at.as_ms().to_be_bytes().to_vec();
    out.extend_from_slice(&session_bytes(&cursor.id));
    out
}

/// The sessions-due range `[start, end)` of rows due by `until`
/// (inclusive), strictly after `after`.
pub fn sessions_due_range(
    until: homing_core::StoreTime,
    after: Option<&SessionCursor>,
) -> (Vec<u8>, Vec<u8>) {
    let start = after.map_or_else(Vec::new, |c| {
        crate::keyspace::successor(&session_due_bytes(c))
    });
    let end = match until.as_ms().checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xFF; 9],
    };
    (start, end)
}

fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    crate::keyspace::prefix_end(prefix).expect("a session prefix ends in 0x00, so it has an end")
}

/// Which of the two per-record session indexes an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionIndex {
    /// `(session, reservation)`: every record held under a session.
    Keys,
    /// `(session, notice)`: every frozen record.
    Notices,
}

/// One entry of a per-record session index; its value is the
/// reservation's stored id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEntry {
    /// Which index.
    pub index: SessionIndex,
    /// The entry's key in that index.
    pub entry: Vec<u8>,
}

/// The session-index entries a record has: its session-keys entry and,
/// when frozen, its session-notices entry.
pub fn session_entries(record: &DcRecord) -> Vec<SessionEntry> {
    let RecordState::Active { expiry, .. } = &record.state else {
        return Vec::new();
    };
    let keys = |session| SessionEntry {
        index: SessionIndex::Keys,
        entry: session_key_entry(session, &record.id),
    };
    match expiry {
        Expiry::At(_) => Vec::new(),
        Expiry::Session(session) => vec![keys(session)],
        Expiry::Frozen {
            session, notice, ..
        } => vec![
            keys(session),
            SessionEntry {
                index: SessionIndex::Notices,
                entry: session_notice_entry(session, *notice),
            },
        ],
    }
}

/// The session-index entries to delete and to put when `old` becomes `new`
/// (`old` `None`: a new record). Each backend applies them in the write's
/// transaction.
pub fn session_index_changes(
    old: Option<&DcRecord>,
    new: &DcRecord,
) -> (Vec<SessionEntry>, Vec<SessionEntry>) {
    let before = old.map(session_entries).unwrap_or_default();
    let after = session_entries(new);
    let gone = before
        .iter()
        .filter(|e| !after.contains(e))
        .cloned()
        .collect();
    let added = after.into_iter().filter(|e| !before.contains(e)).collect();
    (gone, added)
}

pub use homing_core::record::needs_guard;

/// The caller-bug check of a plain compare-and-set: a record joining a
/// session or freezing needs [`crate::DcStore::compare_and_set_in_session`].
pub(crate) fn check_unguarded(old: Option<&DcRecord>, new: &DcRecord) -> Result<(), StoreError> {
    match needs_guard(old, new) {
        None => Ok(()),
        Some(session) => Err(StoreError::SessionGuardMissing {
            id: new.id.clone(),
            session,
        }),
    }
}

/// The caller-bug check of a guarded compare-and-set: the guard is the
/// record's session, and a row to write follows the guarded version.
pub(crate) fn check_guard(record: &DcRecord, guard: &SessionGuard) -> Result<(), StoreError> {
    if record.session() != Some(&guard.id) {
        return Err(StoreError::InvalidArgument(format!(
            "record {} is not held under session {}",
            record.id, guard.id
        )));
    }
    if let Some(next) = &guard.next
        && (next.id != guard.id || Some(next.version) != guard.version.checked_add(1))
    {
        return Err(StoreError::InvalidArgument(format!(
            "session row {} version {} does not follow version {}",
            next.id, next.version, guard.version
        )));
    }
    Ok(())
}

/// The caller-bug check of a session row's compare-and-set.
pub(crate) fn check_session_cas(
    expected: Option<u64>,
    row: &SessionRecord,
) -> Result<(), StoreError> {
    let want = expected.map_or(Some(1), |v| v.checked_add(1));
    if Some(row.version) != want {
        return Err(StoreError::InvalidVersion {
            expected,
            got: row.version,
        });
    }
    Ok(())
}

/// Judges a session row's compare-and-set against the stored row:
/// `None` to write, `Some(conflict)` to refuse.
pub(crate) fn judge_session_cas(
    expected: Option<u64>,
    current: Option<SessionRecord>,
) -> Option<SessionCas> {
    match (&current, expected) {
        (None, None) => None,
        (Some(stored), Some(v)) if stored.version == v => None,
        _ => Some(SessionCas::Conflict { current }),
    }
}

/// Judges a guarded write's session row: `None` when it is still at the
/// guarded version.
pub(crate) fn judge_guard(
    guard: &SessionGuard,
    current: Option<SessionRecord>,
) -> Option<GuardedCas> {
    match &current {
        Some(row) if row.version == guard.version => None,
        _ => Some(GuardedCas::SessionMoved { current }),
    }
}
