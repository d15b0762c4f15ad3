//! The FoundationDB [`DcStore`]: one DC's records (`r/`), their scan and
//! expiry indexes (`k/`, `d/`), the event log and its head, the allocator
//! (`alloc`) and the migration mark, each operation one transaction. A
//! record write also moves the record's session-index entries, and a write
//! guarded by a host session reads the session row in its transaction (a
//! racing change of the row conflicts, and the retry judges it anew); the
//! session rows themselves are in `session`.

use async_trait::async_trait;
use foundationdb::{Database, Transaction};
use homing_core::{
    DcRecord, Due, DueCursor, DueKind, DuePage, Event, EventSeq, NamespaceScope, ReservationId,
    SessionId, SessionRecord, StoreTime,
};
use tokio::sync::Mutex;

use super::{Space, Step, TRANSACTION_ATTEMPTS_MAX, exact_range, fdb_err};
use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, SCAN_LIMIT_MAX, ScanCursor, check_cas, check_events_limit,
    check_limit, check_scan, judge_cas, judge_event_import, judge_import,
};
use crate::error::StoreError;
use crate::keyspace;
use crate::session::{self, GuardedCas, SessionCas, SessionCursor, SessionGuard};

/// The section of the expiry index: `d/<keyspace::due_bytes>` → id.
const DUE: &[u8] = b"d/";
/// Set once a DC store's records are indexed by expiry.
const DUE_INDEX: &[u8] = b"due-index";
/// Records indexed per transaction for a store from before the index.
const INDEX_PAGE_RECORDS: usize = 128;

/// A [`DcStore`] in FoundationDB.
pub struct FdbDcStore {
    pub(super) space: Space,
    blocks: Mutex<Blocks>,
    /// Held by a compare-and-set while it appends an event: every append
    /// reads and writes the one head key, so appends of this process take
    /// turns instead of failing each other's commits (other processes still
    /// conflict, and FDB retries them).
    appending: Mutex<()>,
    /// The store's records are known to be indexed by expiry (checked
    /// before the first expiry query: stores from before the index are
    /// indexed then).
    indexed: std::sync::atomic::AtomicBool,
}

/// What the first, event-less attempt of a compare-and-set found.
#[allow(clippy::large_enum_variant)] // one per write, never stored, like `Cas`
enum CasStep {
    Done(GuardedCas),
    /// The write derives an event: redo it holding the append turn.
    Append,
}

/// One record write, as every attempt of its transaction needs it.
struct Write<'a> {
    expected: Option<u64>,
    record: &'a DcRecord,
    /// The encoded record.
    value: Vec<u8>,
    guard: Option<&'a SessionGuard>,
    /// The guard's next row, and it encoded.
    next_row: Option<(&'a SessionRecord, Vec<u8>)>,
}

