//! A host's `Cancel` at its DC, as homingd's `Node::cancel` runs it: note
//! the lease key (an acquire still running honours it as it lands), read
//! the key's records page by page until the grant made under the lease
//! (homing-node's [`KeyRecords`], the read homingd's `Inspect` also
//! makes), and release that grant as cancelled (an [`Update`](homing_node::Update)).

use homing_core::{Key, LeaseKey, Reply};
use homing_node::{Change, KeyRecords, KeyRecordsPoll, cancel};
use homing_store::SCAN_LIMIT_MAX;

use crate::counter::Counter;
use crate::dc::{Next, ScanPage, StoreOp, Task, TaskKind, Work, error, update_next};
use crate::sim::{NodeId, Sim};

/// A cancel reading its key's records.
#[derive(Debug)]
pub(crate) struct CancelJob {
    read: KeyRecords,
    lease: LeaseKey,
}

impl Sim {
    /// DC `d` receives a host's `Cancel { key, lease }`.
    pub(crate) fn cancel_start(
        &mut self,
        d: usize,
        client: NodeId,
        rpc: u64,
        key: u32,
        wanted: Key,
        lease: LeaseKey,
    ) {
        let now = self.node_now(d);
        self.dcs[d].cancelled.note(lease, now);
        let read = KeyRecords::held_under(wanted, lease, SCAN_LIMIT_MAX);
        let next = scan_of(&read);
        let task = Task {
            client,
            rpc,
            key,
            kind: TaskKind::Cancel(Box::new(CancelJob { read, lease })),
            waiting: None,
            work: Work::default(),
        };
        let tid = self.new_task_id(d);
        self.dc_continue(d, tid, task, next);
    }

    /// A page of the cancel's read came back (`op` is the scan it asked).
    pub(crate) fn cancel_store_done(&mut self, d: usize, tid: u64, mut task: Task, op: StoreOp) {
        let TaskKind::Cancel(job) = &mut task.kind else {
            return;
        };
        let StoreOp::Scan(page) = op else {
            let reply = error(
                homing_core::ErrorKind::Internal,
                "unexpected store operation",
            );
            return self.dc_continue(d, tid, task, Next::Reply(reply));
        };
        match self.scan_page(d, &page) {
            Ok(records) => job.read.handle_page(records),
            Err(failure) => {
                let reply = Reply::Error(failure.into_reply());
                return self.dc_continue(d, tid, task, Next::Reply(reply));
            }
        }
        if let KeyRecordsPoll::Scan { .. } = job.read.poll() {
            let next = scan_of(&job.read);
            return self.dc_continue(d, tid, task, next);
        }
        let lease = job.lease;
        let next = match cancel::target(job.read.records(), &lease) {
            Some(id) => {
                self.measurements.count(Counter::CancelFoundAGrant);
                task.kind = self.update_task(d, id, Change::Cancel { lease });
                let TaskKind::Update(update) = &mut task.kind else {
                    unreachable!("an update task")
                };
                update_next(update, &mut self.measurements)
            }
            None => {
                self.measurements.count(Counter::CancelFoundNoGrant);
                Next::Reply(Reply::Cancelled(false))
            }
        };
        self.dc_continue(d, tid, task, next);
    }
}

/// The store operation a [`KeyRecords`] read asks for next.
fn scan_of(read: &KeyRecords) -> Next {
    match read.poll() {
        KeyRecordsPoll::Scan {
            scope,
            name,
            after,
            limit,
        } => Next::Store(StoreOp::Scan(ScanPage {
            scope: scope.clone(),
            name: name.clone(),
            after: after.clone(),
            limit: *limit,
        })),
        KeyRecordsPoll::Done => unreachable!("a read that is done asks nothing"),
    }
}
