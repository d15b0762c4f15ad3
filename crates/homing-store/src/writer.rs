//! The redb group-commit writer: one thread owns every write transaction.
//! Callers send operations over a bounded channel; the thread takes the first
//! waiting operation, drains up to `group_ops_max - 1` more that are already
//! queued, applies them all in ONE write transaction in arrival order (so a
//! later operation sees an earlier one's write), commits once (one fsync with
//! `Durability::Immediate`), then answers each caller. Under load, N
//! concurrent writers share one fsync; alone, a writer pays one fsync per op.
//! `group_ops_max = 1` is the non-grouped mode kept for comparison.
//!
//! Host-session rows ([`Op::SessionCas`]: a session's renewal, open, close)
//! go ahead of everything else: they wait in their own queue, which the
//! thread empties first into each group, so an acquire storm or a big reap
//! that fills the main queue delays a heartbeat by at most the group being
//! committed (etcd's failure mode is keepalives starved by writes).
//!
//! A commit that fails with a storage error (a full disk) closes the file
//! before its callers are answered with the error, and the writer opens it
//! again before it takes another group (`reopen.rs`); writes queued
//! meanwhile are refused within [`REFUSE_POLL_MS`].

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use homing_core::{DcRecord, Due, DueKind, Event, EventSeq, SessionId, SessionRecord};
use redb::{Database, ReadableTable, Table, TableDefinition};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};

use crate::dc::{Cas, Import, judge_cas, judge_event_import, judge_import, judge_session_import};
use crate::error::StoreError;
use crate::global::judge_swap;
use crate::keyspace;
use crate::reopen::{self, DbFile, REOPEN_PAUSE_MS_FIRST, REOPEN_PAUSE_MS_MAX, needs_reopen};
use crate::session::{self, GuardedCas, SessionCas, SessionEntry, SessionGuard, SessionIndex};

/// Global entries: key bytes → reservation ID text.
pub(crate) const GLOBAL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("global");
/// DC records: reservation ID text → postcard record.
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// Scan index: `(key, id)` bytes → reservation ID text.
pub(crate) const BY_KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records_by_key");
/// Expiry index: `keyspace::due_bytes` (kind, time, id) → reservation ID text.
pub(crate) const DUE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records_due");
/// The DC's event log: seq → postcard event.
pub(crate) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// Global store: each DC's lease terms, marks and retired flag, by DC id.
pub(crate) const DCS: TableDefinition<&str, &[u8]> = TableDefinition::new("dcs");
/// Global store: successions, `keyspace::succession_key` (dc, unique) →
/// `keyspace::encode_succession`, written once.
pub(crate) const SUCCESSIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("successions");
/// Global store: deployment settings, `keyspace::setting_key` (the
/// setting's name) → the value as the caller gave it, changed by
/// compare-and-set.
pub(crate) const SETTINGS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("settings");
/// Host sessions: session name (`<dc>~<n>`) → `session::encode_session`.
pub(crate) const SESSIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("sessions");
/// `session::session_key_entry` (session, reservation) → reservation ID text.
pub(crate) const SESSION_KEYS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("session_keys");
/// `session::session_notice_entry` (session, notice) → reservation ID text.
pub(crate) const SESSION_NOTICES: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("session_notices");
/// `session::session_due_entry` (time, session) → session name.
pub(crate) const SESSIONS_DUE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("sessions_due");
/// Small counters (the allocator's high-water mark, the event head).
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The allocator's persisted high-water mark in [`META`] (exclusive: every
/// unique handed out is below it).
pub(crate) const HIGH_WATER: &str = "allocator_high_water";
/// The seq of the last event ever appended, in [`META`]: kept apart from
/// [`EVENTS`] so that trimming every event does not reset it.
pub(crate) const EVENT_HEAD: &str = "event_head";
/// The expiry index's layout version in [`META`]: absent in files written
/// before the index existed, which are indexed once on open.
pub(crate) const DUE_INDEX: &str = "due_index";
/// `1` in [`META`] while an unfinished migration copies into the store.
pub(crate) const MIGRATING: &str = "migrating";

