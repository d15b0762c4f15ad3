//! The etcd DC store's appender: one task per DC store writes every
//! compare-and-set, and owns the event head. Every event is a write of the
//! single head key, so writers racing on etcd would fail each other's guards
//! nearly every time; and one transaction per write caps a DC store at one
//! etcd round trip per renewal. Instead, compare-and-sets are queued here;
//! the task takes the first waiting one, drains more that are already queued
//! (bounded in count and bytes, never the same record twice), and writes them
//! all in ONE transaction: each record guarded by the `mod_revision` its
//! caller read (a write in a host session also its session row's, see
//! [`SessionGuardRead`]), and — when the group derives events — the head guarded by the
//! value the task last saw, the events at consecutive seqs after it and the
//! new head (a group of renewals alone leaves the head alone). If a guard
//! fails the transaction reads back every record (and the head); a caller
//! whose record (or session row) moved is told so, with both as read back
//! (it judges its CAS anew), the rest go again, at most [`CAS_ATTEMPTS_MAX`]
//! times. A group never writes a key twice, nor writes a key another of its
//! writes compares (a freeze's session row and a join guarded by it go in
//! turn), and each of its transaction's three lists (compares, writes,
//! read-backs) stays within etcd's [`TXN_OPS_MAX`].

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use homing_core::{Event, EventSeq};
use tokio::sync::{mpsc, oneshot};

use super::members::Op;
use super::{
    CAS_ATTEMPTS_MAX, EVENT_HEAD, EVENTS, Space, decode_counter, every_first_kv, unchanged_at,
};
use crate::error::StoreError;
use crate::keyspace;

/// Most operations in each list of one etcd transaction (its compares, its
/// writes, its read-backs): etcd's `--max-txn-ops` default. A group takes
/// compare-and-sets while each list, with the head's compare, put and
/// read-back, stays within it. A compare-and-set costs one compare and one
/// read-back (two with a session guard) and up to 12 writes (record,
/// scan-index entry, old and new expiry entries, event, two session-index
/// entries gone and two added, the session row and its old and new
/// sessions-due entries), so one alone always fits.
pub const TXN_OPS_MAX: usize = 128;
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
    /// entry, its session-index entries gone, the session row's old
    /// sessions-due entry); never one of `puts`.
    pub(super) deletes: Vec<Vec<u8>>,
    /// The session row the write depends on, compared in the same
    /// transaction (its next row, if any, is among `puts`).
    pub(super) guard: Option<SessionGuardRead>,
    /// The event the change derives, if any (a renewal derives none); the
    /// appender numbers it.
    pub(super) event: Option<Event>,
}

/// A session row as the caller of a guarded write read it.
pub(super) struct SessionGuardRead {
    /// The row's key.
    pub(super) key: Vec<u8>,
    /// Its `mod_revision` as read (`None`: absent).
    pub(super) read_revision: Option<i64>,
}

impl Append {
    /// Every key the transaction writes for this append.
    fn written(&self) -> impl Iterator<Item = &[u8]> {
        let puts = self.puts.iter().map(|(k, _)| k.as_slice());
        puts.chain(self.deletes.iter().map(Vec::as_slice))
    }

    /// Every key the transaction compares for this append.
    fn compared(&self) -> impl Iterator<Item = &[u8]> {
        let guard = self.guard.as_ref().map(|g| g.key.as_slice());
        std::iter::once(self.record_key.as_slice()).chain(guard)
    }

    /// What it adds to each list of the transaction: (compares, writes,
    /// read-backs).
    fn ops(&self) -> [usize; 3] {
        let guarded = usize::from(self.guard.is_some());
        let event = usize::from(self.event.is_some());
        [
            1 + guarded,
            self.puts.len() + self.deletes.len() + event,
            1 + guarded,
        ]
    }

    /// Whether `self` and `other` may not share a transaction: one would
    /// write a key the other writes or compares.
    fn clashes(&self, other: &Append) -> bool {
        let touches = |a: &Append, key: &[u8]| a.written().chain(a.compared()).any(|k| k == key);
        self.written().any(|k| touches(other, k)) || other.written().any(|k| touches(self, k))
    }
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
    /// The record (or the guarding session row) is no longer as read:
    /// nothing written; judge again against both as they are now.
    Moved {
        /// The record's kv as the failed transaction read it back.
        now: Option<KeyValue>,
        /// The session row's kv as read back (`None` for an unguarded write
        /// or an absent row).
        session: Option<KeyValue>,
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
        // The head's compare, put and read-back.
        let mut ops = [1, 1, 1];
        add_ops(&mut ops, first.append.ops());
        let mut group = vec![first];
        loop {
            let Ok(next) = rx.try_recv() else { break };
            // One transaction may not write a key twice: a second write of
            // a record (or of a session row, or of a record guarded by a
            // row another write changes) waits for the next group, where
            // its guard fails if it must.
            let clashes = group.iter().any(|q| q.append.clashes(&next.append));
            let mut more = ops;
            add_ops(&mut more, next.append.ops());
            let over = more.iter().any(|&n| n > TXN_OPS_MAX);
            if clashes || over || bytes + next.bytes() > APPEND_GROUP_BYTES_MAX {
                held = Some(next);
                break;
            }
            (bytes, ops) = (bytes + next.bytes(), more);
            group.push(next);
        }
        commit(&space, &head_key, &mut head, group).await;
    }
}

