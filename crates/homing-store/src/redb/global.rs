//! The redb [`GlobalStore`]: write-once entries, DC leases, successions
//! and settings, every write through the file's writer.

use std::path::Path;

use async_trait::async_trait;
use homing_core::succession::judge_takeover;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms, Key, ReservationId, Succession,
    SuccessionCause, TakeOverReply, TakeoverPolicy,
};
use redb::ReadableTable;
use tokio::sync::Mutex;

use crate::dc_lease::{DcEntry, DcLeaseTable, process_clock};
use crate::error::StoreError;
use crate::global::{
    DCS_MAX, GlobalStore, SetIfAbsent, check_batch, check_cause, check_link, check_setting,
};
use crate::keyspace;
use crate::setting::Setting;
use crate::writer::{DCS, GLOBAL, Op, Outcome, SETTINGS, SUCCESSIONS, backend};

use super::{RedbOptions, Shared, unexpected};

/// A [`GlobalStore`] in a redb file. DC leases are judged by this
/// process's monotonic clock (a redb global store serves one machine); their
/// terms, marks and retired flags are durable, renewal times are not (see
/// [`crate::dc_lease`]).
///
/// Successions live in the `successions` table, written once through the
/// writer (durable when answered, like `set_if_absent`); a move, a
/// migration's import and a takeover all end in that one write-once op, so
/// whichever lands first is the one. A takeover holds
/// the DC-lease lock, which renewals and retires hold across their own
/// writes, from its reading of the DC's standing until its write has
/// committed: no renewal is answered between the two.
///
/// Settings live in the `settings` table; a swap is one writer op that
/// compares and writes in the group's transaction (durable when answered).
pub struct RedbGlobalStore {
    shared: Shared,
    dcs: Mutex<DcLeaseTable>,
}

impl RedbGlobalStore {
    /// Opens (creating if needed) the global store at `path`. Fails with
    /// `Unavailable` if this process already has it open.
    pub fn open(
        path: impl AsRef<Path>,
        options: RedbOptions,
    ) -> Result<RedbGlobalStore, StoreError> {
        RedbGlobalStore::over(Shared::open(path.as_ref(), options)?)
    }

    /// Opens the global store on the storage `open` returns instead of a
    /// file (see [`RedbDcStore::on_storage`]).
    pub fn on_storage<S: redb::StorageBackend>(
        open: impl Fn() -> Result<S, std::io::Error> + Send + Sync + 'static,
        options: RedbOptions,
    ) -> Result<RedbGlobalStore, StoreError> {
        RedbGlobalStore::over(Shared::on_storage(open, options)?)
    }

    fn over(shared: Shared) -> Result<RedbGlobalStore, StoreError> {
        let entries = shared.read_here(|txn| {
            let table = match txn.open_table(DCS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(backend(e)),
            };
            let mut entries = Vec::new();
            for row in table.iter().map_err(backend)? {
                let (dc, value) = row.map_err(backend)?;
                let dc = DcId::new(dc.value()).map_err(|e| StoreError::corrupt("dc entry", e))?;
                entries.push((dc, keyspace::decode_dc_entry(value.value())?));
            }
            Ok(entries)
        })?;
        Ok(RedbGlobalStore {
            shared,
            dcs: Mutex::new(DcLeaseTable::new(process_clock(), entries)),
        })
    }

    /// Makes `entry` durable for `dc` unless the table holds it already, then
    /// records it (`renewed`: a renewal received now).
    async fn put_dc(
        &self,
        dcs: &mut DcLeaseTable,
        dc: &DcId,
        entry: DcEntry,
        renewed: bool,
    ) -> Result<(), StoreError> {
        if dcs.entry(dc) != entry || !dcs.known(dc) {
            let op = Op::PutDc {
                dc: dc.as_str().to_string(),
                value: keyspace::encode_dc_entry(&entry),
            };
            match self.shared.writer.submit(op).await? {
                Outcome::DcPut => {}
                _ => return Err(unexpected()),
            }
        }
        dcs.put(dc, entry, renewed);
        Ok(())
    }