/// Operations queued for the writer before senders wait (backpressure).
pub const WRITE_QUEUE_OPS_MAX: usize = 4096;

/// While the file is closed after an I/O error, how often the writer
/// refuses what was queued meanwhile, ms: the longest a write then waits
/// for its error.
pub const REFUSE_POLL_MS: u64 = 10;

/// One write, as the writer applies it.
pub(crate) enum Op {
    /// Insert `id` under `key` unless present.
    SetIfAbsent { key: Vec<u8>, id: Vec<u8> },
    /// Compare-and-set a record (already validated and encoded by the caller).
    Cas {
        expected: Option<u64>,
        record: DcRecord,
        value: Vec<u8>,
    },
    /// Compare-and-set a record that joins or freezes in a session, iff
    /// the session row is at the guarded version; the guard's next row
    /// (encoded in `row_value`) is written with it.
    GuardedCas {
        expected: Option<u64>,
        record: DcRecord,
        value: Vec<u8>,
        guard: SessionGuard,
        row_value: Option<Vec<u8>>,
    },
    /// Compare-and-set a session row.
    SessionCas {
        expected: Option<u64>,
        row: SessionRecord,
        value: Vec<u8>,
    },
    /// Delete a session row at this version.
    DeleteSession { id: SessionId, version: u64 },
    /// Write a copied session row unless it is there.
    ImportSession { row: SessionRecord, value: Vec<u8> },
    /// Raise the allocator's high-water mark to at least this.
    HighWater(u64),
    /// Write a copied record unless it is there (see `DcStore::import`).
    Import { record: DcRecord, value: Vec<u8> },
    /// Write a copied event at its seq unless one is there.
    ImportEvent { event: Event, value: Vec<u8> },
    /// Delete every event with a seq below this.
    TrimEvents(EventSeq),
    /// Set or clear the migration mark.
    Migrating(bool),
    /// Drop a released record's expiry entry if the record has `version`.
    Settle { id: Vec<u8>, version: u64 },
    /// Global store: what is kept about a DC (the caller serialises changes).
    PutDc { dc: String, value: Vec<u8> },
    /// Global store: insert a succession under `key` unless one is there
    /// (a takeover's caller holds the DC-lease lock across its check and this).
    SetSuccessor { key: Vec<u8>, value: Vec<u8> },
    /// Global store: set the setting under `key` to `value` if it holds
    /// `expected` (`None`: absent).
    SwapSetting {
        key: &'static [u8],
        expected: Option<Vec<u8>>,
        value: Vec<u8>,
    },
    /// Tests: panic in the writer thread, as a bug in redb would.
    #[cfg(test)]
    Crash,
    /// Tests: hold the writer thread (saying so on `held`) until `go`
    /// says go (or drops).
    #[cfg(test)]
    Hold {
        held: std::sync::mpsc::Sender<()>,
        go: std::sync::mpsc::Receiver<()>,
    },
}

impl Op {
    /// Whether it goes ahead of the queue: a host session's row (its
    /// renewals carry every key of the session).
    fn urgent(&self) -> bool {
        matches!(self, Op::SessionCas { .. })
    }
}

