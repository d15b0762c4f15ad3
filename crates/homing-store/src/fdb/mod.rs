//! The FoundationDB backend (cargo feature `fdb`), the production global
//! store.
//!
//! **Verified by compilation on CI, not against a running cluster.** The
//! conformance suite runs against it whenever `FDB_CLUSTER_FILE` points at a
//! cluster (and `libfdb_c` is installed); without it the test prints a skip
//! line and passes:
//!
//! ```text
//! FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster cargo test -p homing-store --features fdb
//! ```
//!
//! Keys live under a subspace prefix scoped by deployment/tenant, with the
//! same layout as the etcd backend: `g/<key bytes>` → reservation ID,
//! `r/<id>` → postcard record, `k/<(key, id) bytes>` → id,
//! `events/<seq, 8 bytes big-endian>` → postcard event, `events-head` → the
//! last event seq ever appended and `alloc` → the allocator's high-water
//! mark (both 8 bytes big-endian), `d/<kind, time, id>` → id (the expiry
//! index, kept by every record write; a store from before it is indexed on
//! its first expiry query, `due-index` marking that done), `dcs/<dc>` → a
//! DC's lease terms, marks and retired flag and `dcv/<dc>` → the
//! versionstamp of its last renewal (`dc_lease`: judged by FDB's versions
//! and this process's clock), `succ/<dc, 0x00, unique 8 bytes big-endian>`
//! → a reservation's succession, written once; a takeover judges the DC and
//! writes in one transaction (`succession`). Every operation is one serializable FDB
//! transaction (reads add conflict ranges, so a racing set_if_absent or CAS
//! retries and then sees the winner), retried at most
//! `TRANSACTION_ATTEMPTS_MAX` times through FDB's `on_error` backoff. A
//! compare-and-set that derives an event reads the head and writes the
//! record, the event at `head + 1` and the new head in that one
//! transaction; such appends of one process take turns (a renewal, which
//! derives none, does not wait for them), so they only conflict with other
//! processes' appends. Concurrent `set_if_absent` calls share one
//! transaction (`batch`): each key read and set when absent, a conflict
//! on any key retrying the batch.
//!
//! The FDB client network must run before any database is opened:
//! [`FdbNetwork::start`] starts it (at most once per process) and
//! [`FdbNetwork::open`] opens a database; keep the network until every store
//! built on it is dropped.

use async_trait::async_trait;
use foundationdb::options::{DatabaseOption, StreamingMode};
use foundationdb::{Database, FdbError, RangeOption};
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcTerms, Due, DueCursor, DueKind, DuePage,
    Event, EventSeq, Key, NamespaceScope, ReservationId, StoreTime, Succession, SuccessionCause,
    TakeOverReply, TakeoverPolicy,
};
use tokio::sync::Mutex;

use self::dc_lease::DcLeases;
pub use self::dc_lease::SIGHTINGS_MAX;
use self::succession::Successions;

use crate::allocator::Blocks;
use crate::batch::{Batch, BatchBounds, Batcher};
use crate::dc::{
    Cas, DcStore, EventPage, Import, SCAN_LIMIT_MAX, ScanCursor, check_cas, check_events_limit,
    check_limit, check_scan, judge_cas, judge_event_import, judge_import,
};
use crate::error::StoreError;
use crate::global::{GlobalStore, SetIfAbsent, check_batch, check_cause};
use crate::keyspace;

/// Most attempts of one transaction (conflicts, recoverable FDB errors).
pub const TRANSACTION_ATTEMPTS_MAX: usize = 16;

/// Bound on one transaction, in milliseconds, retries included.
pub const TRANSACTION_TIMEOUT_MS: i32 = 5_000;
/// Bound on FDB's own retries of one transaction.
const TRANSACTION_RETRY_LIMIT: i32 = 100;

/// Whether this process already started the FDB network (it may only once).
static NETWORK_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The FDB client network of this process; stops it when dropped.
pub struct FdbNetwork {
    _guard: foundationdb::api::NetworkAutoStop,
}

