//! The etcd [`DcStore`]: one DC's records (`r/`), their scan and expiry
//! indexes (`k/`, `d/`), the event log (written through [`super::log`]),
//! the allocator (`alloc`) and the migration mark.
//!
//! - compare-and-set: take the stored record from the store's record cache
//!   (`record_cache`: the last record and `mod_revision` this store saw per
//!   id) when it holds version `expected`, assume a create's record is absent
//!   unless the cache knows it, else read it; judge the CAS and derive its
//!   event locally, then write guarded by that `mod_revision` (absent:
//!   `create_revision == 0`). So homingd's get-then-CAS renewal is one read
//!   and one write, and a create one write. Every write goes through the DC
//!   store's appender (`log`), which groups concurrent compare-and-sets into
//!   one transaction: each record guarded by its `mod_revision`, and for
//!   those that derive an event, the event at `head + 1` and the new head,
//!   so that appends do not fail each other's guard on the head (a group of
//!   renewals alone leaves the head alone). If the
//!   guard fails because the record moved (another writer, or a stale
//!   cache), the failed transaction reads the record back and the CAS judges
//!   again against that (bounded by [`CAS_ATTEMPTS_MAX`]): the caller sees
//!   `Cas::Conflict` only when the stored record differs from `expected`, so
//!   no answer depends on the cache. (Records are compared by
//!   `mod_revision`, not by etcd's per-key `version`, because an imported
//!   record keeps its own version.)
//! - allocator: hi-lo blocks; the high-water mark is raised by a transaction
//!   on the counter key's `mod_revision`, retried a bounded number of times.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
};
use homing_core::{
    DcRecord, Due, DueCursor, DueKind, DuePage, Event, EventSeq, NamespaceScope, ReservationId,
    SessionId, SessionRecord, StoreTime,
};
use tokio::sync::Mutex;

use super::compaction::{CompactionPolicy, Compactor};
use super::log::{Append, Appended, Appender, SessionGuardRead};
use super::members::Op;
use super::record_cache::{RECORD_CACHE_BYTES_MAX, RECORD_CACHE_ENTRIES_MAX, RecordCache, Seen};
use super::session::StoredRow;
use super::{
    CAS_ATTEMPTS_MAX, EVENT_HEAD, EVENTS, Space, decode_counter, every_first_kv, first_kv,
    protocol, unchanged,
};
use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_limit,
    check_scan, judge_cas, judge_event_import, judge_import,
};
use crate::error::StoreError;
use crate::failover::Failover;
use crate::keyspace;
use crate::session::{self, GuardedCas, SessionCas, SessionCursor, SessionGuard};

/// The section of the expiry index: `d/<keyspace::due_bytes>` → id.
const DUE: &[u8] = b"d/";

/// Most attempts to raise the allocator's high-water mark against concurrent raisers.
pub const ALLOCATE_ATTEMPTS_MAX: usize = 16;

/// How an [`EtcdDcStore`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdDcOptions {
    /// Most records the compare-and-set cache holds (at most
    /// [`RECORD_CACHE_BYTES_MAX`] bytes of them). `0`: no cache, every
    /// compare-and-set reads the record first (one more round trip).
    pub record_cache_entries_max: usize,
}

impl Default for EtcdDcOptions {
    fn default() -> EtcdDcOptions {
        EtcdDcOptions {
            record_cache_entries_max: RECORD_CACHE_ENTRIES_MAX,
        }
    }
}

/// A [`DcStore`] in etcd.
pub struct EtcdDcStore {
    pub(super) space: Space,
    blocks: Mutex<Blocks>,
    pub(super) appender: Appender,
    pub(super) cache: RecordCache,
}

/// A record as the store holds it (or is assumed to), for a compare-and-set.
struct Stored {
    record: Option<DcRecord>,
    /// Its `mod_revision` (`None`: absent).
    revision: Option<i64>,
}

impl EtcdDcStore {
    /// Connects to the cluster at `endpoints` with the default options; this
    /// DC's keys live under `prefix`. Spawns the store's event appender on
    /// the current tokio runtime (it ends when the store is dropped).
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdDcStore, StoreError> {
        EtcdDcStore::connect_with(endpoints, prefix, EtcdDcOptions::default()).await
    }