/// What an applied [`Op`] found.
pub(crate) enum Outcome {
    /// `None`: inserted; `Some(bytes)`: the existing entry.
    SetIfAbsent(Option<Vec<u8>>),
    /// The compare-and-set result.
    Cas(Cas),
    /// The guarded compare-and-set result.
    Guarded(GuardedCas),
    /// The session row's compare-and-set result.
    SessionCas(SessionCas),
    /// Whether the session row was deleted.
    SessionDeleted(bool),
    /// What a session-row import did.
    ImportSession(Import<SessionRecord>),
    /// The high-water mark is durable.
    HighWater,
    /// What a record import did.
    Import(Import<DcRecord>),
    /// What an event import did.
    ImportEvent(Import<Event>),
    /// The events are gone.
    Trimmed,
    /// The migration mark is durable.
    Migrating,
    /// Whether the entry was dropped.
    Settled(bool),
    /// The DC entry is durable.
    DcPut,
    /// `None`: inserted (durable); `Some(bytes)`: the succession already there.
    SetSuccessor(Option<Vec<u8>>),
    /// `Ok`: set (durable); `Err`: what the setting holds instead.
    SwapSetting(Result<(), Option<Vec<u8>>>),
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

/// Handle to the writer thread; dropping it stops and joins the thread, so the
/// database file is closed when the store is dropped.
pub(crate) struct Writer {
    /// The main queue; `None` in it only wakes the thread for `urgent`.
    queue: Option<mpsc::Sender<Option<Request>>>,
    /// Ops that go first ([`Op::urgent`]): not bounded by the main queue
    /// (one per host session renewing, each waiting for its answer).
    urgent: Arc<Urgent>,
    thread: Option<JoinHandle<()>>,
}

/// The queue of urgent ops.
type Urgent = std::sync::Mutex<std::collections::VecDeque<Request>>;

pub(crate) fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "redb",
        reason: e.to_string(),
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable {
        backend: "redb",
        reason: "writer thread stopped".into(),
    }
}

impl Writer {
    /// Starts the writer thread over `file`, committing up to `group_ops_max` ops per transaction.
    pub(crate) fn start(file: Arc<DbFile>, group_ops_max: usize) -> Result<Writer, StoreError> {
        assert!(group_ops_max >= 1, "a group holds at least one op");
        let db = file.database()?;
        let (queue, rx) = mpsc::channel(WRITE_QUEUE_OPS_MAX);
        let urgent = Arc::new(Urgent::default());
        let queues = Queues {
            urgent: urgent.clone(),
            rx,
        };
        let thread = std::thread::Builder::new()
            .name("homing-redb-writer".into())
            .spawn(move || run(&file, db, queues, group_ops_max))
            .map_err(backend)?;
        Ok(Writer {
            queue: Some(queue),
            urgent,
            thread: Some(thread),
        })
    }

    /// `Ok` while the writer thread runs. A thread that died (a panic in
    /// redb) leaves every later write of the store failing while reads still
    /// work: health checks must ask this, not only read.
    pub(crate) fn running(&self) -> Result<(), StoreError> {
        match &self.thread {
            Some(thread) if !thread.is_finished() => Ok(()),
            _ => Err(stopped()),
        }
    }

    /// Ops waiting in the main queue (tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue
            .as_ref()
            .map_or(0, |q| WRITE_QUEUE_OPS_MAX - q.capacity())
    }

    /// Ops waiting in the urgent queue (tests).
    #[cfg(test)]
    pub(crate) fn urgent_queued(&self) -> usize {
        self.urgent.lock().expect("urgent queue").len()
    }

    /// Queues `op` and waits until its transaction committed (or failed).
    pub(crate) async fn submit(&self, op: Op) -> Result<Outcome, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = oneshot::channel();
        let request = Request { op, reply };
        if request.op.urgent() {
            self.urgent.lock().expect("urgent queue").push_back(request);
            // Wakes a thread waiting on an empty queue; a full one means
            // the thread is busy and takes the urgent queue first anyway.
            if let Err(mpsc::error::TrySendError::Closed(_)) = queue.try_send(None) {
                return Err(stopped());
            }
        } else {
            queue.send(Some(request)).await.map_err(|_| stopped())?;
        }
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            // The thread ends once the queue is drained; it does not panic on
            // store errors (they are answered to callers).
            let _ = thread.join();
        }
    }
}

/// The writer thread's ends of the two queues.
struct Queues {
    urgent: Arc<Urgent>,
    rx: mpsc::Receiver<Option<Request>>,
}

impl Queues {
    fn urgent(&self) -> Option<Request> {
        self.urgent.lock().expect("urgent queue").pop_front()
    }

