//! When a DC record next needs its DC's upkeep: the key of the stores'
//! expiry index, so that a pass reads only the records that are due instead
//! of every record the DC ever wrote.
//!
//! A record is due for one of two reasons, each its own [`DueKind`]:
//!
//! - an active lease is due for the reaper at its expiry (the reaper adds
//!   the grace period when it asks: [`DueKind::Lease`] at its own expiry or
//!   the one it froze at; a live host session's keys have no entry, their
//!   session has one);
//! - a released record is due for the orphan sweeper at its release time
//!   (the sweeper adds the orphan age: [`DueKind::Released`] at `at`), until
//!   the sweeper proves it a member of its chain and settles it.
//!
//! Linked and abandoned records are never due: they have no entry. The
//! index keeps raw times, not `expiry + grace`, so changing the grace or the
//! orphan age needs no re-indexing.

use serde::{Deserialize, Serialize};

use crate::record::{DcRecord, RecordState};
use crate::reservation::ReservationId;
use crate::time::StoreTime;

/// Why a record is in the expiry index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DueKind {
    /// An active lease, at its expiry.
    Lease,
    /// A released record not yet proven a member of its chain, at its
    /// release.
    Released,
}

impl DueKind {
    /// The byte that starts this kind's section of a byte-keyed index.
    pub const fn tag(self) -> u8 {
        match self {
            DueKind::Lease => b'l',
            DueKind::Released => b'r',
        }
    }
}

/// A record's entry in the expiry index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Due {
    /// Why.
    pub kind: DueKind,
    /// From when (store time; the asker adds its own margin).
    pub at: StoreTime,
}

impl Due {
    /// The entry `record` has in the expiry index (`None`: never due).
    pub fn of(record: &DcRecord) -> Option<Due> {
        match &record.state {
            RecordState::Active { expiry, .. } => expiry.indexed_at().map(|at| Due {
                kind: DueKind::Lease,
                at,
            }),
            RecordState::Released { at, .. } => Some(Due {
                kind: DueKind::Released,
                at: *at,
            }),
            RecordState::Linked { .. } | RecordState::Abandoned => None,
        }
    }
}

/// Where a page of due records ended: the last index entry read (a record
/// or a bad entry). The next page starts strictly after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DueCursor {
    /// The entry's time.
    pub at: StoreTime,
    /// The entry's reservation.
    pub id: ReservationId,
}

/// An index entry whose record could not be read back (undecodable bytes,
/// a dangling entry): reported and skipped, never a reason to stop a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// The reservation the entry names, as stored.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One page of the expiry index, oldest entry first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DuePage {
    /// Due records, decoded.
    pub records: Vec<DcRecord>,
    /// Entries whose record could not be read, skipped.
    pub bad: Vec<BadRecord>,
    /// Where the next page starts (`None`: no more entries are due).
    pub next: Option<DueCursor>,
    /// Entries of this kind not due yet, counted without reading their
    /// records; only on the last page (`next == None`), else 0.
    pub pending: u64,
}
