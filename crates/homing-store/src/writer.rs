//! The redb group-commit writer: one thread owns every write transaction.
//! Callers send operations over a bounded channel; the thread takes the first
//! waiting operation, drains up to `group_ops_max - 1` more that are already
//! queued, applies them all in ONE write transaction in arrival order (so a
//! later operation sees an earlier one's write), commits once (one fsync with
//! `Durability::Immediate`), then answers each caller. Under load, N
//! concurrent writers share one fsync; alone, a writer pays one fsync per op.
//! `group_ops_max = 1` is the non-grouped mode kept for comparison.

use std::sync::Arc;
use std::thread::JoinHandle;

use homing_core::DcRecord;
use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use crate::dc::{Cas, judge_cas};
use crate::error::StoreError;
use crate::keyspace;

/// Global entries: key bytes → reservation ID text.
pub(crate) const GLOBAL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("global");
/// DC records: reservation ID text → postcard record.
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// Scan index: `(key, id)` bytes → reservation ID text.
pub(crate) const BY_KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records_by_key");
/// Small counters (the allocator's high-water mark).
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The allocator's persisted high-water mark in [`META`].
pub(crate) const HIGH_WATER: &str = "allocator_high_water";

/// Operations queued for the writer before senders wait (backpressure).
pub const WRITE_QUEUE_OPS_MAX: usize = 4096;

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
    /// Raise the allocator's high-water mark to at least this.
    HighWater(u64),
}

/// What an applied [`Op`] found.
pub(crate) enum Outcome {
    /// `None`: inserted; `Some(bytes)`: the existing entry.
    SetIfAbsent(Option<Vec<u8>>),
    /// The compare-and-set result.
    Cas(Cas),
    /// The high-water mark is durable.
    HighWater,
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

/// Handle to the writer thread; dropping it stops and joins the thread, so the
/// database file is closed when the store is dropped.
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

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
    /// Starts the writer thread over `db`, committing up to `group_ops_max` ops per transaction.
    pub(crate) fn start(db: Arc<Database>, group_ops_max: usize) -> Result<Writer, StoreError> {
        assert!(group_ops_max >= 1, "a group holds at least one op");
        let (queue, rx) = mpsc::channel(WRITE_QUEUE_OPS_MAX);
        let thread = std::thread::Builder::new()
            .name("homing-redb-writer".into())
            .spawn(move || run(&db, rx, group_ops_max))
            .map_err(backend)?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `op` and waits until its transaction committed (or failed).
    pub(crate) async fn submit(&self, op: Op) -> Result<Outcome, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Request { op, reply })
            .await
            .map_err(|_| stopped())?;
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

fn run(db: &Database, mut rx: mpsc::Receiver<Request>, group_ops_max: usize) {
    let mut batch = Vec::with_capacity(group_ops_max);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < group_ops_max {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let ops = batch.len();
        match commit_group(db, &batch) {
            Ok(outcomes) => {
                for (request, outcome) in batch.drain(..).zip(outcomes) {
                    // A caller that stopped waiting still had its op committed.
                    let _ = request.reply.send(outcome);
                }
            }
            Err(e) => {
                tracing::warn!(ops, error = %e, "redb group commit failed");
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(backend(&e)));
                }
            }
        }
    }
}

type Answer = Result<Outcome, StoreError>;

/// Applies every op in one write transaction. The outer error aborts the
/// whole group; inner errors belong to one op only.
fn commit_group(db: &Database, batch: &[Request]) -> Result<Vec<Answer>, redb::Error> {
    let txn = db.begin_write()?;
    let mut answers = Vec::with_capacity(batch.len());
    {
        let mut global = txn.open_table(GLOBAL)?;
        let mut records = txn.open_table(RECORDS)?;
        let mut by_key = txn.open_table(BY_KEY)?;
        let mut meta = txn.open_table(META)?;
        for request in batch {
            let answer = match &request.op {
                Op::SetIfAbsent { key, id } => {
                    let existing = global.get(key.as_slice())?.map(|v| v.value().to_vec());
                    if existing.is_none() {
                        global.insert(key.as_slice(), id.as_slice())?;
                    }
                    Ok(Outcome::SetIfAbsent(existing))
                }
                Op::Cas {
                    expected,
                    record,
                    value,
                } => {
                    let id = keyspace::id_bytes(&record.id);
                    let current = records
                        .get(id.as_slice())?
                        .map(|v| keyspace::decode_record(v.value()));
                    match current.transpose() {
                        Err(e) => Err(e),
                        Ok(current) => match judge_cas(*expected, record, current) {
                            Err(e) => Err(e),
                            Ok(Some(conflict)) => Ok(Outcome::Cas(conflict)),
                            Ok(None) => {
                                records.insert(id.as_slice(), value.as_slice())?;
                                if expected.is_none() {
                                    let scan = keyspace::record_scan_bytes(&record.key, &record.id);
                                    by_key.insert(scan.as_slice(), id.as_slice())?;
                                }
                                Ok(Outcome::Cas(Cas::Written))
                            }
                        },
                    }
                }
                Op::HighWater(mark) => {
                    let old = meta.get(HIGH_WATER)?.map_or(0, |v| v.value());
                    meta.insert(HIGH_WATER, old.max(*mark))?;
                    Ok(Outcome::HighWater)
                }
            };
            answers.push(answer);
        }
    }
    txn.commit()?;
    Ok(answers)
}