    /// The next op, urgent ones first, waiting for one; `None` once the
    /// store is dropped.
    fn next(&mut self) -> Option<Request> {
        loop {
            if let Some(request) = self.urgent() {
                return Some(request);
            }
            if let Some(request) = self.rx.blocking_recv()? {
                return Some(request);
            }
        }
    }

    /// The next op already queued, urgent ones first.
    fn queued(&mut self) -> Option<Request> {
        if let Some(request) = self.urgent() {
            return Some(request);
        }
        loop {
            match self.rx.try_recv() {
                Ok(Some(request)) => return Some(request),
                Ok(None) => continue,
                Err(_) => return None,
            }
        }
    }
}

fn run(file: &DbFile, mut db: Arc<Database>, mut queues: Queues, group_ops_max: usize) {
    let mut batch = Vec::with_capacity(group_ops_max);
    while let Some(first) = queues.next() {
        batch.push(first);
        while batch.len() < group_ops_max {
            match queues.queued() {
                Some(next) => batch.push(next),
                None => break,
            }
        }
        let ops = batch.len();
        match commit_group(&db, &batch) {
            Ok(outcomes) => {
                for (request, outcome) in batch.drain(..).zip(outcomes) {
                    // A caller that stopped waiting still had its op committed.
                    let _ = request.reply.send(outcome);
                }
            }
            Err(e) => {
                tracing::warn!(ops, error = %e, "redb group commit failed");
                let reopening = needs_reopen(&e);
                if reopening {
                    // Closed before anyone hears of the failure, so a caller
                    // that got the error finds the store unhealthy.
                    file.close(e.to_string());
                }
                // Nothing of the group was committed: every caller gets the error.
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(backend(&e)));
                }
                if reopening {
                    match reopen(file, db, &mut queues, &e) {
                        Some(reopened) => db = reopened,
                        None => return,
                    }
                }
            }
        }
    }
}

/// Opens the file `cause` closed again, pausing between attempts
/// (`reopen.rs`), and meanwhile refuses every write queued; the database
/// open again, or `None` once the queue closed (the store dropped) first.
fn reopen(
    file: &DbFile,
    db: Arc<Database>,
    queues: &mut Queues,
    cause: &redb::Error,
) -> Option<Arc<Database>> {
    // Ours must go before the file can open again; readers in flight drop theirs.
    drop(db);
    let cause = cause.to_string();
    tracing::error!(error = %cause, "redb storage failed: closed the file to open it again");
    let started = Instant::now();
    let mut pause_ms = REOPEN_PAUSE_MS_FIRST;
    let mut attempts: u64 = 0;
    loop {
        attempts += 1;
        match file.try_reopen() {
            Ok(db) => {
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                tracing::info!(attempts, elapsed_ms, "redb file open again: writes resume");
                return Some(db);
            }
            // Logged at 1, 2, 4, 8, ... attempts: a disk full for hours
            // writes a few dozen lines, not thousands.
            Err(e) if attempts.is_power_of_two() => {
                tracing::warn!(attempts, pause_ms, error = %e, "redb file does not open again yet");
            }
            Err(_) => {}
        }
        if !refuse_for(queues, Duration::from_millis(pause_ms), &cause) {
            return None;
        }
        pause_ms = (pause_ms * 2).min(REOPEN_PAUSE_MS_MAX);
    }
}

/// Answers every write queued during `pause` with `Unavailable`, at least
/// every [`REFUSE_POLL_MS`]; `false` once the queue is closed.
fn refuse_for(queues: &mut Queues, pause: Duration, cause: &str) -> bool {
    let until = Instant::now() + pause;
    loop {
        if let Some(request) = queues.urgent() {
            let _ = request.reply.send(Err(reopen::closed(cause)));
            continue;
        }
        match queues.rx.try_recv() {
            Ok(Some(request)) => {
                let _ = request.reply.send(Err(reopen::closed(cause)));
            }
            Ok(None) => {}
            Err(TryRecvError::Disconnected) => return false,
            Err(TryRecvError::Empty) => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return true;
                }
                std::thread::sleep(left.min(Duration::from_millis(REFUSE_POLL_MS)));
            }
        }
    }
}