fn add_ops(total: &mut [usize; 3], ops: [usize; 3]) {
    for (t, n) in total.iter_mut().zip(ops) {
        *t += n;
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
        guards.push(unchanged_at(&a.record_key, a.read_revision));
        if let Some(guard) = &a.guard {
            guards.push(unchanged_at(&guard.key, guard.read_revision));
        }
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
        .flat_map(|q| q.append.compared().map(|k| TxnOp::get(k, None)))
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
    // Invariant: the group was formed within the bound (see `run`).
    assert!(
        guards.len() <= TXN_OPS_MAX && ops.len() <= TXN_OPS_MAX && reread.len() <= TXN_OPS_MAX,
        "an append group above etcd's txn op bound"
    );
    let reads = reread.len();
    let txn = Txn::new().when(guards).and_then(ops).or_else(reread);
    let txned = space.txn_at(Op::HotWrite, txn).await?;
    let (written, revision, responses) = (txned.succeeded, txned.revision, txned.responses);
    if written {
        if base.is_some() {
            *head = Some(seq);
        }
        return Ok(Some(revision));
    }
    let mut now = every_first_kv(&responses, reads)?;
    if base.is_some() {
        let head_kv: Option<KeyValue> = now.pop().flatten();
        *head = Some(decode_counter("event head", head_kv.as_ref())?);
    }
    let mut now = now.into_iter();
    // A record that moved may have been written by this very group on an
    // attempt that was abandoned and landed (`members`): a transaction is
    // all or nothing, so if the group landed every record holds the bytes
    // its caller put, at the revision the group got. That caller is told
    // Written, once; every guard of the group now fails, so it cannot land
    // again. Any other moved record is told to its caller, who judges anew.
    let mut kept = Vec::with_capacity(group.len());
    for q in group.drain(..) {
        // Read back in `compared` order: the record, then its guard's row.
        let kv = now.next().flatten();
        let session = match &q.append.guard {
            Some(_) => now.next().flatten(),
            None => None,
        };
        let revision = kv.as_ref().map(KeyValue::mod_revision);
        let row_revision = session.as_ref().map(KeyValue::mod_revision);
        let row_held = q
            .append
            .guard
            .as_ref()
            .is_none_or(|g| g.read_revision == row_revision);
        if revision == q.append.read_revision && row_held {
            kept.push(q);
        } else if let Some(revision) = landed(txned.ambiguous, &q.append, kv.as_ref()) {
            space.members.resolved_ambiguous();
            let _ = q.reply.send(Ok(Appended::Written { revision }));
        } else {
            let _ = q.reply.send(Ok(Appended::Moved {
                now: kv,
                session,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn append(record: &[u8], guard: Option<&[u8]>, row_written: bool) -> Append {
        let mut puts = vec![(record.to_vec(), b"record".to_vec())];
        if let (Some(row), true) = (guard, row_written) {
            puts.push((row.to_vec(), b"row".to_vec()));
        }
        Append {
            record_key: record.to_vec(),
            read_revision: None,
            puts,
            deletes: Vec::new(),
            guard: guard.map(|key| SessionGuardRead {
                key: key.to_vec(),
                read_revision: Some(1),
            }),
            event: None,
        }
    }

    #[test]
    fn joins_of_one_session_share_a_transaction_but_not_with_its_freeze() {
        let join = |r: &[u8]| append(r, Some(b"s/iad~1"), false);
        let freeze = append(b"r/3", Some(b"s/iad~1"), true);
        assert!(!join(b"r/1").clashes(&join(b"r/2")));
        assert!(join(b"r/1").clashes(&freeze));
        assert!(freeze.clashes(&join(b"r/1")));
        assert!(join(b"r/1").clashes(&append(b"r/1", None, false)));
        assert!(!append(b"r/1", None, false).clashes(&append(b"r/2", None, false)));
    }

    #[test]
    fn a_guarded_write_counts_its_row_in_every_list() {
        assert_eq!(append(b"r/1", None, false).ops(), [1, 1, 1]);
        assert_eq!(append(b"r/2", Some(b"s/iad~1"), false).ops(), [2, 1, 2]);
        assert_eq!(append(b"r/3", Some(b"s/iad~1"), true).ops(), [2, 2, 2]);
    }
}