impl FdbNetwork {
    /// Starts the network. Fails if this process already started it once.
    pub fn start() -> Result<FdbNetwork, StoreError> {
        if NETWORK_STARTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Backend {
                backend: "fdb",
                reason: "the fdb network can only be started once per process".to_string(),
            });
        }
        #[allow(unsafe_code)]
        // SAFETY: `boot` may run at most once per process, which the flag above
        // guarantees; its guard is owned by the returned `FdbNetwork`, whose
        // documented contract is to outlive every database opened from it.
        let guard = unsafe { foundationdb::boot() };
        Ok(FdbNetwork { _guard: guard })
    }

    /// Opens the database of `cluster_file` (the platform default if `None`).
    pub fn open(
        &self,
        cluster_file: Option<&std::path::Path>,
    ) -> Result<std::sync::Arc<Database>, StoreError> {
        let db = match cluster_file {
            Some(path) => {
                let path = path.to_str().ok_or_else(|| StoreError::Backend {
                    backend: "fdb",
                    reason: format!("cluster file path {} is not UTF-8", path.display()),
                })?;
                Database::from_path(path)
            }
            None => Database::default(),
        };
        let db = db.map_err(fdb_err)?;
        // FDB retries a transaction forever by default; bound it so an
        // unreachable cluster fails requests instead of hanging them.
        db.set_option(DatabaseOption::TransactionTimeout(TRANSACTION_TIMEOUT_MS))
            .map_err(fdb_err)?;
        db.set_option(DatabaseOption::TransactionRetryLimit(
            TRANSACTION_RETRY_LIMIT,
        ))
        .map_err(fdb_err)?;
        Ok(std::sync::Arc::new(db))
    }
}

fn fdb_err(e: FdbError) -> StoreError {
    if e.is_retryable() {
        StoreError::Unavailable {
            backend: "fdb",
            reason: e.to_string(),
        }
    } else {
        StoreError::Backend {
            backend: "fdb",
            reason: e.to_string(),
        }
    }
}

/// An operation's outcome, or the FDB error that aborts the attempt.
enum Step<T> {
    Done(T),
    Fdb(FdbError),
}

/// A database handle and the subspace prefix.
#[derive(Clone)]
struct Space {
    db: std::sync::Arc<Database>,
    prefix: Vec<u8>,
}

impl Space {
    fn key(&self, section: &[u8], rest: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), section, rest].concat()
    }
}

/// Runs `$body` (an expression over the transaction `$trx` yielding
/// `Result<Step<T>, StoreError>`) then commits, retrying through `on_error` at
/// most [`TRANSACTION_ATTEMPTS_MAX`] times; `$body`'s own errors end the loop.
/// A macro rather than a generic function: async closures borrowing the
/// transaction are not provably `Send` for `async_trait` yet. The four-argument
/// form also sets the caller's `bool` `$unknown` once a commit failed in a way
/// that may have committed (`commit_unknown_result`), so `$body`, run again,
/// can recognise its own earlier write.
macro_rules! transact {
    ($space:expr, $trx:ident, $body:expr) => {{
        let mut unknown_outcome = false;
        let out = transact!($space, $trx, unknown_outcome, $body);
        let _ = unknown_outcome;
        out
    }};
    ($space:expr, $trx:ident, $unknown:ident, $body:expr) => {{
        let mut $trx = $space.db.create_trx().map_err(fdb_err)?;
        let mut attempts = 0;
        loop {
            if attempts == TRANSACTION_ATTEMPTS_MAX {
                break Err(StoreError::Unavailable {
                    backend: "fdb",
                    reason: format!(
                        "transaction did not commit in {TRANSACTION_ATTEMPTS_MAX} attempts"
                    ),
                });
            }
            attempts += 1;
            let step: Result<Step<_>, StoreError> = async { $body }.await;
            match step? {
                Step::Done(value) => match $trx.commit().await {
                    Ok(_) => break Ok(value),
                    Err(e) => {
                        $unknown |= e.is_maybe_committed();
                        $trx = e.on_error().await.map_err(fdb_err)?
                    }
                },
                Step::Fdb(e) => $trx = $trx.on_error(e).await.map_err(fdb_err)?,
            }
        }
    }};
}