type Answer = Result<Outcome, StoreError>;

/// Why one op was not applied: its own failure (answered to its caller, the
/// group goes on), or the storage failing under the whole group.
enum NotApplied {
    /// This op only; it wrote nothing (every check runs before its first insert).
    Op(StoreError),
    /// The transaction: the whole group is aborted.
    Group(redb::Error),
}

impl From<StoreError> for NotApplied {
    fn from(e: StoreError) -> NotApplied {
        NotApplied::Op(e)
    }
}

impl From<redb::StorageError> for NotApplied {
    fn from(e: redb::StorageError) -> NotApplied {
        NotApplied::Group(e.into())
    }
}

/// The tables one group writes, open for the group's transaction.
struct Tables<'txn> {
    global: Table<'txn, &'static [u8], &'static [u8]>,
    records: Table<'txn, &'static [u8], &'static [u8]>,
    by_key: Table<'txn, &'static [u8], &'static [u8]>,
    due: Table<'txn, &'static [u8], &'static [u8]>,
    events: Table<'txn, u64, &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    dcs: Table<'txn, &'static str, &'static [u8]>,
    successions: Table<'txn, &'static [u8], &'static [u8]>,
    settings: Table<'txn, &'static [u8], &'static [u8]>,
    sessions: Table<'txn, &'static [u8], &'static [u8]>,
    session_keys: Table<'txn, &'static [u8], &'static [u8]>,
    session_notices: Table<'txn, &'static [u8], &'static [u8]>,
    sessions_due: Table<'txn, &'static [u8], &'static [u8]>,
}

/// Applies every op in one write transaction, in arrival order.
fn commit_group(db: &Database, batch: &[Request]) -> Result<Vec<Answer>, redb::Error> {
    let txn = db.begin_write()?;
    let mut answers = Vec::with_capacity(batch.len());
    {
        let mut tables = Tables {
            global: txn.open_table(GLOBAL)?,
            records: txn.open_table(RECORDS)?,
            by_key: txn.open_table(BY_KEY)?,
            due: txn.open_table(DUE)?,
            events: txn.open_table(EVENTS)?,
            meta: txn.open_table(META)?,
            dcs: txn.open_table(DCS)?,
            successions: txn.open_table(SUCCESSIONS)?,
            settings: txn.open_table(SETTINGS)?,
            sessions: txn.open_table(SESSIONS)?,
            session_keys: txn.open_table(SESSION_KEYS)?,
            session_notices: txn.open_table(SESSION_NOTICES)?,
            sessions_due: txn.open_table(SESSIONS_DUE)?,
        };
        for request in batch {
            answers.push(match apply(&mut tables, &request.op) {
                Ok(outcome) => Ok(outcome),
                Err(NotApplied::Op(e)) => Err(e),
                Err(NotApplied::Group(e)) => return Err(e),
            });
        }
    }
    txn.commit()?;
    Ok(answers)
}

