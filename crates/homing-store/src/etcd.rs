//! The etcd backend (cargo feature `etcd`): both stores as keys under one
//! configurable prefix (e.g. `/homing/<deployment>/global/`, or
//! `/homing/<deployment>/dc/<dc>/` for one DC's store).
//!
//! Layout under the prefix: `g/<key bytes>` → reservation ID (global
//! entries); `r/<id>` → postcard record; `k/<(key, id) bytes>` → id (scan
//! index); `alloc` → the allocator's high-water mark (decimal).
//!
//! - `set_if_absent`: one transaction, `create_revision(g/k) == 0` ? put : get.
//! - compare-and-set: one transaction on etcd's own per-key `version`, which
//!   counts puts since creation. Records are only ever written by this CAS
//!   (create = etcd version 1 = record version 1, never deleted), so the two
//!   counters are equal and `version(r/id) == expected` is exactly the record
//!   CAS. Reads check the equality and report `Corrupt` if it ever breaks.
//! - allocator: hi-lo blocks; the high-water mark is raised by a transaction
//!   on the counter key's `mod_revision`, retried a bounded number of times.

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse,
};
use homing_core::{DcRecord, Key, Namespace, ReservationId};
use tokio::sync::Mutex;

use crate::allocator::Blocks;
use crate::dc::{Cas, DcStore, ScanCursor, check_cas, check_limit};
use crate::error::StoreError;
use crate::global::{GlobalStore, SetIfAbsent, check_batch};
use crate::keyspace;

/// Most attempts to raise the allocator's high-water mark against concurrent raisers.
pub const ALLOCATE_ATTEMPTS_MAX: usize = 16;
/// Connect timeout, in milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Per-request timeout, in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Attempts of one request when the member it went to does not answer (the
/// client then reaches another member).
pub const TRANSPORT_ATTEMPTS_MAX: usize = 3;
/// Pause between such attempts, in milliseconds.
pub const TRANSPORT_RETRY_PAUSE_MS: u64 = 100;

fn map_err(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match e {
        // Transport trouble and gRPC statuses (leader loss, timeouts, no quorum) are worth a retry.
        E::TransportError(_) | E::GRpcStatus(_) | E::IoError(_) => StoreError::Unavailable {
            backend: "etcd",
            reason: e.to_string(),
        },
        e => StoreError::Backend {
            backend: "etcd",
            reason: e.to_string(),
        },
    }
}

fn protocol(reason: &str) -> StoreError {
    StoreError::Backend {
        backend: "etcd",
        reason: reason.into(),
    }
}

/// A connection and the prefix every key lives under.
#[derive(Clone)]
struct Space {
    kv: KvClient,
    prefix: Vec<u8>,
}

