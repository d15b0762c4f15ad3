//! The DC store contract: one DC's own records, changed only by
//! compare-and-set on `DcRecord::version`, scanned in `(key, id)` order; the
//! DC's lifecycle event log, appended in the same transaction as the change
//! it records; and the durable allocator of the DC's reservation uniques.

use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{
    DcRecord, DueCursor, DueKind, DuePage, Event, EventSeq, Namespace, NamespaceScope, RecordRead,
    ReservationId, SessionId, SessionRecord, StoreTime,
};

use crate::error::StoreError;
use crate::failover::Failover;
use crate::session::{self, GuardedCas, SessionCas, SessionCounts, SessionCursor, SessionGuard};

pub use homing_core::ScanCursor;

/// Most records one [`DcStore::scan`] returns.
pub const SCAN_LIMIT_MAX: usize = 128;
/// Most rows or records one session page returns.
pub const SESSION_PAGE_MAX: usize = SCAN_LIMIT_MAX;
/// Most events one [`DcStore::events`] returns.
pub const EVENTS_LIMIT_MAX: usize = 256;

/// One page of a DC's event log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventPage {
    /// Events with `seq > after`, in order, at most `limit`.
    pub events: Vec<Event>,
    /// The oldest event still kept (`head + 1` when none is kept): a cursor
    /// below `oldest - 1` has missed trimmed events.
    pub oldest: EventSeq,
    /// The last event ever appended (`0`: none yet). Never goes down, also
    /// when every event is trimmed.
    pub head: EventSeq,
}

impl EventPage {
    /// A page of stored (encoded) events, decoded.
    pub(crate) fn decode<B: AsRef<[u8]>>(
        stored: &[B],
        oldest: EventSeq,
        head: EventSeq,
    ) -> Result<EventPage, StoreError> {
        let events = stored
            .iter()
            .map(|bytes| crate::keyspace::decode_event(bytes.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(EventPage {
            events,
            oldest,
            head,
        })
    }
}

/// What [`DcStore::import`] or [`DcStore::import_event`] did with a copied item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Import<T> {
    /// Written: it was absent (or, for a record, an older version of it was there).
    Written,
    /// An equal item was already there: nothing to do (a resumed copy).
    Present,
    /// A different item is there (a record with a newer or equal version but
    /// other contents, an event with other contents): left alone, reported.
    Conflict {
        /// What the target holds.
        current: T,
    },
}

/// What [`DcStore::compare_and_set`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per write, never stored: boxing buys nothing
pub enum Cas {
    /// The record was written (durably, for durable backends).
    Written,
    /// The stored version was not the expected one; nothing was written.
    Conflict {
        /// The record as stored now (`None`: no record with this id).
        current: Option<DcRecord>,
    },
}

impl Cas {
    /// Whether this call's write is what the store holds. Only
    /// [`Cas::Written`] is: a conflict whose current record equals the one
    /// written is another caller's identical write (two re-activations of
    /// one released record in the same millisecond compute the same record),
    /// and counting it as ours would let both callers hold the key with one
    /// token. A backend that retries an attempt whose outcome it could not
    /// learn settles that itself ([`Cas::after_unknown_outcome`]).
    pub fn landed(&self) -> bool {
        matches!(self, Cas::Written)
    }

    /// For a backend that retried this very compare-and-set after an attempt
    /// whose commit outcome was lost (the attempt may have committed): a
    /// conflict with exactly `record` is that attempt's write, so
    /// [`Cas::Written`]. Only after such a retry: anywhere else an equal
    /// record is someone else's write.
    pub fn after_unknown_outcome(self, record: &DcRecord) -> Cas {
        match self {
            Cas::Conflict {
                current: Some(current),
            } if &current == record => Cas::Written,
            other => other,
        }
    }
}

/// One DC's records and allocator.
#[async_trait]
pub trait DcStore: Send + Sync + 'static {
    /// The record of reservation `id`, if any.
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError>;

    /// Writes `record` iff the stored record's version is `expected` (`None`:
    /// no record with this id yet). `record.version` must be
    /// `expected.map_or(1, |v| v + 1)`, else [`StoreError::InvalidVersion`]
    /// (caller bug) and nothing is written; a record's key never changes
    /// ([`StoreError::KeyChanged`]).
    ///
    /// In the same transaction, when [`homing_core::event::derive`] of
    /// (stored record, `record`) gives an event, the event is appended to the
    /// log with `seq = head + 1`: a written change and its event land
    /// together or not at all.
    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError>;

