//! The FoundationDB [`GlobalStore`]: write-once entries (`g/`), batched,
//! and the DC leases, successions and settings it serves through
//! `dc_lease`, `succession` and `setting`.

use async_trait::async_trait;
use foundationdb::Database;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms, Key, ReservationId, Succession,
    SuccessionCause, TakeOverReply, TakeoverPolicy,
};

use super::dc_lease::DcLeases;
use super::setting::Settings;
use super::succession::Successions;
use super::{Space, Step, TRANSACTION_ATTEMPTS_MAX, exact_range, fdb_err};
use crate::batch::{Batch, BatchBounds, Batcher};
use crate::error::StoreError;
use crate::global::{
    GlobalStore, SetIfAbsent, check_batch, check_cause, check_link, check_setting,
};
use crate::keyspace;
use crate::setting::Setting;

/// A [`GlobalStore`] in FoundationDB.
pub struct FdbGlobalStore {
    space: Space,
    /// Groups concurrent `set_if_absent` calls into one transaction.
    write_once: Batcher<Entries>,
    /// Each DC's lease and marks (`dc_lease`).
    dcs: DcLeases,
    /// Who succeeds which reservation (`succession`).
    successions: Successions,
    /// The deployment settings (`setting`).
    settings: Settings,
}

impl FdbGlobalStore {
    /// A store over `db` (network already booted) with keys under `prefix`
    /// (e.g. `b"homing/<deployment>/global/"`). Spawns the store's
    /// write-once batcher on the current tokio runtime (it ends when the
    /// store is dropped).
    pub fn new(db: std::sync::Arc<Database>, prefix: &[u8]) -> FdbGlobalStore {
        let space = Space {
            db,
            prefix: prefix.to_vec(),
        };
        let entries = std::sync::Arc::new(Entries {
            space: space.clone(),
        });
        FdbGlobalStore {
            dcs: DcLeases::new(space.clone()),
            successions: Successions::new(space.clone()),
            settings: Settings::new(space.clone()),
            space,
            write_once: Batcher::start(entries, BatchBounds::default()),
        }
    }
}

/// The global entries under one prefix, as the write-once batcher writes them.
struct Entries {
    space: Space,
}

#[async_trait]
impl Batch for Entries {
    type Call = (Key, ReservationId);
    type Outcome = SetIfAbsent;

    fn key(call: &Self::Call) -> &Key {
        &call.0
    }

    /// One serializable transaction: each key read (adding its conflict
    /// range) and set when absent. A conflict on any key retries the whole
    /// batch, which then reads the winner's entry for that key.
    async fn commit(&self, batch: &[(Key, ReservationId)]) -> Result<Vec<SetIfAbsent>, StoreError> {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = batch
            .iter()
            .map(|(key, id)| {
                let k = self.space.key(b"g/", &keyspace::key_bytes(key));
                (k, keyspace::id_bytes(id))
            })
            .collect();
        let found = transact!(self.space, trx, {
            let mut found = Vec::with_capacity(entries.len());
            for (k, v) in &entries {
                let existing = step!(trx.get(k, false).await).map(|e| e.to_vec());
                if existing.is_none() {
                    trx.set(k, v);
                }
                found.push(existing);
            }
            Ok(Step::Done(found))
        })?;
        found
            .into_iter()
            .map(|existing| match existing {
                None => Ok(SetIfAbsent::Inserted),
                Some(bytes) => Ok(SetIfAbsent::Exists(keyspace::decode_id(&bytes)?)),
            })
            .collect()
    }

    fn backend(&self) -> &'static str {
        "fdb"
    }
}

#[async_trait]
impl GlobalStore for FdbGlobalStore {
    async fn successor(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        self.successions.get(from).await
    }

    async fn set_successor(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_cause(succession, SuccessionCause::Moved)?;
        self.successions.set(succession).await
    }

    async fn import_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_link(succession)?;
        self.successions.set(succession).await
    }

    async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        check_cause(succession, SuccessionCause::TakenOver)?;
        self.successions
            .take_over(&self.dcs, succession, policy)
            .await
    }

    async fn successions_of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        self.successions.of(dc, after, limit).await
    }

    async fn scan_successions(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        self.successions.scan(after, limit).await
    }

    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        let k = self.space.key(b"g/", &keyspace::key_bytes(key));
        let found = transact!(self.space, trx, {
            Ok(Step::Done(
                step!(trx.get(&k, false).await).map(|v| v.to_vec()),
            ))
        })?;
        found.map(|b| keyspace::decode_id(&b)).transpose()
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        check_batch(keys.len())?;
        let ks: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| self.space.key(b"g/", &keyspace::key_bytes(k)))
            .collect();
        let found = transact!(self.space, trx, {
            let mut out = Vec::with_capacity(ks.len());
            for k in &ks {
                out.push(step!(trx.get(k, false).await).map(|v| v.to_vec()));
            }
            Ok(Step::Done(out))
        })?;
        found
            .into_iter()
            .map(|b| b.map(|b| keyspace::decode_id(&b)).transpose())
            .collect()
    }

    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        self.write_once.call((key.clone(), id.clone())).await
    }

    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError> {
        check_batch(limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let section = self.space.key(b"g/", b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let start = self.space.key(b"g/", &keyspace::global_scan_start(after));
        let rows = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect();
            Ok(Step::Done(rows))
        })?;
        rows.into_iter()
            .map(|(k, id)| {
                let k = k.strip_prefix(section.as_slice()).ok_or_else(|| {
                    StoreError::corrupt("global entry", "key outside its section")
                })?;
                Ok((keyspace::decode_key(k)?, keyspace::decode_id(&id)?))
            })
            .collect()
    }

    async fn renew_dc_lease(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        self.dcs.renew(dc, terms, marks).await
    }

    async fn dc_lease(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        self.dcs.state(dc).await
    }

    async fn dc_leases(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        self.dcs.states().await
    }

    async fn retire_dc(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        self.dcs.retire(dc).await
    }

    async fn setting(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        self.settings.get(name).await
    }

    async fn swap_setting(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
        check_setting(name, value)?;
        self.settings.swap(name, expected, value).await
    }
}