    /// [`EtcdDcStore::connect`] with `options`.
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        options: EtcdDcOptions,
    ) -> Result<EtcdDcStore, StoreError> {
        let space = Space::connect(endpoints, prefix).await?;
        let indexed = index_existing_records(&space).await?;
        if indexed > 0 {
            tracing::info!(
                records = indexed,
                prefix,
                "indexed existing records by expiry (once)"
            );
        }
        Ok(EtcdDcStore {
            appender: Appender::start(space.clone()),
            space,
            // The first allocation reads the persisted mark before serving.
            blocks: Mutex::new(Blocks::resume(0)),
            cache: RecordCache::new(options.record_cache_entries_max, RECORD_CACHE_BYTES_MAX),
        })
    }

    /// Starts compacting the cluster this store is on (see
    /// [`compaction`]); the compactor stops when dropped.
    pub fn compactor(&self, policy: CompactionPolicy) -> Compactor {
        Compactor::start(self.space.clone(), policy)
    }

    /// Decodes `id`'s record kv as read from etcd and caches it.
    fn note(&self, id: &ReservationId, kv: Option<&KeyValue>) -> Result<Stored, StoreError> {
        let record = decode_record_kv(kv)?;
        if let Some(kv) = kv {
            let seen = Seen {
                revision: kv.mod_revision(),
                value: kv.value().to_vec(),
            };
            self.cache.insert(id, seen);
        }
        Ok(Stored {
            record,
            revision: kv.map(KeyValue::mod_revision),
        })
    }

    /// What a compare-and-set may take the stored record to be without
    /// reading it: the cached record if it has version `expected`; for a
    /// create, absent unless the cache knows the id. The write's guard
    /// checks the guess.
    fn assume(&self, expected: Option<u64>, id: &ReservationId) -> Option<Stored> {
        if !self.cache.enabled() {
            return None;
        }
        let seen = self.cache.get(id);
        match (expected, seen) {
            (None, None) => Some(Stored {
                record: None,
                revision: None,
            }),
            (Some(version), Some(seen)) => {
                // Cached bytes were decoded or encoded before; a failure
                // here only means a miss.
                let record = keyspace::decode_record(&seen.value).ok()?;
                (record.version == version).then_some(Stored {
                    record: Some(record),
                    revision: Some(seen.revision),
                })
            }
            _ => None,
        }
    }

    /// A record's compare-and-set through the appender (see the module
    /// doc); with `guard`, also guarded by the session row's revision as
    /// read, the guard's next row written with it. Every write moves the
    /// record's session-index entries in its transaction.
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
        let value = keyspace::encode_record(record)?;
        let rk = self.record_key(&record.id);
        let mut puts = vec![(rk.clone(), value.clone())];
        if expected.is_none() {
            puts.push((self.index_key(record), keyspace::id_bytes(&record.id)));
        }
        let new_due = Due::of(record);
        if let Some(due) = new_due {
            puts.push((
                self.due_key(due, &record.id),
                keyspace::id_bytes(&record.id),
            ));
        }
        let next_row = match guard.and_then(|g| g.next.as_ref()) {
            Some(next) => Some((next, session::encode_session(next)?)),
            None => None,
        };
        let (mut stored, mut row) = self.read_for_write(expected, record, guard).await?;
        // Whether our own append may have committed unseen: its transaction
        // was resent after a lost answer and then found the record moved.
        let mut maybe_ours = false;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let event = homing_core::event::derive(stored.record.as_ref(), record);
            let old = stored.record.clone();
            let old_due = old.as_ref().and_then(Due::of);
            let judged = match guard {
                Some(guard) => crate::dc::judge_guarded(
                    expected,
                    record,
                    guard,
                    stored.record,
                    row.row.clone(),
                    maybe_ours,
                )?,
                None => {
                    session::check_unguarded(old.as_ref(), record)?;
                    // Only on a conflict can an equal record be ours (a
                    // resent write that had landed); otherwise it is
                    // someone else's identical write.
                    judge_cas(expected, record, stored.record)?
                        .map(|c| match maybe_ours {
                            true => c.after_unknown_outcome(record),
                            false => c,
                        })
                        .map(GuardedCas::from)
                }
            };
            if let Some(judged) = judged {
                return Ok(judged);
            }
            let mut puts = puts.clone();
            // An entry that stays is put again (one transaction may not
            // delete and put one key), which also restores a settled one.
            let mut deletes: Vec<Vec<u8>> = old_due
                .filter(|old| Some(*old) != new_due)
                .map(|old| self.due_key(old, &record.id))
                .into_iter()
                .collect();
            let (gone, added) = session::session_index_changes(old.as_ref(), record);
            deletes.extend(
                gone.iter()
                    .map(|e| self.session_index_key(e.index, &e.entry)),
            );
            let id = keyspace::id_bytes(&record.id);
            puts.extend(
                added
                    .iter()
                    .map(|e| (self.session_index_key(e.index, &e.entry), id.clone())),
            );
            if let Some((next, value)) = &next_row {
                let writes = self.session_row_writes(row.row.as_ref(), next, value.clone());
                puts.extend(writes.puts);
                deletes.extend(writes.deletes);
            }
            let append = Append {
                record_key: rk.clone(),
                read_revision: stored.revision,
                puts,
                deletes,
                guard: guard.map(|g| SessionGuardRead {
                    key: self.session_key(&g.id),
                    read_revision: row.revision,
                }),
                event,
            };
            match self.appender.submit(append).await? {
                Appended::Written { revision } => {
                    let value = value.clone();
                    self.cache.insert(&record.id, Seen { revision, value });
                    return Ok(GuardedCas::Written);
                }
                // The record (or the row) moved since it was read or
                // cached: judge again against both as they are now.
                Appended::Moved {
                    now,
                    session,
                    resent,
                } => {
                    maybe_ours |= resent;
                    stored = self.note(&record.id, now.as_ref())?;
                    if guard.is_some() {
                        row = StoredRow::of(session.as_ref())?;
                    }
                }
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("compare-and-set: record moved for {CAS_ATTEMPTS_MAX} attempts"),
        })
    }

    /// The record (cached when it may be assumed, else read) and, for a
    /// guarded write, its session row, read together.
    async fn read_for_write(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: Option<&SessionGuard>,
    ) -> Result<(Stored, StoredRow), StoreError> {
        let no_row = || StoredRow {
            row: None,
            revision: None,
        };
        let rk = self.record_key(&record.id);
        let row_key = guard.map(|g| self.session_key(&g.id));
        let assumed = self.assume(expected, &record.id);
        let mut keys: Vec<&[u8]> = Vec::with_capacity(2);
        if assumed.is_none() {
            keys.push(&rk);
        }
        keys.extend(row_key.as_deref());
        let mut read = match keys.len() {
            0 => Vec::new(),
            _ => self
                .read_together(Op::HotRead, &keys)
                .await?
                .into_iter()
                .collect(),
        }
        .into_iter();
        let stored = match assumed {
            Some(assumed) => assumed,
            None => self.note(&record.id, read.next().flatten().as_ref())?,
        };
        let row = match row_key {
            Some(_) => StoredRow::of(read.next().flatten().as_ref())?,
            None => no_row(),
        };
        Ok((stored, row))
    }

    pub(super) fn record_key(&self, id: &ReservationId) -> Vec<u8> {
        self.space.key(b"r/", &keyspace::id_bytes(id))
    }

    fn index_key(&self, record: &DcRecord) -> Vec<u8> {
        self.space
            .key(b"k/", &keyspace::record_scan_bytes(&record.key, &record.id))
    }

    fn due_key(&self, due: Due, id: &ReservationId) -> Vec<u8> {
        self.space.key(DUE, &keyspace::due_bytes(due, id))
    }

    fn event_key(&self, seq: EventSeq) -> Vec<u8> {
        self.space.key(EVENTS, &keyspace::event_seq_bytes(seq))
    }

    fn head_key(&self) -> Vec<u8> {
        self.space.key(EVENT_HEAD, b"")
    }

    fn counter_key(&self) -> Vec<u8> {
        self.space.key(b"alloc", b"")
    }

    fn migrating_key(&self) -> Vec<u8> {
        self.space.key(MIGRATING, b"")
    }

    /// Reads `keys` in one transaction (one revision): the first kv of each.
    async fn read_together(
        &self,
        op: Op,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<KeyValue>>, StoreError> {
        let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(*k, None)).collect();
        let (_, responses) = self.space.txn(op, Txn::new().and_then(gets)).await?;
        every_first_kv(&responses, keys.len())
    }

    /// Runs `ops` guarded by `guards`; on failure, reads `reread` back.
    async fn guarded(
        &self,
        guards: Vec<Compare>,
        ops: Vec<TxnOp>,
        reread: &[&[u8]],
    ) -> Result<Guarded, StoreError> {
        let gets: Vec<TxnOp> = reread.iter().map(|k| TxnOp::get(*k, None)).collect();
        let txn = Txn::new().when(guards).and_then(ops).or_else(gets);
        let (written, responses) = self.space.txn(Op::BulkWrite, txn).await?;
        if written {
            return Ok(Guarded::Written);
        }
        Ok(Guarded::Failed {
            now: every_first_kv(&responses, reread.len())?,
        })
    }
}

