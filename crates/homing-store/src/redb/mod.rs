//! The embedded redb backend, the zero-set-up default: one file per store
//! (each DC its own DC-store file; the devnet shares one global-store file).
//!
//! Writes go through the group-commit writer thread (`writer.rs`) and
//! are durable when acknowledged (`Durability::Immediate`, redb's default:
//! fsync on commit); a compare-and-set's event is appended in the same write
//! transaction, numbered after the head kept in the `meta` table, so the
//! events of one group get consecutive seqs. Imports, trims and allocator
//! raises go through the writer too. Point reads (one key) run in a read
//! transaction on the caller's thread; scans and event pages, which read up
//! to their limits, run on tokio's blocking pool.
//!
//! The two stores live in `global` ([`RedbGlobalStore`]) and `dc`
//! ([`RedbDcStore`]); this module holds what both are built on: the
//! options and an open file with its writer (`Shared`).

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

pub use self::dc::RedbDcStore;
pub use self::fillable::{FillableFile, FullDisk};
pub use self::global::RedbGlobalStore;
use crate::error::StoreError;
use crate::reopen::DbFile;
use crate::writer::{
    BY_KEY, DUE, EVENTS, GLOBAL, META, RECORDS, SESSION_KEYS, SESSION_NOTICES, SESSIONS,
    SESSIONS_DUE, SETTINGS, SUCCESSIONS, Writer, backend, build_due_index,
};

mod dc;
mod fillable;
mod global;

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

/// redb's page cache per file by default, bytes (redb's own default).
pub const CACHE_BYTES_DEFAULT: usize = 1024 * 1024 * 1024;

/// Options for opening a redb store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedbOptions {
    /// Group commit or one transaction per op.
    pub commit: CommitMode,
    /// The most memory redb's page cache of the file takes, bytes (the
    /// records are on disk; this is what stays in memory of them).
    pub cache_bytes: usize,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            commit: CommitMode::Grouped {
                group_ops_max: GROUP_OPS_MAX_DEFAULT,
            },
            cache_bytes: CACHE_BYTES_DEFAULT,
        }
    }
}

/// An open redb file with its writer. Field order matters: the writer is
/// joined (dropping its database handle) before ours is dropped.
struct Shared {
    writer: Writer,
    file: Arc<DbFile>,
}

impl Shared {
    fn open(path: &Path, options: RedbOptions) -> Result<Shared, StoreError> {
        let at = path.to_owned();
        let cache_bytes = options.cache_bytes;
        let create = move || Database::builder().set_cache_size(cache_bytes).create(&at);
        let file = DbFile::new(Box::new(create)).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable {
                backend: "redb",
                reason: format!("{} is already open", path.display()),
            },
            e => backend(e),
        })?;
        Shared::start(file, options)
    }

    /// Over storage other than a file (see `RedbDcStore::on_storage`).
    fn on_storage<S: redb::StorageBackend>(
        open: impl Fn() -> Result<S, std::io::Error> + Send + Sync + 'static,
        options: RedbOptions,
    ) -> Result<Shared, StoreError> {
        let cache_bytes = options.cache_bytes;
        let file = DbFile::new(Box::new(move || {
            let storage = open().map_err(redb::StorageError::Io)?;
            (Database::builder().set_cache_size(cache_bytes)).create_with_backend(storage)
        }))
        .map_err(backend)?;
        Shared::start(file, options)
    }

    fn start(file: DbFile, options: RedbOptions) -> Result<Shared, StoreError> {
        let db = file.database()?;
        // Create every table up front so read transactions never miss one.
        let txn = db.begin_write().map_err(backend)?;
        for table in [
            GLOBAL,
            RECORDS,
            BY_KEY,
            SESSIONS,
            SESSION_KEYS,
            SESSION_NOTICES,
            SESSIONS_DUE,
        ] {
            txn.open_table(table).map_err(backend)?;
        }
        txn.open_table(EVENTS).map_err(backend)?;
        txn.open_table(META).map_err(backend)?;
        txn.open_table(DUE).map_err(backend)?;
        txn.open_table(SUCCESSIONS).map_err(backend)?;
        txn.open_table(SETTINGS).map_err(backend)?;
        let indexed = build_due_index(&txn).map_err(backend)?;
        txn.commit().map_err(backend)?;
        drop(db);
        if indexed > 0 {
            tracing::info!(
                records = indexed,
                "indexed existing records by expiry (once)"
            );
        }
        let file = Arc::new(file);
        let group_ops_max = match options.commit {
            CommitMode::Grouped { group_ops_max } => group_ops_max.max(1),
            CommitMode::PerOp => 1,
        };
        let writer = Writer::start(file.clone(), group_ops_max)?;
        Ok(Shared { writer, file })
    }

    /// Runs `read` in a read transaction on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.file.database()?;
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(backend)?;
            read(&txn)
        })
        .await
        .map_err(backend)?
    }

    /// Runs `read` in a read transaction on this thread: for point reads
    /// only. One key is a few µs from redb's page cache, while handing it to
    /// the blocking pool costs a thread wake-up each way. Profiled under
    /// `homing bench reserve` (64 clients): the hand-off of the global get
    /// alone was ~8 % of the process's CPU (plus the pool threads parking
    /// again); reading here took a reserve from ~86 to ~75 µs of CPU and its
    /// global get from ~0.19 ms to ~2 µs (docs/BENCHMARKS.md). The price: a
    /// page in no cache blocks the calling worker for one disk read.
    fn read_here<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let txn = self.file.database()?.begin_read().map_err(backend)?;
        read(&txn)
    }
}

