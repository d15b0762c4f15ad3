//! The embedded redb backend, the zero-set-up default: one file per store
//! (each DC its own DC-store file; the devnet shares one global-store file).
//!
//! Writes go through the group-commit [`writer`](crate::writer) thread and
//! are durable when acknowledged (`Durability::Immediate`, redb's default:
//! fsync on commit). Reads run in read transactions on tokio's blocking pool.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{DcRecord, Key, Namespace, ReservationId};
use redb::{Database, ReadableDatabase};
use tokio::sync::Mutex;

use crate::allocator::Blocks;
use crate::dc::{Cas, DcStore, ScanCursor, check_cas, check_limit};
use crate::error::StoreError;
use crate::global::{GlobalStore, SetIfAbsent, check_batch};
use crate::keyspace;
use crate::writer::{BY_KEY, GLOBAL, HIGH_WATER, META, Op, Outcome, RECORDS, Writer, backend};

/// Default most operations committed in one group (one transaction, one fsync).
pub const GROUP_OPS_MAX_DEFAULT: usize = 256;

/// How the writer commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Up to `group_ops_max` queued operations share one transaction.
    Grouped {
        /// Most operations per transaction.
        group_ops_max: usize,
    },
    /// One transaction (one fsync) per operation: the baseline for benchmarks.
    PerOp,
}

/// Options for opening a redb store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedbOptions {
    /// Group commit or one transaction per op.
    pub commit: CommitMode,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            commit: CommitMode::Grouped {
                group_ops_max: GROUP_OPS_MAX_DEFAULT,
            },
        }
    }
}

/// An open redb file with its writer. Field order matters: the writer is
/// joined (dropping its database handle) before ours is dropped.
struct Shared {
    writer: Writer,
    db: Arc<Database>,
}

impl Shared {
    fn open(path: &Path, options: RedbOptions) -> Result<Shared, StoreError> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable {
                backend: "redb",
                reason: format!("{} is already open", path.display()),
            },
            e => backend(e),
        })?;
        // Create every table up front so read transactions never miss one.
        let txn = db.begin_write().map_err(backend)?;
        for table in [GLOBAL, RECORDS, BY_KEY] {
            txn.open_table(table).map_err(backend)?;
        }
        txn.open_table(META).map_err(backend)?;
        txn.commit().map_err(backend)?;
        let db = Arc::new(db);
        let group_ops_max = match options.commit {
            CommitMode::Grouped { group_ops_max } => group_ops_max.max(1),
            CommitMode::PerOp => 1,
        };
        let writer = Writer::start(db.clone(), group_ops_max)?;
        Ok(Shared { writer, db })
    }

    /// Runs `read` in a read transaction on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(backend)?;
            read(&txn)
        })
        .await
        .map_err(backend)?
    }
}

fn unexpected() -> StoreError {
    backend("writer answered with the wrong outcome kind")
}

/// A [`GlobalStore`] in a redb file.
pub struct RedbGlobalStore {
    shared: Shared,
}

impl RedbGlobalStore {
    /// Opens (creating if needed) the global store at `path`. Fails with
    /// `Unavailable` if this process already has it open.
    pub fn open(
        path: impl AsRef<Path>,
        options: RedbOptions,
    ) -> Result<RedbGlobalStore, StoreError> {
        Ok(RedbGlobalStore {
            shared: Shared::open(path.as_ref(), options)?,
        })
    }
}

#[async_trait]
impl GlobalStore for RedbGlobalStore {
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        let key = keyspace::key_bytes(key);
        let found = self
            .shared
            .read(move |txn| {
                let table = txn.open_table(GLOBAL).map_err(backend)?;
                let value = table.get(key.as_slice()).map_err(backend)?;
                Ok(value.map(|v| v.value().to_vec()))
            })
            .await?;
        found.map(|bytes| keyspace::decode_id(&bytes)).transpose()
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
}

/// A [`DcStore`] in a redb file.
pub struct RedbDcStore {
    shared: Shared,
    blocks: Mutex<Blocks>,
}