    /// Writes `succession` unless its reservation has one (durable when
    /// answered); the one it has otherwise.
    async fn insert_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        let from = &succession.link.from;
        let op = Op::SetSuccessor {
            key: keyspace::succession_key(from),
            value: keyspace::encode_succession(succession),
        };
        match self.shared.writer.submit(op).await? {
            Outcome::SetSuccessor(None) => Ok(None),
            Outcome::SetSuccessor(Some(bytes)) => {
                Ok(Some(keyspace::decode_succession(from, &bytes)?))
            }
            _ => Err(unexpected()),
        }
    }

    /// The successions whose keys are at or above `start` and below `end`
    /// (`None`: to the table's end), at most `limit`, in key order.
    async fn successions_between(
        &self,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        let found = self
            .shared
            .read(move |txn| {
                let table = txn.open_table(SUCCESSIONS).map_err(backend)?;
                let range = match &end {
                    Some(end) => table.range::<&[u8]>(start.as_slice()..end.as_slice()),
                    None => table.range::<&[u8]>(start.as_slice()..),
                };
                range
                    .map_err(backend)?
                    .take(limit)
                    .map(|entry| {
                        let (k, v) = entry.map_err(backend)?;
                        Ok((k.value().to_vec(), v.value().to_vec()))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })
            .await?;
        found
            .into_iter()
            .map(|(k, v)| keyspace::decode_succession(&keyspace::decode_succession_key(&k)?, &v))
            .collect()
    }
}

#[async_trait]
impl GlobalStore for RedbGlobalStore {
    async fn successor(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        let key = keyspace::succession_key(from);
        let found = self.shared.read_here(|txn| {
            let table = txn.open_table(SUCCESSIONS).map_err(backend)?;
            let value = table.get(key.as_slice()).map_err(backend)?;
            Ok(value.map(|v| v.value().to_vec()))
        })?;
        found
            .map(|bytes| keyspace::decode_succession(from, &bytes))
            .transpose()
    }

    async fn set_successor(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_cause(succession, SuccessionCause::Moved)?;
        self.insert_succession(succession).await
    }

    async fn import_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_link(succession)?;
        self.insert_succession(succession).await
    }

    async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        check_cause(succession, SuccessionCause::TakenOver)?;
        // Held through the write, as renewals hold it through theirs: no
        // renewal lands between the judgement and the succession.
        let dcs = self.dcs.lock().await;
        let from = &succession.link.from;
        let existing = self.successor(from).await?;
        if let Some(reply) = judge_takeover(existing, dcs.state(from.dc()), policy, succession) {
            return Ok(reply);
        }
        let reply = match self.insert_succession(succession).await? {
            None => TakeOverReply::Taken,
            // A move confirmed between the read and the write.
            Some(existing) => TakeOverReply::Exists(existing),
        };
        drop(dcs);
        Ok(reply)
    }

    async fn successions_of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        let Some((start, end)) = keyspace::successions_range(dc, after)? else {
            return Ok(Vec::new());
        };
        self.successions_between(start, Some(end), limit).await
    }

    async fn scan_successions(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        let start = keyspace::successions_scan_start(after);
        self.successions_between(start, None, limit).await
    }

    async fn health(&self) -> Result<(), StoreError> {
        self.shared.health()
    }

    async fn setting(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.read_here(|txn| {
            let table = txn.open_table(SETTINGS).map_err(backend)?;
            let value = table.get(keyspace::setting_key(name)).map_err(backend)?;
            Ok(value.map(|v| v.value().to_vec()))
        })
    }

    async fn swap_setting(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
        check_setting(name, value)?;
        let op = Op::SwapSetting {
            key: keyspace::setting_key(name),
            expected: expected.map(<[u8]>::to_vec),
            value: value.to_vec(),
        };
        match self.shared.writer.submit(op).await? {
            Outcome::SwapSetting(judged) => Ok(judged),
            _ => Err(unexpected()),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        let key = keyspace::key_bytes(key);
        self.shared.read_here(|txn| {
            let table = txn.open_table(GLOBAL).map_err(backend)?;
            let value = table.get(key.as_slice()).map_err(backend)?;
            value.map(|v| keyspace::decode_id(v.value())).transpose()
        })
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        check_batch(keys.len())?;
        let keys: Vec<Vec<u8>> = keys.iter().map(keyspace::key_bytes).collect();
        let found = self
            .shared
            .read(move |txn| {
                let table = txn.open_table(GLOBAL).map_err(backend)?;
                keys.iter()
                    .map(|k| {
                        Ok(table
                            .get(k.as_slice())
                            .map_err(backend)?
                            .map(|v| v.value().to_vec()))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })
            .await?;
        found
            .into_iter()
            .map(|bytes| bytes.map(|b| keyspace::decode_id(&b)).transpose())
            .collect()
    }

    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        let op = Op::SetIfAbsent {
            key: keyspace::key_bytes(key),
            id: keyspace::id_bytes(id),
        };
        match self.shared.writer.submit(op).await? {
            Outcome::SetIfAbsent(None) => Ok(SetIfAbsent::Inserted),
            Outcome::SetIfAbsent(Some(bytes)) => {
                Ok(SetIfAbsent::Exists(keyspace::decode_id(&bytes)?))
            }
            _ => Err(unexpected()),
        }
    }

    async fn renew_dc_lease(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        let mut dcs = self.dcs.lock().await;
        let renewed = dcs.entry(dc).renewed(*terms, *marks);
        if let Some(entry) = renewed {
            self.put_dc(&mut dcs, dc, entry, true).await?;
        }
        Ok(DcLeaseTable::renewal(renewed))
    }

    async fn dc_lease(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        Ok(self.dcs.lock().await.state(dc))
    }

    async fn dc_leases(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        let mut states = self.dcs.lock().await.states();
        states.truncate(DCS_MAX);
        Ok(states)
    }

    async fn retire_dc(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let mut dcs = self.dcs.lock().await;
        let retired = dcs.entry(dc).retire();
        self.put_dc(&mut dcs, dc, retired, false).await?;
        Ok(dcs.state(dc))
    }

    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError> {
        check_batch(limit)?;
        // Byte order is key order, and the smallest key bytes above `after`'s
        // start strictly after them.
        let start = after.map_or_else(Vec::new, |k| keyspace::successor(&keyspace::key_bytes(k)));
        let found = self
            .shared
            .read(move |txn| {
                let table = txn.open_table(GLOBAL).map_err(backend)?;
                let range = table.range::<&[u8]>(start.as_slice()..).map_err(backend)?;
                range
                    .take(limit)
                    .map(|entry| {
                        let (k, id) = entry.map_err(backend)?;
                        Ok((k.value().to_vec(), id.value().to_vec()))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })
            .await?;
        found
            .into_iter()
            .map(|(k, id)| Ok((keyspace::decode_key(&k)?, keyspace::decode_id(&id)?)))
            .collect()
    }
}
