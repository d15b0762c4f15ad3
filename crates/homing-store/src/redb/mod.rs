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

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use homing_core::succession::judge_takeover;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcTerms, DueCursor, DueKind, DuePage, Event,
    EventSeq, Key, NamespaceScope, ReservationId, StoreTime, Succession, SuccessionCause,
    TakeOverReply, TakeoverPolicy,
};
use redb::{Database, ReadableDatabase, ReadableTable};
use tokio::sync::Mutex;

use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_limit,
    check_scan,
};
use crate::dc_lease::{DcEntry, DcLeaseTable, process_clock};
use crate::error::StoreError;
use crate::global::{DCS_MAX, GlobalStore, SetIfAbsent, check_batch, check_cause};
use crate::keyspace;
use crate::writer::{
    BY_KEY, DCS, DUE, EVENT_HEAD, EVENTS, GLOBAL, HIGH_WATER, META, MIGRATING, Op, Outcome,
    RECORDS, SUCCESSIONS, Writer, backend, build_due_index,
};

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
        Shared::start(db, options)
    }

    /// Over storage other than a file (see `RedbDcStore::on_storage`).
    fn on_storage(
        storage: impl redb::StorageBackend,
        options: RedbOptions,
    ) -> Result<Shared, StoreError> {
        let db = Database::builder()
            .create_with_backend(storage)
            .map_err(backend)?;
        Shared::start(db, options)
    }

    fn start(db: Database, options: RedbOptions) -> Result<Shared, StoreError> {
        // Create every table up front so read transactions never miss one.
        let txn = db.begin_write().map_err(backend)?;
        for table in [GLOBAL, RECORDS, BY_KEY] {
            txn.open_table(table).map_err(backend)?;
        }
        txn.open_table(EVENTS).map_err(backend)?;
        txn.open_table(META).map_err(backend)?;
        txn.open_table(DUE).map_err(backend)?;
        txn.open_table(SUCCESSIONS).map_err(backend)?;
        let indexed = build_due_index(&txn).map_err(backend)?;
        txn.commit().map_err(backend)?;
        if indexed > 0 {
            tracing::info!(
                records = indexed,
                "indexed existing records by expiry (once)"
            );
        }
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
        let txn = self.db.begin_read().map_err(backend)?;
        read(&txn)
    }
}

impl Shared {
    /// The writer thread runs and a read transaction opens.
    fn health(&self) -> Result<(), StoreError> {
        self.writer.running()?;
        self.read_here(|txn| txn.open_table(META).map(|_| ()).map_err(backend))
    }
}

fn unexpected() -> StoreError {
    backend("writer answered with the wrong outcome kind")
}