/// Applies one op inside the group's transaction.
fn apply(t: &mut Tables<'_>, op: &Op) -> Result<Outcome, NotApplied> {
    match op {
        Op::SetIfAbsent { key, id } => {
            let existing = t.global.get(key.as_slice())?.map(|v| v.value().to_vec());
            if existing.is_none() {
                t.global.insert(key.as_slice(), id.as_slice())?;
            }
            Ok(Outcome::SetIfAbsent(existing))
        }
        Op::Cas {
            expected,
            record,
            value,
        } => cas(t, *expected, record, value, true),
        Op::GuardedCas {
            expected,
            record,
            value,
            guard,
            row_value,
        } => guarded_cas(t, *expected, record, value, guard, row_value.as_deref()),
        Op::SessionCas {
            expected,
            row,
            value,
        } => {
            let current = stored_session(t, &row.id)?;
            if let Some(conflict) = session::judge_session_cas(*expected, current.clone()) {
                return Ok(Outcome::SessionCas(conflict));
            }
            put_session(t, current.as_ref(), row, value)?;
            Ok(Outcome::SessionCas(SessionCas::Written))
        }
        Op::DeleteSession { id, version } => {
            let current = stored_session(t, id)?;
            let Some(row) = current.filter(|r| r.version == *version) else {
                return Ok(Outcome::SessionDeleted(false));
            };
            t.sessions_due
                .remove(session::session_due_entry(&row).as_slice())?;
            t.sessions.remove(session::session_bytes(id).as_slice())?;
            Ok(Outcome::SessionDeleted(true))
        }
        Op::ImportSession { row, value } => {
            let current = stored_session(t, &row.id)?;
            if let Some(judged) = judge_session_import(row, current.clone()) {
                return Ok(Outcome::ImportSession(judged));
            }
            put_session(t, current.as_ref(), row, value)?;
            Ok(Outcome::ImportSession(Import::Written))
        }
        Op::HighWater(mark) => {
            let old = t.meta.get(HIGH_WATER)?.map_or(0, |v| v.value());
            t.meta.insert(HIGH_WATER, old.max(*mark))?;
            Ok(Outcome::HighWater)
        }
        Op::Import { record, value } => import(t, record, value),
        Op::ImportEvent { event, value } => import_event(t, event, value),
        Op::TrimEvents(before) => {
            t.events.retain_in(..*before, |_, _| false)?;
            Ok(Outcome::Trimmed)
        }
        Op::Migrating(on) => {
            t.meta.insert(MIGRATING, u64::from(*on))?;
            Ok(Outcome::Migrating)
        }
        Op::Settle { id, version } => settle(t, id, *version),
        Op::PutDc { dc, value } => {
            t.dcs.insert(dc.as_str(), value.as_slice())?;
            Ok(Outcome::DcPut)
        }
        Op::SetSuccessor { key, value } => {
            let existing = t
                .successions
                .get(key.as_slice())?
                .map(|v| v.value().to_vec());
            if existing.is_none() {
                t.successions.insert(key.as_slice(), value.as_slice())?;
            }
            Ok(Outcome::SetSuccessor(existing))
        }
        Op::SwapSetting {
            key,
            expected,
            value,
        } => {
            let held = t.settings.get(*key)?.map(|v| v.value().to_vec());
            let judged = judge_swap(held, expected.as_deref());
            if judged.is_ok() {
                t.settings.insert(*key, value.as_slice())?;
            }
            Ok(Outcome::SwapSetting(judged))
        }
        #[cfg(test)]
        Op::Crash => panic!("the writer thread crashes on purpose"),
        #[cfg(test)]
        Op::Hold { held, go } => {
            let _ = held.send(());
            let _ = go.recv();
            Ok(Outcome::Trimmed)
        }
    }
}

/// The stored record of `id`, decoded.
fn stored(t: &Tables<'_>, id: &[u8]) -> Result<Option<DcRecord>, NotApplied> {
    let current = t.records.get(id)?;
    Ok(current
        .map(|v| keyspace::decode_record(v.value()))
        .transpose()?)
}

/// The stored row of session `id`, decoded.
fn stored_session(t: &Tables<'_>, id: &SessionId) -> Result<Option<SessionRecord>, NotApplied> {
    let current = t.sessions.get(session::session_bytes(id).as_slice())?;
    Ok(current
        .map(|v| session::decode_session(v.value()))
        .transpose()?)
}

/// Writes session row `row` (encoded: `value`) over `old`, moving its
/// sessions-due entry.
fn put_session(
    t: &mut Tables<'_>,
    old: Option<&SessionRecord>,
    row: &SessionRecord,
    value: &[u8],
) -> Result<(), NotApplied> {
    let name = session::session_bytes(&row.id);
    if let Some(old) = old {
        t.sessions_due
            .remove(session::session_due_entry(old).as_slice())?;
    }
    t.sessions_due
        .insert(session::session_due_entry(row).as_slice(), name.as_slice())?;
    t.sessions.insert(name.as_slice(), value)?;
    Ok(())
}

