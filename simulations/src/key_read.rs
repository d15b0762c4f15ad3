//! Requests that read one key's records at its DC, as homingd's `Node`
//! runs them through homing-node's [`KeyRecords`] (page by page, only the
//! key's own records): a host's `Cancel` (note the lease key — an acquire
//! still running honours it as it lands —, read until the grant made under
//! it, release that grant as cancelled with an
//! [`Update`](homing_node::Update)) and an operator's `Inspect` (up to a
//! page of the key's records, redacted). The region's first router
//! inspects a key after each scan of its DC (`crate::scan`).

use homing_core::{Key, LeaseKey};
use homing_node::KeyRecords;
use homing_store::SCAN_LIMIT_MAX;

use crate::dc::{Task, TaskKind};
use crate::sim::{NodeId, Sim};
use crate::stepper::Stepping;

/// A request reading its key's records.
#[derive(Debug)]
pub(crate) struct KeyRead {
    pub(crate) read: KeyRecords,
    pub(crate) then: Then,
}

/// What the read is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Then {
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
        let kind = TaskKind::Step(Box::new(Stepping::KeyRead(KeyRead { read, then })));
        self.step_start(d, Task::new(client, rpc, key, kind));
    }
}