/// The key of the migration mark ([`DcStore::migrating`]).
const MIGRATING: &[u8] = b"migrating";

/// The key marking a DC store's records as indexed by expiry.
const DUE_INDEX: &[u8] = b"due-index";
/// Records read per transaction while indexing a store from before the
/// expiry index (each page's puts are guarded by its records' revisions).
const INDEX_PAGE_RECORDS: usize = 64;

/// Indexes by expiry every decodable record of a DC store written before
/// the index existed, once (`due-index` marks it done), page by page: each
/// page's entries are put in one transaction guarded by its records'
/// `mod_revision`s, so a record written meanwhile (by a writer that indexes
/// it itself) is read again. Undecodable records get no entry and are
/// logged. Returns how many records were indexed.
async fn index_existing_records(space: &Space) -> Result<u64, StoreError> {
    let marker = space.key(DUE_INDEX, b"");
    let end = space.key(b"r0", b"");
    let mut start = space.key(b"r/", b"");
    let mut indexed = 0;
    let mut attempts = 0;
    loop {
        // The mark and a page of records in one read: an indexed store
        // costs one request on connect, a fresh one two.
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(INDEX_PAGE_RECORDS as i64);
        let gets = vec![
            TxnOp::get(marker.clone(), None),
            TxnOp::get(start.clone(), Some(options)),
        ];
        let (_, responses) = space.txn(Op::BulkRead, Txn::new().and_then(gets)).await?;
        let [TxnOpResponse::Get(mark), TxnOpResponse::Get(page)] = responses.as_slice() else {
            return Err(protocol(
                "transaction answered without the gets it asked for",
            ));
        };
        if !mark.kvs().is_empty() {
            return Ok(indexed);
        }
        let (mut guards, mut ops) = (Vec::new(), Vec::new());
        for kv in page.kvs() {
            let record = match keyspace::decode_record(kv.value()) {
                Ok(record) => record,
                Err(e) => {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    tracing::warn!(key, error = %e, "undecodable record left out of the expiry index");
                    continue;
                }
            };
            if let Some(due) = Due::of(&record) {
                guards.push(unchanged(kv.key(), Some(kv)));
                let entry = space.key(DUE, &keyspace::due_bytes(due, &record.id));
                ops.push(TxnOp::put(entry, keyspace::id_bytes(&record.id), None));
            }
        }
        let count = ops.len() as u64;
        if !ops.is_empty() {
            let txn = Txn::new().when(guards).and_then(ops);
            if !space.txn(Op::BulkWrite, txn).await?.0 {
                attempts += 1;
                if attempts >= CAS_ATTEMPTS_MAX {
                    return Err(contended("indexing existing records"));
                }
                continue;
            }
        }
        indexed += count;
        match page.kvs().last() {
            Some(last) if page.kvs().len() == INDEX_PAGE_RECORDS => {
                start = keyspace::successor(last.key());
            }
            _ => break,
        }
    }
    space
        .txn(
            Op::BulkWrite,
            Txn::new().and_then([TxnOp::put(marker, "1", None)]),
        )
        .await?;
    Ok(indexed)
}