/// A [`GlobalStore`] in a redb file. DC leases are judged by this
/// process's monotonic clock (a redb global store serves one machine); their
/// terms, marks and retired flags are durable, renewal times are not (see
/// [`crate::dc_lease`]).
///
/// Successions live in the `successions` table, written once through the
/// writer (durable when answered, like `set_if_absent`). A takeover holds
/// the DC-lease lock, which renewals and retires hold across their own
/// writes, from its reading of the DC's standing until its write has
/// committed: no renewal is answered between the two.
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

    /// Opens the global store on `storage` instead of a file (see
    /// [`RedbDcStore::on_storage`]).
    pub fn on_storage(
        storage: impl redb::StorageBackend,
        options: RedbOptions,
    ) -> Result<RedbGlobalStore, StoreError> {
        RedbGlobalStore::over(Shared::on_storage(storage, options)?)
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
        let found = self
            .shared
            .read(move |txn| {
                let table = txn.open_table(SUCCESSIONS).map_err(backend)?;
                let range = table
                    .range::<&[u8]>(start.as_slice()..end.as_slice())
                    .map_err(backend)?;
                range
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

    async fn health(&self) -> Result<(), StoreError> {
        self.shared.health()
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

/// A [`DcStore`] in a redb file.
pub struct RedbDcStore {
    shared: Shared,
    blocks: Mutex<Blocks>,
}

impl RedbDcStore {
    /// Opens (creating if needed) the DC store at `path`; the allocator
    /// resumes above every unique it may have handed out before.
    pub fn open(path: impl AsRef<Path>, options: RedbOptions) -> Result<RedbDcStore, StoreError> {
        RedbDcStore::resume(Shared::open(path.as_ref(), options)?)
    }

    /// Opens the DC store on `storage` instead of a file: for tests that
    /// model the disk, such as a power cut that loses every write not yet
    /// synced (`tests/redb_power_loss.rs`).
    pub fn on_storage(
        storage: impl redb::StorageBackend,
        options: RedbOptions,
    ) -> Result<RedbDcStore, StoreError> {
        RedbDcStore::resume(Shared::on_storage(storage, options)?)
    }

    fn resume(shared: Shared) -> Result<RedbDcStore, StoreError> {
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
    async fn health(&self) -> Result<(), StoreError> {
        self.shared.health()
    }

    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let id = keyspace::id_bytes(id);
        self.shared.read_here(|txn| read_record(txn, &id))
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
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_scan(scope, name_prefix, limit)?;
        let ranges = keyspace::scan_ranges(scope, name_prefix, after);
        self.shared
            .read(move |txn| {
                let index = txn.open_table(BY_KEY).map_err(backend)?;
                let mut out = Vec::with_capacity(limit);
                for (start, end) in &ranges {
                    let range = match end {
                        Some(end) => index.range::<&[u8]>(start.as_slice()..end.as_slice()),
                        None => index.range::<&[u8]>(start.as_slice()..),
                    }
                    .map_err(backend)?;
                    for entry in range.take(limit - out.len()) {
                        let (_, id) = entry.map_err(backend)?;
                        let record = read_record(txn, id.value())?.ok_or_else(|| {
                            StoreError::corrupt("scan index", "entry without a record")
                        })?;
                        out.push(record);
                    }
                    if out.len() == limit {
                        break;
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        check_limit(limit)?;
        let (start, end) = keyspace::due_range(kind, until, after);
        let (pending_start, pending_end) = keyspace::due_pending_range(kind, until);
        self.shared
            .read(move |txn| {
                let due = txn.open_table(DUE).map_err(backend)?;
                let records = txn.open_table(RECORDS).map_err(backend)?;
                let mut entries = Vec::with_capacity(limit);
                let range = due
                    .range::<&[u8]>(start.as_slice()..end.as_slice())
                    .map_err(backend)?;
                for entry in range.take(limit) {
                    let (entry, id) = entry.map_err(backend)?;
                    let value = records.get(id.value()).map_err(backend)?;
                    entries.push((entry.value().to_vec(), value.map(|v| v.value().to_vec())));
                }
                let pending = if entries.len() < limit {
                    let range =
                        due.range::<&[u8]>(pending_start.as_slice()..pending_end.as_slice());
                    range.map_err(backend)?.count() as u64
                } else {
                    0
                };
                keyspace::due_page(kind, entries, limit, pending)
            })
            .await
    }

    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
        let id = keyspace::id_bytes(id);
        match self
            .shared
            .writer
            .submit(Op::Settle { id, version })
            .await?
        {
            Outcome::Settled(dropped) => Ok(dropped),
            _ => Err(unexpected()),
        }
    }

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let found = self
            .shared
            .read(move |txn| {
                let events = txn.open_table(EVENTS).map_err(backend)?;
                let meta = txn.open_table(META).map_err(backend)?;
                let head = meta
                    .get(EVENT_HEAD)
                    .map_err(backend)?
                    .map_or(0, |v| v.value());
                let oldest = events
                    .first()
                    .map_err(backend)?
                    .map_or(head + 1, |(seq, _)| seq.value());
                // Past the last seq nothing follows.
                let page = match after.checked_add(1) {
                    Some(start) => events
                        .range(start..)
                        .map_err(backend)?
                        .take(limit)
                        .map(|entry| Ok(entry.map_err(backend)?.1.value().to_vec()))
                        .collect::<Result<Vec<_>, StoreError>>()?,
                    None => Vec::new(),
                };
                Ok((page, oldest, head))
            })
            .await?;
        let (page, oldest, head) = found;
        EventPage::decode(&page, oldest, head)
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        match self.shared.writer.submit(Op::TrimEvents(before)).await? {
            Outcome::Trimmed => Ok(()),
            _ => Err(unexpected()),
        }
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        let op = Op::Import {
            record: record.clone(),
            value: keyspace::encode_record(record)?,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::Import(import) => Ok(import),
            _ => Err(unexpected()),
        }
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        let op = Op::ImportEvent {
            event: event.clone(),
            value: keyspace::encode_event(event)?,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::ImportEvent(import) => Ok(import),
            _ => Err(unexpected()),
        }
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        // The durable mark is exclusive: every unique handed out is below it.
        self.shared
            .read(|txn| {
                let meta = txn.open_table(META).map_err(backend)?;
                let high_water = meta.get(HIGH_WATER).map_err(backend)?;
                Ok(high_water.map_or(0, |v| v.value()))
            })
            .await
    }

    async fn migrating(&self) -> Result<bool, StoreError> {
        self.shared.read_here(|txn| {
            let meta = txn.open_table(META).map_err(backend)?;
            let mark = meta.get(MIGRATING).map_err(backend)?;
            Ok(mark.is_some_and(|v| v.value() != 0))
        })
    }

    async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
        match self.shared.writer.submit(Op::Migrating(on)).await? {
            Outcome::Migrating => Ok(()),
            _ => Err(unexpected()),
        }
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        // Held across the write so no allocation interleaves.
        let mut blocks = self.blocks.lock().await;
        let past = floor.checked_add(1).ok_or(StoreError::AllocatorExhausted)?;
        // Durable first: after a crash the store resumes at or above `past`.
        match self.shared.writer.submit(Op::HighWater(past)).await? {
            Outcome::HighWater => {}
            _ => return Err(unexpected()),
        }
        blocks.jump_to(past);
        Ok(())
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
            expires_at: StoreTime::from_ms(expires_ms),
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
