//! The etcd DC store's appender: one task per DC store writes every
//! compare-and-set, and owns the event head. Every event is a write of the
//! single head key, so writers racing on etcd would fail each other's guards
//! nearly every time; and one transaction per write caps a DC store at one
//! etcd round trip per renewal. Instead, compare-and-sets are queued here;
//! the task takes the first waiting one, drains more that are already queued
//! (bounded in count and bytes, never the same record twice), and writes them
//! all in ONE transaction: each record guarded by the `mod_revision` its
//! caller read, and — when the group derives events — the head guarded by the
//! value the task last saw, the events at consecutive seqs after it and the
//! new head (a group of renewals alone leaves the head alone). If a guard
//! fails the transaction reads back every record (and the head); a caller
//! whose record moved is told so, with the record as read back (it judges its
//! CAS anew), the rest go again, at most [`CAS_ATTEMPTS_MAX`] times.

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use homing_core::{Event, EventSeq};
use tokio::sync::{mpsc, oneshot};

use super::members::Op;
use super::{CAS_ATTEMPTS_MAX, EVENT_HEAD, EVENTS, Space, decode_counter, every_first_kv};
use crate::error::StoreError;
use crate::keyspace;

/// Most compare-and-sets one transaction carries: each costs one compare and
/// up to four writes (record, scan-index entry or old expiry entry's delete,
/// new expiry entry, event), plus the head once, and etcd allows 128 of each
/// per transaction by default: 31 × 4 + 1 = 125.
pub const APPEND_GROUP_OPS_MAX: usize = 31;
/// Most key and value bytes one transaction carries (etcd refuses requests
/// above 1.5 MiB by default). A single larger op still goes alone.
pub const APPEND_GROUP_BYTES_MAX: usize = 1024 * 1024;
/// Appends queued before callers wait (backpressure).
pub const APPEND_QUEUE_OPS_MAX: usize = 4096;

/// One compare-and-set, judged by its caller.
pub(super) struct Append {
    /// The record's key.
    pub(super) record_key: Vec<u8>,
    /// Its `mod_revision` as the caller read it (`None`: absent).
    pub(super) read_revision: Option<i64>,
    /// The record first (and, for a create, its scan-index entry; its new
    /// expiry-index entry).
    pub(super) puts: Vec<(Vec<u8>, Vec<u8>)>,
    /// Keys deleted in the same transaction (the record's old expiry-index
    /// entry); never one of `puts`.
    pub(super) deletes: Vec<Vec<u8>>,
    /// The event the change derives, if any (a renewal derives none); the
    /// appender numbers it.
    pub(super) event: Option<Event>,
}

/// What became of an [`Append`].
#[derive(Debug)]
pub(super) enum Appended {
    /// Record and event are written, at this etcd revision (the record's
    /// new `mod_revision`).
    Written {
        /// The transaction's revision.
        revision: i64,
    },
    /// The record is no longer as read: nothing written; judge again
    /// against the record as it is now.
    Moved {
        /// The record's kv as the failed transaction read it back.
        now: Option<KeyValue>,
        /// The transaction was resent after a lost answer: an earlier
        /// attempt may have written this very record.
        resent: bool,
    },
}

struct Queued {
    append: Append,
    reply: oneshot::Sender<Result<Appended, StoreError>>,
}

impl Queued {
    fn bytes(&self) -> usize {
        let puts: usize = self
            .append
            .puts
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
            + self.append.deletes.iter().map(Vec::len).sum::<usize>();
        // The event repeats the record's key and ids: bound it by the record.
        2 * puts
    }
}

/// Handle to the appender task; the task ends when the handle is dropped
/// (after answering what is queued).
pub(super) struct Appender {
    queue: mpsc::Sender<Queued>,
}

fn stopped() -> StoreError {
    StoreError::Unavailable {
        backend: "etcd",
        reason: "event appender stopped".into(),
    }
}

impl Appender {
    /// Starts the task on the current tokio runtime.
    pub(super) fn start(space: Space) -> Appender {
        let (queue, rx) = mpsc::channel(APPEND_QUEUE_OPS_MAX);
        tokio::spawn(run(space, rx));
        Appender { queue }
    }

    /// Queues `append` and waits for its transaction.
    pub(super) async fn submit(&self, append: Append) -> Result<Appended, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued { append, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(space: Space, mut rx: mpsc::Receiver<Queued>) {
    let head_key = space.key(EVENT_HEAD, b"");
    // The head as last seen; `None`: unknown, read it first.
    let mut head: Option<EventSeq> = None;
    let mut held: Option<Queued> = None;
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut bytes = first.bytes();
        let mut group = vec![first];
        while group.len() < APPEND_GROUP_OPS_MAX {
            let Ok(next) = rx.try_recv() else { break };
            // One transaction may not put a key twice: a second write of a
            // record waits for the next group (where its guard fails).
            let twice = group
                .iter()
                .any(|q| q.append.record_key == next.append.record_key);
            if twice || bytes + next.bytes() > APPEND_GROUP_BYTES_MAX {
                held = Some(next);
                break;
            }
            bytes += next.bytes();
            group.push(next);
        }
        commit(&space, &head_key, &mut head, group).await;
    }
}

/// Writes `group` (bounded retries when only the head moved) and answers
/// every caller.
async fn commit(
    space: &Space,
    head_key: &[u8],
    head: &mut Option<EventSeq>,
    mut group: Vec<Queued>,
) {
    for _ in 0..CAS_ATTEMPTS_MAX {
        if group.is_empty() {
            return;
        }
        match attempt(space, head_key, head, &mut group).await {
            Ok(Some(revision)) => {
                for q in group.drain(..) {
                    let _ = q.reply.send(Ok(Appended::Written { revision }));
                }
                return;
            }
            Ok(None) => {}
            Err(e) => {
                *head = None;
                for q in group.drain(..) {
                    let _ = q.reply.send(Err(e.for_each_caller("etcd")));
                }
                return;
            }
        }
    }
    for q in group.drain(..) {
        let _ = q.reply.send(Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("event head contended for {CAS_ATTEMPTS_MAX} attempts"),
        }));
    }
}