/// What [`EtcdDcStore::guarded`] did.
enum Guarded {
    /// Written.
    Written,
    /// A guard failed: nothing written; the first kv of each reread key.
    Failed { now: Vec<Option<KeyValue>> },
}

fn decode_record_kv(kv: Option<&KeyValue>) -> Result<Option<DcRecord>, StoreError> {
    kv.map(|kv| keyspace::decode_record(kv.value())).transpose()
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "etcd",
        reason: format!("{what}: contended for {CAS_ATTEMPTS_MAX} attempts"),
    }
}

#[async_trait]
impl DcStore for EtcdDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let response = self
            .space
            .get(Op::HotRead, self.record_key(id), None)
            .await?;
        Ok(self.note(id, response.kvs().first())?.record)
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        match self.write(expected, record, None).await? {
            GuardedCas::Written => Ok(Cas::Written),
            GuardedCas::RecordConflict { current } => Ok(Cas::Conflict { current }),
            GuardedCas::SessionMoved { .. } => Err(protocol(
                "an unguarded compare-and-set answered that a session row moved",
            )),
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
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let ranges =
            keyspace::prefixed_scan_ranges(&self.space.key(b"k/", b""), scope, name_prefix, after);
        // Every range in one read (one revision), each up to the whole page;
        // the ranges are in byte order, so the page is their concatenation.
        let gets: Vec<TxnOp> = ranges
            .into_iter()
            .map(|(start, end)| {
                let options = GetOptions::new().with_range(end).with_limit(limit as i64);
                TxnOp::get(start, Some(options))
            })
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        let mut ids = Vec::with_capacity(limit);
        for response in &responses {
            let TxnOpResponse::Get(get) = response else {
                return Err(protocol(
                    "transaction answered without the get it asked for",
                ));
            };
            ids.extend(get.kvs().iter().map(|kv| kv.value().to_vec()));
        }
        ids.truncate(limit);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = ids
            .iter()
            .map(|id| TxnOp::get(self.space.key(b"r/", id), None))
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        every_first_kv(&responses, ids.len())?
            .into_iter()
            .map(|kv| {
                let kv =
                    kv.ok_or_else(|| StoreError::corrupt("scan index", "entry without a record"))?;
                keyspace::decode_record(kv.value())
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
            // etcd reads limit 0 as "no limit".
            return Ok(DuePage::default());
        }
        let [(start, end), (pending_start, pending_end)] =
            keyspace::prefixed_due_ranges(&self.space.key(DUE, b""), kind, until, after);
        // The entries and the count of those not due, in one read; the
        // records at that same revision, so an entry and its record agree
        // unless the store is damaged.
        let gets = vec![
            TxnOp::get(
                start,
                Some(GetOptions::new().with_range(end).with_limit(limit as i64)),
            ),
            TxnOp::get(
                pending_start,
                Some(GetOptions::new().with_range(pending_end).with_count_only()),
            ),
        ];
        let txned = self
            .space
            .txn_at(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        let [TxnOpResponse::Get(entries), TxnOpResponse::Get(pending)] = txned.responses.as_slice()
        else {
            return Err(protocol(
                "transaction answered without the gets it asked for",
            ));
        };
        let prefix = self.space.key(DUE, b"");
        let entries: Vec<(Vec<u8>, Vec<u8>)> = entries
            .kvs()
            .iter()
            .map(|kv| (kv.key()[prefix.len()..].to_vec(), kv.value().to_vec()))
            .collect();
        let pending = u64::try_from(pending.count()).unwrap_or_default();
        if entries.is_empty() {
            return keyspace::due_page(kind, Vec::new(), limit, pending);
        }
        let at = GetOptions::new().with_revision(txned.revision);
        let gets: Vec<TxnOp> = entries
            .iter()
            .map(|(_, id)| TxnOp::get(self.space.key(b"r/", id), Some(at.clone())))
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        let values = every_first_kv(&responses, entries.len())?;
        let entries = entries
            .into_iter()
            .zip(values)
            .map(|((entry, _), kv)| (entry, kv.map(|kv| kv.value().to_vec())))
            .collect();
        keyspace::due_page(kind, entries, limit, pending)
    }

    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
        let rk = self.record_key(id);
        let response = self.space.get(Op::BulkRead, rk.clone(), None).await?;
        let kv = response.kvs().first();
        let Some(record) = decode_record_kv(kv)?.filter(|r| r.version == version) else {
            return Ok(false);
        };
        let Some(due) = Due::of(&record).filter(|d| d.kind == DueKind::Released) else {
            return Ok(false);
        };
        let dk = self.due_key(due, id);
        let guards = vec![
            unchanged(&rk, kv),
            Compare::create_revision(dk.clone(), CompareOp::Greater, 0),
        ];
        let delete = TxnOp::delete(dk, None);
        Ok(matches!(
            self.guarded(guards, vec![delete], &[]).await?,
            Guarded::Written
        ))
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut blocks = self.blocks.lock().await;
        if let Some(unique) = blocks.take() {
            return Ok(unique);
        }
        let counter = self.counter_key();
        for _ in 0..ALLOCATE_ATTEMPTS_MAX {
            let response = self.space.get(Op::HotRead, counter.clone(), None).await?;
            let kv = response.kvs().first();
            let persisted = decode_counter("allocator", kv)?;
            let guard = unchanged(&counter, kv);
            blocks.jump_to(persisted);
            let high_water = blocks.next_high_water()?;
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                counter.clone(),
                high_water.to_string(),
                None,
            )]);
            if self.space.txn(Op::HotWrite, txn).await?.0 {
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

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let section = self.space.key(EVENTS, b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let first = GetOptions::new().with_range(end.clone()).with_limit(1);
        let mut gets = vec![
            TxnOp::get(self.head_key(), None),
            TxnOp::get(section, Some(first)),
        ];
        // etcd reads limit 0 as "no limit"; past the last seq nothing follows.
        let start = after.checked_add(1).filter(|_| limit > 0);
        if let Some(start) = start {
            let page = GetOptions::new().with_range(end).with_limit(limit as i64);
            gets.push(TxnOp::get(self.event_key(start), Some(page)));
        }
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        let head = decode_counter("event head", first_kv(responses.first())?.as_ref())?;
        let oldest = match first_kv(responses.get(1))? {
            Some(kv) => keyspace::decode_event(kv.value())?.seq,
            None => head + 1,
        };
        let events = match responses.get(2) {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .iter()
                .map(|kv| keyspace::decode_event(kv.value()))
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(protocol(
                    "transaction answered without the get it asked for",
                ));
            }
            None => Vec::new(),
        };
        Ok(EventPage {
            events,
            oldest,
            head,
        })
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        if before == 0 {
            // Nothing is below seq 0 (and etcd reads an empty range oddly).
            return Ok(());
        }
        let options = DeleteOptions::new().with_range(self.event_key(before));
        let delete = TxnOp::delete(self.event_key(0), Some(options));
        self.space
            .txn(Op::BulkWrite, Txn::new().and_then([delete]))
            .await?;
        Ok(())
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        // Written around the cache: forget what it knew of this record.
        self.cache.remove(&record.id);
        let value = keyspace::encode_record(record)?;
        let rk = self.record_key(&record.id);
        let mut read = self.read_together(Op::BulkRead, &[&rk]).await?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let kv = read[0].take();
            let current = decode_record_kv(kv.as_ref())?;
            let old_due = current.as_ref().and_then(Due::of);
            if let Some(judged) = judge_import(record, current.clone()) {
                return Ok(judged);
            }
            // An older version has the same key (judge_import checks it),
            // so the index entry is the same either way.
            let mut ops = vec![
                TxnOp::put(rk.clone(), value.clone(), None),
                TxnOp::put(self.index_key(record), keyspace::id_bytes(&record.id), None),
            ];
            let (gone, added) = session::session_index_changes(current.as_ref(), record);
            for entry in gone {
                ops.push(TxnOp::delete(
                    self.session_index_key(entry.index, &entry.entry),
                    None,
                ));
            }
            for entry in added {
                let key = self.session_index_key(entry.index, &entry.entry);
                ops.push(TxnOp::put(key, keyspace::id_bytes(&record.id), None));
            }
            let new_due = Due::of(record);
            if old_due != new_due {
                if let Some(old) = old_due {
                    ops.push(TxnOp::delete(self.due_key(old, &record.id), None));
                }
                if let Some(new) = new_due {
                    let id = keyspace::id_bytes(&record.id);
                    ops.push(TxnOp::put(self.due_key(new, &record.id), id, None));
                }
            }
            match self
                .guarded(vec![unchanged(&rk, kv.as_ref())], ops, &[&rk])
                .await?
            {
                Guarded::Written => return Ok(Import::Written),
                Guarded::Failed { now } => read = now,
            }
        }
        Err(contended("import"))
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        let value = keyspace::encode_event(event)?;
        let (ek, hk) = (self.event_key(event.seq), self.head_key());
        let mut read = self.read_together(Op::BulkRead, &[&ek, &hk]).await?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let (event_kv, head_kv) = (read[0].take(), read[1].take());
            let current = event_kv
                .as_ref()
                .map(|kv| keyspace::decode_event(kv.value()))
                .transpose()?;
            if let Some(judged) = judge_event_import(event, current) {
                return Ok(judged);
            }
            let head = decode_counter("event head", head_kv.as_ref())?;
            let guards = vec![unchanged(&ek, None), unchanged(&hk, head_kv.as_ref())];
            let mut ops = vec![TxnOp::put(ek.clone(), value.clone(), None)];
            if event.seq > head {
                ops.push(TxnOp::put(hk.clone(), event.seq.to_string(), None));
            }
            match self.guarded(guards, ops, &[&ek, &hk]).await? {
                Guarded::Written => return Ok(Import::Written),
                Guarded::Failed { now } => read = now,
            }
        }
        Err(contended("event import"))
    }

    async fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        self.read_session(id).await
    }

    async fn session_counts(&self) -> Result<Option<crate::SessionCounts>, StoreError> {
        self.count_sessions().await.map(Some)
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

    fn failover(&self) -> Option<Arc<Failover>> {
        Some(self.space.members.failover().clone())
    }

    async fn migrating(&self) -> Result<bool, StoreError> {
        // Linearizable (etcd's default read): a mark set by a migration that
        // just finished its first step is seen.
        let response = self
            .space
            .get(Op::BulkRead, self.migrating_key(), None)
            .await?;
        Ok(response.kvs().first().is_some_and(|kv| kv.value() != b"0"))
    }

    async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
        let key = self.migrating_key();
        let op = if on {
            TxnOp::put(key, b"1".to_vec(), None)
        } else {
            TxnOp::delete(key, None)
        };
        self.space
            .txn(Op::BulkWrite, Txn::new().and_then([op]))
            .await?;
        Ok(())
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        // The persisted mark is exclusive: every unique handed out is below it.
        let response = self
            .space
            .get(Op::BulkRead, self.counter_key(), None)
            .await?;
        decode_counter("allocator", response.kvs().first())
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        // Held across the write so no allocation of this store interleaves.
        let mut blocks = self.blocks.lock().await;
        let past = floor.checked_add(1).ok_or(StoreError::AllocatorExhausted)?;
        let counter = self.counter_key();
        for _ in 0..ALLOCATE_ATTEMPTS_MAX {
            let response = self.space.get(Op::BulkRead, counter.clone(), None).await?;
            let kv = response.kvs().first();
            if decode_counter("allocator", kv)? >= past {
                blocks.jump_to(past);
                return Ok(());
            }
            let txn = Txn::new()
                .when([unchanged(&counter, kv)])
                .and_then([TxnOp::put(counter.clone(), past.to_string(), None)]);
            if self.space.txn(Op::BulkWrite, txn).await?.0 {
                blocks.jump_to(past);
                return Ok(());
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("allocator counter contended for {ALLOCATE_ATTEMPTS_MAX} attempts"),
        })
    }
}
