//! The DC store contract: one DC's own records, changed only by
//! compare-and-set on `DcRecord::version`, scanned in `(key, id)` order; the
//! DC's lifecycle event log, appended in the same transaction as the change
//! it records; and the durable allocator of the DC's reservation uniques.

use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{DcRecord, Event, EventSeq, NamespaceScope, ReservationId};

use crate::error::StoreError;
use crate::failover::Failover;

pub use homing_core::ScanCursor;

/// Most records one [`DcStore::scan`] returns.
pub const SCAN_LIMIT_MAX: usize = 128;
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
    /// Whether `record` is now what the store holds: written by this call, or
    /// found already there — a write retried after a lost reply (a backend
    /// retrying on `Unavailable`, or the caller) that had landed the first
    /// time. Versions only grow, so an equal record is that same write.
    pub fn landed(&self, record: &DcRecord) -> bool {
        match self {
            Cas::Written => true,
            Cas::Conflict { current } => current.as_ref() == Some(record),
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

/// Rejects a scan limit above the bound.
fn check_limit(limit: usize) -> Result<(), StoreError> {
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
    use homing_core::{ActorId, FencingToken, HostTime, Key, KeyName, LeasePolicy, StoreTime};

    #[test]
    fn a_conflict_with_the_record_we_wrote_counts_as_landed() {
        let (record, _) = DcRecord::reserve(
            "iad.1".parse().unwrap(),
            Key::new(KeyName::new("k").unwrap()),
            None,
            FencingToken::FIRST,
            None,
            ActorId::new("a").unwrap(),
            HostTime::from_ms(0),
            StoreTime::from_ms(0),
            &LeasePolicy::DEFAULT,
        );
        assert!(Cas::Written.landed(&record));
        let same = Cas::Conflict {
            current: Some(record.clone()),
        };
        assert!(same.landed(&record));
        let mut other = record.clone();
        other.version += 1;
        assert!(
            !Cas::Conflict {
                current: Some(other)
            }
            .landed(&record)
        );
        assert!(!Cas::Conflict { current: None }.landed(&record));
    }
}