/// A guarded compare-and-set: the session row must be at the guarded
/// version; then the record's compare-and-set, then the guard's row.
fn guarded_cas(
    t: &mut Tables<'_>,
    expected: Option<u64>,
    record: &DcRecord,
    value: &[u8],
    guard: &SessionGuard,
    row_value: Option<&[u8]>,
) -> Result<Outcome, NotApplied> {
    let current = stored_session(t, &guard.id)?;
    if let Some(moved) = session::judge_guard(guard, current.clone()) {
        return Ok(Outcome::Guarded(moved));
    }
    match cas(t, expected, record, value, false)? {
        Outcome::Cas(Cas::Written) => {}
        Outcome::Cas(Cas::Conflict { current }) => {
            return Ok(Outcome::Guarded(GuardedCas::RecordConflict { current }));
        }
        _ => unreachable!("cas answers Outcome::Cas"),
    }
    if let (Some(next), Some(row_value)) = (&guard.next, row_value) {
        put_session(t, current.as_ref(), next, row_value)?;
    }
    Ok(Outcome::Guarded(GuardedCas::Written))
}

/// The last event seq ever appended (0: none).
fn head(t: &Tables<'_>) -> Result<EventSeq, NotApplied> {
    Ok(t.meta.get(EVENT_HEAD)?.map_or(0, |v| v.value()))
}

/// A compare-and-set and, in the same transaction, its event at `head + 1`.
/// Events of several ops in one group get consecutive seqs: each reads the
/// head the previous one wrote.
/// `unguarded`: refuse a record that joins or freezes in a session.
fn cas(
    t: &mut Tables<'_>,
    expected: Option<u64>,
    record: &DcRecord,
    value: &[u8],
    unguarded: bool,
) -> Result<Outcome, NotApplied> {
    let id = keyspace::id_bytes(&record.id);
    let current = stored(t, &id)?;
    if unguarded {
        session::check_unguarded(current.as_ref(), record)?;
    }
    let event = homing_core::event::derive(current.as_ref(), record);
    let old_due = current.as_ref().and_then(Due::of);
    let old = current.clone();
    if let Some(conflict) = judge_cas(expected, record, current)? {
        return Ok(Outcome::Cas(conflict));
    }
    apply_session_index(t, &id, old.as_ref(), record)?;
    reindex(t, &id, old_due, record)?;
    let event = match event {
        Some(mut event) => {
            // Invariant: a u64 log never fills (one event per write).
            event.seq = head(t)?.checked_add(1).expect("event seq overflow");
            Some((event.seq, keyspace::encode_event(&event)?))
        }
        None => None,
    };
    if let Some((seq, bytes)) = &event {
        t.events.insert(*seq, bytes.as_slice())?;
        t.meta.insert(EVENT_HEAD, *seq)?;
    }
    t.records.insert(id.as_slice(), value)?;
    if expected.is_none() {
        let scan = keyspace::record_scan_bytes(&record.key, &record.id);
        t.by_key.insert(scan.as_slice(), id.as_slice())?;
    }
    Ok(Outcome::Cas(Cas::Written))
}

/// A record import: written when absent or older, judged otherwise; no event.
fn import(t: &mut Tables<'_>, record: &DcRecord, value: &[u8]) -> Result<Outcome, NotApplied> {
    let id = keyspace::id_bytes(&record.id);
    let current = stored(t, &id)?;
    let old_due = current.as_ref().and_then(Due::of);
    let old = current.clone();
    if let Some(judged) = judge_import(record, current) {
        return Ok(Outcome::Import(judged));
    }
    apply_session_index(t, &id, old.as_ref(), record)?;
    reindex(t, &id, old_due, record)?;
    t.records.insert(id.as_slice(), value)?;
    // An older version of the record has the same key (judge_import checks
    // it), so its index entry is these same bytes.
    let scan = keyspace::record_scan_bytes(&record.key, &record.id);
    t.by_key.insert(scan.as_slice(), id.as_slice())?;
    Ok(Outcome::Import(Import::Written))
}

