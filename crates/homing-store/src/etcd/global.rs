//! The etcd [`GlobalStore`]: write-once entries (`g/`), batched, and the
//! DC leases, successions and settings it serves through
//! [`super::dc_lease`], [`super::succession`] and [`super::setting`].
//!
//! - `set_if_absent`: `create_revision(g/k) == 0` ? put : get; concurrent
//!   calls share one transaction, a nested one per key (`batch`).
//!   Retried on another member when one does not answer in time (`members`);
//!   if an abandoned attempt may have landed and the retry reads the
//!   caller's own id back, the answer is `Inserted` (it was, once).
//! - `get_nearest` (a connect's read): a serializable range; concurrent
//!   calls share one read-only transaction of serializable ranges, which
//!   the member answers from its own state like a lone serializable range
//!   (etcd's `Txn` skips the quorum read when every operation is a
//!   serializable range; etcdserver `v3_server.go`, `isTxnSerializable`).

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms, Key, ReservationId, Succession,
    SuccessionCause, TakeOverReply, TakeoverPolicy,
};

use super::compaction::{CompactionPolicy, Compactor};
use super::dc_lease::DcLeases;
use super::members::Op;
use super::setting::Settings;
use super::succession::Successions;
use super::{Space, first_kv, protocol};
use crate::batch::{Batch, BatchBounds, Batcher};
use crate::error::StoreError;
use crate::failover::Failover;
use crate::global::{
    GlobalStore, SetIfAbsent, check_batch, check_cause, check_link, check_setting,
};
use crate::keyspace;
use crate::setting::Setting;

/// A [`GlobalStore`] in etcd.
#[derive(Clone)]
pub struct EtcdGlobalStore {
    pub(super) space: Space,
    /// Groups concurrent `set_if_absent` calls into one transaction.
    write_once: Arc<Batcher<Entries>>,
    /// Groups concurrent `get_nearest` calls into one read-only transaction
    /// (`None`: each is a range request of its own).
    nearest_reads: Option<Arc<Batcher<NearestReads>>>,
    /// Each DC's lease and marks (`dc_lease`).
    pub(super) dcs: DcLeases,
    /// Who succeeds which reservation (`succession`).
    pub(super) successions: Successions,
    /// The deployment settings (`setting`).
    settings: Settings,
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

    /// One transaction of nested ones, each deciding its own key:
    /// `create_revision(g/k) == 0` ? put : get.
    async fn commit(&self, batch: &[(Key, ReservationId)]) -> Result<Vec<SetIfAbsent>, StoreError> {
        let nested: Vec<TxnOp> = batch
            .iter()
            .map(|(key, id)| {
                let k = self.space.key(b"g/", &keyspace::key_bytes(key));
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(k.clone(), keyspace::id_bytes(id), None)])
                        .or_else([TxnOp::get(k, None)]),
                )
            })
            .collect();
        let seen = self.space.members.revision_seen();
        let txned = self
            .space
            .txn_at(Op::HotWrite, Txn::new().and_then(nested))
            .await?;
        if txned.responses.len() != batch.len() {
            return Err(protocol(
                "transaction answered a different number of writes",
            ));
        }
        batch
            .iter()
            .zip(&txned.responses)
            .map(|((_, id), response)| {
                let TxnOpResponse::Txn(nested) = response else {
                    return Err(protocol("transaction answered without its nested one"));
                };
                if nested.succeeded() {
                    return Ok(SetIfAbsent::Inserted);
                }
                // The failed guard read the entry back in the same transaction.
                let kv = first_kv(nested.op_responses().first())?
                    .ok_or_else(|| protocol("entry vanished (entries are never deleted)"))?;
                let existing = keyspace::decode_id(kv.value())?;
                // An abandoned attempt landed: the entry is ours, inserted once.
                if existing == *id && self.space.members.landed_ours(txned.ambiguous, seen, &kv) {
                    return Ok(SetIfAbsent::Inserted);
                }
                Ok(SetIfAbsent::Exists(existing))
            })
            .collect()
    }

    fn backend(&self) -> &'static str {
        "etcd"
    }
}

/// The global entries under one prefix, as a connect reads them from the
/// nearest member (`GlobalStore::get_nearest`), batched.
struct NearestReads {
    space: Space,
}

#[async_trait]
impl Batch for NearestReads {
    type Call = Key;
    type Outcome = Option<ReservationId>;

    fn key(call: &Key) -> &Key {
        call
    }

    /// One read-only transaction of serializable ranges, one per key: the
    /// member answers it from its own state, as it would each range alone.
    async fn commit(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        let serializable = GetOptions::new().with_serializable();
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|key| {
                let k = self.space.key(b"g/", &keyspace::key_bytes(key));
                TxnOp::get(k, Some(serializable.clone()))
            })
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::HotRead, Txn::new().and_then(gets))
            .await?;
        decode_entries(keys.len(), &responses)
    }

    fn backend(&self) -> &'static str {
        "etcd"
    }
}