impl RedbDcStore {
    /// Opens (creating if needed) the DC store at `path`; the allocator
    /// resumes above every unique it may have handed out before.
    pub fn open(path: impl AsRef<Path>, options: RedbOptions) -> Result<RedbDcStore, StoreError> {
        let shared = Shared::open(path.as_ref(), options)?;
        let txn = shared.db.begin_read().map_err(backend)?;
        let meta = txn.open_table(META).map_err(backend)?;
        let high_water = meta
            .get(HIGH_WATER)
            .map_err(backend)?
            .map_or(0, |v| v.value());
        drop(meta);
        drop(txn);
        Ok(RedbDcStore {
            shared,
            blocks: Mutex::new(Blocks::resume(high_water)),
        })
    }
}

fn read_record(txn: &redb::ReadTransaction, id: &[u8]) -> Result<Option<DcRecord>, StoreError> {
    let table = txn.open_table(RECORDS).map_err(backend)?;
    let value = table.get(id).map_err(backend)?;
    value
        .map(|v| keyspace::decode_record(v.value()))
        .transpose()
}

#[async_trait]
impl DcStore for RedbDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let id = keyspace::id_bytes(id);
        self.shared.read(move |txn| read_record(txn, &id)).await
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        check_cas(expected, record)?;
        let value = keyspace::encode_record(record)?;
        let op = Op::Cas {
            expected,
            record: record.clone(),
            value,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::Cas(cas) => Ok(cas),
            _ => Err(unexpected()),
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
        let (start, end) = keyspace::scan_range(namespace, name_prefix, after);
        self.shared
            .read(move |txn| {
                let index = txn.open_table(BY_KEY).map_err(backend)?;
                let range = match &end {
                    Some(end) => index.range::<&[u8]>(start.as_slice()..end.as_slice()),
                    None => index.range::<&[u8]>(start.as_slice()..),
                }
                .map_err(backend)?;
                let mut out = Vec::with_capacity(limit);
                for entry in range.take(limit) {
                    let (_, id) = entry.map_err(backend)?;
                    let record = read_record(txn, id.value())?.ok_or_else(|| {
                        StoreError::corrupt("scan index", "entry without a record")
                    })?;
                    out.push(record);
                }
                Ok(out)
            })
            .await
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut blocks = self.blocks.lock().await;
        if let Some(unique) = blocks.take() {
            return Ok(unique);
        }
        let high_water = blocks.next_high_water()?;
        match self.shared.writer.submit(Op::HighWater(high_water)).await? {
            Outcome::HighWater => {}
            _ => return Err(unexpected()),
        }
        blocks.granted(high_water);
        // Invariant: a fresh block of ALLOCATOR_BLOCK_IDS ≥ 1 has a first unique.
        Ok(blocks.take().expect("a granted block is not empty"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::conformance::Backend;

    /// Stores in files of one temporary directory, one file per place.
    pub(crate) struct RedbBackend {
        dir: tempfile::TempDir,
        options: RedbOptions,
    }

    impl RedbBackend {
        pub(crate) fn new(options: RedbOptions) -> RedbBackend {
            RedbBackend {
                dir: tempfile::tempdir().expect("temporary directory"),
                options,
            }
        }
    }

    #[async_trait]
    impl Backend for RedbBackend {
        async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
            let path = self.dir.path().join(format!("{place}.global.redb"));
            Arc::new(RedbGlobalStore::open(path, self.options).expect("open global store"))
        }
        async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
            let path = self.dir.path().join(format!("{place}.dc.redb"));
            Arc::new(RedbDcStore::open(path, self.options).expect("open dc store"))
        }
        fn durable(&self) -> bool {
            true
        }
    }

    mod grouped {
        crate::conformance_tests!(super::RedbBackend::new(super::RedbOptions::default()));
    }

    mod per_op {
        crate::conformance_tests!(super::RedbBackend::new(super::RedbOptions {
            commit: super::CommitMode::PerOp
        }));
    }

    #[test]
    fn opening_an_open_file_twice_is_unavailable_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.redb");
        let _first = RedbGlobalStore::open(&path, RedbOptions::default()).unwrap();
        assert!(matches!(
            RedbGlobalStore::open(&path, RedbOptions::default()),
            Err(StoreError::Unavailable { .. })
        ));
    }
}