/// Moves `record`'s expiry entry from `old` (the stored record's) to the
/// one it has now (put again when it stays: that restores a settled one).
fn reindex(
    t: &mut Tables<'_>,
    id: &[u8],
    old: Option<Due>,
    record: &DcRecord,
) -> Result<(), NotApplied> {
    let new = Due::of(record);
    if let Some(old) = old.filter(|old| Some(*old) != new) {
        t.due
            .remove(keyspace::due_bytes(old, &record.id).as_slice())?;
    }
    if let Some(new) = new {
        t.due
            .insert(keyspace::due_bytes(new, &record.id).as_slice(), id)?;
    }
    Ok(())
}

/// Moves `record`'s session-index entries from `old`'s.
fn apply_session_index(
    t: &mut Tables<'_>,
    id: &[u8],
    old: Option<&DcRecord>,
    record: &DcRecord,
) -> Result<(), NotApplied> {
    let (gone, added) = session::session_index_changes(old, record);
    for SessionEntry { index, entry } in gone {
        t.session_index(index).remove(entry.as_slice())?;
    }
    for SessionEntry { index, entry } in added {
        t.session_index(index).insert(entry.as_slice(), id)?;
    }
    Ok(())
}

impl<'txn> Tables<'txn> {
    fn session_index(
        &mut self,
        index: SessionIndex,
    ) -> &mut Table<'txn, &'static [u8], &'static [u8]> {
        match index {
            SessionIndex::Keys => &mut self.session_keys,
            SessionIndex::Notices => &mut self.session_notices,
        }
    }
}

/// Drops a released record's expiry entry if the record is at `version`.
fn settle(t: &mut Tables<'_>, id: &[u8], version: u64) -> Result<Outcome, NotApplied> {
    let Some(record) = stored(t, id)?.filter(|r| r.version == version) else {
        return Ok(Outcome::Settled(false));
    };
    let dropped = match Due::of(&record) {
        Some(due) if due.kind == DueKind::Released => t
            .due
            .remove(keyspace::due_bytes(due, &record.id).as_slice())?
            .is_some(),
        _ => false,
    };
    Ok(Outcome::Settled(dropped))
}

/// Indexes every decodable record of a file written before the expiry index
/// existed, once, in the transaction that opens the file (`DUE_INDEX`
/// marks it done). An undecodable record gets no entry (a full-scan reaper
/// could not read it either) and is logged.
pub(crate) fn build_due_index(txn: &redb::WriteTransaction) -> Result<u64, redb::Error> {
    let mut meta = txn.open_table(META)?;
    if meta.get(DUE_INDEX)?.is_some() {
        return Ok(0);
    }
    let records = txn.open_table(RECORDS)?;
    let mut due = txn.open_table(DUE)?;
    let mut indexed = 0;
    for entry in records.iter()? {
        let (id, value) = entry?;
        let record = match keyspace::decode_record(value.value()) {
            Ok(record) => record,
            Err(e) => {
                let id = String::from_utf8_lossy(id.value()).into_owned();
                tracing::warn!(reservation = %id, error = %e, "undecodable record left out of the expiry index");
                continue;
            }
        };
        if let Some(at) = Due::of(&record) {
            due.insert(keyspace::due_bytes(at, &record.id).as_slice(), id.value())?;
            indexed += 1;
        }
    }
    meta.insert(DUE_INDEX, 1)?;
    Ok(indexed)
}

/// An event import at its own seq; the head becomes at least that seq.
fn import_event(t: &mut Tables<'_>, event: &Event, value: &[u8]) -> Result<Outcome, NotApplied> {
    let current = t
        .events
        .get(event.seq)?
        .map(|v| keyspace::decode_event(v.value()))
        .transpose()?;
    if let Some(judged) = judge_event_import(event, current) {
        return Ok(Outcome::ImportEvent(judged));
    }
    let head = head(t)?;
    t.events.insert(event.seq, value)?;
    t.meta.insert(EVENT_HEAD, head.max(event.seq))?;
    Ok(Outcome::ImportEvent(Import::Written))
}