    /// Records whose key is in `scope` and whose name starts with
    /// `name_prefix`, in `(key, id)` order, strictly after `after` if given, at
    /// most `limit` (≤ [`SCAN_LIMIT_MAX`], else [`StoreError::BatchTooLarge`]).
    /// Fewer than `limit` only when no more records match: callers stop
    /// paging at a short page. A scope with children takes no name prefix
    /// ([`StoreError::InvalidScan`]); [`NamespaceScope::everything`] pages
    /// through every record (the reaper and the orphan sweeper use that).
    async fn scan(
        &self,
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError>;

    /// The expiry index: records whose [`homing_core::Due`] entry is of
    /// `kind` and at or before `until`, oldest first, strictly after `after`
    /// if given, at most `limit` entries (≤ [`SCAN_LIMIT_MAX`], else
    /// [`StoreError::BatchTooLarge`]). Reads only those entries and their
    /// records, all at one point in time, so a pass costs what is due, not
    /// what the DC ever wrote. An entry whose record cannot be read back
    /// (undecodable, dangling, not matching its entry) is returned in
    /// [`DuePage::bad`] instead of failing the page. Every compare-and-set
    /// and import keeps the record's entry in the same transaction
    /// ([`homing_core::Due::of`]); linked and abandoned records have none.
    async fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError>;

    /// Drops the [`DueKind::Released`] entry of record `id` iff the stored
    /// record still has `version` (the orphan sweeper proved it a member of
    /// its chain, which it stays forever): `Ok(true)` dropped, `Ok(false)`
    /// the record moved, is gone or had no such entry. A later write of the
    /// record indexes it again as [`homing_core::Due::of`] says.
    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError>;

    /// A unique for this DC's next reservation: never returned twice, also
    /// across crashes and reopen. Always ≥ 1.
    async fn allocate(&self) -> Result<u64, StoreError>;

    /// Events with `seq > after`, oldest first, at most `limit` (≤
    /// [`EVENTS_LIMIT_MAX`], else [`StoreError::BatchTooLarge`]), with the
    /// log's bounds. Fewer than `limit` only when no more are kept.
    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError>;

    /// Deletes every event with `seq < before` (retention). The head stays.
    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError>;

    /// Migration: writes `record` exactly as given (version included) unless
    /// the store holds it already — equal: [`Import::Present`]; an older
    /// version: overwritten, [`Import::Written`]; same or newer version with
    /// other contents: [`Import::Conflict`]. Appends no event.
    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError>;

    /// Migration: writes `event` at its own `seq` unless one is there
    /// (equal: [`Import::Present`], else [`Import::Conflict`]); the head
    /// becomes at least `event.seq`.
    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError>;

    /// Migration: a bound at or above every unique [`DcStore::allocate`]
    /// ever returned (a backend reserving blocks reports its durable bound).
    async fn allocator_floor(&self) -> Result<u64, StoreError>;

    /// Migration: every later [`DcStore::allocate`] returns more than `floor`.
    /// A floor below the current one changes nothing.
    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError>;

    /// Its endpoints' health and failover counters, for a store that talks
    /// to several servers and goes around a silent one (etcd); `None` for
    /// the others.
    fn failover(&self) -> Option<Arc<Failover>> {
        None
    }

    /// How many keys this DC created in `namespace` (exactly that namespace,
    /// not those under it): its records there that are the first
    /// reservation of their key (`predecessor: None`, so it wrote or tried
    /// to write the key's global entry) and not abandoned (a race it lost).
    /// Counts at most `at_most` (a caller comparing with a bound needs no
    /// more). The default pages through [`DcStore::scan`]: one read per
    /// [`SCAN_LIMIT_MAX`] records of the namespace, up to the bound; a
    /// backend with a cheaper count overrides it.
    async fn keys_created(&self, namespace: &Namespace, at_most: u64) -> Result<u64, StoreError> {
        let scope = NamespaceScope::exact(namespace.clone());
        let mut created = 0;
        let mut after = None;
        while created < at_most {
            let page = self
                .scan(&scope, "", after.as_ref(), SCAN_LIMIT_MAX)
                .await?;
            created += page.iter().filter(|r| created_key(r)).count() as u64;
            if page.len() < SCAN_LIMIT_MAX {
                break;
            }
            after = page.last().map(ScanCursor::after);
        }
        Ok(created.min(at_most))
    }

    /// Whether an unfinished `homing migrate` is copying into this store.
    /// The migration marks its target DC stores before it copies and clears
    /// the mark once the copy verified; homingd refuses to start on a marked
    /// store (its allocator and records are still being brought in). Every
    /// backend keeps the mark.
    async fn migrating(&self) -> Result<bool, StoreError>;

    /// Sets or clears the mark [`DcStore::migrating`] reads, durably.
    async fn set_migrating(&self, on: bool) -> Result<(), StoreError>;

    /// The record of `id` with the row of the session it is held under, if
    /// it is ([`RecordRead`]): the record, then the row. Every judgement of
    /// whether a lease is held reads this way.
    async fn read(&self, id: &ReservationId) -> Result<Option<RecordRead>, StoreError> {
        let Some(record) = self.get(id).await? else {
            return Ok(None);
        };
        let session = match record.session() {
            Some(session) => self.session(session).await?,
            None => None,
        };
        let session = session.map(Box::new);
        Ok(Some(RecordRead { record, session }))
    }

    /// The row of host session `id`, if any.
    async fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError>;

    /// Writes session row `row` iff the stored row's version is `expected`
    /// (`None`: no row yet); `row.version` must follow it, else
    /// [`StoreError::InvalidVersion`]. Keeps the row's sessions-due entry
    /// in the same transaction ([`crate::session`]).
    async fn compare_and_set_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError>;

    /// Deletes session row `id` iff it is at `version` (`Ok(true)`), with
    /// its sessions-due entry. The caller deletes only an ended session
    /// whose keys were all reaped: an ended session gains no key (a key
    /// joins only under a guard of a live row), so none can appear after.
    async fn delete_session(&self, id: &SessionId, version: u64) -> Result<bool, StoreError>;

    /// [`DcStore::compare_and_set`] of a record that joins a session or
    /// freezes in it, iff the session row is still at `guard.version`; the
    /// row `guard.next`, if given, is written in the same transaction. Any
    /// other record may be written this way too (the guard is then only
    /// checked). Nothing is written on a conflict of either.
    async fn compare_and_set_in_session(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: &SessionGuard,
    ) -> Result<GuardedCas, StoreError>;

    /// The records held under session `id` (live or frozen), in the order of
    /// their stored ids, strictly after `after`, at most `limit` (≤
    /// [`SESSION_PAGE_MAX`]); fewer only when no more are.
    async fn session_keys(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError>;

    /// The frozen records of session `id` whose notice is numbered above
    /// `after`, in notice order, at most `limit` (≤
    /// [`SESSION_PAGE_MAX`]).
    async fn session_notices(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError>;

    /// Session rows due by `until` (a live one at its expiry, an ended one
    /// at its end), oldest first, strictly after `after`, at most `limit`
    /// (≤ [`SESSION_PAGE_MAX`]).
    async fn due_sessions(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError>;

    /// Every session row, live or ended, in the order of their stored names
    /// ([`crate::session::session_bytes`], byte order: `iad~10` before
    /// `iad~2`), strictly after `after`, at most `limit` (≤
    /// [`SESSION_PAGE_MAX`]); fewer only when no more are.
    /// Migration pages through them to copy and verify every row.
    async fn sessions(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError>;

    /// Migration: writes session row `row` exactly as given unless the store
    /// holds it already (judged as [`DcStore::import`] judges a record).
    async fn import_session(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError>;

    /// How many session rows and session keys the store holds, counted
    /// without reading them (homingd's metrics after each upkeep pass);
    /// `None` where a backend cannot count cheaply (FoundationDB).
    async fn session_counts(&self) -> Result<Option<SessionCounts>, StoreError> {
        Ok(None)
    }

    /// Whether the store serves now (homingd's `/readyz` asks): one read of
    /// the event log's bounds, plus what a backend needs to write (redb: its
    /// writer thread runs).
    async fn health(&self) -> Result<(), StoreError> {
        self.events(0, 0).await.map(|_| ())
    }
}

/// Whether `record` is a key this DC created (see [`DcStore::keys_created`]).
pub(crate) fn created_key(record: &DcRecord) -> bool {
    record.predecessor.is_none() && record.state != homing_core::RecordState::Abandoned
}

/// The caller-bug check every backend runs before a scan.
pub(crate) fn check_scan(
    scope: &NamespaceScope,
    name_prefix: &str,
    limit: usize,
) -> Result<(), StoreError> {
    check_limit(limit)?;
    if scope.include_children && !name_prefix.is_empty() {
        return Err(StoreError::InvalidScan {
            reason: format!(
                "a scan of namespace {scope} with children takes no name prefix (got {name_prefix:?})"
            ),
        });
    }
    Ok(())
}

/// Rejects an events limit above the bound.
pub(crate) fn check_events_limit(limit: usize) -> Result<(), StoreError> {
    if limit > EVENTS_LIMIT_MAX {
        return Err(StoreError::BatchTooLarge {
            len: limit,
            max: EVENTS_LIMIT_MAX,
        });
    }
    Ok(())
}

/// How an import judges the stored record against the copied one.
pub(crate) fn judge_import(
    record: &DcRecord,
    current: Option<DcRecord>,
) -> Option<Import<DcRecord>> {
    match current {
        None => None,
        Some(current) if &current == record => Some(Import::Present),
        Some(current) if current.version < record.version && current.key == record.key => None,
        Some(current) => Some(Import::Conflict { current }),
    }
}

/// How a session-row import judges the stored row.
pub(crate) fn judge_session_import(
    row: &SessionRecord,
    current: Option<SessionRecord>,
) -> Option<Import<SessionRecord>> {
    match current {
        None => None,
        Some(current) if &current == row => Some(Import::Present),
        Some(current) if current.version < row.version => None,
        Some(current) => Some(Import::Conflict { current }),
    }
}

/// How an event import judges the stored event at the same seq.
pub(crate) fn judge_event_import(event: &Event, current: Option<Event>) -> Option<Import<Event>> {
    match current {
        None => None,
        Some(current) if &current == event => Some(Import::Present),
        Some(current) => Some(Import::Conflict { current }),
    }
}

/// The caller-bug checks every backend runs before a compare-and-set.
pub(crate) fn check_cas(expected: Option<u64>, record: &DcRecord) -> Result<(), StoreError> {
    let want = match expected {
        None => 1,
        Some(v) => v.checked_add(1).ok_or(StoreError::InvalidVersion {
            expected,
            got: record.version,
        })?,
    };
    if record.version != want {
        return Err(StoreError::InvalidVersion {
            expected,
            got: record.version,
        });
    }
    Ok(())
}

impl From<Cas> for GuardedCas {
    fn from(cas: Cas) -> GuardedCas {
        match cas {
            Cas::Written => GuardedCas::Written,
            Cas::Conflict { current } => GuardedCas::RecordConflict { current },
        }
    }
}

/// Judges a guarded compare-and-set against the stored record and session
/// row, for the backends that read both before they write: `Ok(None)` to
/// write. The row is judged first (as [`session::judge_guard`]), then the record (as
/// [`judge_cas`]). `unknown_outcome`: an earlier attempt of this
/// very write may have landed unseen; if the stored record is exactly
/// `record` it did (with its row), and the answer is `Written`.
#[cfg_attr(not(any(feature = "etcd", feature = "fdb")), allow(dead_code))]
pub(crate) fn judge_guarded(
    expected: Option<u64>,
    record: &DcRecord,
    guard: &SessionGuard,
    stored: Option<DcRecord>,
    row: Option<SessionRecord>,
    unknown_outcome: bool,
) -> Result<Option<GuardedCas>, StoreError> {
    if unknown_outcome && stored.as_ref() == Some(record) {
        return Ok(Some(GuardedCas::Written));
    }
    if let Some(moved) = session::judge_guard(guard, row) {
        return Ok(Some(moved));
    }
    Ok(judge_cas(expected, record, stored)?.map(GuardedCas::from))
}

/// Checks a CAS against the stored record: `Ok(None)` to write, `Ok(Some(conflict))`
/// to refuse, `Err` for a key change.
pub(crate) fn judge_cas(
    expected: Option<u64>,
    record: &DcRecord,
    current: Option<DcRecord>,
) -> Result<Option<Cas>, StoreError> {
    match (&current, expected) {
        (None, None) => Ok(None),
        (Some(stored), Some(v)) if stored.version == v => {
            if stored.key != record.key {
                return Err(StoreError::KeyChanged {
                    id: record.id.clone(),
                });
            }
            Ok(None)
        }
        _ => Ok(Some(Cas::Conflict { current })),
    }
}

/// Rejects a scan (or expiry-index page) limit above the bound.
pub(crate) fn check_limit(limit: usize) -> Result<(), StoreError> {
    if limit > SCAN_LIMIT_MAX {
        return Err(StoreError::BatchTooLarge {
            len: limit,
            max: SCAN_LIMIT_MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{
        ActorId, FencingToken, HostTime, Key, KeyName, LeaseKey, LeasePolicy, StoreTime,
    };

    #[test]
    fn only_a_write_or_a_retry_after_an_unknown_outcome_counts_as_landed() {
        let (record, _) = DcRecord::reserve(
            "iad.1".parse().unwrap(),
            Key::new(KeyName::new("k").unwrap()),
            None,
            FencingToken::FIRST,
            None,
            &homing_core::Holding {
                actor: ActorId::new("a").unwrap(),
                lease: LeaseKey::from_bytes([1; 16]).unwrap(),
                host_time: HostTime::from_ms(0),
                session: None,
            },
            StoreTime::from_ms(0),
            &LeasePolicy::DEFAULT,
        );
        assert!(Cas::Written.landed());
        let same = Cas::Conflict {
            current: Some(record.clone()),
        };
        // An equal record found by a first attempt is someone else's write.
        assert!(!same.landed());
        assert!(same.after_unknown_outcome(&record).landed());
        let mut other = record.clone();
        other.version += 1;
        let moved = Cas::Conflict {
            current: Some(other),
        };
        assert!(!moved.after_unknown_outcome(&record).landed());
        assert!(
            !Cas::Conflict { current: None }
                .after_unknown_outcome(&record)
                .landed()
        );
    }
}
