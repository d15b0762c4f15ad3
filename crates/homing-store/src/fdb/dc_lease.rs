//! DC leases in FoundationDB (DESIGN.md §7.5). **Verified by compilation,
//! not against a running cluster** (as the rest of the backend; see
//! [`crate::fdb`]).
//!
//! Two keys per DC under the global prefix: `dcs/<dc>` → the [`DcEntry`]
//! (terms, marks, retired) and `dcv/<dc>` → the versionstamp of the commit
//! of the DC's last renewal, written by FDB itself
//! (`SetVersionstampedValue`). A renewal reads the entry and writes both in
//! one serializable transaction, so a renewal racing a retire conflicts,
//! retries and reads `retired`; run again after an unknown commit result it
//! only moves the versionstamp later.
//!
//! The store's clock is FDB's version: the master hands out about
//! 1,000,000 versions per second, so `(read version − renewal's commit
//! version) / 1000` is the ms since the store received the renewal — the
//! commit version is assigned after the DC sent it, the read version no
//! later than now. But a recovery of the transaction system jumps versions
//! ahead by `MAX_VERSIONS_IN_FLIGHT` (100 s of versions, far more after a
//! forced recovery) unless the cluster's version epoch is enabled, and
//! that jump would make a lease look older than it is: expired early, the
//! one wrong answer. So a store also counts, by this process's monotonic
//! clock, how long it has known each renewal (by its versionstamp), and
//! judges from the smaller of the two. Like redb's, a store that just
//! opened calls no lease expired before a whole `expires_after` has passed
//! in this process; a store that reads a DC every few seconds sees its
//! expiry that much late. Both errors are on the safe side.

use std::collections::BTreeMap;

use foundationdb::options::MutationType;
use homing_core::{DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms};

use super::{Space, Step, TRANSACTION_ATTEMPTS_MAX, exact_range, fdb_err};
use crate::dc_lease::{DcEntry, Sightings, process_clock};
use crate::error::StoreError;
use crate::global::DCS_MAX;
use crate::keyspace;

/// The section of DC entries: `dcs/<dc>` → [`DcEntry`].
const ENTRIES: &[u8] = b"dcs/";
/// The section of renewal stamps: `dcv/<dc>` → the last renewal's versionstamp.
const RENEWED: &[u8] = b"dcv/";
/// Bytes of an FDB versionstamp: the commit version (8, big-endian), then
/// the order in its batch (2).
const VERSIONSTAMP_BYTES: usize = 10;
/// Versions per ms of the master's clock (FDB's `VERSIONS_PER_SECOND` / 1000).
const VERSIONS_PER_MS: i64 = 1_000;
/// Most renewals whose first sighting a store remembers; past it, one is
/// forgotten and counted as seen anew (later, never earlier, expiry).
pub const SIGHTINGS_MAX: usize = DCS_MAX;

/// A renewal's versionstamp as stored.
type Stamp = [u8; VERSIONSTAMP_BYTES];

/// The DC leases under one global prefix.
pub(super) struct DcLeases {
    space: Space,
    sightings: Sightings<Stamp>,
}

/// What one transaction read of a DC: its entry, its last renewal's
/// versionstamp, and the transaction's read version.
pub(super) struct Read {
    entry: Option<Vec<u8>>,
    stamp: Option<Vec<u8>>,
}

/// The `SetVersionstampedValue` parameter that stores the bare versionstamp:
/// its placeholder, then the placeholder's offset (0, u32 little-endian).
fn versionstamp_param() -> Vec<u8> {
    let mut param = vec![0u8; VERSIONSTAMP_BYTES];
    param.extend_from_slice(&0u32.to_le_bytes());
    param
}

fn decode_entry(bytes: Option<&[u8]>) -> Result<DcEntry, StoreError> {
    bytes
        .map(keyspace::decode_dc_entry)
        .transpose()
        .map(Option::unwrap_or_default)
}

fn decode_stamp(bytes: &[u8]) -> Result<Stamp, StoreError> {
    bytes
        .try_into()
        .map_err(|_| StoreError::corrupt("dc renewal stamp", format!("{} bytes", bytes.len())))
}

/// The commit version in a versionstamp.
fn stamp_version(stamp: &Stamp) -> i64 {
    let mut version = [0u8; 8];
    version.copy_from_slice(&stamp[..8]);
    i64::from_be_bytes(version)
}

/// Ms of versions from `committed` to `read` (0 if not after).
fn version_since_ms(read: i64, committed: i64) -> u64 {
    u64::try_from(read.saturating_sub(committed) / VERSIONS_PER_MS).unwrap_or(0)
}

impl DcLeases {
    pub(super) fn new(space: Space) -> DcLeases {
        DcLeases {
            space,
            sightings: Sightings::new(process_clock(), SIGHTINGS_MAX),
        }
    }

    fn keys(&self, dc: &DcId) -> (Vec<u8>, Vec<u8>) {
        let name = dc.as_str().as_bytes();
        (self.space.key(ENTRIES, name), self.space.key(RENEWED, name))
    }