impl Shared {
    /// The writer thread runs, the file is open (not closed after an I/O
    /// error, see `reopen.rs`) and a read transaction opens.
    fn health(&self) -> Result<(), StoreError> {
        self.writer.running()?;
        self.file.health()?;
        self.read_here(|txn| txn.open_table(META).map(|_| ()).map_err(backend))
    }
}

fn unexpected() -> StoreError {
    backend("writer answered with the wrong outcome kind")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;

    use homing_core::{DcRecord, DueKind, Key, ReservationId, StoreTime};

    use super::*;
    use crate::conformance::Backend;
    use crate::dc::DcStore;
    use crate::global::GlobalStore;

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
            commit: super::CommitMode::PerOp,
            ..super::RedbOptions::default()
        }));
    }

    #[tokio::test]
    async fn a_dead_writer_thread_makes_the_store_unhealthy_though_reads_work() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbDcStore::open(dir.path().join("dc.redb"), RedbOptions::default()).unwrap();
        store.health().await.unwrap();
        let crashed = store.shared.writer.submit(crate::writer::Op::Crash).await;
        assert!(matches!(crashed, Err(StoreError::Unavailable { .. })));
        // The panic ends the thread; its reply channel closed first.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.shared.writer.running().is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "writer thread still runs"
            );
            std::thread::yield_now();
        }
        assert!(store.events(0, 0).await.is_ok(), "reads still work");
        assert!(matches!(
            store.health().await,
            Err(StoreError::Unavailable { .. })
        ));
    }

    fn leased(unique: u64, expires_ms: u64) -> DcRecord {
        let id = ReservationId::new("iad".parse().unwrap(), unique);
        let key = Key::new(homing_core::KeyName::new(format!("k{unique}")).unwrap());
        let mut record = crate::conformance::record(&id, &key);
        record.state = homing_core::RecordState::Active {
            actor: homing_core::ActorId::new("a").unwrap(),
            expiry: homing_core::Expiry::At(StoreTime::from_ms(expires_ms)),
            lease: None,
            previous: None,
        };
        record
    }

    async fn due_ids(store: &RedbDcStore) -> (Vec<String>, Vec<String>) {
        let page = store
            .due(DueKind::Lease, StoreTime::from_ms(u64::MAX), None, 16)
            .await
            .unwrap();
        let ids = page.records.iter().map(|r| r.id.to_string()).collect();
        (ids, page.bad.iter().map(|b| b.entry.clone()).collect())
    }

    /// A store file holding leases `(unique, expiry ms)`, changed with
    /// `damage` (a raw write transaction on the closed file), then reopened.
    async fn damaged(
        leases: &[(u64, u64)],
        damage: impl FnOnce(&redb::WriteTransaction),
    ) -> (tempfile::TempDir, RedbDcStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dc.redb");
        let store = RedbDcStore::open(&path, RedbOptions::default()).unwrap();
        for &(unique, at) in leases {
            let record = leased(unique, at);
            store.compare_and_set(None, &record).await.unwrap();
        }
        drop(store);
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        damage(&txn);
        txn.commit().unwrap();
        drop(db);
        let store = RedbDcStore::open(&path, RedbOptions::default()).unwrap();
        (dir, store)
    }

    /// Writes undecodable bytes as record `id`.
    fn garbage(txn: &redb::WriteTransaction, id: &str) {
        let mut records = txn.open_table(RECORDS).unwrap();
        records.insert(id.as_bytes(), &b"\xffgarbage"[..]).unwrap();
    }

    /// A file written before the expiry index existed (no `records_due`
    /// table, no layout mark) is indexed once on open; an undecodable
    /// record among them is left out and the rest are indexed.
    #[tokio::test]
    async fn a_file_from_before_the_expiry_index_is_indexed_on_open() {
        let (_dir, store) = damaged(&[(1, 300), (2, 100)], |txn| {
            txn.delete_table(DUE).unwrap();
            let mut meta = txn.open_table(META).unwrap();
            meta.remove(crate::writer::DUE_INDEX).unwrap();
            drop(meta);
            garbage(txn, "iad.3");
        })
        .await;
        let indexed = (vec!["iad.2".into(), "iad.1".into()], vec![]);
        assert_eq!(due_ids(&store).await, indexed);
    }

    /// An index entry whose record does not decode is returned as bad and
    /// the page goes on past it.
    #[tokio::test]
    async fn an_undecodable_due_record_is_reported_and_skipped() {
        let leases = [(1, 100), (2, 200), (3, 300)];
        let (_dir, store) = damaged(&leases, |txn| garbage(txn, "iad.2")).await;
        let page = (vec!["iad.1".into(), "iad.3".into()], vec!["iad.2".into()]);
        assert_eq!(due_ids(&store).await, page);
    }

    /// A host session's renewal is not queued behind a storm of other
    /// writes: it goes in the next group committed. Without the urgent
    /// queue it would be answered after the 600 writes queued before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_row_write_goes_ahead_of_the_writes_queued_before_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dc.redb");
        let store = Arc::new(RedbDcStore::open(&path, RedbOptions::default()).unwrap());
        let (held_tx, held) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let hold = crate::writer::Op::Hold {
            held: held_tx,
            go: go_rx,
        };
        let holder = store.clone();
        let holding = tokio::spawn(async move { holder.shared.writer.submit(hold).await });
        tokio::task::spawn_blocking(move || held.recv().unwrap())
            .await
            .unwrap();
        // The writer thread is held: 600 writes queue up, then a session row.
        let answered = Arc::new(AtomicUsize::new(0));
        let mut writes = Vec::new();
        for unique in 1..=600 {
            let (store, answered) = (store.clone(), answered.clone());
            writes.push(tokio::spawn(async move {
                store
                    .compare_and_set(None, &leased(unique, 1_000))
                    .await
                    .unwrap();
                answered.fetch_add(1, Ordering::SeqCst)
            }));
        }
        while store.shared.writer.queued() < 600 {
            tokio::task::yield_now().await;
        }
        let (row, _) = homing_core::SessionRecord::open(
            homing_core::SessionId::new("iad".parse().unwrap(), 1),
            homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
            homing_core::HostTime::from_ms(0),
            StoreTime::from_ms(1),
            &homing_core::LeasePolicy::DEFAULT,
        );
        let (renewer, answered_at) = (store.clone(), answered.clone());
        let renewal = tokio::spawn(async move {
            let cas = renewer.compare_and_set_session(None, &row).await.unwrap();
            assert_eq!(cas, crate::SessionCas::Written);
            answered_at.fetch_add(1, Ordering::SeqCst)
        });
        // Queued: in the urgent queue, or (were it not urgent) the main one.
        while store.shared.writer.urgent_queued() + store.shared.writer.queued() < 601 {
            tokio::task::yield_now().await;
        }
        go.send(()).unwrap();
        holding.await.unwrap().unwrap();
        let place = renewal.await.unwrap();
        for write in writes {
            write.await.unwrap();
        }
        assert!(
            place < crate::redb::GROUP_OPS_MAX_DEFAULT,
            "the session row was answered {place}th of 601"
        );
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