impl Space {
    async fn connect(endpoints: &[String], prefix: &str) -> Result<Space, StoreError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_millis(CONNECT_TIMEOUT_MS))
            .with_timeout(std::time::Duration::from_millis(REQUEST_TIMEOUT_MS));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(map_err)?;
        Ok(Space {
            kv: client.kv_client(),
            prefix: prefix.as_bytes().to_vec(),
        })
    }

    fn key(&self, section: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + section.len() + rest.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(section);
        out.extend_from_slice(rest);
        out
    }

    /// Runs `request` again (bounded) while it fails for want of a member.
    /// A retried write may have landed the first time: `set_if_absent` then
    /// sees its own entry and a CAS sees its own record, which callers treat
    /// as success (see `Cas::landed`).
    async fn retrying<T, F, Fut>(&self, request: F) -> Result<T, StoreError>
    where
        F: Fn(KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 1;
        loop {
            match request(self.kv.clone()).await.map_err(map_err) {
                Err(StoreError::Unavailable { .. }) if attempt < TRANSPORT_ATTEMPTS_MAX => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(TRANSPORT_RETRY_PAUSE_MS))
                        .await;
                }
                other => return other,
            }
        }
    }

    async fn get(
        &self,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        self.retrying(|mut kv| {
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<(bool, Vec<TxnOpResponse>), StoreError> {
        let response = self
            .retrying(|mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok((response.succeeded(), response.op_responses()))
    }
}

/// The first key-value of a transaction's get response, if any.
fn first_kv(response: Option<&TxnOpResponse>) -> Result<Option<KeyValue>, StoreError> {
    match response {
        Some(TxnOpResponse::Get(get)) => Ok(get.kvs().first().cloned()),
        _ => Err(protocol(
            "transaction answered without the get it asked for",
        )),
    }
}

/// A [`GlobalStore`] in etcd.
#[derive(Clone)]
pub struct EtcdGlobalStore {
    space: Space,
}

impl EtcdGlobalStore {
    /// Connects to the cluster at `endpoints` (`http://host:port`); keys live under `prefix`.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
    ) -> Result<EtcdGlobalStore, StoreError> {
        Ok(EtcdGlobalStore {
            space: Space::connect(endpoints, prefix).await?,
        })
    }

    fn entry_key(&self, key: &Key) -> Vec<u8> {
        self.space.key(b"g/", &keyspace::key_bytes(key))
    }
}

#[async_trait]
impl GlobalStore for EtcdGlobalStore {
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        let response = self.space.get(self.entry_key(key), None).await?;
        response
            .kvs()
            .first()
            .map(|kv| keyspace::decode_id(kv.value()))
            .transpose()
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
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        if responses.len() != keys.len() {
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

    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        let k = self.entry_key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), keyspace::id_bytes(id), None)])
            .or_else([TxnOp::get(k, None)]);
        let (inserted, responses) = self.space.txn(txn).await?;
        if inserted {
            return Ok(SetIfAbsent::Inserted);
        }
        let kv = first_kv(responses.first())?
            .ok_or_else(|| protocol("entry vanished (entries are never deleted)"))?;
        Ok(SetIfAbsent::Exists(keyspace::decode_id(kv.value())?))
    }
}

/// A [`DcStore`] in etcd.
pub struct EtcdDcStore {
    space: Space,
    blocks: Mutex<Blocks>,
}

impl EtcdDcStore {
    /// Connects to the cluster at `endpoints`; this DC's keys live under `prefix`.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdDcStore, StoreError> {
        Ok(EtcdDcStore {
            space: Space::connect(endpoints, prefix).await?,
            // The first allocation reads the persisted mark before serving.
            blocks: Mutex::new(Blocks::resume(0)),
        })
    }

    fn record_key(&self, id: &ReservationId) -> Vec<u8> {
        self.space.key(b"r/", &keyspace::id_bytes(id))
    }
}

/// Decodes a record kv and checks its version against etcd's.
fn decode_kv(kv: &KeyValue) -> Result<DcRecord, StoreError> {
    let record = keyspace::decode_record(kv.value())?;
    if i64::try_from(record.version).ok() != Some(kv.version()) {
        return Err(StoreError::corrupt(
            "record",
            format!(
                "record version {} but etcd version {}",
                record.version,
                kv.version()
            ),
        ));
    }
    Ok(record)
}

