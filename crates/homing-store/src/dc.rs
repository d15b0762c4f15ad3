//! The DC store contract: one DC's own records, changed only by
//! compare-and-set on `DcRecord::version`, scanned in `(key, id)` order, and
//! the durable allocator of the DC's reservation uniques.

use async_trait::async_trait;
use homing_core::{DcRecord, Key, Namespace, ReservationId};

use crate::error::StoreError;

/// Most records one [`DcStore::scan`] returns.
pub const SCAN_LIMIT_MAX: usize = 128;

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

/// Where a scan page ended: the last record returned. The next page starts
/// strictly after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError>;

    /// Records whose key is in `namespace` and whose name starts with
    /// `name_prefix`, in `(key, id)` order, strictly after `after` if given, at
    /// most `limit` (≤ [`SCAN_LIMIT_MAX`], else [`StoreError::BatchTooLarge`]).
    /// Fewer than `limit` only when no more records match: callers stop
    /// paging at a short page.
    /// The empty namespace with the empty prefix pages through every record
    /// of every namespace (the reaper and the orphan sweeper use that).
    async fn scan(
        &self,
        namespace: &Namespace,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError>;

    /// A unique for this DC's next reservation: never returned twice, also
    /// across crashes and reopen. Always ≥ 1.
    async fn allocate(&self) -> Result<u64, StoreError>;
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