impl FdbDcStore {
    /// A store over `db` (network already booted) with this DC's keys under `prefix`.
    pub fn new(db: std::sync::Arc<Database>, prefix: &[u8]) -> FdbDcStore {
        FdbDcStore {
            space: Space {
                db,
                prefix: prefix.to_vec(),
            },
            // The first allocation reads the persisted mark before serving.
            blocks: Mutex::new(Blocks::resume(0)),
            appending: Mutex::new(()),
            indexed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn event_key(&self, seq: EventSeq) -> Vec<u8> {
        self.space.key(b"events/", &keyspace::event_seq_bytes(seq))
    }

    fn head_key(&self) -> Vec<u8> {
        self.space.key(b"events-head", b"")
    }

    fn counter_key(&self) -> Vec<u8> {
        self.space.key(b"alloc", b"")
    }

    fn due_key(&self, due: Due, id: &ReservationId) -> Vec<u8> {
        self.space.key(DUE, &keyspace::due_bytes(due, id))
    }

    /// Moves `record`'s expiry entry from `old` (the stored record's) to the
    /// one it has now, in `trx` (put again when it stays: that restores a
    /// settled one).
    fn reindex(&self, trx: &foundationdb::Transaction, old: Option<Due>, record: &DcRecord) {
        let new = Due::of(record);
        if let Some(old) = old.filter(|old| Some(*old) != new) {
            trx.clear(&self.due_key(old, &record.id));
        }
        if let Some(new) = new {
            trx.set(
                &self.due_key(new, &record.id),
                &keyspace::id_bytes(&record.id),
            );
        }
    }

    /// Indexes by expiry every decodable record of a store written before
    /// the index existed, once (`due-index` marks it done), one page of
    /// records per transaction (a concurrent write conflicts and the page
    /// is retried). Undecodable records get no entry and are logged.
    async fn index_existing_records(&self) -> Result<(), StoreError> {
        if self.indexed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let _turn = self.appending.lock().await;
        let marker = self.space.key(DUE_INDEX, b"");
        let section = self.space.key(b"r/", b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let mut start = section;
        loop {
            let next = transact!(self.space, trx, {
                if step!(trx.get(&marker, false).await).is_some() {
                    return Ok(Step::Done(None));
                }
                let range = exact_range(start.clone(), end.clone(), INDEX_PAGE_RECORDS);
                let rows = step!(trx.get_range(&range, 1, false).await);
                for kv in rows.iter() {
                    match keyspace::decode_record(kv.value()) {
                        Ok(record) => self.reindex(&trx, None, &record),
                        Err(e) => {
                            let key = String::from_utf8_lossy(kv.key()).into_owned();
                            tracing::warn!(key, error = %e, "undecodable record left out of the expiry index");
                        }
                    }
                }
                let last = rows.iter().last().map(|kv| keyspace::successor(kv.key()));
                match last {
                    Some(next) if rows.len() == INDEX_PAGE_RECORDS => Ok(Step::Done(Some(next))),
                    _ => {
                        trx.set(&marker, b"1");
                        Ok(Step::Done(None))
                    }
                }
            })?;
            match next {
                Some(next) => start = next,
                None => break,
            }
        }
        self.indexed
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// A record's compare-and-set (see [`DcStore::compare_and_set`]); with
    /// `guard`, the session row is read in the same transaction and must be
    /// at the guarded version, the guard's next row written with the
    /// record. First without the append turn (a renewal derives no event),
    /// then, if the write derives one, again holding it.
    async fn write(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: Option<&SessionGuard>,
    ) -> Result<GuardedCas, StoreError> {
        check_cas(expected, record)?;
        if let Some(guard) = guard {
            session::check_guard(record, guard)?;
        }
        let next_row = match guard.and_then(|g| g.next.as_ref()) {
            Some(next) => Some((next, session::encode_session(next)?)),
            None => None,
        };
        let write = Write {
            expected,
            record,
            value: keyspace::encode_record(record)?,
            guard,
            next_row,
        };
        // A retry after a commit that may have landed recognises its own
        // record (`Cas::after_unknown_outcome`); a first attempt never does.
        let mut unknown = false;
        let first = transact!(self.space, trx, unknown, {
            self.write_in(&trx, &write, unknown, false).await
        })?;
        if let CasStep::Done(cas) = first {
            return Ok(cas);
        }
        let _turn = self.appending.lock().await;
        let mut unknown = false;
        let appended = transact!(self.space, trx, unknown, {
            // Judged again: the record may have moved since the first look.
            self.write_in(&trx, &write, unknown, true).await
        })?;
        match appended {
            CasStep::Done(cas) => Ok(cas),
            CasStep::Append => Err(StoreError::Backend {
                backend: "fdb",
                reason: "a write holding the append turn asked for it again".into(),
            }),
        }
    }

    /// One attempt of `w` in `trx`: judge it against the record (and row)
    /// as read, and write it; `CasStep::Append` when it derives an event
    /// and `append` (this process's append turn is held) is false.
    async fn write_in(
        &self,
        trx: &Transaction,
        w: &Write<'_>,
        unknown: bool,
        append: bool,
    ) -> Result<Step<CasStep>, StoreError> {
        let record = w.record;
        let id = keyspace::id_bytes(&record.id);
        let rk = self.space.key(b"r/", &id);
        let current = step!(trx.get(&rk, false).await)
            .map(|v| keyspace::decode_record(&v))
            .transpose()?;
        let row = match w.guard {
            // Read in the transaction: a racing change of the row conflicts.
            Some(guard) => step!(self.stored_session(trx, &guard.id).await)?,
            None => None,
        };
        let event = homing_core::event::derive(current.as_ref(), record);
        let old = current.clone();
        let old_due = old.as_ref().and_then(Due::of);
        let judged = match w.guard {
            Some(guard) => {
                crate::dc::judge_guarded(w.expected, record, guard, current, row.clone(), unknown)?
            }
            None => {
                session::check_unguarded(old.as_ref(), record)?;
                judge_cas(w.expected, record, current)?
                    .map(|c| match unknown {
                        true => c.after_unknown_outcome(record),
                        false => c,
                    })
                    .map(GuardedCas::from)
            }
        };
        if let Some(judged) = judged {
            return Ok(Step::Done(CasStep::Done(judged)));
        }
        if let Some(mut event) = event {
            if !append {
                return Ok(Step::Done(CasStep::Append));
            }
            let head_key = self.head_key();
            let head = step!(trx.get(&head_key, false).await);
            let head = decode_counter("event head", head.as_deref())?;
            // Invariant: a u64 log never fills (one event per write).
            event.seq = head.checked_add(1).expect("event seq overflow");
            trx.set(&self.event_key(event.seq), &keyspace::encode_event(&event)?);
            trx.set(&head_key, &event.seq.to_be_bytes());
        }
        trx.set(&rk, &w.value);
        if w.expected.is_none() {
            let index = keyspace::record_scan_bytes(&record.key, &record.id);
            trx.set(&self.space.key(b"k/", &index), &id);
        }
        self.reindex(trx, old_due, record);
        self.reindex_sessions(trx, old.as_ref(), record);
        if let Some((next, value)) = &w.next_row {
            self.put_session(trx, row.as_ref(), next, value);
        }
        Ok(Step::Done(CasStep::Done(GuardedCas::Written)))
    }

    /// Present while an unfinished migration copies into this store.
    fn migrating_key(&self) -> Vec<u8> {
        self.space.key(b"migrating", b"")
    }
}

/// An 8-byte big-endian counter (the event head, the allocator's mark); absent is 0.
fn decode_counter(what: &'static str, bytes: Option<&[u8]>) -> Result<u64, StoreError> {
    match bytes {
        None => Ok(0),
        Some(b) => Ok(u64::from_be_bytes(
            b.try_into()
                .map_err(|_| StoreError::corrupt(what, "not 8 bytes"))?,
        )),
    }
}

#[async_trait]
impl DcStore for FdbDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let k = self.space.key(b"r/", &keyspace::id_bytes(id));
        let found = transact!(self.space, trx, {
            Ok(Step::Done(
                step!(trx.get(&k, false).await).map(|v| v.to_vec()),
            ))
        })?;
        found.map(|b| keyspace::decode_record(&b)).transpose()
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        match self.write(expected, record, None).await? {
            GuardedCas::Written => Ok(Cas::Written),
            GuardedCas::RecordConflict { current } => Ok(Cas::Conflict { current }),
            GuardedCas::SessionMoved { .. } => Err(StoreError::Backend {
                backend: "fdb",
                reason: "an unguarded compare-and-set answered that a session row moved".into(),
            }),
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
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ranges =
            keyspace::prefixed_scan_ranges(&self.space.key(b"k/", b""), scope, name_prefix, after);
        let found = transact!(self.space, trx, {
            let mut ids: Vec<Vec<u8>> = Vec::with_capacity(limit);
            for (start, end) in &ranges {
                let range = exact_range(start.clone(), end.clone(), limit - ids.len());
                let rows = step!(trx.get_range(&range, 1, false).await);
                ids.extend(rows.iter().map(|kv| kv.value().to_vec()));
                if ids.len() == limit {
                    break;
                }
            }
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                let rk = self.space.key(b"r/", id);
                out.push(step!(trx.get(&rk, false).await).map(|v| v.to_vec()));
            }
            Ok(Step::Done(out))
        })?;
        found
            .into_iter()
            .map(|b| {
                let b =
                    b.ok_or_else(|| StoreError::corrupt("scan index", "entry without a record"))?;
                keyspace::decode_record(&b)
            })
            .collect()
    }

    async fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        check_limit(limit)?;
        if limit == 0 {
            return Ok(DuePage::default());
        }
        self.index_existing_records().await?;
        let [(start, end), (pending_start, pending_end)] =
            keyspace::prefixed_due_ranges(&self.space.key(DUE, b""), kind, until, after);
        let prefix_len = self.space.key(DUE, b"").len();
        let (entries, pending) = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| (kv.key()[prefix_len..].to_vec(), kv.value().to_vec()))
                .collect();
            let mut entries = Vec::with_capacity(limit);
            for (entry, id) in rows {
                let rk = self.space.key(b"r/", &id);
                let value = step!(trx.get(&rk, false).await).map(|v| v.to_vec());
                entries.push((entry, value));
            }
            let mut pending = 0;
            if entries.len() < limit {
                // Keys only matter; FDB has no server-side count.
                let mut from = pending_start.clone();
                loop {
                    let range = exact_range(from.clone(), pending_end.clone(), SCAN_LIMIT_MAX);
                    let rows = step!(trx.get_range(&range, 1, false).await);
                    pending += rows.len() as u64;
                    match rows.iter().last() {
                        Some(last) if rows.len() == SCAN_LIMIT_MAX => {
                            from = keyspace::successor(last.key())
                        }
                        _ => break,
                    }
                }
            }
            Ok(Step::Done((entries, pending)))
        })?;
        keyspace::due_page(kind, entries, limit, pending)
    }

    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
        let rk = self.space.key(b"r/", &keyspace::id_bytes(id));
        transact!(self.space, trx, {
            let current = step!(trx.get(&rk, false).await)
                .map(|v| keyspace::decode_record(&v))
                .transpose()?;
            let Some(record) = current.filter(|r| r.version == version) else {
                return Ok(Step::Done(false));
            };
            let Some(due) = Due::of(&record).filter(|d| d.kind == DueKind::Released) else {
                return Ok(Step::Done(false));
            };
            let dk = self.due_key(due, id);
            if step!(trx.get(&dk, false).await).is_none() {
                return Ok(Step::Done(false));
            }
            trx.clear(&dk);
            Ok(Step::Done(true))
        })
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut blocks = self.blocks.lock().await;
        if let Some(unique) = blocks.take() {
            return Ok(unique);
        }
        let counter = self.counter_key();
        let from = blocks.clone();
        let high_water = transact!(self.space, trx, {
            let persisted = step!(trx.get(&counter, false).await);
            let persisted = decode_counter("allocator", persisted.as_deref())?;
            let mut b = from.clone();
            b.jump_to(persisted);
            let mark = b.next_high_water()?;
            trx.set(&counter, &mark.to_be_bytes());
            Ok(Step::Done((persisted, mark)))
        })?;
        blocks.jump_to(high_water.0);
        blocks.granted(high_water.1);
        // Invariant: a fresh block of ALLOCATOR_BLOCK_IDS ≥ 1 has a first unique.
        Ok(blocks.take().expect("a granted block is not empty"))
    }

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let section = self.space.key(b"events/", b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let head_key = self.head_key();
        // Past the last seq nothing follows; FDB reads limit 0 as "no limit".
        let start = after
            .checked_add(1)
            .filter(|_| limit > 0)
            .map(|seq| self.event_key(seq));
        let (head, first, page) = transact!(self.space, trx, {
            let head = step!(trx.get(&head_key, false).await).map(|v| v.to_vec());
            let oldest = exact_range(section.clone(), end.clone(), 1);
            let first: Option<Vec<u8>> = step!(trx.get_range(&oldest, 1, false).await)
                .iter()
                .next()
                .map(|kv| kv.value().to_vec());
            let mut page = Vec::new();
            if let Some(start) = &start {
                let range = exact_range(start.clone(), end.clone(), limit);
                let rows = step!(trx.get_range(&range, 1, false).await);
                page.extend(rows.iter().map(|kv| kv.value().to_vec()));
            }
            Ok(Step::Done((head, first, page)))
        })?;
        let head = decode_counter("event head", head.as_deref())?;
        let oldest = match first {
            Some(bytes) => keyspace::decode_event(&bytes)?.seq,
            None => head + 1,
        };
        EventPage::decode(&page, oldest, head)
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        let (begin, end) = (self.event_key(0), self.event_key(before));
        transact!(self.space, trx, {
            trx.clear_range(&begin, &end);
            Ok(Step::Done(()))
        })
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        let value = keyspace::encode_record(record)?;
        let id = keyspace::id_bytes(&record.id);
        let rk = self.space.key(b"r/", &id);
        let index = self
            .space
            .key(b"k/", &keyspace::record_scan_bytes(&record.key, &record.id));
        transact!(self.space, trx, {
            let current = step!(trx.get(&rk, false).await)
                .map(|v| keyspace::decode_record(&v))
                .transpose()?;
            let old_due = current.as_ref().and_then(Due::of);
            if let Some(judged) = judge_import(record, current.clone()) {
                return Ok(Step::Done(judged));
            }
            trx.set(&rk, &value);
            self.reindex(&trx, old_due, record);
            self.reindex_sessions(&trx, current.as_ref(), record);
            // An older version has the same key (judge_import checks it).
            trx.set(&index, &id);
            Ok(Step::Done(Import::Written))
        })
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        let value = keyspace::encode_event(event)?;
        let (ek, head_key) = (self.event_key(event.seq), self.head_key());
        transact!(self.space, trx, {
            let current = step!(trx.get(&ek, false).await)
                .map(|v| keyspace::decode_event(&v))
                .transpose()?;
            if let Some(judged) = judge_event_import(event, current) {
                return Ok(Step::Done(judged));
            }
            let head = step!(trx.get(&head_key, false).await);
            let head = decode_counter("event head", head.as_deref())?;
            trx.set(&ek, &value);
            if event.seq > head {
                trx.set(&head_key, &event.seq.to_be_bytes());
            }
            Ok(Step::Done(Import::Written))
        })
    }

    async fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        self.read_session(id).await
    }

    async fn compare_and_set_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        self.cas_session(expected, row).await
    }

    async fn delete_session(&self, id: &SessionId, version: u64) -> Result<bool, StoreError> {
        self.remove_session(id, version).await
    }

    async fn compare_and_set_in_session(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: &SessionGuard,
    ) -> Result<GuardedCas, StoreError> {
        self.write(expected, record, Some(guard)).await
    }

    async fn session_keys(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        self.session_key_records(id, after, limit).await
    }

    async fn session_notices(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        self.session_notice_records(id, after, limit).await
    }

    async fn due_sessions(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.due_session_rows(until, after, limit).await
    }

    async fn sessions(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.session_rows(after, limit).await
    }

    async fn import_session(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError> {
        self.import_session_row(row).await
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        // The persisted mark is exclusive: every unique handed out is below it.
        let counter = self.counter_key();
        let mark = transact!(self.space, trx, {
            Ok(Step::Done(
                step!(trx.get(&counter, false).await).map(|v| v.to_vec()),
            ))
        })?;
        decode_counter("allocator", mark.as_deref())
    }

    async fn migrating(&self) -> Result<bool, StoreError> {
        let key = self.migrating_key();
        transact!(self.space, trx, {
            Ok(Step::Done(step!(trx.get(&key, false).await).is_some()))
        })
    }

    async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
        let key = self.migrating_key();
        transact!(self.space, trx, {
            if on {
                trx.set(&key, b"1");
            } else {
                trx.clear(&key);
            }
            Ok(Step::Done(()))
        })
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        // Held across the write so no allocation of this store interleaves.
        let mut blocks = self.blocks.lock().await;
        let past = floor.checked_add(1).ok_or(StoreError::AllocatorExhausted)?;
        let counter = self.counter_key();
        transact!(self.space, trx, {
            let persisted = step!(trx.get(&counter, false).await);
            if decode_counter("allocator", persisted.as_deref())? < past {
                trx.set(&counter, &past.to_be_bytes());
            }
            Ok(Step::Done(()))
        })?;
        blocks.jump_to(past);
        Ok(())
    }
}