/// One transaction for `group`: `Ok(Some(revision))` written at that
/// revision; `Ok(None)` not written, and `group` and `head` now hold what is
/// left to try and the head as it is. Callers with a bad event or a moved
/// record are answered here.
async fn attempt(
    space: &Space,
    head_key: &[u8],
    head: &mut Option<EventSeq>,
    group: &mut Vec<Queued>,
) -> Result<Option<i64>, StoreError> {
    // The head is read, guarded and moved only when the group has events.
    let base = if group.iter().any(|q| q.append.event.is_some()) {
        let base = match *head {
            Some(seq) => seq,
            None => {
                let response = space.get(Op::HotRead, head_key.to_vec(), None).await?;
                decode_counter("event head", response.kvs().first())?
            }
        };
        *head = Some(base);
        Some(base)
    } else {
        None
    };
    let mut guards = Vec::with_capacity(group.len() + 1);
    let mut ops = Vec::with_capacity(3 * group.len() + 1);
    let mut seq = base.unwrap_or_default();
    let mut encoded = Vec::with_capacity(group.len());
    for q in group.drain(..) {
        let Some(event) = &q.append.event else {
            encoded.push((q, None));
            continue;
        };
        let mut event = event.clone();
        // Invariant: a u64 log never fills (one event per write).
        event.seq = seq.checked_add(1).expect("event seq overflow");
        match keyspace::encode_event(&event) {
            Ok(bytes) => {
                seq = event.seq;
                encoded.push((q, Some((event.seq, bytes))));
            }
            Err(e) => {
                let _ = q.reply.send(Err(e));
            }
        }
    }
    for (q, event) in &encoded {
        let a = &q.append;
        guards.push(match a.read_revision {
            Some(rev) => Compare::mod_revision(a.record_key.clone(), CompareOp::Equal, rev),
            None => Compare::create_revision(a.record_key.clone(), CompareOp::Equal, 0),
        });
        ops.extend(
            a.puts
                .iter()
                .map(|(k, v)| TxnOp::put(k.clone(), v.clone(), None)),
        );
        ops.extend(a.deletes.iter().map(|k| TxnOp::delete(k.clone(), None)));
        if let Some((seq, bytes)) = event {
            ops.push(TxnOp::put(
                space.key(EVENTS, &keyspace::event_seq_bytes(*seq)),
                bytes.clone(),
                None,
            ));
        }
    }
    group.extend(encoded.into_iter().map(|(q, _)| q));
    if group.is_empty() {
        return Ok(None);
    }
    let mut reread: Vec<TxnOp> = group
        .iter()
        .map(|q| TxnOp::get(q.append.record_key.clone(), None))
        .collect();
    if let Some(base) = base {
        guards.push(match base {
            0 => Compare::create_revision(head_key.to_vec(), CompareOp::Equal, 0),
            // The head only grows, so its value names it as well as a revision.
            seq => Compare::value(head_key.to_vec(), CompareOp::Equal, seq.to_string()),
        });
        ops.push(TxnOp::put(head_key.to_vec(), seq.to_string(), None));
        reread.push(TxnOp::get(head_key.to_vec(), None));
    }
    let txn = Txn::new().when(guards).and_then(ops).or_else(reread);
    let txned = space.txn_at(Op::HotWrite, txn).await?;
    let (written, revision, responses) = (txned.succeeded, txned.revision, txned.responses);
    if written {
        if base.is_some() {
            *head = Some(seq);
        }
        return Ok(Some(revision));
    }
    let mut now = every_first_kv(&responses, group.len() + usize::from(base.is_some()))?;
    if base.is_some() {
        let head_kv: Option<KeyValue> = now.pop().flatten();
        *head = Some(decode_counter("event head", head_kv.as_ref())?);
    }
    // A record that moved may have been written by this very group on an
    // attempt that was abandoned and landed (`members`): a transaction is
    // all or nothing, so if the group landed every record holds the bytes
    // its caller put, at the revision the group got. That caller is told
    // Written, once; every guard of the group now fails, so it cannot land
    // again. Any other moved record is told to its caller, who judges anew.
    let mut kept = Vec::with_capacity(group.len());
    for (q, kv) in group.drain(..).zip(now) {
        let revision = kv.as_ref().map(KeyValue::mod_revision);
        if revision == q.append.read_revision {
            kept.push(q);
        } else if let Some(revision) = landed(txned.ambiguous, &q.append, kv.as_ref()) {
            space.members.resolved_ambiguous();
            let _ = q.reply.send(Ok(Appended::Written { revision }));
        } else {
            let _ = q.reply.send(Ok(Appended::Moved {
                now: kv,
                resent: txned.ambiguous,
            }));
        }
    }
    *group = kept;
    Ok(None)
}

/// The revision `append`'s record was written at, if an ambiguous attempt of
/// its group landed: the record now holds exactly the bytes it put (records
/// carry their version, so equal bytes are this write, not another's).
fn landed(ambiguous: bool, append: &Append, now: Option<&KeyValue>) -> Option<i64> {
    let now = now.filter(|_| ambiguous)?;
    // Invariant: an append's first put is its record (see `Append::puts`).
    let (_, record) = append.puts.first()?;
    (now.value() == record.as_slice()).then(|| now.mod_revision())
}