macro_rules! step {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(Step::Fdb(e)),
        }
    };
}

mod dc_lease;
mod succession;

/// The section of the expiry index: `d/<keyspace::due_bytes>` → id.
const DUE: &[u8] = b"d/";
/// Set once a DC store's records are indexed by expiry.
const DUE_INDEX: &[u8] = b"due-index";
/// Records indexed per transaction for a store from before the index.
const INDEX_PAGE_RECORDS: usize = 128;

/// A [`GlobalStore`] in FoundationDB.
pub struct FdbGlobalStore {
    space: Space,
    /// Groups concurrent `set_if_absent` calls into one transaction.
    write_once: Batcher<Entries>,
    /// Each DC's lease and marks (`dc_lease`).
    dcs: DcLeases,
    /// Who succeeds which reservation (`succession`).
    successions: Successions,
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
}

/// A [`DcStore`] in FoundationDB.
pub struct FdbDcStore {
    space: Space,
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
    Done(Cas),
    /// The write derives an event: redo it holding the append turn.
    Append,
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

/// `limit` rows of `[begin, end)` in one go: the default `Iterator` mode's
/// first batch is a few KiB, so a page would come back short while more rows
/// exist, and callers read a short page as the end. `Exact` delivers `limit`
/// rows, or every row left in the range. `limit` must be above 0 (FDB reads
/// 0 as "no limit").
fn exact_range<'a>(begin: Vec<u8>, end: Vec<u8>, limit: usize) -> RangeOption<'a> {
    debug_assert!(limit > 0);
    let mut range = RangeOption::from((begin, end));
    range.limit = Some(limit);
    range.mode = StreamingMode::Exact;
    range
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
        check_cas(expected, record)?;
        let value = keyspace::encode_record(record)?;
        let id = keyspace::id_bytes(&record.id);
        let rk = self.space.key(b"r/", &id);
        let index = self
            .space
            .key(b"k/", &keyspace::record_scan_bytes(&record.key, &record.id));
        // A retry after a commit that may have landed recognises its own
        // record (`Cas::after_unknown_outcome`); a first attempt never does.
        let mut unknown = false;
        // First without the append turn: a renewal derives no event.
        let first = transact!(self.space, trx, unknown, {
            let current = step!(trx.get(&rk, false).await)
                .map(|v| keyspace::decode_record(&v))
                .transpose()?;
            let event = homing_core::event::derive(current.as_ref(), record);
            let old_due = current.as_ref().and_then(Due::of);
            if let Some(conflict) = judge_cas(expected, record, current)? {
                let conflict = if unknown {
                    conflict.after_unknown_outcome(record)
                } else {
                    conflict
                };
                return Ok(Step::Done(CasStep::Done(conflict)));
            }
            if event.is_some() {
                return Ok(Step::Done(CasStep::Append));
            }
            trx.set(&rk, &value);
            self.reindex(&trx, old_due, record);
            Ok(Step::Done(CasStep::Done(Cas::Written)))
        })?;
        if let CasStep::Done(cas) = first {
            return Ok(cas);
        }
        let _turn = self.appending.lock().await;
        let head_key = self.head_key();
        let mut unknown = false;
        transact!(self.space, trx, unknown, {
            // Judged again: the record may have moved since the first look.
            let current = step!(trx.get(&rk, false).await)
                .map(|v| keyspace::decode_record(&v))
                .transpose()?;
            let event = homing_core::event::derive(current.as_ref(), record);
            let old_due = current.as_ref().and_then(Due::of);
            if let Some(conflict) = judge_cas(expected, record, current)? {
                return Ok(Step::Done(if unknown {
                    conflict.after_unknown_outcome(record)
                } else {
                    conflict
                }));
            }
            if let Some(mut event) = event {
                let head = step!(trx.get(&head_key, false).await);
                let head = decode_counter("event head", head.as_deref())?;
                // Invariant: a u64 log never fills (one event per write).
                event.seq = head.checked_add(1).expect("event seq overflow");
                trx.set(&self.event_key(event.seq), &keyspace::encode_event(&event)?);
                trx.set(&head_key, &event.seq.to_be_bytes());
            }
            trx.set(&rk, &value);
            if expected.is_none() {
                trx.set(&index, &id);
            }
            self.reindex(&trx, old_due, record);
            Ok(Step::Done(Cas::Written))
        })
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
            if let Some(judged) = judge_import(record, current) {
                return Ok(Step::Done(judged));
            }
            trx.set(&rk, &value);
            self.reindex(&trx, old_due, record);
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

/// The conformance suite against a real cluster, run only when
/// `FDB_CLUSTER_FILE` names one (`FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster
/// cargo test -p homing-store --features fdb`); otherwise it prints why it
/// skipped and passes. Each run writes under a fresh random prefix and clears
/// it at the end, also when a case fails.
#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::conformance::{self, Backend};

    const CLUSTER_FILE_ENV: &str = "FDB_CLUSTER_FILE";

    /// A prefix no other run shares: `RandomState` is seeded from the OS.
    fn run_prefix() -> Vec<u8> {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let run = h.finish();
        format!("homing-test/{run:016x}/").into_bytes()
    }

    struct FdbBackend {
        db: Arc<Database>,
        prefix: Vec<u8>,
    }

    impl FdbBackend {
        fn place(&self, kind: &str, place: &str) -> Vec<u8> {
            [
                self.prefix.as_slice(),
                format!("{kind}/{place}/").as_bytes(),
            ]
            .concat()
        }

        /// Removes everything this run wrote.
        async fn clear(&self) -> Result<(), foundationdb::FdbBindingError> {
            let begin = self.prefix.clone();
            // Invariant: the prefix ends in `/`, so it has an end.
            let end = keyspace::prefix_end(&begin).expect("a prefix ending in '/' has an end");
            self.db
                .run(|trx, _| {
                    let (begin, end) = (begin.clone(), end.clone());
                    async move {
                        trx.clear_range(&begin, &end);
                        Ok(())
                    }
                })
                .await
        }
    }

    #[async_trait]
    impl Backend for FdbBackend {
        async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
            Arc::new(FdbGlobalStore::new(
                self.db.clone(),
                &self.place("global", place),
            ))
        }
        async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
            Arc::new(FdbDcStore::new(self.db.clone(), &self.place("dc", place)))
        }
        fn durable(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn fdb_cluster_passes_the_conformance_suite() {
        let Some(cluster_file) = std::env::var_os(CLUSTER_FILE_ENV) else {
            println!("skipping fdb conformance: {CLUSTER_FILE_ENV} is not set");
            return;
        };
        let cluster_file = cluster_file
            .into_string()
            .expect("FDB_CLUSTER_FILE is valid UTF-8");
        // Declared first so it is dropped last, after every `Database`.
        let network = FdbNetwork::start().expect("start the FDB network");
        let db = network
            .open(Some(std::path::Path::new(&cluster_file)))
            .expect("open the FDB database");
        let backend = Arc::new(FdbBackend {
            db,
            prefix: run_prefix(),
        });
        println!(
            "fdb conformance: cluster file {cluster_file}, prefix {}",
            String::from_utf8_lossy(&backend.prefix)
        );
        // In a task, so a failing case still reaches the clean-up below.
        let suite = tokio::spawn({
            let backend = backend.clone();
            async move { conformance::run_all(backend.as_ref()).await }
        });
        let outcome = suite.await;
        let cleared = backend.clear().await;
        if let Err(failed) = outcome {
            std::panic::resume_unwind(failed.into_panic());
        }
        cleared.expect("clear this run's prefix");
    }
}