/// The entries a transaction of `expected` gets read, in order.
fn decode_entries(
    expected: usize,
    responses: &[TxnOpResponse],
) -> Result<Vec<Option<ReservationId>>, StoreError> {
    if responses.len() != expected {
        return Err(protocol("transaction answered a different number of gets"));
    }
    responses
        .iter()
        .map(|r| {
            first_kv(Some(r))?
                .map(|kv| keyspace::decode_id(kv.value()))
                .transpose()
        })
        .collect()
}

/// How an [`EtcdGlobalStore`] groups concurrent calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdGlobalOptions {
    /// Bounds of the write-once batches (`set_if_absent`).
    pub write_once: BatchBounds,
    /// Bounds of the nearest-read batches (`get_nearest`); `None`: every
    /// nearest read is a range request of its own.
    pub nearest_reads: Option<BatchBounds>,
}

impl Default for EtcdGlobalOptions {
    fn default() -> EtcdGlobalOptions {
        EtcdGlobalOptions {
            write_once: BatchBounds::default(),
            nearest_reads: Some(BatchBounds::default()),
        }
    }
}

impl EtcdGlobalStore {
    /// Starts compacting the cluster this store is on (see
    /// [`compaction`]); the compactor stops when dropped.
    pub fn compactor(&self, policy: CompactionPolicy) -> Compactor {
        Compactor::start(self.space.clone(), policy)
    }

    /// Connects to the cluster at `endpoints` (`http://host:port`) with the
    /// default options; keys live under `prefix`. Spawns the store's
    /// batchers on the current tokio runtime (they end when the store is
    /// dropped).
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
    ) -> Result<EtcdGlobalStore, StoreError> {
        EtcdGlobalStore::connect_with(endpoints, prefix, EtcdGlobalOptions::default()).await
    }

    /// [`EtcdGlobalStore::connect`] with `options`; bounds out of range fail
    /// with [`StoreError::InvalidArgument`].
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        options: EtcdGlobalOptions,
    ) -> Result<EtcdGlobalStore, StoreError> {
        let write_once = options.write_once.check()?;
        let nearest_reads = options.nearest_reads.map(BatchBounds::check).transpose()?;
        let space = Space::connect(endpoints, prefix).await?;
        let entries = Arc::new(Entries {
            space: space.clone(),
        });
        let reads = Arc::new(NearestReads {
            space: space.clone(),
        });
        let dcs = DcLeases::new(space.clone());
        Ok(EtcdGlobalStore {
            successions: Successions::new(space.clone(), dcs.clone()),
            settings: Settings::new(space.clone()),
            dcs,
            space,
            write_once: Arc::new(Batcher::start(entries, write_once)),
            nearest_reads: nearest_reads.map(|bounds| Arc::new(Batcher::start(reads, bounds))),
        })
    }

    fn entry_key(&self, key: &Key) -> Vec<u8> {
        self.space.key(b"g/", &keyspace::key_bytes(key))
    }

    async fn entry(
        &self,
        key: &Key,
        options: Option<GetOptions>,
    ) -> Result<Option<ReservationId>, StoreError> {
        let response = self
            .space
            .get(Op::HotRead, self.entry_key(key), options)
            .await?;
        response
            .kvs()
            .first()
            .map(|kv| keyspace::decode_id(kv.value()))
            .transpose()
    }
}

#[async_trait]
impl GlobalStore for EtcdGlobalStore {
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
        self.successions.take_over(succession, policy).await
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
        self.entry(key, None).await
    }

    /// A serializable read: answered by the member this client talks to
    /// from its own state, without the quorum round trip of `get` (which,
    /// under load on a 3-member cluster, costs about as much as the
    /// write-once itself; docs/BENCHMARKS.md).
    async fn get_nearest(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        match &self.nearest_reads {
            Some(batcher) => batcher.call(key.clone()).await,
            None => {
                self.entry(key, Some(GetOptions::new().with_serializable()))
                    .await
            }
        }
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        check_batch(keys.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(self.entry_key(k), None))
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::HotRead, Txn::new().and_then(gets))
            .await?;
        decode_entries(keys.len(), &responses)
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
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let section = self.space.key(b"g/", b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let start = self.space.key(b"g/", &keyspace::global_scan_start(after));
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let response = self.space.get(Op::BulkRead, start, Some(options)).await?;
        response
            .kvs()
            .iter()
            .map(|kv| {
                let key = kv
                    .key()
                    .strip_prefix(section.as_slice())
                    .ok_or_else(|| protocol("range answered a key outside its section"))?;
                Ok((keyspace::decode_key(key)?, keyspace::decode_id(kv.value())?))
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

    fn failover(&self) -> Option<Arc<Failover>> {
        Some(self.space.members.failover().clone())
    }
}
