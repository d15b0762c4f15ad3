//! Operator drains as requests: homing-node's `Drain`, as homingd runs it.
//! A `drain` fault picks `count` keys; each drain is sent by an operator to a
//! random running DC, which walks the key's chain (its own store, its
//! peers; from the member it remembers, as homingd does), drains the tail
//! if it owns it, and otherwise forwards the drain
//! once to the tail's DC. A DC serving a forwarded drain that forwards it
//! again breaks `drain_forwarded_once` (one operator request may never
//! bounce between DCs).

use homing_core::{Key, Request};

use super::ctx::DcCtx;
use super::task::{Task, TaskStepper};

impl DcCtx<'_> {
    /// An operator's drain of `key` (the trace's `key_index`) starts at
    /// this DC: nobody waits for its reply.
    pub(crate) fn drain_start(&mut self, key_index: u32, key: Key) {
        let serve = self.inst.endpoint.serve(None, Request::Drain { key });
        let kind = TaskStepper::Serve(Box::new(serve));
        self.step_start(Task::new(self.me(), 0, key_index, kind));
    }
}
