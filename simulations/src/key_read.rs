//! Requests that read one key's records at its DC, as homingd's `Node`
//! runs them through homing-node's [`KeyRecords`] (page by page, only the
//! key's own records): a host's `Cancel` (note the lease key — an acquire
//! still running honours it as it lands —, read until the grant made under
//! it, release that grant as cancelled with an
//! [`Update`](homing_node::Update)) and an operator's `Inspect` (up to a
//! page of the key's records, redacted). The region's first router
//! inspects a key after each scan of its DC (`crate::scan`).

use homing_core::{DcRecord, Key, LeaseKey, Reply};
use homing_node::{Change, KeyRecords, KeyRecordsPoll, Stored, cancel};
use homing_store::SCAN_LIMIT_MAX;

use crate::counter::Counter;
use crate::dc::{Next, StoreOp, Task, TaskKind, update_next};
use crate::sim::{NodeId, Sim};

/// A request reading its key's records.
#[derive(Debug)]
pub(crate) struct KeyRead {
    read: KeyRecords,
    then: Then,
}

/// What the read is for.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Cancel the grant held under this lease.
    Cancel(LeaseKey),
    /// Answer the records.
    Inspect,
}

impl Sim {
    /// DC `d` receives a host's `Cancel { key, lease }`.
    pub(crate) fn cancel_start(
        &mut self,
        d: usize,
        from: (NodeId, u64, u32),
        wanted: Key,
        lease: LeaseKey,
    ) {
        let now = self.node_now(d);
        self.dcs[d].cancelled.note(lease, now);
        let read = KeyRecords::held_under(wanted, lease, SCAN_LIMIT_MAX);
        self.key_read_start(d, from, read, Then::Cancel(lease));
    }

    /// DC `d` receives an operator's `Inspect { key }`.
    pub(crate) fn inspect_start(&mut self, d: usize, from: (NodeId, u64, u32), wanted: Key) {
        let read = KeyRecords::inspect(wanted, SCAN_LIMIT_MAX);
        self.key_read_start(d, from, read, Then::Inspect);
    }

    fn key_read_start(
        &mut self,
        d: usize,
        (client, rpc, key): (NodeId, u64, u32),
        read: KeyRecords,
        then: Then,
    ) {
        let next = scan_of(&read);
        let kind = TaskKind::KeyRead(Box::new(KeyRead { read, then }));
        self.dc_start(d, client, rpc, key, kind, next);
    }

    /// A page of the read came back (a failed read answers its error in
    /// `dc_stored`).
    pub(crate) fn key_read_stored(&mut self, d: usize, tid: u64, mut task: Task, page: Stored) {
        let TaskKind::KeyRead(job) = &mut task.kind else {
            return;
        };
        job.read.handle_stored(page);
        if let KeyRecordsPoll::Store(_) = job.read.poll() {
            let next = scan_of(&job.read);
            return self.dc_continue(d, tid, task, next);
        }
        let next = match job.then {
            Then::Inspect => {
                let records = job.read.records().iter().cloned();
                let records = records.map(DcRecord::redacted).collect();
                Next::Reply(Reply::Inspected { records })
            }
            Then::Cancel(lease) => match cancel::target(job.read.records(), &lease) {
                Some(id) => {
                    self.measurements.count(Counter::CancelFoundAGrant);
                    task.kind = self.update_task(d, id, Change::Cancel { lease });
                    let TaskKind::Update(update) = &mut task.kind else {
                        unreachable!("an update task")
                    };
                    update_next(update)
                }
                None => {
                    self.measurements.count(Counter::CancelFoundNoGrant);
                    Next::Reply(Reply::Cancelled(false))
                }
            },
        };
        self.dc_continue(d, tid, task, next);
    }
}

/// The store operation a [`KeyRecords`] read asks for next.
fn scan_of(read: &KeyRecords) -> Next {
    match read.poll() {
        KeyRecordsPoll::Store(op) => Next::Store(StoreOp::Dc(op.clone())),
        KeyRecordsPoll::Done => unreachable!("a read that is done asks nothing"),
    }
}