#[async_trait]
impl DcStore for EtcdDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let response = self.space.get(self.record_key(id), None).await?;
        response.kvs().first().map(decode_kv).transpose()
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        check_cas(expected, record)?;
        let value = keyspace::encode_record(record)?;
        let rk = self.record_key(&record.id);
        let index = self
            .space
            .key(b"k/", &keyspace::record_scan_bytes(&record.key, &record.id));
        let txn = match expected {
            None => Txn::new()
                .when([Compare::create_revision(rk.clone(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(rk.clone(), value, None),
                    TxnOp::put(index, keyspace::id_bytes(&record.id), None),
                ]),
            Some(v) => {
                let v = i64::try_from(v).map_err(|_| StoreError::InvalidVersion {
                    expected,
                    got: record.version,
                })?;
                Txn::new()
                    .when([
                        Compare::version(rk.clone(), CompareOp::Equal, v),
                        // The record keeps its key: its index entry must exist.
                        Compare::create_revision(index, CompareOp::NotEqual, 0),
                    ])
                    .and_then([TxnOp::put(rk.clone(), value, None)])
            }
        };
        let (written, responses) = self.space.txn(txn.or_else([TxnOp::get(rk, None)])).await?;
        if written {
            return Ok(Cas::Written);
        }
        let current = first_kv(responses.first())?
            .as_ref()
            .map(decode_kv)
            .transpose()?;
        match (&current, expected) {
            (Some(stored), Some(v)) if stored.version == v => Err(StoreError::KeyChanged {
                id: record.id.clone(),
            }),
            _ => Ok(Cas::Conflict { current }),
        }
    }

    async fn scan(
        &self,
        namespace: &Namespace,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let (start, end) = keyspace::prefixed_scan_range(
            &self.space.key(b"k/", b""),
            namespace,
            name_prefix,
            after,
        )
        .ok_or_else(|| protocol("unbounded prefix"))?;
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let index = self.space.get(start, Some(options)).await?;
        if index.kvs().is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = index
            .kvs()
            .iter()
            .map(|kv| TxnOp::get(self.space.key(b"r/", kv.value()), None))
            .collect();
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        responses
            .iter()
            .map(|r| {
                let kv = first_kv(Some(r))?
                    .ok_or_else(|| StoreError::corrupt("scan index", "entry without a record"))?;
                decode_kv(&kv)
            })
            .collect()
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut blocks = self.blocks.lock().await;
        if let Some(unique) = blocks.take() {
            return Ok(unique);
        }
        let counter = self.space.key(b"alloc", b"");
        for _ in 0..ALLOCATE_ATTEMPTS_MAX {
            let response = self.space.get(counter.clone(), None).await?;
            let (persisted, guard) = match response.kvs().first() {
                Some(kv) => {
                    let text = std::str::from_utf8(kv.value())
                        .map_err(|e| StoreError::corrupt("allocator", e))?;
                    let mark = text
                        .parse::<u64>()
                        .map_err(|e| StoreError::corrupt("allocator", e))?;
                    (
                        mark,
                        Compare::mod_revision(counter.clone(), CompareOp::Equal, kv.mod_revision()),
                    )
                }
                None => (
                    0,
                    Compare::create_revision(counter.clone(), CompareOp::Equal, 0),
                ),
            };
            blocks.jump_to(persisted);
            let high_water = blocks.next_high_water()?;
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                counter.clone(),
                high_water.to_string(),
                None,
            )]);
            if self.space.txn(txn).await?.0 {
                blocks.granted(high_water);
                // Invariant: a fresh block of ALLOCATOR_BLOCK_IDS ≥ 1 has a first unique.
                return Ok(blocks.take().expect("a granted block is not empty"));
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("allocator counter contended for {ALLOCATE_ATTEMPTS_MAX} attempts"),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::conformance::{self, Backend};
    use crate::etcd_cluster::{ClusterError, LocalEtcdCluster};

    struct EtcdBackend {
        endpoints: Vec<String>,
        run: u64,
    }

    static RUNS: AtomicU64 = AtomicU64::new(0);

    impl EtcdBackend {
        fn prefix(&self, kind: &str, place: &str) -> String {
            format!("/homing-test/{}/{kind}/{place}/", self.run)
        }
    }

    #[async_trait]
    impl Backend for EtcdBackend {
        async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
            let prefix = self.prefix("global", place);
            Arc::new(
                EtcdGlobalStore::connect(&self.endpoints, &prefix)
                    .await
                    .expect("connect"),
            )
        }
        async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
            let prefix = self.prefix("dc", place);
            Arc::new(
                EtcdDcStore::connect(&self.endpoints, &prefix)
                    .await
                    .expect("connect"),
            )
        }
        fn durable(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn etcd_three_member_cluster_passes_the_conformance_suite() {
        let cluster = match LocalEtcdCluster::start().await {
            Ok(cluster) => cluster,
            Err(ClusterError::NoBinary) => {
                println!(
                    "SKIP etcd conformance: no `etcd` binary on PATH (apt-get install etcd-server)"
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let backend = EtcdBackend {
            endpoints: cluster.endpoints().to_vec(),
            run: RUNS.fetch_add(1, Ordering::Relaxed),
        };
        conformance::run_all(&backend).await;
        drop(cluster);
    }
}