    /// Renews `dc`'s lease: one transaction (see the module doc).
    pub(super) async fn renew(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        let (entry_key, stamp_key) = self.keys(dc);
        let param = versionstamp_param();
        transact!(self.space, trx, {
            let stored = step!(trx.get(&entry_key, false).await);
            let entry = decode_entry(stored.as_deref())?;
            match entry.renewed(*terms, *marks) {
                None => Ok(Step::Done(DcRenewal::Retired)),
                Some(renewed) => {
                    trx.set(&entry_key, &keyspace::encode_dc_entry(&renewed));
                    trx.atomic_op(&stamp_key, &param, MutationType::SetVersionstampedValue);
                    Ok(Step::Done(DcRenewal::Renewed(renewed.marks)))
                }
            }
        })
    }

    /// Retires `dc`; its state after.
    pub(super) async fn retire(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let (entry_key, _) = self.keys(dc);
        transact!(self.space, trx, {
            let stored = step!(trx.get(&entry_key, false).await);
            let entry = decode_entry(stored.as_deref())?;
            if stored.is_none() || !entry.retired {
                trx.set(&entry_key, &keyspace::encode_dc_entry(&entry.retire()));
            }
            Ok(Step::Done(()))
        })?;
        self.state(dc).await
    }

    /// What the store knows about `dc` now.
    pub(super) async fn state(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let (read, version) = transact!(self.space, trx, {
            let version = step!(trx.get_read_version().await);
            let read = step!(self.read_in(&trx, dc).await);
            Ok(Step::Done((read, version)))
        })?;
        self.judge(dc, &read, version)
    }

    /// `dc`'s entry and renewal stamp, read in `trx` (with read conflict
    /// ranges: a renewal or retire committed meanwhile fails its commit).
    pub(super) async fn read_in(
        &self,
        trx: &foundationdb::Transaction,
        dc: &DcId,
    ) -> Result<Read, foundationdb::FdbError> {
        let (entry_key, stamp_key) = self.keys(dc);
        let entry = trx.get(&entry_key, false).await?.map(|v| v.to_vec());
        let stamp = trx.get(&stamp_key, false).await?.map(|v| v.to_vec());
        Ok(Read { entry, stamp })
    }

    /// Every DC in id order, at most [`DCS_MAX`], from one transaction.
    pub(super) async fn states(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        let section = |s: &[u8]| {
            let start = self.space.key(s, b"");
            // Invariant: the section ends in `/`, so it has an end.
            let end = keyspace::prefix_end(&start).expect("a section ending in '/' has an end");
            (start, end)
        };
        let (entries, stamps) = (section(ENTRIES), section(RENEWED));
        let (rows, version) = transact!(self.space, trx, {
            let version = step!(trx.get_read_version().await);
            let mut rows: Vec<Vec<(Vec<u8>, Vec<u8>)>> = Vec::with_capacity(2);
            // Stamps exist only beside entries, so the first DCS_MAX of
            // them cover every listed DC.
            for (start, end) in [&entries, &stamps] {
                let range = exact_range(start.clone(), end.clone(), DCS_MAX);
                let found = step!(trx.get_range(&range, 1, false).await);
                rows.push(
                    found
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                        .collect(),
                );
            }
            Ok(Step::Done((rows, version)))
        })?;
        let [entry_rows, stamp_rows] = <[_; 2]>::try_from(rows)
            .map_err(|_| StoreError::corrupt("dc entries", "read both sections"))?;
        let mut found: BTreeMap<DcId, Vec<u8>> = BTreeMap::new();
        for (key, value) in stamp_rows {
            found.insert(keyspace::decode_dc_key(&stamps.0, &key)?, value);
        }
        let mut states = Vec::with_capacity(entry_rows.len());
        for (key, value) in entry_rows {
            let dc = keyspace::decode_dc_key(&entries.0, &key)?;
            let read = Read {
                entry: Some(value),
                stamp: found.remove(&dc),
            };
            states.push(self.judge(&dc, &read, version)?);
        }
        Ok(states)
    }

    /// `dc`'s state from what a transaction at `version` read.
    pub(super) fn judge(
        &self,
        dc: &DcId,
        read: &Read,
        version: i64,
    ) -> Result<DcLeaseState, StoreError> {
        let entry = decode_entry(read.entry.as_deref())?;
        let since_ms = match &read.stamp {
            Some(bytes) => {
                let stamp = decode_stamp(bytes)?;
                let by_versions = version_since_ms(version, stamp_version(&stamp));
                Some(by_versions.min(self.sightings.since_ms(dc, stamp)))
            }
            None => None,
        };
        Ok(entry.state(dc, since_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_count_ms_and_never_run_backwards() {
        assert_eq!(version_since_ms(5_000_000, 2_000_000), 3_000);
        assert_eq!(version_since_ms(2_000_000, 5_000_000), 0);
        let mut stamp = [0u8; VERSIONSTAMP_BYTES];
        stamp[..8].copy_from_slice(&7_000_123i64.to_be_bytes());
        assert_eq!(stamp_version(&stamp), 7_000_123);
        assert!(decode_stamp(&stamp[..9]).is_err());
        assert_eq!(versionstamp_param(), [0u8; 14]);
    }
}
