//! The redb [`DcStore`]: one DC's records and their indexes, the event log,
//! the allocator and the migration mark, every write through the file's
//! writer.

use std::path::Path;

use async_trait::async_trait;
use homing_core::{
    DcRecord, DueCursor, DueKind, DuePage, Event, EventSeq, NamespaceScope, ReservationId,
    SessionId, SessionRecord, StoreTime,
};
use redb::{ReadableTable, ReadableTableMetadata};
use tokio::sync::Mutex;

use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_limit,
    check_scan,
};
use crate::error::StoreError;
use crate::keyspace;
use crate::session::{self, GuardedCas, SessionCas, SessionCursor, SessionGuard};
use crate::writer::{
    BY_KEY, DUE, EVENT_HEAD, EVENTS, HIGH_WATER, META, MIGRATING, Op, Outcome, RECORDS,
    SESSION_KEYS, SESSION_NOTICES, SESSIONS, SESSIONS_DUE, backend,
};

use super::{RedbOptions, Shared, unexpected};

/// A [`DcStore`] in a redb file.
pub struct RedbDcStore {
    pub(super) shared: Shared,
    blocks: Mutex<Blocks>,
}

impl RedbDcStore {
    /// Opens (creating if needed) the DC store at `path`; the allocator
    /// resumes above every unique it may have handed out before.
    pub fn open(path: impl AsRef<Path>, options: RedbOptions) -> Result<RedbDcStore, StoreError> {
        RedbDcStore::resume(Shared::open(path.as_ref(), options)?)
    }

    /// Opens the DC store on the storage `open` returns instead of a file
    /// (`open` is called again to reopen it after an I/O error): for tests
    /// that model the disk, such as a power cut that loses every write not
    /// yet synced (`tests/redb_power_loss.rs`) or a disk that fills
    /// ([`FillableFile`](super::FillableFile), `tests/redb_io_error.rs`).
    pub fn on_storage<S: redb::StorageBackend>(
        open: impl Fn() -> Result<S, std::io::Error> + Send + Sync + 'static,
        options: RedbOptions,
    ) -> Result<RedbDcStore, StoreError> {
        RedbDcStore::resume(Shared::on_storage(open, options)?)
    }

    fn resume(shared: Shared) -> Result<RedbDcStore, StoreError> {
        let high_water = shared.read_here(|txn| {
            let meta = txn.open_table(META).map_err(backend)?;
            let mark = meta.get(HIGH_WATER).map_err(backend)?;
            Ok(mark.map_or(0, |v| v.value()))
        })?;
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

/// The records a session index lists in `[start, end)`, at most `limit`.
fn session_page(
    txn: &redb::ReadTransaction,
    index: redb::TableDefinition<&[u8], &[u8]>,
    (start, end): (Vec<u8>, Vec<u8>),
    limit: usize,
) -> Result<Vec<DcRecord>, StoreError> {
    let index = txn.open_table(index).map_err(backend)?;
    let range = index
        .range::<&[u8]>(start.as_slice()..end.as_slice())
        .map_err(backend)?;
    let mut out = Vec::with_capacity(limit);
    for entry in range.take(limit) {
        let (_, id) = entry.map_err(backend)?;
        let record = read_record(txn, id.value())?
            .ok_or_else(|| StoreError::corrupt("session index", "entry without a record"))?;
        out.push(record);
    }
    Ok(out)
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

    async fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        let name = session::session_bytes(id);
        self.shared.read_here(|txn| {
            let table = txn.open_table(SESSIONS).map_err(backend)?;
            let value = table.get(name.as_slice()).map_err(backend)?;
            value
                .map(|v| session::decode_session(v.value()))
                .transpose()
        })
    }

    async fn session_counts(&self) -> Result<Option<session::SessionCounts>, StoreError> {
        // redb keeps each table's length in its header: no scan.
        self.shared.read_here(|txn| {
            let rows = txn.open_table(SESSIONS).map_err(backend)?;
            let keys = txn.open_table(SESSION_KEYS).map_err(backend)?;
            Ok(Some(session::SessionCounts {
                rows: rows.len().map_err(backend)?,
                keys: keys.len().map_err(backend)?,
            }))
        })
    }

    async fn compare_and_set_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        session::check_session_cas(expected, row)?;
        let op = Op::SessionCas {
            expected,
            row: row.clone(),
            value: session::encode_session(row)?,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::SessionCas(cas) => Ok(cas),
            _ => Err(unexpected()),
        }
    }

    async fn delete_session(&self, id: &SessionId, version: u64) -> Result<bool, StoreError> {
        let op = Op::DeleteSession {
            id: id.clone(),
            version,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::SessionDeleted(deleted) => Ok(deleted),
            _ => Err(unexpected()),
        }
    }

    async fn compare_and_set_in_session(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: &SessionGuard,
    ) -> Result<GuardedCas, StoreError> {
        check_cas(expected, record)?;
        session::check_guard(record, guard)?;
        let row_value = guard
            .next
            .as_ref()
            .map(session::encode_session)
            .transpose()?;
        let op = Op::GuardedCas {
            expected,
            record: record.clone(),
            value: keyspace::encode_record(record)?,
            guard: guard.clone(),
            row_value,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::Guarded(cas) => Ok(cas),
            _ => Err(unexpected()),
        }
    }

    async fn session_keys(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let range = session::session_keys_range(id, after);
        self.shared
            .read(move |txn| session_page(txn, SESSION_KEYS, range, limit))
            .await
    }

    async fn session_notices(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let range = session::session_notices_range(id, after);
        self.shared
            .read(move |txn| session_page(txn, SESSION_NOTICES, range, limit))
            .await
    }

    async fn due_sessions(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = session::sessions_due_range(until, after);
        self.shared
            .read(move |txn| {
                let due = txn.open_table(SESSIONS_DUE).map_err(backend)?;
                let sessions = txn.open_table(SESSIONS).map_err(backend)?;
                let range = due
                    .range::<&[u8]>(start.as_slice()..end.as_slice())
                    .map_err(backend)?;
                let mut out = Vec::with_capacity(limit);
                for entry in range.take(limit) {
                    let (_, name) = entry.map_err(backend)?;
                    let row = sessions
                        .get(name.value())
                        .map_err(backend)?
                        .ok_or_else(|| {
                            StoreError::corrupt("sessions due index", "entry without a session")
                        })?;
                    out.push(session::decode_session(row.value())?);
                }
                Ok(out)
            })
            .await
    }

    async fn sessions(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        let start = session::sessions_start(after);
        self.shared
            .read(move |txn| {
                let sessions = txn.open_table(SESSIONS).map_err(backend)?;
                let range = sessions
                    .range::<&[u8]>(start.as_slice()..)
                    .map_err(backend)?;
                let mut out = Vec::with_capacity(limit);
                for entry in range.take(limit) {
                    let (_, row) = entry.map_err(backend)?;
                    out.push(session::decode_session(row.value())?);
                }
                Ok(out)
            })
            .await
    }

    async fn import_session(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError> {
        let op = Op::ImportSession {
            row: row.clone(),
            value: session::encode_session(row)?,
        };
        match self.shared.writer.submit(op).await? {
            Outcome::ImportSession(import) => Ok(import),
            _ => Err(unexpected()),
        }
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
